#!/usr/bin/env bash
# Formats every C++ and CUDA source of the repository with the checked-in
# .clang-format (clang-format 14, Debian's clang-format package).
#   scripts/format.sh          rewrite files in place
#   scripts/format.sh --check  change nothing; list unformatted files, exit 1 if any (CI)
set -euo pipefail
cd "$(dirname "$0")/.."
cf=$(command -v clang-format-14 || command -v clang-format || true)
if [ -z "$cf" ]; then
  echo "format: clang-format not found (apt-get install clang-format)" >&2
  exit 2
fi
mapfile -t files < <(git ls-files '*.hpp' '*.cpp' '*.cuh' '*.cu')
if [ "${1:-}" = "--check" ]; then
  bad=()
  for f in "${files[@]}"; do
    "$cf" --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
  done
  if ((${#bad[@]})); then
    printf 'format: not formatted: %s\n' "${bad[@]}"
    echo "format: ${#bad[@]} file(s); run scripts/format.sh"
    exit 1
  fi
  echo "format: OK (${#files[@]} files)"
else
  "$cf" -i "${files[@]}"
fi
