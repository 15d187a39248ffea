#!/usr/bin/env bash
# Runs benches of two builds in one run, interleaved (before, after, before,
# after, ...), so that both see the same machine state: the comparison a
# change's closing note needs ("no regression beyond noise").
#   bench/before_after.sh BEFORE_BUILD AFTER_BUILD [ROUNDS] [BENCH[:ARGS]...]
# BEFORE_BUILD / AFTER_BUILD: Meson build directories (release builds) of the
# two commits, each with the named benches built. ROUNDS (default 2): how many
# times each build runs each bench. BENCH: a bench name with optional
# arguments after a colon, comma-separated (default: dcr-bench-construct,
# dcr-bench-apply, dcr-bench-payload). Every run's table is printed whole,
# under a heading naming the build, its commit and the round, with the load
# average when it started; nothing is summarised by hand.
set -euo pipefail
before=${1:?before build dir} after=${2:?after build dir}
rounds=${3:-2}
shift $(($# > 3 ? 3 : $#))
benches=("$@")
[ ${#benches[@]} -gt 0 ] || benches=(dcr-bench-construct dcr-bench-apply dcr-bench-payload)
commit_of() {
  local src
  src=$(sed -n 's/^Source dir: //p' "$1/meson-logs/meson-log.txt" | tail -n1)
  git -C "${src:-.}" log -1 --format='%h %s' 2>/dev/null | cut -c1-72 || echo "?"
}
for b in "${benches[@]}"; do
  name=${b%%:*}
  args=()
  [ "$name" = "$b" ] || IFS=, read -r -a args <<<"${b#*:}"
  for dir in "$before" "$after"; do
    [ -x "$dir/bench/$name" ] || { echo "$dir/bench/$name: not built" >&2; exit 2; }
  done
  echo "# $name ${args[*]}"
  for ((r = 1; r <= rounds; ++r)); do
    for side in before after; do
      dir=$before
      [ "$side" = before ] || dir=$after
      echo
      echo "## $side ($(commit_of "$dir")), round $r, load average $(cut -d' ' -f1-3 /proc/loadavg)"
      echo
      "$dir/bench/$name" --markdown "${args[@]}"
    done
  done
  echo
done
