#pragma once
/// \file
/// Payload encoding (wire format v2 by default, v1 on request;
/// docs/wire-format.md): items in, one
/// header and one zstd-compressed body out. Deterministic: the same items and
/// options give the same bytes (for a given zstd library version).

#include <cstddef>
#include <span>
#include <vector>

#include "dcr/codec/payload_format.hpp"
#include "dcr/codec/zstd.hpp"

namespace dcr {

/// Encoder choices. The defaults are the measured best (dcr-bench-payload,
/// docs/wire-format.md "Choice of defaults"): escape-coded u8 gaps and
/// byte-plane values, zstd level 1 (within 1.08x of the zeroth-order entropy
/// of gaps and masks on every workload measured).
struct encode_options {
  int zstd_level = 1;
  codec::location_scheme locations = codec::location_scheme::escape_u8;
  codec::value_filter filter = codec::value_filter::byte_planes;
  /// Format version written: 2 (digest over header and body), or 1 for
  /// readers that predate v2 (no `add` items; the ids are outside the digest).
  std::uint16_t format_version = codec::payload_version;
  /// Job key for the header digest (empty: unkeyed, the default). Keyed, the
  /// layout is unchanged and only holders of the key can write a payload a
  /// keyed reader accepts (docs/wire-format.md, "Keyed digests").
  seal_key key{};
};

namespace codec {

/// Encode a payload into `out` (replaced), each item's locations coded by
/// the location policy `locate` (`opt.locations` is not read). Fails on an
/// invalid item or option.
template <location_policy L>
inline status encode_payload_with(const payload_id& id, std::span<const item> items,
                                  const encode_options& opt, const L& locate,
                                  std::vector<std::byte>& out) {
  DCR_RETURN_ERROR_IF(items.size() > 0xFFFFFFFFu, length_overflow, "more than 2^32-1 items");
  const std::uint16_t version = opt.format_version;
  DCR_RETURN_ERROR_IF(
      version < oldest_payload_version || version > payload_version, unsupported_version,
      "format version " + std::to_string(version) + ", this build writes " +
          std::to_string(oldest_payload_version) + " to " + std::to_string(payload_version));
  std::vector<std::byte> table, locs, vals;
  std::size_t value_bytes = 0;
  for (std::size_t i = 0; i < items.size(); ++i) {
    DCR_TRY(validate_item(items[i], i));
    DCR_RETURN_ERROR_IF(
        !is_encoding_of_version(static_cast<std::uint8_t>(items[i].encoding), version),
        bad_encoding,
        detail::item_where(i, items[i].tensor.name) + ": " +
            std::string(to_string(items[i].encoding)) + " items need format v2");
    value_bytes += items[i].values.size();
  }
  vals.resize(value_bytes);
  detail::writer t{table};
  std::size_t vpos = 0;
  for (const item& it : items) {
    const std::size_t w = width_of(it.tensor.dtype);
    const value_filter filter = (w > 1 && !it.indices.empty()) ? opt.filter : value_filter::none;
    const std::size_t loc_start = locs.size();
    const location_id loc = locate(std::span<const std::uint64_t>(it.indices), locs);
    apply_filter(filter, it.values, w, std::span(vals).subspan(vpos, it.values.size()));

    t.u16(static_cast<std::uint16_t>(it.tensor.name.size()));
    t.put(it.tensor.name.data(), it.tensor.name.size());
    t.u8(static_cast<std::uint8_t>(it.tensor.dtype));
    t.u8(static_cast<std::uint8_t>(it.encoding));
    t.u8(static_cast<std::uint8_t>(loc));
    t.u8(static_cast<std::uint8_t>(filter));
    t.u8(static_cast<std::uint8_t>(it.tensor.shape.size()));
    for (auto d : it.tensor.shape) t.u64(d);
    t.u64(it.indices.size());
    t.u64(it.indices.empty() ? 0 : it.indices.front());
    t.u64(loc_start);
    t.u64(locs.size() - loc_start);
    t.u64(vpos);
    t.u64(it.values.size());
    vpos += it.values.size();
  }
  std::vector<std::byte> body;
  body.reserve(table.size() + locs.size() + vals.size());
  body.insert(body.end(), table.begin(), table.end());
  body.insert(body.end(), locs.begin(), locs.end());
  body.insert(body.end(), vals.begin(), vals.end());
  std::vector<std::byte> frame;
  DCR_TRY(zstd_compress(body, opt.zstd_level, frame));

  out.clear();
  out.reserve(payload_header_size + frame.size());
  detail::writer h{out};
  h.put(payload_magic.data(), payload_magic.size());
  h.u16(version);
  h.u16(static_cast<std::uint16_t>(payload_header_size));
  h.u64(id.attempt);
  h.u64(id.source_version);
  h.u32(id.owner);
  h.u32(id.sequence);
  h.u32(static_cast<std::uint32_t>(items.size()));
  h.u8(static_cast<std::uint8_t>(compression_id::zstd));
  h.u8(0);
  h.u16(0);
  h.u64(table.size());
  h.u64(locs.size());
  h.u64(vals.size());
  h.u64(body.size());
  h.u64(frame.size());
  const digest128 dg = payload_digest(version, out, frame, opt.key);
  h.put(dg.data(), dg.size());
  h.put(frame.data(), frame.size());
  return status::success();
}

/// Encode a payload into `out` (replaced), locations chosen by `opt.locations`.
/// Fails on an invalid item or option.
inline status encode_payload(const payload_id& id, std::span<const item> items,
                             const encode_options& opt, std::vector<std::byte>& out) {
  return encode_payload_with(id, items, opt, by_scheme{opt.locations}, out);
}

} // namespace codec

/// Encode items into a payload; throws `dcr::error` on an invalid item or option.
inline std::vector<std::byte> encode_payload(const payload_id& id, std::span<const item> items,
                                             const encode_options& opt = {}) {
  std::vector<std::byte> out;
  throw_if_failed(codec::encode_payload(id, items, opt, out));
  return out;
}

namespace codec {
using dcr::encode_payload;
} // namespace codec

} // namespace dcr
