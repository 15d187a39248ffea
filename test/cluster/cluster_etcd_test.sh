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
# shellcheck source=cluster_common.sh
. "$(dirname "$0")/cluster_common.sh"
[ -x /usr/bin/etcd ] || { echo "no /usr/bin/etcd: skipped"; exit 77; }
cluster_setup cluster-etcd
read -r cport pport < <(free_ports 2)
start_etcd "$cport" "$pport"
steps=5
start_cluster --steps "$steps" --etcd "$etcd_url"
# After the first commit, kill etcd, keep it down for 2 s, start it again.
for _ in $(seq 1 600); do
  grep -q '"step":1' "$work/run/rows.jsonl" 2>/dev/null && break
  sleep 0.05
done
sleep 0.35 # the next transition is under way by now
kill -KILL "$etcd_pid"; wait "$etcd_pid" 2>/dev/null || true
echo "etcd killed after version 1"
sleep 2
start_etcd "$cport" "$pport"
echo "etcd restarted"
finish_cluster "$steps"
grep -q "waiting\|retrying" "$work/run/logs/coordinator.log" ||
  { echo "FAIL: no coordinator saw etcd down"; tail -n 30 "$work/run/logs/coordinator.log"; exit 1; }
[ ! -e "$work/run/control/commit" ] || { echo "FAIL: a file commit record was written"; exit 1; }
echo "PASS: etcd restarted mid-run"
