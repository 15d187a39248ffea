#pragma once
/// \file
/// Vocabulary: `twin/` (namespace `dcr::twin`) holds the host twins of the GPU
/// kernels in `cuda/dcr/gpu/` (namespace `dcr::gpu`) and the element-level code
/// both share; a twin has its kernel's semantics, checks and errors, runs in
/// CI, and the GPU tests compare the two.
///
/// Argument checks shared by the CUDA entry points and the host twins, so that
/// both reject the same inputs with the same `dcr::errc` and message. Host
/// code only; includes element.hpp and core/error.hpp (no tensor.hpp), so
/// `.cuh` headers can include it without relaxed constexpr.

#include <cstdint>
#include <string>
#include <string_view>

#include "dcr/core/error.hpp"
#include "dcr/twin/element.hpp"

namespace dcr::twin {

/// A view may be read: rank in range, extents and strides non-negative, no
/// size overflow, and non-null data when non-empty.
inline status check_source_view(const layout& l, const void* data, std::string_view what) {
  DCR_RETURN_ERROR_IF(!l.is_non_negative(), invalid_argument,
                      std::string(what) + ": rank out of range or negative extent/stride");
  std::int64_t n = 1;
  for (int i = 0; i < l.rank; ++i) {
    DCR_RETURN_ERROR_IF(l.extents[i] != 0 && n > INT64_MAX / l.extents[i], length_overflow,
                        std::string(what) + ": element count overflows int64");
    n *= l.extents[i];
  }
  std::int64_t hi = 0;
  for (int i = 0; i < l.rank && n > 0; ++i) {
    const std::int64_t e = l.extents[i] - 1;
    DCR_RETURN_ERROR_IF(l.strides[i] != 0 && e > (INT64_MAX - hi) / l.strides[i], length_overflow,
                        std::string(what) + ": storage span overflows int64");
    hi += e * l.strides[i];
  }
  DCR_RETURN_ERROR_IF(n > 0 && data == nullptr, invalid_argument,
                      std::string(what) + ": null data for a non-empty view");
  DCR_RETURN_ERROR_IF(l.contiguous && !l.is_row_major(), invalid_argument,
                      std::string(what) + ": marked contiguous but strides are not row-major");
  return status::success();
}

/// A view may be written: readable and unique (distinct coordinates never
/// share storage).
inline status check_destination_view(const layout& l, const void* data, std::string_view what) {
  DCR_TRY(check_source_view(l, data, what));
  DCR_RETURN_ERROR_IF(!l.is_unique(), invalid_argument,
                      std::string(what) + ": destination layout is not unique (aliasing strides)");
  return status::success();
}

/// Byte range [lo, hi) a view may touch.
inline void byte_range(const layout& l, const void* data, std::size_t width, std::uintptr_t& lo,
                       std::uintptr_t& hi) {
  lo = reinterpret_cast<std::uintptr_t>(data);
  hi = lo + static_cast<std::uintptr_t>(l.required_span_size()) * width;
}

/// Destination and source of a copy: same extents, and storage ranges that do
/// not overlap (an in-place XOR would cancel itself).
inline status check_copy_pair(const layout& dst, const void* dst_data, const layout& src,
                              const void* src_data, std::size_t width) {
  DCR_TRY(check_destination_view(dst, dst_data, "copy destination"));
  DCR_TRY(check_source_view(src, src_data, "copy source"));
  DCR_RETURN_ERROR_IF(!dst.same_extents(src), shape_mismatch,
                      "copy source and destination extents differ");
  std::uintptr_t a0, a1, b0, b1;
  byte_range(dst, dst_data, width, a0, a1);
  byte_range(src, src_data, width, b0, b1);
  DCR_RETURN_ERROR_IF(a0 < a1 && b0 < b1 && a0 < b1 && b0 < a1, invalid_argument,
                      "copy source and destination storage overlap");
  return status::success();
}

/// Checks of a copy in `mode` (shared by the copy kernels and their twin);
/// `mask` is only looked at for `overwrite_mask`, `nan_dtype` only for
/// `overwrite_nan` (its width must be the word width).
template <word W>
status check_copy(const view<W>& dst, const view<const W>& src, copy_mode mode,
                  const view<const std::uint8_t>& mask, dtype_id nan_dtype) {
  DCR_RETURN_ERROR_IF(static_cast<unsigned>(mode) > 5, invalid_argument,
                      "unknown copy mode " + std::to_string(static_cast<unsigned>(mode)));
  DCR_TRY(check_copy_pair(dst.shape, dst.data, src.shape, src.data, sizeof(W)));
  if (mode == copy_mode::overwrite_mask) {
    DCR_TRY(check_source_view(mask.shape, mask.data, "copy mask"));
    DCR_RETURN_ERROR_IF(!mask.shape.same_extents(src.shape), shape_mismatch,
                        "copy mask and source extents differ");
  }
  DCR_RETURN_ERROR_IF(mode == copy_mode::overwrite_nan && width_of(nan_dtype) != sizeof(W),
                      bad_dtype,
                      "overwrite_nan: dtype " + std::string(name_of(nan_dtype)) +
                          " does not have " + std::to_string(sizeof(W)) + "-byte words");
  return status::success();
}

/// Status for a failed location check (`code` from `check_location`) at record `k`.
inline status location_failure(int code, std::uint64_t k, std::uint64_t size) {
  if (code == 1)
    return fail(errc::index_out_of_range, "record " + std::to_string(k) +
                                              ": location outside the view of " +
                                              std::to_string(size) + " elements");
  return fail(errc::not_increasing,
              "record " + std::to_string(k) + ": location not greater than the previous one");
}

/// Gap buffer length for `count` records of gap width `width`.
inline status check_gap_buffer(unsigned width, std::uint64_t gap_bytes, std::uint64_t count) {
  DCR_RETURN_ERROR_IF(!is_gap_width(width), bad_location,
                      "gap width " + std::to_string(width) + " is not 1, 2, 4 or 8");
  const std::uint64_t gaps = count == 0 ? 0 : count - 1;
  DCR_RETURN_ERROR_IF(gaps > UINT64_MAX / width || gap_bytes != gaps * width, offset_out_of_range,
                      "gap buffer holds " + std::to_string(gap_bytes) + " bytes, " +
                          std::to_string(count) + " records of width " + std::to_string(width) +
                          " need " + std::to_string(gaps * width));
  return status::success();
}

/// A run `[start, start + count)` lies inside a view of `size` elements (an empty run always does).
inline status check_run(std::uint64_t start, std::uint64_t count, std::uint64_t size) {
  DCR_RETURN_ERROR_IF(count != 0 && (count > size || start > size - count), index_out_of_range,
                      "run [" + std::to_string(start) + ", +" + std::to_string(count) +
                          ") outside the view of " + std::to_string(size) + " elements");
  return status::success();
}

} // namespace dcr::twin
