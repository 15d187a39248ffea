#!/usr/bin/env bash
# Installs what is missing (Debian packages), configures and builds build/.
# Sourced by demo.sh and test.sh; safe to run again (incremental).
# DCR_BUILD_TARGETS limits the build to the named ninja targets.
set -euo pipefail
DCR_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$DCR_ROOT"

packages=(g++ pkg-config cmake meson ninja-build libboost1.81-dev libzstd-dev libxxhash-dev
          libb2-dev libssl-dev doctest-dev zstd xxhash coreutils ${DCR_EXTRA_PACKAGES:-})
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "== installing: ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# CUDA 13 is not on PATH by default; meson finds nvcc through it.
if [ -x /usr/local/cuda/bin/nvcc ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi

# The Python package's environment (.venv/, pinned, cached; about 3 GB with
# torch's CUDA libraries), with DCR_PYTHON_SETUP=1 (test.sh sets it; demo.sh
# and the benches do not need it). Wherever .venv/ exists, Meson finds it and
# builds the extension dcr._dcr with the rest.
if [ "${DCR_PYTHON_SETUP:-0}" = 1 ]; then bash "$DCR_ROOT/scripts/setup-python.sh"; fi

jobs=${DCR_JOBS:-2}
if [ ! -f build/build.ninja ]; then
  echo "== configuring build/"
  meson setup build ${DCR_MESON_OPTIONS:-}
elif [ -f .venv/.dcr-requirements ] && [ .venv/.dcr-requirements -nt build/build.ninja ]; then
  echo "== reconfiguring build/ (the Python environment changed)"
  meson setup --reconfigure build
fi
# DCR_BUILD_TARGETS: build only these (e.g. the demo); default everything.
if [ -n "${DCR_BUILD_TARGETS:-}" ]; then
  echo "== building $DCR_BUILD_TARGETS in build/ (-j$jobs)"
  # shellcheck disable=SC2086
  ninja -C build -j "$jobs" $DCR_BUILD_TARGETS
else
  echo "== building build/ (-j$jobs)"
  meson compile -C build -j "$jobs"
fi
