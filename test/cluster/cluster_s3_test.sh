#!/usr/bin/env bash
# A local cluster with its objects (payloads, manifests, dense exports) in an
# S3 bucket of a real OpenStack Swift (test/s3/start-swift.sh) and a rollout
# process SIGKILLed mid-apply at step 2. Checked: PASS verification (every
# receiver equals a dense load of the committed version byte for byte), one
# committed version per step, the fault fired, nothing written to the
# directory object store. Exits 77 (skip) without Swift. Stops every process
# it started (Swift stops when its stdin closes).
set -euo pipefail
bin=$1
here=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/dcr-cluster-s3-XXXXXX")
coproc SWIFT { exec bash "$here/test/s3/start-swift.sh" 2>"$work/swift.log"; }
swift_pid=$SWIFT_PID
cleanup() {
  exec {SWIFT[1]}>&- 2>/dev/null || true
  wait "$swift_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 143' TERM INT
ready=""
read -r -t 180 ready port ak sk region <&"${SWIFT[0]}" || true
if [ "$ready" != READY ]; then
  set +e; wait "$swift_pid"; rc=$?; set -e
  [ "$rc" -eq 77 ] && { echo "no swift: skipped"; exit 77; }
  echo "swift did not start ($rc)"; tail -n 30 "$work/swift.log"; exit 1
fi
steps=3
set +e
out=$(DCR_S3_ACCESS_KEY=$ak DCR_S3_SECRET_KEY=$sk DCR_CLUSTER_KEEP=1 \
  bash "$here/scripts/cluster.sh" --bin "$bin" --workdir "$work/run" --steps "$steps" \
  --s3 "http://127.0.0.1:$port" --kill-receiver-every 2 --json 2>"$work/stderr")
rc=$?
set -e
echo "$out"
if [ "$rc" -ne 0 ]; then
  cat "$work/stderr"; for f in "$work"/run/logs/*.log; do echo "== $f"; tail -n 20 "$f"; done
  echo "FAIL: cluster run exited $rc"; exit 1
fi
grep -qF '"bit_exact":true' <<<"$out" || { echo "FAIL: not bit-exact"; exit 1; }
versions=$(grep -o '"step":[0-9]*' <<<"$out" | cut -d: -f2 | paste -sd' ')
[ "$versions" = "$(seq -s' ' 1 $steps)" ] || { echo "FAIL: committed versions '$versions'"; exit 1; }
[ -e "$work/run/faults/rollout-apply-2" ] || { echo "FAIL: the receiver kill did not fire"; exit 1; }
[ -z "$(find "$work/run/objects" -type f 2>/dev/null)" ] || { echo "FAIL: objects written to the directory store"; exit 1; }
echo "PASS: cluster over S3"
