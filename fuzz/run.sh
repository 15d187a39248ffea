#!/usr/bin/env bash
# Builds the libFuzzer targets in build-fuzz (clang++, ASan+UBSan) and runs
# each for a bounded time: SECONDS in total (decode and body 30% each,
# roundtrip and the text decoders 20% each), then the control-channel
# decoders for a tenth on top, then each decoder of arriving input that has
# its own target (payload_if, locations, config, net, http, relay: the keyed
# relay link's read path and the payload seal check, control_reply: the
# coordinator's decoding of every reply) for PER_TARGET seconds (default: a
# sixth of SECONDS, at least 10). CI runs it with 60: about 60 + 6 + 7 x 10
# s, under 2.5 minutes of fuzzing after the build.
# Every target in fuzz/meson.build runs (the list below is checked against it).
# Exits non-zero when a target crashes; reproducers land in build-fuzz/fuzz/.
# A longer run: DCR_JOBS=1 fuzz/run.sh 3600 600 (docs/wire-format.md,
# "Fuzzing", has the executions per target so far).
set -euo pipefail
seconds=${1:-60}
per_target=${2:-$(( seconds / 6 > 10 ? seconds / 6 : 10 ))}
cd "$(dirname "$0")/.."
if [ ! -f build-fuzz/build.ninja ]; then
  CXX=clang++ meson setup build-fuzz -Dfuzz=true -Dtests=false -Dbenches=false -Dexamples=false \
    -Dcuda=disabled -Dbuildtype=debugoptimized
fi
ninja -C build-fuzz -j "${DCR_JOBS:-2}" fuzz/fuzz_decode fuzz/fuzz_body fuzz/fuzz_roundtrip fuzz/fuzz_text fuzz/fuzz_control \
  fuzz/fuzz_make_seed fuzz/fuzz_make_text_seeds \
  fuzz/fuzz_payload_if fuzz/fuzz_locations fuzz/fuzz_config fuzz/fuzz_net fuzz/fuzz_http fuzz/fuzz_make_wire_seeds \
  fuzz/fuzz_relay fuzz/fuzz_control_reply
out=build-fuzz/fuzz
# Every fuzz_* target that fuzz/meson.build builds must be run below.
for t in $(sed -n "/^foreach t : \[/,/\]/p" fuzz/meson.build | grep -o "'[a-z_]*'" | tr -d "'"); do
  case " decode body roundtrip text control payload_if locations config net http relay control_reply " in
    *" $t "*) ;;
    *) echo "fuzz/run.sh: target fuzz_$t is built but not run" >&2; exit 1 ;;
  esac
done
seeds=$out/seeds
mkdir -p "$seeds"
# Seeds of both format versions: v2 (header in the digest, add items) and v1.
for s in $(seq 1 24); do
  "$out/fuzz_make_seed" "$seeds/payload-$s.bin" "$s" $((1 + s % 7)) 2
  "$out/fuzz_make_seed" "$seeds/payload-v1-$s.bin" "$s" $((1 + s % 7)) 1
done
# The body target's input: 16 bytes of section lengths, 4 of item count (bit 31 set:
# seal as v1), then the raw body.
mkdir -p "$out/seeds-body"
for f in "$seeds"/payload-*.bin; do
  b=$out/seeds-body/$(basename "$f")
  # Header bytes 40..55 (table, location lengths) and 32..35 (item count), then the decompressed body.
  v1=$(case "$f" in *payload-v1-*) echo 1 ;; *) echo 0 ;; esac)
  { dd if="$f" bs=1 skip=40 count=16 status=none; dd if="$f" bs=1 skip=32 count=3 status=none
    if [ "$v1" = 1 ]; then printf '\x80'; else printf '\x00'; fi
    tail -c +97 "$f" | zstd -q -d -c; } > "$b"
done
run() { # TARGET SECONDS CORPUS SEEDS
  mkdir -p "$3"
  echo "== $1 for $2 s"
  "$out/$1" -max_total_time="$2" -rss_limit_mb=2048 -timeout=10 -max_len=65536 \
    -artifact_prefix="$out/crash-$1-" -print_final_stats=1 "$3" "$4"
}
t1=$((seconds * 3 / 10)); t3=$(((seconds - 2 * t1) / 2)); t4=$((seconds - 2 * t1 - t3))
[ "$t1" -ge 1 ] || t1=1
[ "$t3" -ge 1 ] || t3=1
[ "$t4" -ge 1 ] || t4=1
mkdir -p "$out/seeds-text"
"$out/fuzz_make_text_seeds" "$out/seeds-text"
run fuzz_decode "$t1" "$out/corpus-decode" "$seeds"
run fuzz_body "$t1" "$out/corpus-body" "$out/seeds-body"
run fuzz_roundtrip "$t3" "$out/corpus-roundtrip" "$seeds"
run fuzz_text "$t4" "$out/corpus-text" "$out/seeds-text"
# Control-channel frames and call bodies: a few seconds on top (small decoders).
mkdir -p "$out/seeds-control"
printf '\x25\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00' > "$out/seeds-control/refit-short"
run fuzz_control "$(( seconds / 10 > 5 ? seconds / 10 : 5 ))" "$out/corpus-control" "$out/seeds-control"
# decode_payload_if: the payload seeds behind a keep mask (all rows, every other row).
mkdir -p "$out/seeds-payload-if"
for f in "$seeds"/payload-*.bin; do
  { printf '\xff'; cat "$f"; } > "$out/seeds-payload-if/all-$(basename "$f")"
  { printf '\x55'; cat "$f"; } > "$out/seeds-payload-if/half-$(basename "$f")"
