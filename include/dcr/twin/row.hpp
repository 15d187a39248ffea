#pragma once
/// \file
/// Vocabulary: `twin/` (namespace `dcr::twin`) holds the host twins of the GPU
/// kernels in `cuda/dcr/gpu/` (namespace `dcr::gpu`) and the element-level code
/// both share; a twin has its kernel's semantics, checks and errors, runs in
/// CI, and the GPU tests compare the two.
///
/// Host twin of `dcr::gpu::scatter_row` (`cuda/dcr/gpu/row.cuh`): one item
/// table row of a decompressed payload body (`codec::parse_table`) applied
/// straight from its wire sections, the location bytes in the row's coding
/// and the value bytes in the row's filter, without expanding the item.
/// The effect equals `codec::decode_row` followed by `scatter_item`, and a
/// location failure carries `decode_row`'s message.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "dcr/codec/payload_format.hpp"
#include "dcr/core/error.hpp"
#include "dcr/twin/locations.hpp"
#include "dcr/twin/scatter.hpp"

namespace dcr::twin {

/// The row's location and value sections inside `body`, after the checks
/// `scatter_item` makes of an item: `W`-byte words of a known dtype
/// (`bad_dtype`), a known encoding (`bad_encoding`), `dst_size` equal to the
/// tensor's element count (`shape_mismatch`), and sections that lie inside
/// the body (`offset_out_of_range`; `parse_table` guarantees it for rows it
/// made from this body).
template <word W>
status row_sections(std::span<const std::byte> body, const codec::payload_header& h,
                    const codec::item_row& row, std::uint64_t dst_size,
                    std::span<const std::uint8_t>& locations,
                    std::span<const std::uint8_t>& values) {
  const std::string& name = row.tensor.name;
  DCR_RETURN_ERROR_IF(width_of(row.tensor.dtype) != sizeof(W), bad_dtype,
                      name + ": dtype " + std::string(name_of(row.tensor.dtype)) + " is not " +
                          std::to_string(sizeof(W)) + "-byte words");
  DCR_RETURN_ERROR_IF(
      !codec::is_encoding_of_version(static_cast<std::uint8_t>(row.encoding), h.version),
      bad_encoding, name + ": unknown value encoding");
  DCR_RETURN_ERROR_IF(dst_size != row.tensor.numel(), shape_mismatch,
                      name + ": view of " + std::to_string(dst_size) + " elements, tensor of " +
                          std::to_string(row.tensor.numel()));
  const auto inside = [&](std::uint64_t at, std::uint64_t len) {
    return at <= body.size() && len <= body.size() - at;
  };
  const std::uint64_t loc_at = h.table_length + row.location_offset;
  const std::uint64_t val_at = h.table_length + h.location_length + row.value_offset;
  DCR_RETURN_ERROR_IF(h.table_length > body.size() || h.location_length > body.size() ||
                          !inside(loc_at, row.location_length) || !inside(val_at, row.value_length),
                      offset_out_of_range,
                      name + ": row sections outside the " + std::to_string(body.size()) +
                          "-byte body");
  const auto* p = reinterpret_cast<const std::uint8_t*>(body.data());
  locations = {p + loc_at, static_cast<std::size_t>(row.location_length)};
  values = {p + val_at, static_cast<std::size_t>(row.value_length)};
  return status::success();
}

/// `status` of a row's scatter, worded like `codec::decode_row` (item
/// number, name, coding and location section) when it failed.
inline status row_error(const status& s, const codec::payload_header& h, const codec::item_row& row,
                        std::size_t i) {
  if (s) return s;
  const std::uint64_t loc_at = h.table_length + row.location_offset;
  return fail(s.code, "item " + std::to_string(i) + " '" + row.tensor.name + "' (" +
                          std::string(codec::to_string(row.location)) +
                          " locations at body bytes [" + std::to_string(loc_at) + ", +" +
                          std::to_string(row.location_length) + ")): " + s.message);
}

/// True when the row's values are byte planes of words wider than a byte.
inline bool row_planes(const codec::item_row& row) noexcept {
  return row.filter == codec::value_filter::byte_planes && width_of(row.tensor.dtype) > 1;
}

/// Apply row `i` of a decompressed body onto `dst` (the tensor's canonical
/// extents, possibly strided storage): XOR or overwrite by the row's
/// encoding. On any failure nothing is written.
template <word W>
status scatter_row(view<W> dst, std::span<const std::byte> body, const codec::payload_header& h,
                   const codec::item_row& row, std::size_t i) {
  std::span<const std::uint8_t> loc, val;
  DCR_TRY(row_sections<W>(body, h, row, static_cast<std::uint64_t>(dst.size()), loc, val));
  return row_error(scatter_encoded<W>(dst, row.first, row.count, row.location, loc, val,
                                      row_planes(row), op_of(row.encoding)),
                   h, row, i);
}

} // namespace dcr::twin
