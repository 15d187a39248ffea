#!/usr/bin/env bash
# dcr-demo resume after a hard kill: the process is SIGKILLed at a named crash
# point of a transition (DCR_DEMO_KILL_AT) or from outside once the commit
# record shows a new version; a re-run with the same --workdir must resume
# from the committed version and end bit-exact, and a re-run that cannot
# resume (another seed, fewer steps) must refuse and say what to do.
set -euo pipefail
demo=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
steps=3

expect_resume() { # WORKDIR LABEL
  local out
  out=$("$demo" --size small --steps $steps --workdir "$1" 2>"$tmp/err") || {
    cat "$tmp/err"; echo "$2: re-run failed"; exit 1; }
  grep -q "resuming" "$tmp/err" || { cat "$tmp/err"; echo "$2: re-run did not resume"; exit 1; }
  grep -q "a dense refit of version $steps byte for byte: PASS" <<<"$out" || {
    echo "$out"; cat "$tmp/err"; echo "$2: re-run is not bit-exact at version $steps"; exit 1; }
  echo "$2: resumed, bit-exact at version $steps"
}

# Killed by SIGKILL from outside right after the record reached version 1
# (a re-run used to crash with SIGSEGV here).
w=$tmp/outside
"$demo" --size small --steps $steps --workdir "$w" >/dev/null 2>&1 &
pid=$!
for _ in $(seq 1 3000); do
  if grep -qs '^version 1$' "$w/control/commit"; then kill -KILL $pid; break; fi
  sleep 0.005
done
set +e
wait $pid
rc=$?
set -e
[ "$rc" -eq 137 ] || echo "note: the run ended (rc $rc) before the outside kill"
expect_resume "$w" "outside kill at version 1"

# Killed by itself with SIGKILL at every crash point of steps 1 and 2.
for point in after_prepare after_first_ack after_commit; do
  for step in 1 2; do
    w=$tmp/$point-$step
    set +e
    DCR_DEMO_KILL_AT=$point:$step "$demo" --size small --steps $steps --workdir "$w" >/dev/null 2>&1
    rc=$?
    set -e
    [ "$rc" -eq 137 ] || { echo "$point:$step: expected death by SIGKILL (137), got $rc"; exit 1; }
    expect_resume "$w" "SIGKILL $point of step $step"
  done
done

# Refusals: a workdir of another run, and one already past --steps.
w=$tmp/after_commit-2
set +e
"$demo" --size small --steps $steps --seed 7 --workdir "$w" >/dev/null 2>"$tmp/err"
rc=$?
set -e
[ "$rc" -ne 0 ] || { echo "a workdir of another seed was not refused"; exit 1; }
grep -q "re-run with the --size/--checkpoint/--seed that created" "$tmp/err" || {
  cat "$tmp/err"; echo "refusal does not say what to do"; exit 1; }
set +e
"$demo" --size small --steps 1 --workdir "$w" >/dev/null 2>"$tmp/err"
rc=$?
set -e
[ "$rc" -ne 0 ] || { echo "a workdir past --steps was not refused"; exit 1; }
grep -q "pass --steps >= $steps" "$tmp/err" || { cat "$tmp/err"; echo "refusal does not say what to do"; exit 1; }
# A lost commit record next to a killed run's attempt objects: refused, not a fresh start.
w=$tmp/lost
set +e
DCR_DEMO_KILL_AT=after_first_ack:2 "$demo" --size small --steps $steps --workdir "$w" >/dev/null 2>&1
rm -f "$w/control/commit"
"$demo" --size small --steps $steps --workdir "$w" >/dev/null 2>"$tmp/err"
rc=$?
set -e
[ "$rc" -ne 0 ] || { echo "a lost record next to attempt objects was not refused"; exit 1; }
grep -q "foreign_incarnation" "$tmp/err" && grep -q "restore the commit record" "$tmp/err" || {
  cat "$tmp/err"; echo "lost-record refusal does not say what to do"; exit 1; }
echo "demo resume checks passed"
