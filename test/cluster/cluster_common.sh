# shellcheck shell=bash
# Shared by the cluster tests that run scripts/cluster.sh in the background
# next to a real etcd (cluster_lease_test.sh, cluster_etcd_test.sh); sourced,
# not run. The caller has `set -euo pipefail`. It provides:
#   cluster_setup NAME  a work directory ($work) and a trap that stops every
#                       process started through these functions and removes it
#   free_ports N        N free loopback ports, on one line
#   start_etcd CPORT PPORT
#                       /usr/bin/etcd serving $etcd_url (client port CPORT,
#                       peer port PPORT, data in $work/etcd); a restart with the
#                       same ports keeps the data
#   start_cluster ARGS  scripts/cluster.sh --bin $bin --workdir $work/run --json
#                       ARGS in the background ($cluster_pid; output in
#                       $work/out, errors in $work/stderr)
#   finish_cluster STEPS
#                       waits for it; fails with its logs unless it exited 0,
#                       verified bit-exact and committed versions 1..STEPS in
#                       order; leaves its JSON in $out
# Needs $bin (the directory of the programs).

cluster_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
etcd_pid=""
cluster_pid=""

cluster_cleanup() {
  [ -z "$cluster_pid" ] || kill -TERM "$cluster_pid" 2>/dev/null || true
  [ -z "$cluster_pid" ] || wait "$cluster_pid" 2>/dev/null || true
  [ -z "$etcd_pid" ] || kill -KILL "$etcd_pid" 2>/dev/null || true
  [ -z "$etcd_pid" ] || wait "$etcd_pid" 2>/dev/null || true
  [ -z "${work:-}" ] || rm -rf "$work"
}

cluster_setup() {
  work=$(mktemp -d "${TMPDIR:-/tmp}/dcr-$1-XXXXXX")
  trap cluster_cleanup EXIT
  trap 'exit 143' TERM INT
}

free_ports() {
  python3 -c 'import socket, sys
s=[socket.socket() for _ in range(int(sys.argv[1]))]
[x.bind(("127.0.0.1",0)) for x in s]
print(*[x.getsockname()[1] for x in s])' "$1"
}

start_etcd() {
  etcd_url=http://127.0.0.1:$1
  /usr/bin/etcd --name dcr --data-dir "$work/etcd" --listen-client-urls "$etcd_url" \
    --advertise-client-urls "$etcd_url" --listen-peer-urls "http://127.0.0.1:$2" \
    --initial-advertise-peer-urls "http://127.0.0.1:$2" \
    --initial-cluster "dcr=http://127.0.0.1:$2" --initial-cluster-state new \
    >>"$work/etcd.log" 2>&1 &
  etcd_pid=$!
  for _ in $(seq 1 300); do
    curl -sf "$etcd_url/health" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "etcd did not start"; tail -n 20 "$work/etcd.log"; exit 1
}

start_cluster() {
  : "${bin:?the caller sets bin, the directory of the programs}"
  DCR_CLUSTER_KEEP=1 bash "$cluster_root/scripts/cluster.sh" --bin "$bin" --workdir "$work/run" \
    --json "$@" >"$work/out" 2>"$work/stderr" &
  cluster_pid=$!
}

finish_cluster() {
  local rc versions
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
  [ "$versions" = "$(seq -s' ' 1 "$1")" ] ||
    { echo "FAIL: committed versions '$versions'"; exit 1; }
}
