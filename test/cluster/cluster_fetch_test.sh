#!/usr/bin/env bash
# The manifest index on a local cluster of real processes (scripts/cluster.sh:
# 2 owners, 2 rollout nodes x 2 receivers, the small Qwen3-MoE-style model;
# vLLM there runs DP = 2 with expert parallelism, so each node holds half of
# the experts). Run twice on the same seed: with the index (the default) and
# with --fetch-all. Checked: both runs verify PASS (every receiver equals a
# dense load of the committed version, byte for byte); with the index every
# node skipped payloads and fetched fewer payloads and fewer bytes than with
# --fetch-all, which skipped none; the payloads listed (fetched + skipped)
# are as many in both runs (the same payload set). The counters are the
# rollout processes' own ("fetch indexed|all: ..." in their logs).
set -euo pipefail
bin=$1
here=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/dcr-cluster-fetch-XXXXXX")
trap 'rm -rf "$work"' EXIT
steps=2
run() { # NAME FLAGS...
  local name=$1; shift
  set +e
  out=$(DCR_CLUSTER_KEEP=1 bash "$here/scripts/cluster.sh" --bin "$bin" --workdir "$work/$name" \
    --steps "$steps" --json "$@" 2>"$work/$name.stderr")
  rc=$?
  set -e
  echo "$name: $out"
  if [ "$rc" -ne 0 ]; then
    cat "$work/$name.stderr"; for f in "$work/$name"/logs/*.log; do echo "== $f"; tail -n 20 "$f"; done
    echo "FAIL: cluster run ($name) exited $rc"; exit 1
  fi
  grep -qF '"bit_exact":true' <<<"$out" || { echo "FAIL: $name not bit-exact"; exit 1; }
  grep -qF '"receivers_checked":4' <<<"$out" || { echo "FAIL: $name: not every receiver checked"; exit 1; }
  [ ! -s "$work/$name/restarts" ] || { echo "FAIL: $name: a process restarted in a clean run"; exit 1; }
}
# counters NAME NODE: "fetched_payloads fetched_bytes skipped_payloads skipped_bytes" of the node
counters() {
  local line
  line=$(grep -o 'fetch [a-z]*: fetched [0-9]* payloads [0-9]* bytes, skipped [0-9]* payloads [0-9]* bytes' \
    "$work/$1/logs/node$2.log" | tail -n1)
  [ -n "$line" ] || { echo "FAIL: $1: node $2 printed no fetch counters" >&2; exit 1; }
  echo "$line" | awk '{print $4, $6, $9, $11}'
}
run indexed
run all --fetch-all
for j in 0 1; do
  read -r ip ib is isb < <(counters indexed "$j")
  read -r ap ab as asb < <(counters all "$j")
  echo "node $j: indexed fetched $ip payloads / $ib bytes, skipped $is / $isb bytes;" \
    "fetch-all fetched $ap / $ab, skipped $as"
  [ "$as" -eq 0 ] && [ "$asb" -eq 0 ] || { echo "FAIL: --fetch-all skipped payloads"; exit 1; }
  [ "$is" -gt 0 ] && [ "$isb" -gt 0 ] || { echo "FAIL: node $j skipped nothing with the index"; exit 1; }
  [ "$ip" -gt 0 ] && [ "$ip" -lt "$ap" ] || { echo "FAIL: node $j: $ip payloads fetched, not fewer than $ap"; exit 1; }
  [ "$ib" -lt "$ab" ] || { echo "FAIL: node $j: $ib bytes fetched, not fewer than $ab"; exit 1; }
  [ $((ip + is)) -eq "$ap" ] || { echo "FAIL: node $j: $ip + $is payloads listed, $ap with --fetch-all"; exit 1; }
done
echo "PASS: indexed fetch"
