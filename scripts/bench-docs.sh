#!/usr/bin/env bash
# Regenerates docs/benchmarks.md by running every bench with --markdown on
# this machine. Benches print their own inputs, sizes and machine; nothing in
# the output is edited by hand. Usage: scripts/bench-docs.sh [--quick]
#   --cluster-only  run only the testbed cluster bench (the long one) and put
#                   its output in place of the file's cluster section, from
#                   its heading to the end; every other section stays as the
#                   last full run wrote it, and the section says so.
#   --section BENCH [ARGS...]  run only BENCH (e.g. dcr-bench-digest,
#                   dcr-bench-apply, bench_engine.py) with --markdown ARGS and
#                   put its output in place of its section (from the "## "
#                   heading that names `BENCH` to the next "## " heading); the
#                   section says it was regenerated on its own, with which
#                   arguments.
# BENCH names ending in .py are the Python benches in bench/python/, run with
# the vLLM environment's interpreter (.venv-vllm/, or DCR_VENV_VLLM; made by
# scripts/setup-python.sh) over the extension in build/python.
# Analysis written by hand is never in a bench's section: it goes in the
# dated "Notes (hand-written, ...)" section at the end, which this script
# keeps as it is.
set -euo pipefail
# --section builds only its bench (setup.sh builds everything otherwise); a
# Python bench needs the extension, whose file name depends on the
# interpreter: everything is built for it.
if [ "${1:-}" = "--section" ] && [ -n "${2:-}" ] && [ "${2%.py}" = "$2" ]; then
  export DCR_BUILD_TARGETS=${DCR_BUILD_TARGETS:-bench/$2}
