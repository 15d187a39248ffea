#pragma once
/// \file
/// Payload wire format (versions 1 and 2), the format itself (normative spec:
/// docs/wire-format.md): identities, the 96-byte little-endian header, item
/// table rows, and the checks that parse them; row locations and values
/// decoded from an already decompressed body. No compression here, so device
/// code (cuda/dcr/gpu/row.cuh) and the relay tree include only this header;
/// `payload_encode.hpp` and `payload_decode.hpp` add zstd.
///
/// A payload is a fixed 96-byte little-endian header followed by one zstd
/// frame, the body. The body holds the item table, then the location buffer,
/// then the value buffer. The header carries a BLAKE2b-128 digest: in v2 of
/// header bytes 0..79 followed by the compressed body, so every header id and
/// length is covered and a payload verifies on its own; in v1 (still read) of
/// the compressed body only (`b2sum -l 128` of it).
///
/// The decoder trusts nothing: every header and table field is checked before
/// it is used, allocations are bounded by what the input can express, and
/// every failure is a typed `dcr::status` naming the item and byte offset.

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "dcr/codec/item.hpp"
#include "dcr/codec/locations.hpp"
#include "dcr/codec/values.hpp"
#include "dcr/core/endian.hpp"
#include "dcr/core/error.hpp"
#include "dcr/core/hash.hpp"
#include "dcr/core/tensor.hpp"

