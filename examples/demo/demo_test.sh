#!/usr/bin/env bash
# dcr-demo end to end: --json keys and verdict, the --checkpoint path (with a
# receiver killed every step), and a usage error exits non-zero.
set -euo pipefail
demo=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

out=$("$demo" --size small --steps 2 --json 2>"$tmp/err")
echo "$out"
for key in '"steps":[' '"step":1' '"step":2' '"change_pct":' '"payload_pct":' '"speedup_vs_dense":' \
           '"bit_exact":true' '"receivers_checked":8'; do
  grep -qF -- "$key" <<<"$out" || { echo "missing $key in --json output"; exit 1; }
done
[ "$(grep -c . <<<"$out")" -eq 1 ] || { echo "--json must print one line on stdout"; exit 1; }

# FP8 rollout: BF16 training, block-FP8 receivers, the same --json keys and verdict.
out=$("$demo" --size small --steps 2 --rollout-dtype fp8 --json 2>"$tmp/err")
echo "$out"
for key in '"step":2' '"payload_pct":' '"rollout_dtype":"fp8"' '"bit_exact":true' '"receivers_checked":8'; do
  grep -qF -- "$key" <<<"$out" || { echo "missing $key in --rollout-dtype fp8 --json output"; exit 1; }
done
set +e
"$demo" --rollout-dtype fp16 >/dev/null 2>&1
rc=$?
set -e
[ "$rc" -eq 2 ] || { echo "--rollout-dtype fp16 was not refused as a usage error"; exit 1; }

"$demo" --size small --save-checkpoint "$tmp/ck.safetensors" 2>/dev/null
[ -s "$tmp/ck.safetensors" ] || { echo "no checkpoint written"; exit 1; }
"$demo" --checkpoint "$tmp/ck.safetensors" --steps 2 --kill-receiver-every 1 --workdir "$tmp/work" >"$tmp/table" 2>/dev/null
cat "$tmp/table"
grep -q "byte for byte: PASS" "$tmp/table" || { echo "checkpoint run did not verify"; exit 1; }
grep -q "(kill)" "$tmp/table" || { echo "no receiver was killed"; exit 1; }

# Recovery on a step that kills nothing: receiver 0's storage is dropped before
# step 2's transition, the coordinator restores it densely from the committed
# version, and the run ends bit-exact.
DCR_DEMO_DROP_AT=2 "$demo" --size small --steps 3 >"$tmp/table" 2>"$tmp/err" ||
  { cat "$tmp/err"; echo "run with a dropped receiver failed"; exit 1; }
grep -q "dropped before the refit" "$tmp/err" || { echo "no receiver was dropped"; exit 1; }
grep -q "byte for byte: PASS" "$tmp/table" || { echo "run with a dropped receiver did not verify"; exit 1; }

set +e
"$demo" --no-such-flag >/dev/null 2>&1
rc=$?
set -e
[ "$rc" -ne 0 ] || { echo "usage error returned 0"; exit 1; }
echo "demo checks passed"