done
mkdir -p "$out/seeds-locations" "$out/seeds-config" "$out/seeds-net" "$out/seeds-relay" \
  "$out/seeds-control-reply"
"$out/fuzz_make_wire_seeds" "$out/seeds-locations" "$out/seeds-config" "$out/seeds-net" \
  "$out/seeds-relay" "$out/seeds-control-reply"
run fuzz_payload_if "$per_target" "$out/corpus-payload-if" "$out/seeds-payload-if"
run fuzz_locations "$per_target" "$out/corpus-locations" "$out/seeds-locations"
run fuzz_config "$per_target" "$out/corpus-config" "$out/seeds-config"
run fuzz_net "$per_target" "$out/corpus-net" "$out/seeds-net"
# HTTP responses as etcd and S3 send them: a flags byte (bit 0: HEAD; bits
# 1-7: bytes per read), a second read size, then the response bytes.
mkdir -p "$out/seeds-http"
h=$out/seeds-http
printf '\x10\x01HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 27\r\n\r\n{"header":{"revision":"1"}}' >"$h/etcd-200"
printf '\x00\x02HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6;x=y\r\n world\r\n0\r\nTrailer: t\r\n\r\n' >"$h/chunked"
printf '\x06\x00HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\nConnection: close\r\n\r\nnot found' >"$h/404-close"
printf '\x01\x05HTTP/1.1 200 OK\r\nContent-Length: 1000\r\nETag: "abc"\r\n\r\n' >"$h/head"
printf '\x02\x03HTTP/1.0 500 Internal Server Error\r\n\r\n{"error":"etcdserver: request timed out","code":14}' >"$h/eof-body"
printf '\x08\x01HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n' >"$h/continue"
# Found by the campaign: a header that never ends (a bare LF after a fold)
# and a close; refused as malformed or as cut off depending on the reads.
printf '\x10\x01HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 27\r\n\t\n{"header":{"revision":\xa21"}}' >"$h/unterminated-header"
printf '\x02\x00' >"$h/empty" # found by the campaign: a close before any byte
# Found by the campaign: a last chunk with a trailer, read a byte at a time
# (Beast 1.81 asserted; dcr-net builds Beast with its assertions off).
printf '\x00\x02HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nhello\r\n6\x04;x=y\r\n world\r\n0\r\nTrailer: t\r\n\r\n' >"$h/split-last-chunk"
# Found by the campaign: a chunk extension's quoted string running past its
# line and past the bytes read so far (Beast re-counted the chunk against its
# body limit at every read; the reader now counts chunks itself), and a
# header longer than the limit with a bad line early (malformed whole, too
# large in pieces: both refuse).
{ printf '\x00\x00HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6;x="abc\r\n'
  head -c 2000 /dev/zero | tr '\0' z
  printf '"z\r\n world\r\n0\r\n\r\n'; } >"$h/chunk-ext-past-reads"
{ printf '\x00\x01HTTP/1.1 200 OK\r\n'
  for _ in $(seq 1 40); do printf 'X-Pad: %0100d\r\n' 0; done
  printf 'X-Bad: a\x05\nb\r\n'
  for _ in $(seq 1 50); do printf 'X-Pad: %0100d\r\n' 0; done
  printf '\r\n'; } >"$h/long-bad-header"
# Found by the campaign: the header's end among the first bytes, before a
# status line could be whole (malformed whole; in pieces Beast skipped past
# that end and waited to the header limit; the reader now checks the status
# line's first 13 bytes itself).
{ printf '\x00\x00\x9a\r\n\r\n\r\x06\x00'
  head -c 9000 /dev/zero | tr '\0' x; } >"$h/early-header-end"
run fuzz_http "$per_target" "$out/corpus-http" "$out/seeds-http"
run fuzz_relay "$per_target" "$out/corpus-relay" "$out/seeds-relay"
run fuzz_control_reply "$per_target" "$out/corpus-control-reply" "$out/seeds-control-reply"
echo "fuzz: no crashes in $((seconds + (seconds / 10 > 5 ? seconds / 10 : 5) + 7 * per_target)) s"