namespace dcr {

/// Who sent a payload and where it belongs: attempt, the source version it
/// was built against, the owner (training rank) and the owner's payload number.
struct payload_id {
  std::uint64_t attempt = 0, source_version = 0;
  std::uint32_t owner = 0, sequence = 0;
  friend bool operator==(const payload_id&, const payload_id&) = default;
};

/// A payload's identity and its items, decoded and validated.
struct decoded_payload {
  payload_id id;
  std::vector<item> items;
  friend bool operator==(const decoded_payload&, const decoded_payload&) = default;
};

namespace codec {

/// First four payload bytes: "DCRP".
inline constexpr std::array<std::uint8_t, 4> payload_magic = {0x44, 0x43, 0x52, 0x50};
/// Format version this build writes by default.
inline constexpr std::uint16_t payload_version = 2;
/// Oldest format version this build reads (every version up to
/// `payload_version` is read).
inline constexpr std::uint16_t oldest_payload_version = 1;
/// Bytes of the header (the same 96 bytes in v1 and v2).
inline constexpr std::size_t payload_header_size = 96;
/// Header bytes before the digest field: what the v2 digest covers, then the body.
inline constexpr std::size_t payload_digest_offset = 80;
/// Smallest item table row: empty name, rank 0.
inline constexpr std::size_t min_row_size = 2 + 5 + 6 * 8;

/// Body compression ids (header byte 36).
enum class compression_id : std::uint8_t { zstd = 1 };

/// Every field of a header.
struct payload_header {
  std::uint16_t version = payload_version;
  payload_id id;
  std::uint32_t item_count = 0;
  compression_id compression = compression_id::zstd;
  std::uint64_t table_length = 0, location_length = 0, value_length = 0;
  std::uint64_t raw_length = 0, compressed_length = 0;
  digest128 digest{};
};

/// One item table row as stored (before locations are expanded).
struct item_row {
  tensor_meta tensor;
  value_encoding encoding = value_encoding::xor_mask;
  location_id location = location_id::run;
  value_filter filter = value_filter::none;
  std::uint64_t count = 0, first = 0;
  std::uint64_t location_offset = 0, location_length = 0;
  std::uint64_t value_offset = 0, value_length = 0;
  std::uint64_t table_offset = 0; ///< body byte where the row starts (diagnostics)
};

/// Largest expansion one zstd frame can express per compressed byte: an RLE
/// block spends 4 bytes (3 header + 1) on at most 128 KiB of output.
inline constexpr std::uint64_t zstd_max_expansion = 32768;

/// Bounds the decoder enforces on top of what the bytes themselves allow.
struct decode_limits {
  std::uint64_t max_raw_body = std::uint64_t{1} << 32; ///< decompressed body bytes (4 GiB)
  /// The job key the payload's digest must be keyed with (empty: unkeyed,
  /// the default). A payload sealed without it or with another key is
  /// `digest_mismatch` (docs/wire-format.md, "Keyed digests").
  seal_key key{};
};

namespace detail {

/// Appends little-endian fields to a byte vector.
struct writer {
  std::vector<std::byte>& out;
  void u8(std::uint8_t v) { out.push_back(static_cast<std::byte>(v)); }
  void u16(std::uint16_t v) { word(v); }
  void u32(std::uint32_t v) { word(v); }
  void u64(std::uint64_t v) { word(v); }
  template <class W>
  void word(W v) {
    std::byte b[sizeof(W)];
    store_le(b, v);
    put(b, sizeof(W));
  }
  void put(const void* p, std::size_t n) {
    const auto* b = static_cast<const std::byte*>(p);
    out.insert(out.end(), b, b + n);
  }
};

/// Reads little-endian fields from a span, tracking the offset for errors.
struct reader {
  std::span<const std::byte> in;
  std::size_t pos = 0;
  bool has(std::size_t n) const noexcept { return in.size() - pos >= n; }
  std::uint8_t u8() noexcept { return static_cast<std::uint8_t>(in[pos++]); }
  std::uint16_t u16() noexcept {
    auto v = load_le<std::uint16_t>(in.data() + pos);
    pos += 2;
    return v;
  }
  std::uint64_t u64() noexcept {
    auto v = load_le<std::uint64_t>(in.data() + pos);
    pos += 8;
    return v;
  }
};

/// Product of dims, or false on overflow.
inline bool checked_numel(std::span<const std::uint64_t> shape, std::uint64_t& n) noexcept {
  n = 1;
  for (auto d : shape)
    if (__builtin_mul_overflow(n, d, &n)) return false;
  return true;
}

inline std::string item_where(std::size_t i, const std::string& name) {
  return "item " + std::to_string(i) + " ('" + name + "')";
}

} // namespace detail

/// Check that `it` satisfies the `item` invariants the wire format needs.
inline status validate_item(const item& it, std::size_t i = 0) {
  const auto where = [&] { return detail::item_where(i, it.tensor.name); };
  DCR_RETURN_ERROR_IF(!info(it.tensor.dtype), bad_dtype,
                      where() + ": unknown dtype id " +
                          std::to_string(static_cast<int>(it.tensor.dtype)));
  DCR_RETURN_ERROR_IF(!is_known_encoding(static_cast<std::uint8_t>(it.encoding)), bad_encoding,
                      where() + ": unknown value encoding " +
                          std::to_string(static_cast<int>(it.encoding)));
  DCR_RETURN_ERROR_IF(it.tensor.name.size() > 0xFFFF, length_overflow,
                      where() + ": name longer than 65535 bytes");
  DCR_RETURN_ERROR_IF(it.tensor.shape.size() > max_rank, shape_mismatch,
                      where() + ": rank " + std::to_string(it.tensor.shape.size()) + " > " +
                          std::to_string(max_rank));
  std::uint64_t numel;
  DCR_RETURN_ERROR_IF(!detail::checked_numel(it.tensor.shape, numel), length_overflow,
                      where() + ": element count overflows 64 bits");
  const std::size_t w = width_of(it.tensor.dtype);
  DCR_RETURN_ERROR_IF(
      it.values.size() / w != it.indices.size() || it.values.size() % w != 0, invalid_argument,
      where() + ": " + std::to_string(it.values.size()) + " value bytes for " +
          std::to_string(it.indices.size()) + " indices of width " + std::to_string(w));
  const auto& idx = it.indices;
  bool increasing = true;
  for (std::size_t k = 1; k < idx.size(); ++k) increasing &= idx[k] > idx[k - 1];
  if (DCR_UNLIKELY(!increasing))
    for (std::size_t k = 1; k < idx.size(); ++k)
      DCR_RETURN_ERROR_IF(idx[k] <= idx[k - 1], not_increasing,
                          where() + ": index " + std::to_string(k) + " (" + std::to_string(idx[k]) +
                              ") <= index " + std::to_string(k - 1) + " (" +
                              std::to_string(idx[k - 1]) + ")");
  DCR_RETURN_ERROR_IF(!idx.empty() && idx.back() >= numel, index_out_of_range,
                      where() + ": index " + std::to_string(idx.back()) + " >= numel " +
                          std::to_string(numel));
  return status::success();
}

/// Check `it` against the canonical tensor it updates (what a receiver
/// applies): dtype and shape equal `meta`'s, then every `item` invariant.
inline status validate_item(const item& it, const tensor_meta& meta) {
  DCR_RETURN_ERROR_IF(it.tensor.dtype != meta.dtype, bad_dtype,
                      "item for " + meta.name + ": dtype " + std::string(name_of(it.tensor.dtype)) +
                          ", canonical " + std::string(name_of(meta.dtype)));
  DCR_RETURN_ERROR_IF(it.tensor.shape != meta.shape, shape_mismatch,
                      "item for " + meta.name + ": shape differs");
  return validate_item(it);
}

/// Parse and check the header: every field, the total length (no truncated
/// or trailing bytes) and the length bounds. Does not check the digest.
inline status parse_header(std::span<const std::byte> bytes, payload_header& h,
                           const decode_limits& limits = {}) {
  using namespace std::string_literals;
  DCR_RETURN_ERROR_IF(bytes.size() < payload_header_size, truncated,
                      "payload has " + std::to_string(bytes.size()) + " bytes, header needs " +
                          std::to_string(payload_header_size));
  const std::byte* p = bytes.data();
  DCR_RETURN_ERROR_IF(std::memcmp(p, payload_magic.data(), 4) != 0, bad_magic,
                      "payload byte 0: magic is not \"DCRP\"");
  h.version = load_le<std::uint16_t>(p + 4);
  DCR_RETURN_ERROR_IF(
      h.version < oldest_payload_version || h.version > payload_version, unsupported_version,
      "payload byte 4: format version " + std::to_string(h.version) + ", this build reads " +
          std::to_string(oldest_payload_version) + " to " + std::to_string(payload_version));
  const std::uint16_t hsize = load_le<std::uint16_t>(p + 6);
  DCR_RETURN_ERROR_IF(hsize != payload_header_size, unsupported_version,
                      "payload byte 6: header size " + std::to_string(hsize) + " is not " +
                          std::to_string(payload_header_size));
  h.id.attempt = load_le<std::uint64_t>(p + 8);
  h.id.source_version = load_le<std::uint64_t>(p + 16);
  h.id.owner = load_le<std::uint32_t>(p + 24);
  h.id.sequence = load_le<std::uint32_t>(p + 28);
  h.item_count = load_le<std::uint32_t>(p + 32);
  const auto comp = static_cast<std::uint8_t>(p[36]);
  DCR_RETURN_ERROR_IF(comp != static_cast<std::uint8_t>(compression_id::zstd), compression,
                      "payload byte 36: unknown compression id " + std::to_string(comp));
  h.compression = compression_id::zstd;
  DCR_RETURN_ERROR_IF(p[37] != std::byte{0} || load_le<std::uint16_t>(p + 38) != 0, bad_format,
                      "payload bytes 37..39: reserved bytes are not zero");
  h.table_length = load_le<std::uint64_t>(p + 40);
  h.location_length = load_le<std::uint64_t>(p + 48);
  h.value_length = load_le<std::uint64_t>(p + 56);
  h.raw_length = load_le<std::uint64_t>(p + 64);
  h.compressed_length = load_le<std::uint64_t>(p + 72);
  std::memcpy(h.digest.data(), p + 80, 16);

  std::uint64_t sum;
  DCR_RETURN_ERROR_IF(__builtin_add_overflow(h.table_length, h.location_length, &sum) ||
                          __builtin_add_overflow(sum, h.value_length, &sum),
                      length_overflow, "payload bytes 40..63: section lengths overflow 64 bits");
  DCR_RETURN_ERROR_IF(sum != h.raw_length, length_overflow,
                      "payload byte 64: raw body length " + std::to_string(h.raw_length) +
                          " != table + locations + values = " + std::to_string(sum));
  DCR_RETURN_ERROR_IF(h.raw_length > limits.max_raw_body, length_overflow,
                      "payload byte 64: raw body length " + std::to_string(h.raw_length) +
                          " exceeds the limit " + std::to_string(limits.max_raw_body));
  DCR_RETURN_ERROR_IF(h.item_count > h.table_length / min_row_size, length_overflow,
                      "payload byte 32: " + std::to_string(h.item_count) + " items cannot fit a " +
                          std::to_string(h.table_length) + "-byte table");
  const std::uint64_t avail = bytes.size() - payload_header_size;
  DCR_RETURN_ERROR_IF(h.compressed_length > avail, truncated,
                      "payload byte 72: body of " + std::to_string(h.compressed_length) +
                          " bytes, only " + std::to_string(avail) + " follow the header");
  DCR_RETURN_ERROR_IF(h.compressed_length < avail, trailing_bytes,
                      std::to_string(avail - h.compressed_length) +
                          " bytes after the body (payload byte " +
                          std::to_string(payload_header_size + h.compressed_length) + ")");
  DCR_RETURN_ERROR_IF(h.raw_length / zstd_max_expansion > h.compressed_length, length_overflow,
                      "payload byte 64: raw body length " + std::to_string(h.raw_length) +
                          " exceeds what a " + std::to_string(h.compressed_length) +
                          "-byte zstd frame can hold");
  return status::success();
}

/// The compressed body of a payload whose header parsed.
inline std::span<const std::byte> compressed_body(std::span<const std::byte> bytes) noexcept {
  return bytes.subspan(payload_header_size);
}

/// The digest a payload of format `version` must carry: v1, BLAKE2b-128 of
/// the compressed body; v2, BLAKE2b-128 of header bytes 0..79 (magic,
/// version, ids, lengths; not the digest field itself) followed by the
/// compressed body. `header` holds at least those 80 bytes. With a
/// non-empty `key`, the same bytes under keyed BLAKE2b-128.
inline digest128 payload_digest(std::uint16_t version, std::span<const std::byte> header,
                                std::span<const std::byte> body, const seal_key& key = {}) {
  blake2b_128 h{key};
  if (version >= 2) h.update(header.first(payload_digest_offset));
  return h.update(body).final();
}

/// Parse the header and check the digest (v2: header and body; v1: body),
/// without decompressing.
inline status read_payload_header(std::span<const std::byte> bytes, payload_header& h,
                                  const decode_limits& limits = {}) {
  DCR_TRY(parse_header(bytes, h, limits));
  const digest128 d = payload_digest(h.version, bytes, compressed_body(bytes), limits.key);
  DCR_RETURN_ERROR_IF(!same_digest(d, h.digest), digest_mismatch,
                      "payload byte 80: header digest " + to_hex(h.digest) + " != " +
                          (limits.key.empty() ? "" : "keyed (job key) ") + "BLAKE2b-128 of " +
                          (h.version >= 2 ? "header bytes 0..79 and body " : "body ") + to_hex(d));
  return status::success();
}

/// Parse and check the item table of a decompressed body: every row's ids,
/// shape, counts and buffer ranges (which must tile both buffers in item
/// order). Locations themselves are checked by `decode_payload`.
inline status parse_table(std::span<const std::byte> body, const payload_header& h,
                          std::vector<item_row>& rows) {
  rows.clear();
  rows.reserve(h.item_count);
  detail::reader r{body.first(h.table_length)};
  std::uint64_t loc_pos = 0, val_pos = 0;
  for (std::uint32_t i = 0; i < h.item_count; ++i) {
    item_row row;
    row.table_offset = r.pos;
    const auto at = [&](std::size_t off) {
      return "item " + std::to_string(i) + " (body byte " + std::to_string(off) + ")";
    };
    DCR_RETURN_ERROR_IF(!r.has(2), truncated, at(r.pos) + ": table ends in the name length");
    const std::uint16_t name_len = r.u16();
    DCR_RETURN_ERROR_IF(!r.has(name_len + 5u), truncated,
                        at(r.pos) + ": table ends in the name or ids");
    row.tensor.name.assign(reinterpret_cast<const char*>(body.data() + r.pos), name_len);
    r.pos += name_len;
    const auto where = [&](std::size_t off) { return at(off) + " '" + row.tensor.name + "'"; };
    const std::size_t ids = r.pos;
    const std::uint8_t dt = r.u8(), enc = r.u8(), loc = r.u8(), filt = r.u8(), rank = r.u8();
    DCR_RETURN_ERROR_IF(!is_known_dtype(dt), bad_dtype,
                        where(ids) + ": unknown dtype id " + std::to_string(dt));
    DCR_RETURN_ERROR_IF(!is_encoding_of_version(enc, h.version), bad_encoding,
                        where(ids + 1) + ": unknown value encoding " + std::to_string(enc) +
                            " (format v" + std::to_string(h.version) + ")");
    DCR_RETURN_ERROR_IF(!is_known_location(loc), bad_location,
                        where(ids + 2) + ": unknown location coding " + std::to_string(loc));
    DCR_RETURN_ERROR_IF(!is_known_filter(filt), bad_encoding,
                        where(ids + 3) + ": unknown value filter " + std::to_string(filt));
    DCR_RETURN_ERROR_IF(rank > max_rank, shape_mismatch,
                        where(ids + 4) + ": rank " + std::to_string(rank) + " > " +
                            std::to_string(max_rank));
    row.tensor.dtype = static_cast<dtype_id>(dt);
    row.encoding = static_cast<value_encoding>(enc);
    row.location = static_cast<location_id>(loc);
    row.filter = static_cast<value_filter>(filt);
    DCR_RETURN_ERROR_IF(!r.has(8u * rank + 48u), truncated,
                        where(r.pos) + ": table ends in the shape or counts");
    const std::size_t shape_at = r.pos;
    row.tensor.shape.resize(rank);
    for (auto& d : row.tensor.shape) d = r.u64();
    std::uint64_t numel;
    DCR_RETURN_ERROR_IF(!detail::checked_numel(row.tensor.shape, numel), length_overflow,
                        where(shape_at) + ": element count overflows 64 bits");
    const std::size_t count_at = r.pos;
    row.count = r.u64();
    row.first = r.u64();
    row.location_offset = r.u64();
    row.location_length = r.u64();
    row.value_offset = r.u64();
    row.value_length = r.u64();
    DCR_RETURN_ERROR_IF(row.count > numel, index_out_of_range,
                        where(count_at) + ": count " + std::to_string(row.count) + " > numel " +
                            std::to_string(numel));
    if (row.count == 0) {
      DCR_RETURN_ERROR_IF(
          row.location != location_id::run || row.first != 0 || row.filter != value_filter::none,
          bad_location, where(ids + 2) + ": an empty item must be run, first 0, filter none");
    } else {
      DCR_RETURN_ERROR_IF(row.first >= numel, index_out_of_range,
                          where(count_at + 8) + ": first index " + std::to_string(row.first) +
                              " >= numel " + std::to_string(numel));
    }
    const std::uint64_t width = width_of(row.tensor.dtype);
    DCR_RETURN_ERROR_IF(
        row.value_length / width != row.count || row.value_length % width != 0, length_overflow,
        where(count_at + 40) + ": value length " + std::to_string(row.value_length) + " != count " +
            std::to_string(row.count) + " x width " + std::to_string(width));
    DCR_RETURN_ERROR_IF(row.location_offset != loc_pos, offset_out_of_range,
                        where(count_at + 16) + ": location offset " +
                            std::to_string(row.location_offset) + " != " + std::to_string(loc_pos) +
                            " (sections tile the buffer in item order)");
    DCR_RETURN_ERROR_IF(row.location_length > h.location_length - loc_pos, offset_out_of_range,
                        where(count_at + 24) + ": location range [" + std::to_string(loc_pos) +
                            ", +" + std::to_string(row.location_length) + ") exceeds the " +
                            std::to_string(h.location_length) + "-byte location buffer");
    DCR_RETURN_ERROR_IF(row.value_offset != val_pos, offset_out_of_range,
                        where(count_at + 32) + ": value offset " +
                            std::to_string(row.value_offset) + " != " + std::to_string(val_pos) +
                            " (sections tile the buffer in item order)");
    DCR_RETURN_ERROR_IF(row.value_length > h.value_length - val_pos, offset_out_of_range,
                        where(count_at + 40) + ": value range [" + std::to_string(val_pos) + ", +" +
                            std::to_string(row.value_length) + ") exceeds the " +
                            std::to_string(h.value_length) + "-byte value buffer");
    loc_pos += row.location_length;
    val_pos += row.value_length;
    rows.push_back(std::move(row));
  }
  DCR_RETURN_ERROR_IF(r.pos != h.table_length, trailing_bytes,
                      "item table: " + std::to_string(h.table_length - r.pos) +
                          " bytes after the last row (body byte " + std::to_string(r.pos) + ")");
  DCR_RETURN_ERROR_IF(loc_pos != h.location_length, trailing_bytes,
                      "location buffer: " + std::to_string(h.location_length - loc_pos) +
                          " bytes no item uses (body byte " +
                          std::to_string(h.table_length + loc_pos) + ")");
  DCR_RETURN_ERROR_IF(val_pos != h.value_length, trailing_bytes,
                      "value buffer: " + std::to_string(h.value_length - val_pos) +
                          " bytes no item uses (body byte " +
                          std::to_string(h.table_length + h.location_length + val_pos) + ")");
  return status::success();
}

/// Decode and check the locations of row `i` (of a parsed table) into
/// `out`, which holds `row.count > 0` entries, with location policy `L`.
template <location_policy L = by_scheme>
inline status decode_row_locations(std::span<const std::byte> body, const payload_header& h,
                                   const item_row& row, std::size_t i,
                                   std::span<std::uint64_t> out) {
  std::uint64_t numel;
  detail::checked_numel(row.tensor.shape, numel);
  const std::uint64_t loc_at = h.table_length + row.location_offset;
  if (auto s =
          L::decode(row.location, body.subspan(loc_at, row.location_length), row.first, numel, out);
      !s)
    return fail(s.code, "item " + std::to_string(i) + " '" + row.tensor.name + "' (" +
                            std::string(to_string(row.location)) + " locations at body bytes [" +
                            std::to_string(loc_at) + ", +" + std::to_string(row.location_length) +
                            ")): " + s.message);
  return status::success();
}

/// Expand one row into an item (locations decoded and checked by policy `L`,
/// values unfiltered).
template <location_policy L = by_scheme>
inline status decode_row(std::span<const std::byte> body, const payload_header& h,
                         const item_row& row, std::size_t i, item& out) {
  out.tensor = row.tensor;
  out.encoding = row.encoding;
  out.indices.assign(row.count, 0);
  out.values.assign(row.value_length, std::byte{0});
  if (row.count == 0) return status::success();
  DCR_TRY(decode_row_locations<L>(body, h, row, i, out.indices));
  const std::uint64_t val_at = h.table_length + h.location_length + row.value_offset;
  remove_filter(row.filter, body.subspan(val_at, row.value_length), width_of(row.tensor.dtype),
                out.values);
  return status::success();
}

} // namespace codec

/// Header fields and digest check only (no decompression): cheap dedupe and
/// routing before a payload is staged. `key`: the job key its digest must be
/// keyed with (empty: unkeyed).
inline status read_payload_id(std::span<const std::byte> bytes, payload_id& out,
                              const seal_key& key = {}) {
  codec::payload_header h;
  codec::decode_limits limits;
  limits.key = key;
  DCR_TRY(codec::read_payload_header(bytes, h, limits));
  out = h.id;
  return status::success();
}

namespace codec {
using dcr::read_payload_id;
} // namespace codec

} // namespace dcr
