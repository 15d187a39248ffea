#!/usr/bin/env bash
# The set digest's ARMv8 paths (core/set_digest.hpp), which x86 builds never
# compile: test/core/set_digest_test.cpp built for aarch64 by the cross
# compilers (g++-aarch64-linux-gnu; clang with that package's sysroot) and
# run under qemu-user on a CPU model with the AES instructions.
#   scripts/cross-aarch64-test.sh [OUT]     (OUT: where the binaries go)
# Four builds, each with the path it must take (DCR_EXPECT_HARDWARE_AES,
# checked by the test, so a build that silently fell back fails):
#   g++,     -march=armv8-a        AES instructions chosen at run time (HWCAP_AES)
#   g++,     -march=armv8-a+crypto AES instructions compiled in
#   clang++, -march=armv8-a+aes    AES instructions compiled in
#   clang++, -march=armv8-a        table-driven rounds (clang 14 declares the
#                                  AES intrinsics only for +aes builds)
# The seal (libb2's BLAKE2b, not built for aarch64 here) is left out of these
# builds (DCR_TEST_NO_SEAL); the host build checks it.
# Exit 77 (a skip, which scripts/test.sh does not allow) when the cross
# compiler or qemu is missing: scripts/setup.sh installs them.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root/build/aarch64}"
mkdir -p "$out/include"
gxx=aarch64-linux-gnu-g++
qemu=qemu-aarch64
clangxx=$(command -v clang++ || command -v clang++-14 || true)
for tool in "$gxx" "$qemu"; do
  if ! command -v "$tool" >/dev/null; then
    echo "SKIP: $tool not found (Debian packages g++-aarch64-linux-gnu, qemu-user)"
    exit 77
  fi
done
# Only the header-only libraries the test includes, not the host's whole
# /usr/include (its glibc headers are x86's).
for h in doctest xxhash.h blake2.h; do ln -sfn "/usr/include/$h" "$out/include/$h"; done
src="$root/test/core/set_digest_test.cpp"
flags=(-std=c++20 -O2 -I"$root/include" -isystem "$out/include" -DDCR_TEST_NO_SEAL
  -DDOCTEST_CONFIG_IMPLEMENT_WITH_MAIN -Wall -Wextra -Werror)
sysroot=/usr/aarch64-linux-gnu
fail=0
run() { # NAME EXPECT COMPILER ARGS...
  local name=$1 expect=$2
  shift 2
  echo "=== $name (hardware AES expected: $expect)"
  "$@" "${flags[@]}" "$src" -o "$out/set_digest_test-$name"
  if ! DCR_EXPECT_HARDWARE_AES=$expect "$qemu" -L "$sysroot" -cpu max \
    "$out/set_digest_test-$name" --no-intro=true; then
    fail=1
  fi
}
run gcc-hwcap 1 "$gxx" -march=armv8-a
run gcc-crypto 1 "$gxx" -march=armv8-a+crypto
if [ -n "$clangxx" ]; then
  run clang-aes 1 "$clangxx" --target=aarch64-linux-gnu -march=armv8-a+aes
  run clang-base 0 "$clangxx" --target=aarch64-linux-gnu -march=armv8-a
else
  echo "SKIP: clang++ not found"
  exit 77
fi
[ "$fail" -eq 0 ] && echo "aarch64: every build passed" || echo "aarch64: a build FAILED"
exit "$fail"
