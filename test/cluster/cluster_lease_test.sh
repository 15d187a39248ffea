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
# shellcheck source=cluster_common.sh
. "$(dirname "$0")/cluster_common.sh"
[ "$store" = file ] || [ -x /usr/bin/etcd ] || { echo "no /usr/bin/etcd: skipped"; exit 77; }
cluster_setup cluster-lease
read -r cport pport oport < <(free_ports 3)
store_flags=()
if [ "$store" = etcd ]; then
  start_etcd "$cport" "$pport"
  store_flags=(--etcd "$etcd_url")
fi
steps=5
start_cluster --steps "$steps" --kill-owner-at 4 "${store_flags[@]}"
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
finish_cluster "$steps"
grep -qF '"receivers_equal":4' <<<"$out" || { echo "FAIL: not every receiver equals a dense load"; exit 1; }
[ -e "$work/run/faults/owner-upload-4" ] || { echo "FAIL: owner 0 was not killed mid-upload"; exit 1; }
held=$(grep -c "owner lease held" "$work/run/logs/owner0.log" || true)
[ "$held" -ge 2 ] || { echo "FAIL: the restarted owner 0 did not get the lease ($held claims)"; exit 1; }
echo "PASS: second owner refused, restarted owner got the lease ($store store)"
