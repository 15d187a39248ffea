#!/usr/bin/env bash
# The --json keys scripts depend on (issue contract) are present.
set -euo pipefail
table2=$1 payload=$2 detect=$3 apply=$4 construct=$5
t=$("$table2" --quick --json)
for k in a changed_pct overwrite_bytes xor_bytes ratio xor_filtered_bytes ratio_filtered \
  add_bytes ratio_add add_filtered_bytes ratio_add_planes; do
  grep -q "\"$k\":" <<<"$t" || { echo "dcr-bench-table2: missing key $k"; exit 1; }
done
[ "$(grep -o '"a":' <<<"$t" | wc -l)" -eq 3 ]
p=$("$payload" --quick --json)
for k in workload coding payload_pct bytes_per_change; do
  grep -q "\"$k\":" <<<"$p" || { echo "dcr-bench-payload: missing key $k"; exit 1; }
done
for c in v1 default xor_default add_default best_per_item full_xor_zstd index_value_zstd \
  entropy_bound entropy_bound_add; do
  [ "$(grep -o "\"coding\":\"$c\"" <<<"$p" | wc -l)" -eq 4 ] || { echo "dcr-bench-payload: coding $c not in every workload"; exit 1; }
done
# Every row of the detection, apply and construction benches carries its floor.
for b in "$detect" "$apply" "$construct"; do
  j=$("$b" --quick --json)
  rows=$(grep -o '"change_pct":' <<<"$j" | wc -l)
  [ "$rows" -gt 0 ] && [ "$(grep -o '"ratio_to_floor":' <<<"$j" | wc -l)" -eq "$rows" ] ||
    { echo "$(basename "$b"): ratio_to_floor missing from some of its $rows rows"; exit 1; }
done
# The apply bench reports 1-thread and all-thread apply and their ratio on every row.
j=$("$apply" --quick --json)
rows=$(grep -o '"change_pct":' <<<"$j" | wc -l)
for k in threads one_thread_s all_threads_s scaling overwrite_scaling; do
  [ "$(grep -o "\"$k\":" <<<"$j" | wc -l)" -eq "$rows" ] ||
    { echo "dcr-bench-apply: $k missing from some of its $rows rows"; exit 1; }
done
echo "bench json keys: ok"
