#!/usr/bin/env bash
# dcr-inspect on a good payload (text, JSON, extracted body vs zstd -d and
# b2sum) and on corrupted and truncated copies (one-line error, exit 1).
set -euo pipefail
inspect=$1 make=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$make" "$dir/p.bin" 5 6
"$inspect" "$dir/p.bin" > "$dir/text.out"
grep -q '^  digest  *[0-9a-f]\{32\} (ok)$' "$dir/text.out"
[ "$(grep -c 'model.layers' "$dir/text.out")" -eq 6 ]
"$inspect" --json "$dir/p.bin" --extract-body "$dir/body.zst" > "$dir/json.out"
# v2: the digest is b2sum -l 128 of header bytes 0..79 followed by the body.
digest=$({ head -c 80 "$dir/p.bin"; cat "$dir/body.zst"; } | b2sum -l 128 | cut -d' ' -f1)
grep -q "\"digest\":\"$digest\"" "$dir/json.out"
grep -q '"version":2,' "$dir/json.out"
grep -q '^  version  *2 (digest covers header and body)$' "$dir/text.out"
# A v1 payload still inspects; its digest is b2sum -l 128 of the body alone.
"$make" "$dir/v1.bin" 5 6 1
"$inspect" --json "$dir/v1.bin" --extract-body "$dir/body1.zst" > "$dir/json1.out"
digest1=$(b2sum -l 128 "$dir/body1.zst" | cut -d' ' -f1)
grep -q "\"digest\":\"$digest1\"" "$dir/json1.out"
grep -q '"version":1,' "$dir/json1.out"
grep -q '^{"header":{.*},"items":\[{.*}\]}$' "$dir/json.out"
zstd -q -d -c "$dir/body.zst" > "$dir/body.raw"
raw=$(grep -o '"raw_length":[0-9]*' "$dir/json.out" | cut -d: -f2)
[ "$(stat -c %s "$dir/body.raw")" -eq "$raw" ]
# Corruptions: a body byte, the magic, a trailing byte, a truncation.
size=$(stat -c %s "$dir/p.bin")
expect_fail() { # FILE CODE
  set +e
  "$inspect" "$1" > /dev/null 2> "$dir/err"
  rc=$?
  set -e
  [ "$rc" -eq 1 ] || { echo "expected exit 1 for $1, got $rc"; exit 1; }
  [ "$(wc -l < "$dir/err")" -eq 1 ] || { echo "expected one error line"; cat "$dir/err"; exit 1; }
  grep -q ": $2: " "$dir/err" || { echo "expected $2"; cat "$dir/err"; exit 1; }
}
cp "$dir/p.bin" "$dir/c1.bin"
printf '\x00' | dd of="$dir/c1.bin" bs=1 seek=$((size - 3)) conv=notrunc status=none
expect_fail "$dir/c1.bin" digest_mismatch
cp "$dir/p.bin" "$dir/c2.bin"
printf 'X' | dd of="$dir/c2.bin" bs=1 seek=0 conv=notrunc status=none
expect_fail "$dir/c2.bin" bad_magic
# v2: a flipped id byte (owner, payload byte 24) fails the digest before decompression.
cp "$dir/p.bin" "$dir/c6.bin"
printf '\x7f' | dd of="$dir/c6.bin" bs=1 seek=24 conv=notrunc status=none
expect_fail "$dir/c6.bin" digest_mismatch
cp "$dir/p.bin" "$dir/c3.bin"
printf 'Z' >> "$dir/c3.bin"
expect_fail "$dir/c3.bin" trailing_bytes
head -c $((size - 1)) "$dir/p.bin" > "$dir/c4.bin"
expect_fail "$dir/c4.bin" truncated
head -c 10 "$dir/p.bin" > "$dir/c5.bin"
expect_fail "$dir/c5.bin" truncated
expect_fail "$dir/missing.bin" io
echo "dcr-inspect: ok"
