#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: builds the CUDA kernel tests (among them
# receiver<L, cuda::device_sink> against a dense refit), dcr-bench-cuda and
# dcr-demo in build/ (CUDA enabled), runs the tests, the bench and the demo
# with --device cuda, and
# writes everything to gpu-results/<UTC time>-<host>/ (test log, bench table
# as Markdown, bench JSON, device facts). Meant to finish in under 5 minutes.
# Usage: scripts/gpu-check.sh [--quick]   (--quick: small bench inputs)
# Exits 77 when no CUDA device is visible.
set -euo pipefail
DCR_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$DCR_ROOT"
if [ -x /usr/local/cuda/bin/nvcc ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
command -v nvcc >/dev/null || { echo "gpu-check: nvcc not found" >&2; exit 1; }
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-check: no CUDA device visible (nvidia-smi -L failed): nothing measured" >&2
  exit 77
fi

out="gpu-results/$(date -u +%Y%m%dT%H%M%SZ)-$(hostname -s)"
mkdir -p "$out"
{
  nvidia-smi -L
  nvidia-smi --query-gpu=name,memory.total,clocks.max.memory,driver_version --format=csv
  nvcc --version | tail -n 2
} > "$out/device.txt" 2>&1 || true

jobs=${DCR_JOBS:-$(nproc)}
if [ ! -f build/build.ninja ]; then
  meson setup build -Dcuda=enabled
elif ! meson introspect build --buildoptions | python3 -c \
    'import json,sys; sys.exit(0 if any(o["name"] == "cuda" and o["value"] == "enabled" for o in json.load(sys.stdin)) else 1)'; then
  meson configure build -Dcuda=enabled
fi
# Only the CUDA targets: every test of the cuda suite, as meson lists them
# (a test added to cuda/meson.build is built and run without editing this
# script), and the bench. The rest of the project is not needed here.
mapfile -t cuda_tests < <(meson introspect build --tests | python3 -c '
import json, os, sys
seen = set()
for t in json.load(sys.stdin):
    if any(s.split(":")[-1] == "cuda" for s in t["suite"]):
        exe = os.path.relpath(t["cmd"][0], os.path.abspath("build"))
        if exe not in seen and not exe.startswith(".."):
            seen.add(exe)
            print(exe)')
[ "${#cuda_tests[@]}" -gt 0 ] || { echo "gpu-check: meson lists no test in the cuda suite" >&2; exit 1; }
echo "gpu-check: building ${cuda_tests[*]}" | tee "$out/build.log"
ninja -C build -j "$jobs" "${cuda_tests[@]}" bench/dcr-bench-cuda examples/dcr-demo \
  2>&1 | tee -a "$out/build.log" | tail -n 3

set +e
meson test -C build --no-rebuild --suite cuda --print-errorlogs 2>&1 | tee "$out/tests.log"
test_rc=${PIPESTATUS[0]}
cp build/meson-logs/testlog.txt "$out/testlog.txt" 2>/dev/null
# The refit end to end with the receivers applying through cuda::device_sink
# (the demo checks every receiver's device copy against a dense refit).
timeout 240 build/examples/dcr-demo --size small --steps 3 --device cuda > "$out/demo.log" 2>&1
demo_rc=$?
timeout 240 build/bench/dcr-bench-cuda --markdown --json-file="$out/bench.json" "$@" \
  > "$out/bench.md" 2> "$out/bench.err"
bench_rc=$?
set -e
cat "$out/bench.md"
{
  echo "tests: exit $test_rc"
  echo "bench: exit $bench_rc"
  echo "demo --device cuda: exit $demo_rc"
} > "$out/summary.txt"
echo "gpu-check: results in $out (tests exit $test_rc, bench exit $bench_rc, demo --device cuda exit $demo_rc)"
[ "$test_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ] && [ "$demo_rc" -eq 0 ]
