#!/usr/bin/env bash
# The long fuzzing campaign (docs/wire-format.md, "Fuzzing"): after
# fuzz/run.sh has built the targets and written their seeds, runs each target
# in turn, ONE process at a time under `nice -n 15` (a shared machine's builds
# keep their CPUs), until it has executed RUNS inputs (default 10^7) or its
# share of the time left before END (a `date -d` time; default: 1 hour from
# now) is spent. Prints one Markdown row per target: executions, exec/s,
# corpus size, coverage (libFuzzer's cov: edges/PCs and ft: features) and
# crashes. Corpora persist in build-fuzz/fuzz/corpus-*, so runs add up.
#   fuzz/campaign.sh [END] [RUNS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
end=$(date -d "${1:-now + 1 hour}" +%s)
runs=${2:-10000000}
shift $(($# > 2 ? 2 : $#))
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(decode body roundtrip text control payload_if locations config net http)
out=build-fuzz/fuzz
seeds_of() {
  case "$1" in
    decode|roundtrip) echo "$out/seeds" ;;
    body) echo "$out/seeds-body" ;;
    text) echo "$out/seeds-text" ;;
    payload_if) echo "$out/seeds-payload-if" ;;
    *) echo "$out/seeds-$1" ;;
  esac
}
echo "| target | executions | exec/s | corpus (inputs) | coverage (cov / ft) | crashes |"
echo "|---|--:|--:|--:|--:|---|"
left=${#targets[@]}
for t in "${targets[@]}"; do
  now=$(date +%s)
  share=$(( (end - now) / left ))
  left=$((left - 1))
  [ "$share" -ge 10 ] || share=10
  corpus=$out/corpus-${t//_/-}
  mkdir -p "$corpus"
  log=$out/campaign-$t.log
  set +e
  nice -n 15 "$out/fuzz_$t" -runs="$runs" -max_total_time="$share" -rss_limit_mb=2048 -timeout=10 \
    -max_len=65536 -artifact_prefix="$out/crash-fuzz_$t-" -print_final_stats=1 \
    "$corpus" "$(seeds_of "$t")" >"$log" 2>&1
  rc=$?
  set -e
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
  rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
  last=$(grep -E '^#[0-9]+' "$log" | tail -n1)
  cov=$(grep -o 'cov: [0-9]*' <<<"$last" | grep -o '[0-9]*' || echo "?")
  ft=$(grep -o 'ft: [0-9]*' <<<"$last" | grep -o '[0-9]*' || echo "?")
  corp=$(find "$corpus" -type f | wc -l)
  crash="none"
  [ "$rc" -eq 0 ] || crash="exit $rc: $(ls "$out"/crash-fuzz_"$t"-* 2>/dev/null | head -n1)"
  printf '| `fuzz_%s` | %s | %s | %s | %s / %s | %s |\n' "$t" "$execs" "$rate" "$corp" "$cov" "$ft" "$crash"
done
