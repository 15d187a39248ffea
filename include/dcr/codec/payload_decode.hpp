#pragma once
/// \file
/// Payload decoding (wire formats v1 and v2, docs/wire-format.md): header, digest,
/// zstd body, table, locations and values, every field checked before use
/// (see payload_format.hpp for the order of checks).

#include <algorithm>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "dcr/codec/payload_format.hpp"
#include "dcr/codec/zstd.hpp"

namespace dcr {
namespace codec {

/// Decompress the body of a payload whose header and digest checked out.
inline status decompress_body(std::span<const std::byte> bytes, const payload_header& h,
                              std::vector<std::byte>& body) {
  const auto frame = compressed_body(bytes);
  if (auto s = zstd_check_frame(frame, h.raw_length); !s)
    return fail(s.code,
                "body (payload byte " + std::to_string(payload_header_size) + "): " + s.message);
  body.resize(h.raw_length);
  if (auto s = zstd_decompress(frame, body); !s)
    return fail(s.code,
                "body (payload byte " + std::to_string(payload_header_size) + "): " + s.message);
  return status::success();
}

/// Header, table rows and decompressed body of a payload, all checked except
/// the locations (what an inspector shows).
struct payload_info {
  payload_header header;
  std::vector<item_row> rows;
  std::vector<std::byte> body;
};

/// Parse a payload down to its table (digest checked, body decompressed).
inline status inspect_payload(std::span<const std::byte> bytes, payload_info& out,
                              const decode_limits& limits = {}) {
  DCR_TRY(read_payload_header(bytes, out.header, limits));
  DCR_TRY(decompress_body(bytes, out.header, out.body));
  return parse_table(out.body, out.header, out.rows);
}

/// The canonical tensor names a payload's items update, sorted and without
/// repeats, read from its header and item table only (the body is
/// decompressed just up to the end of the table). The header and table are
/// checked as `parse_table` checks them; the digest and the locations are
/// not (the writer of a manifest index runs this on payloads it built).
inline status payload_tensors(std::span<const std::byte> bytes, std::vector<std::string>& names,
                              const decode_limits& limits = {}) {
  names.clear();
  payload_header h;
  DCR_TRY(parse_header(bytes, h, limits));
  std::vector<std::byte> table(h.table_length);
  if (auto s = zstd_decompress_prefix(compressed_body(bytes), table); !s)
    return fail(s.code,
                "body (payload byte " + std::to_string(payload_header_size) + "): " + s.message);
  std::vector<item_row> rows;
  DCR_TRY(parse_table(table, h, rows));
  for (auto& r : rows) names.push_back(std::move(r.tensor.name));
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return status::success();
}

/// Decode and validate a whole payload.
inline status decode_payload(std::span<const std::byte> bytes, decoded_payload& out,
                             const decode_limits& limits) {
  payload_info pi;
  DCR_TRY(inspect_payload(bytes, pi, limits));
  out.id = pi.header.id;
  out.items.clear();
  out.items.resize(pi.rows.size());
  for (std::size_t i = 0; i < pi.rows.size(); ++i)
    DCR_TRY(decode_row(pi.body, pi.header, pi.rows[i], i, out.items[i]));
  return status::success();
}

/// Decode and validate a whole payload like `decode_payload`, expanding only
/// the items whose table row `keep(row)` accepts (e.g. the tensors a receiver
/// stores anything of). A rejected item is checked like every other (header,
/// digest, its table row and the tiling of both buffers by `parse_table`, its
/// locations decoded into one reused buffer and checked), so a payload is
/// refused exactly when, and with the status with which, `decode_payload`
/// refuses it. A rejected item comes back with its tensor and encoding but no
/// indices and no values: what it changes is not read out, because the
/// caller said it has nowhere to put it.
///
/// `L` is the location policy (every coding by default; a static pipeline
/// names the codings it decodes).
///
/// `out` may be reused from an earlier call: its items keep their buffers
/// (name, shape, indices and values are assigned in place, so a receiver
/// that decodes payload after payload into one `decoded_payload` allocates
/// nothing per item once the buffers have grown), and on success every item
/// holds exactly what this payload says, nothing of the earlier one.
/// `ws` (optional) keeps the body and table buffers across calls too.
template <location_policy L = by_scheme, class Keep>
requires std::predicate<Keep&, const item_row&>
inline status decode_payload_if(std::span<const std::byte> bytes, decoded_payload& out, Keep&& keep,
                                const decode_limits& limits = {}, payload_info* ws = nullptr) {
  payload_info local;
  payload_info& pi = ws ? *ws : local;
  DCR_TRY(inspect_payload(bytes, pi, limits));
  out.id = pi.header.id;
  out.items.resize(pi.rows.size());    // items past the new count go; the others are overwritten
  std::vector<std::uint64_t> rejected; // capacity reused across rejected items
  for (std::size_t i = 0; i < pi.rows.size(); ++i) {
    const item_row& row = pi.rows[i];
    item& it = out.items[i];
    if (keep(row)) {
      DCR_TRY(decode_row<L>(pi.body, pi.header, row, i, it));
      continue;
    }
    it.tensor = row.tensor;
    it.encoding = row.encoding;
    it.indices.clear();
    it.values.clear();
    if (row.count == 0) continue;
    rejected.resize(row.count);
    DCR_TRY(decode_row_locations<L>(pi.body, pi.header, row, i, rejected));
  }
  return status::success();
}

} // namespace codec

/// Decode and validate every byte of a payload; `out` is unspecified on failure.
inline status decode_payload(std::span<const std::byte> bytes, decoded_payload& out) {
  return codec::decode_payload(bytes, out, codec::decode_limits{});
}

/// Throwing form of `decode_payload`.
inline decoded_payload decode_payload_or_throw(std::span<const std::byte> bytes) {
  decoded_payload out;
  throw_if_failed(decode_payload(bytes, out));
  return out;
}

namespace codec {
using dcr::decode_payload;
using dcr::decode_payload_or_throw;
} // namespace codec

} // namespace dcr
