#!/usr/bin/env bash
# The owner lease (docs/protocol.md, "Threat model"): while a local cluster
# runs (scripts/cluster.sh), a second dcr-owner process started as rank 0
# with the same job must be refused (exit 3, "held by another process")
# while the first holds the lease; owner 0 is SIGKILLed mid-upload of step 4
# and the restarted process must get the lease (the kernel dropped the dead
# one's flock; with etcd its lease expired) and serve on. Checked: the
# refusal, the restart's "owner lease held" line, PASS verification (every
# receiver equals a dense load of the committed version byte for byte) and
# one committed version per step in order.
#   cluster_lease_test.sh BIN file|etcd
# etcd: the commit record and the leases in a real etcd (/usr/bin/etcd);
# exits 77 (skip) without it. Stops every process it started.
set -euo pipefail
bin=$1
store=$2
here=$(cd "$(dirname "$0")/../.." && pwd)
[ "$store" = file ] || [ -x /usr/bin/etcd ] || { echo "no /usr/bin/etcd: skipped"; exit 77; }
work=$(mktemp -d "${TMPDIR:-/tmp}/dcr-cluster-lease-XXXXXX")
etcd_pid=""
cluster_pid=""
cleanup() {
  [ -z "$cluster_pid" ] || kill -TERM "$cluster_pid" 2>/dev/null || true
  [ -z "$cluster_pid" ] || wait "$cluster_pid" 2>/dev/null || true
  [ -z "$etcd_pid" ] || kill -KILL "$etcd_pid" 2>/dev/null || true
  [ -z "$etcd_pid" ] || wait "$etcd_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 143' TERM INT
read -r cport pport oport < <(python3 -c 'import socket
s=[socket.socket() for _ in range(3)]
[x.bind(("127.0.0.1",0)) for x in s]
print(*[x.getsockname()[1] for x in s])')
store_flags=()
if [ "$store" = etcd ]; then
  url=http://127.0.0.1:$cport
  /usr/bin/etcd --name dcr --data-dir "$work/etcd" --listen-client-urls "$url" \
    --advertise-client-urls "$url" --listen-peer-urls "http://127.0.0.1:$pport" \
    --initial-advertise-peer-urls "http://127.0.0.1:$pport" \
    --initial-cluster "dcr=http://127.0.0.1:$pport" --initial-cluster-state new \
    >>"$work/etcd.log" 2>&1 &
  etcd_pid=$!
  for _ in $(seq 1 300); do curl -sf "$url/health" >/dev/null 2>&1 && break; sleep 0.1; done
  curl -sf "$url/health" >/dev/null || { echo "etcd did not start"; tail -n 20 "$work/etcd.log"; exit 1; }
  store_flags=(--etcd "$url")
fi
steps=5
DCR_CLUSTER_KEEP=1 bash "$here/scripts/cluster.sh" --bin "$bin" --workdir "$work/run" \
  --steps "$steps" --kill-owner-at 4 --json "${store_flags[@]}" >"$work/out" 2>"$work/stderr" &
cluster_pid=$!
[ "$store" = file ] || store_flags+=(--etcd-prefix "dcr/cluster-$cluster_pid/")
# As soon as the first owner 0 holds its lease (long before its SIGKILL at
# step 4), the second process: same job (cluster.sh's defaults), same rank,
# another port, no waiting for the lease.
for _ in $(seq 1 1200); do
  grep -q 'owner lease held' "$work/run/logs/owner0.log" 2>/dev/null && break
  sleep 0.05
done
grep -q 'owner lease held' "$work/run/logs/owner0.log" ||
  { echo "FAIL: owner 0 took no lease"; cat "$work/stderr"; exit 1; }
set +e
timeout 60 "$bin/dcr-owner" --rank 0 --listen "127.0.0.1:$oport" --workdir "$work/run" \
  --lease-wait 0 "${store_flags[@]}" >"$work/second.log" 2>&1
rc=$?
set -e
cat "$work/second.log"
[ "$rc" -eq 3 ] || { echo "FAIL: a second owner 0 exited $rc, expected 3 (refused)"; exit 1; }
# The refusal was against a live holder: the first owner 0 had not died yet.
! grep -qx owner0 "$work/run/restarts" 2>/dev/null ||
  { echo "FAIL: owner 0 restarted before the second process was refused (test raced)"; exit 1; }
grep -q "held by another process" "$work/second.log" ||
  { echo "FAIL: the refusal does not say the owner is held"; exit 1; }
set +e
wait "$cluster_pid"
rc=$?
cluster_pid=""
set -e
out=$(cat "$work/out")
echo "$out"
if [ "$rc" -ne 0 ]; then
  cat "$work/stderr"; for f in "$work"/run/logs/*.log; do echo "== $f"; tail -n 20 "$f"; done
  echo "FAIL: cluster run exited $rc"; exit 1
fi
grep -qF '"bit_exact":true' <<<"$out" || { echo "FAIL: not bit-exact"; exit 1; }
grep -qF '"receivers_equal":4' <<<"$out" || { echo "FAIL: not every receiver equals a dense load"; exit 1; }
versions=$(grep -o '"step":[0-9]*' <<<"$out" | cut -d: -f2 | paste -sd' ')
[ "$versions" = "$(seq -s' ' 1 $steps)" ] || { echo "FAIL: committed versions '$versions'"; exit 1; }
[ -e "$work/run/faults/owner-upload-4" ] || { echo "FAIL: owner 0 was not killed mid-upload"; exit 1; }
held=$(grep -c "owner lease held" "$work/run/logs/owner0.log" || true)
[ "$held" -ge 2 ] || { echo "FAIL: the restarted owner 0 did not get the lease ($held claims)"; exit 1; }
echo "PASS: second owner refused, restarted owner got the lease ($store store)"
