#!/usr/bin/env bash
# A local cluster with the commit record in a real etcd (/usr/bin/etcd,
# Debian etcd-server), and etcd SIGKILLed and restarted (same data
# directory) while the cluster runs refits: calls to etcd fail with
# `unavailable` meanwhile, and the coordinator and owners wait and retry.
# Checked: PASS verification (every receiver equals a dense load of the
# committed version byte for byte), one committed version per step in
# order, and etcd really was down while a coordinator needed it. Exits 77
# (skip) without etcd. Stops every process it started.
set -euo pipefail
bin=$1
here=$(cd "$(dirname "$0")/../.." && pwd)
[ -x /usr/bin/etcd ] || { echo "no /usr/bin/etcd: skipped"; exit 77; }
work=$(mktemp -d "${TMPDIR:-/tmp}/dcr-cluster-etcd-XXXXXX")
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
read -r cport pport < <(python3 -c 'import socket
s=[socket.socket() for _ in range(2)]
[x.bind(("127.0.0.1",0)) for x in s]
print(*[x.getsockname()[1] for x in s])')
url=http://127.0.0.1:$cport
start_etcd() {
  /usr/bin/etcd --name dcr --data-dir "$work/etcd" --listen-client-urls "$url" \
    --advertise-client-urls "$url" --listen-peer-urls "http://127.0.0.1:$pport" \
    --initial-advertise-peer-urls "http://127.0.0.1:$pport" \
    --initial-cluster "dcr=http://127.0.0.1:$pport" --initial-cluster-state new \
    >>"$work/etcd.log" 2>&1 &
  etcd_pid=$!
  for _ in $(seq 1 300); do
    curl -sf "$url/health" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "etcd did not start"; tail -n 20 "$work/etcd.log"; exit 1
}
start_etcd
steps=5
DCR_CLUSTER_KEEP=1 bash "$here/scripts/cluster.sh" --bin "$bin" --workdir "$work/run" \
  --steps "$steps" --etcd "$url" --json >"$work/out" 2>"$work/stderr" &
cluster_pid=$!
# After the first commit, kill etcd, keep it down for 2 s, start it again.
for _ in $(seq 1 600); do
  grep -q '"step":1' "$work/run/rows.jsonl" 2>/dev/null && break
  sleep 0.05
done
sleep 0.35 # the next transition is under way by now
kill -KILL "$etcd_pid"; wait "$etcd_pid" 2>/dev/null || true
echo "etcd killed after version 1"
sleep 2
start_etcd
echo "etcd restarted"
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
versions=$(grep -o '"step":[0-9]*' <<<"$out" | cut -d: -f2 | paste -sd' ')
[ "$versions" = "$(seq -s' ' 1 $steps)" ] || { echo "FAIL: committed versions '$versions'"; exit 1; }
grep -q "waiting\|retrying" "$work/run/logs/coordinator.log" ||
  { echo "FAIL: no coordinator saw etcd down"; tail -n 30 "$work/run/logs/coordinator.log"; exit 1; }
[ ! -e "$work/run/control/commit" ] || { echo "FAIL: a file commit record was written"; exit 1; }
echo "PASS: etcd restarted mid-run"
