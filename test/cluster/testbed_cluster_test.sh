#!/usr/bin/env bash
# The cluster programs on the network-namespace testbed (scripts/testbed.sh):
# 2 training and 2 rollout nodes behind 8 Mbit/s links, the objects in the
# storage host's Swift (S3) and the commit record in its etcd, so every
# payload crosses the shaped links. Two link faults:
#  - step 2: rollout node r0's link down for 2 s as the transition starts
#    (shorter than the control channel's liveness deadline: TCP rides it
#    out, the step takes at least that long and commits);
#  - step 3: training node t1's link down for 6 s (longer than the liveness
#    deadline: the attempt fails and an overwrite_all retry commits).
# Checked: PASS verification (every receiver equals a dense load of the
# committed version byte for byte), versions 1..3 committed in order, both
# faults fired, step 2 took >= 2 s, step 3 took >= 2 attempts. The testbed
# tears itself down; the test checks nothing of it is left. Exit 77 (skip)
# where namespaces cannot be made or etcd/Swift are missing.
set -uo pipefail
bin=$1
here=$(cd "$(dirname "$0")/../.." && pwd)
name=dcrtb-cl$$
work=$(mktemp -d "${TMPDIR:-/tmp}/dcr-testbed-cluster-XXXXXX")
trap '[ "${keep:-0}" = 1 ] || rm -rf "$work"' EXIT
DCR_CLUSTER_KEEP=1 bash "$here/scripts/testbed.sh" run --name "$name" --rate 8mbit -- \
  bash "$here/scripts/cluster.sh" --testbed --bin "$bin" --workdir "$work/run" --steps 3 \
  --link-down r0:2:2 --link-down t1:3:6 --json >"$work/out" 2>"$work/err"
rc=$?
cat "$work/out"
[ "$rc" -eq 77 ] && { tail -n 3 "$work/err"; exit 77; }
fail() {
  keep=1
  echo "(kept: $work)"
  echo "FAIL: $*"
  cat "$work/err"
  for f in "$work"/run/logs/*.log; do echo "== $f"; tail -n 20 "$f"; done
  exit 1
}
[ "$rc" -eq 0 ] || fail "cluster run exited $rc"
left=$(ip netns list 2>/dev/null | awk '{print $1}' | grep -c "^$name-")
[ "$left" -eq 0 ] || fail "$left namespace(s) of the testbed left behind"
[ -e "$work/run/faults/link-r0-2" ] && [ -e "$work/run/faults/link-t1-3" ] || fail "a link fault did not fire"
/usr/bin/python3 - "$work/out" <<'PY' || fail "checks on the JSON rows"
import json, sys
d = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
steps = d["steps"]
assert d["bit_exact"] is True, d
assert [s["step"] for s in steps] == [1, 2, 3], steps
assert steps[1]["refit_s"] >= 2.0, ("step 2 did not wait out the link fault", steps[1])
assert steps[2]["attempts"] >= 2, ("step 3 did not fail and retry", steps[2])
print("testbed cluster: PASS (step 2 %.1f s, step 3 %d attempts)" % (steps[1]["refit_s"], steps[2]["attempts"]))
PY