fi
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh" >&2
cd "$DCR_ROOT"
out=docs/benchmarks.md
tmp=$(mktemp)
cluster_heading="## Refit vs full checkpoint on the testbed (\`dcr-bench-cluster\`)"
notes_prefix="## Notes (hand-written"
# Benches whose --markdown output has no "## " heading of its own get this one.
heading_of() {
  case "$1" in
    dcr-bench-digest) echo "## State-digest update per write (\`dcr-bench-digest\`)" ;;
    dcr-bench-cuda) echo "## CUDA kernels (\`dcr-bench-cuda\`)" ;;
    bench_engine.py) echo "## vLLM engine refit against vLLM's dense updates (\`bench_engine.py\`)" ;;
    bench_engine_link.py) echo "## vLLM engine refit across a testbed link (\`bench_engine_link.py\`)" ;;
    *) echo "" ;;
  esac
}
# run_bench NAME ARGS...: its section on stdout (heading first); 77 from the
# bench (no GPU) and a missing binary are reported in the section.
run_bench() {
  local b=$1 exe rc h
  shift
  case "$b" in *.py) run_py_bench "$b" "$@"; return ;; esac
  exe=$(find build/bench -name "$b" -type f -perm -u+x 2>/dev/null | head -n1)
  h=$(heading_of "$b")
  if [ -z "$exe" ]; then
    [ -z "$h" ] || { echo; echo "$h"; }
    echo; echo "_${b}: not built in build/ (for dcr-bench-cuda: no CUDA; see docs/cuda.md), not measured._"
    return 0
  fi
  echo "== $b" >&2
  # dcr-bench-cuda prints its own heading when it measures.
  [ -z "$h" ] || [ "$b" = dcr-bench-cuda ] || { echo; echo "$h"; echo; }
  set +e
  "$exe" --markdown "$@"
  rc=$?
  set -e
  if [ $rc -eq 77 ]; then [ "$b" != dcr-bench-cuda ] || { echo; echo "$h"; }; echo; echo "_${b}: unmeasured: this machine has no GPU (\`scripts/gpu-check.sh\` on one produces this table)._";
  elif [ $rc -ne 0 ]; then echo "bench $b failed ($rc)" >&2; return $rc; fi
}
# run_py_bench NAME ARGS...: a bench of bench/python/ (it prints its own
# heading when it measures); without the vLLM environment or the extension
# its section says so.
run_py_bench() {
  local b=$1 py=${DCR_VENV_VLLM:-$DCR_ROOT/.venv-vllm}/bin/python3 rc
  shift
  if [ ! -x "$py" ] || ! ls build/python/_dcr.*.so >/dev/null 2>&1; then
    echo; heading_of "$b"
    echo; echo "_${b}: needs the vLLM environment (\`scripts/setup-python.sh\` makes .venv-vllm/) and the extension in build/python/; not measured._"
    return 0
  fi
  echo "== $b" >&2
  # A blank line before the heading the bench prints, as the others have
  # (--section finds the heading from the second line on).
  echo
  # The bench's progress bars and engine log go to stderr.
  set +e
  if [ "$b" = bench_engine_link.py ]; then
    # Its roles run in testbed namespaces across a shaped 1 Gbit link
    # (root); the testbed's own layout lines are left out of the section.
    if [ "$(id -u)" != 0 ]; then
      echo; heading_of "$b"; echo; echo "_${b}: needs root (the testbed); not measured._"
      set -e
      return 0
    fi
    DCR_BUILD_DIR="$DCR_ROOT/build" bash scripts/testbed.sh run --train 1 --roll 1 --rate 1gbit \
      --services none -- "$py" "bench/python/$b" --markdown "$@" | sed -n '/^## /,$p'
    rc=${PIPESTATUS[0]}
  else
    DCR_BUILD_DIR="$DCR_ROOT/build" "$py" "bench/python/$b" --markdown "$@"
    rc=$?
  fi
  set -e
  if [ $rc -ne 0 ]; then echo "bench $b failed ($rc)" >&2; return $rc; fi
}
# The hand-written notes, kept from the current file (empty if none).
notes() { [ -f "$out" ] && awk -v p="$notes_prefix" 'index($0, p) == 1 { on = 1 } on { print }' "$out"; }
if [ "${1:-}" = "--section" ]; then
  [ $# -ge 2 ] || { echo "bench-docs: --section BENCH [ARGS...]" >&2; exit 2; }
  name=$2
  shift 2
  grep -q "^## .*(\`$name\`)" "$out" || { echo "bench-docs: $out has no section of $name" >&2; exit 1; }
  load=$(cut -d' ' -f1-3 /proc/loadavg)
  run_bench "$name" "$@" >"$tmp.section"
  {
    awk -v n="(\`$name\`)" '/^## / && index($0, n) { exit } { print }' "$out"
    # The bench's heading line, the note, then the rest of its output.
    sed -n '/^## /{p;q}' "$tmp.section"
    echo
    echo "_This section was regenerated on its own by \`scripts/bench-docs.sh --section $name${*:+ $*}\`"
    echo "on $(date -u +%Y-%m-%d), load average $load at its start (other"
    echo "jobs on the machine); the other sections are from their last run._"
    sed '1,/^## /d' "$tmp.section"
    echo
    awk -v n="(\`$name\`)" 'on && /^## / { go = 1 } go { print } /^## / && index($0, n) { on = 1 }' "$out"
  } >"$tmp"
  rm -f "$tmp.section"
  mv "$tmp" "$out"
  echo "wrote the $name section of $out"
  exit 0
fi
cluster_only=0
if [ "${1:-}" = "--cluster-only" ]; then
  cluster_only=1
  shift
fi
notes_text=$(notes || true)
{
if [ $cluster_only = 1 ]; then
  # Everything before the cluster section, as the last full run wrote it.
  grep -qxF "$cluster_heading" "$out" || { echo "bench-docs: $out has no cluster section" >&2; exit 1; }
  awk -v h="$cluster_heading" '$0 == h { exit } { print }' "$out"
else
  echo "# Benchmarks"
  echo
  echo "Generated by \`scripts/bench-docs.sh $*\` on $(date -u +%Y-%m-%d). Every number is a"
  echo "ratio to a reference measured in the same process, or a size; each section states its"
  echo "inputs and the machine it ran on."
  echo
  echo "Floors: besides its reference, every detection, apply and construction table has a \"× floor\""
  echo "column (and every \`--json\` row a \`ratio_to_floor\` field): the time over the memory traffic the"
  echo "operation cannot avoid, measured in the same run. Detection floor = a streaming read of the old"
  echo "and the new buffer with no output (an OR of their XOR in the widest vectors the CPU has; the"
  echo "better of a plain and an L2-prefetching read). Apply floor = a read-modify-write (or, when faster, a store) of one 64-bit"
  echo "word in every 64-byte line of the rank's storage that holds a change, plus a streaming read of"
  echo "the items' value bytes (not their indices). Construction floor = the detection floor over every"
  echo "source shard plus a memcpy of the value bytes emitted."
  for b in dcr-bench-table2 dcr-bench-payload dcr-bench-detect dcr-bench-construct dcr-bench-fp8-rollout \
           dcr-bench-digest dcr-bench-apply dcr-bench-cuda dcr-bench-refit dcr-bench-scaling \
           bench_engine.py bench_engine_link.py; do
    echo
    run_bench "$b" "$@"
  done
fi
  # The cluster bench runs on the network-namespace testbed (root): the role
  # programs over shaped links, real S3 and etcd (docs/testbed.md). Two runs:
  # 1 Gbit/s links (1.2 / 3 / 5 %, DCR_BENCH_CLUSTER_ARGS overrides) and
  # 100 Mbit/s links (3 %, DCR_BENCH_CLUSTER_SLOW_ARGS), each with its own
  # full-checkpoint reference at that rate; both transports, object-store rows
  # with and without the manifest index, 1 GB model.
  [ $cluster_only = 1 ] || echo
  echo "$cluster_heading"
  echo
  if [ $cluster_only = 1 ]; then
    echo "_This section was regenerated on its own by \`scripts/bench-docs.sh --cluster-only\` on"
    echo "$(date -u +%Y-%m-%d); the sections above are from the last full run._"
    echo
  fi
  echo "Each row starts the role programs (two \`dcr-owner\`, two \`dcr-rollout\` with one receiver"
  echo "each, \`dcr-coordinator\`) on the testbed, bootstraps version 0 and times one refit to version 1."
  echo "The refit window runs from the moment the first owner begins comparing the candidate with its"
  echo "baseline (change detection is inside the window) to the moment the last owner finishes its"
  echo "baseline update after the joint commit; the change injection (\`--change-pct\`), model"
  echo "loading, prewarm, the bootstrap (initial baselines, dense restores) and the verification that"
  echo "follows (every receiver against a dense load of version 1, byte for byte) are outside it. A row"
  echo "whose owners recorded no comparison opens its window at the first construction, and the table's"
  echo "notes say so. Columns: refit s; the construction lower bound (the busiest owner's comparison and"
  echo "construction outside its uploads), the transport lower bound (the busiest owner's uploads or"
  echo "node's fetches), finalization (last apply to the end of the window) and refit / (larger bound +"
  echo "finalization); speedup over the full-checkpoint reference and the wire-only ideal speedup (the"
  echo "reference over the time the refit's bytes take on the links); and the peak resident set over"
  echo "the refit of the largest owner, the largest rollout node and the coordinator, beside the bytes"
  echo "that role must hold (an owner: its shards and baseline trackers; a rollout node: its receivers'"
  echo "storage and scratch and the payloads in flight). \`--json\` rows carry the same as"
  echo "\`owner_peak_rss_bytes\`, \`owner_owned_bytes\` (the largest owner's owned shard bytes, what its"
  echo "peak is held against in the targets), \`owner_held_bytes\`, \`rollout_peak_rss_bytes\`,"
  echo "\`rollout_held_bytes\` and \`coordinator_peak_rss_bytes\`."
  fast_args=${DCR_BENCH_CLUSTER_ARGS:---size 1GB --transports object_store,relay_tree --change-pct 1.2,3,5}
  slow_args=${DCR_BENCH_CLUSTER_SLOW_ARGS:---size 1GB --transports object_store,relay_tree --change-pct 3}
  if [ "$(id -u)" = 0 ] && [ -x build/bench/dcr-bench-cluster ]; then
    mkdir -p docs/images
    for run in "1gbit|$fast_args|cluster-refit-timeline.svg" "100mbit|$slow_args|cluster-refit-timeline-100mbit.svg"; do
      IFS='|' read -r rate cluster_args svg <<<"$run"
      echo "== dcr-bench-cluster at $rate" >&2
      echo
      echo "### Links at $rate"
      echo
      echo "\`scripts/testbed.sh run --train 2 --roll 2 --rate $rate --services etcd,s3 -- build/bench/dcr-bench-cluster $cluster_args --markdown\`:"
      echo
      # shellcheck disable=SC2086
      bash scripts/testbed.sh run --train 2 --roll 2 --rate "$rate" \
        --services etcd,s3 -- build/bench/dcr-bench-cluster $cluster_args --markdown \
        --svg "docs/images/$svg"
      echo
      echo "![timeline of one refit at $rate](images/$svg)"
    done
  else
    echo; echo "_dcr-bench-cluster: needs root and build/bench/dcr-bench-cluster; not measured._"
  fi
  # The hand-written notes of the current file, unchanged, last.
  [ -z "$notes_text" ] || { echo; echo "$notes_text"; }
} > "$tmp"
mv "$tmp" "$out"
echo "wrote $out"
