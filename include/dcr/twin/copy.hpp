#pragma once
/// \file
/// Vocabulary: `twin/` (namespace `dcr::twin`) holds the host twins of the GPU
/// kernels in `cuda/dcr/gpu/` (namespace `dcr::gpu`) and the element-level code
/// both share; a twin has its kernel's semantics, checks and errors, runs in
/// CI, and the GPU tests compare the two.
///
/// Host twin of the CUDA copy kernels (`cuda/dcr/gpu/copy.cuh`): an
/// elementwise copy of a source view into a destination view with the same
/// extents, in one of the intercepting sink's modes:
///
/// | mode             | effect at row-major coordinate k                    |
/// |------------------|-----------------------------------------------------|
/// | `dense`          | `dst[k] = src[k]`                                   |
/// | `xor_mask`       | `dst[k] ^= src[k]`                                  |
/// | `overwrite`      | `dst[k] = src[k]` only where `src[k] != placeholder` |
/// | `overwrite_mask` | `dst[k] = src[k]` only where `mask[k] != 0`         |
/// | `overwrite_nan`  | `dst[k] = src[k]` only where `src[k]` is not NaN    |
/// | `add`            | `dst[k] = dst[k] + unzigzag(src[k])` mod 2^w        |
///
/// Inactive positions are never written. `masked_overwrite` is the rollout
/// side's overwrite path: scratch holds values and placeholders; the
/// explicit-mask form serves items whose values may themselves be NaN; the
/// NaN form treats every NaN pattern of the dtype as the placeholder (what
/// the receiver's overwrite sink does for loader temporaries, whose casts may
/// change a NaN's payload).
/// Checks (shared with the kernels): destination unique, same extents,
/// non-overlapping storage, mask extents equal to the source's.

#include <cstdint>
#include <type_traits>

#include "dcr/core/error.hpp"
#include "dcr/twin/check.hpp"
#include "dcr/twin/element.hpp"
#include "dcr/twin/view.hpp"

namespace dcr::twin {

/// Copy `src` into `dst` in `mode` (see the table above).
template <word W>
status copy(view<W> dst, std::type_identity_t<view<const W>> src, copy_mode mode, W placeholder = 0,
            view<const std::uint8_t> mask = {}, dtype_id nan_dtype = dtype_id::bf16) {
  DCR_TRY(check_copy(dst, src, mode, mask, nan_dtype));
  const std::int64_t n = dst.size();
  // One loop per mode keeps each plain and vectorisable.
  switch (mode) {
  case copy_mode::dense:
    for (std::int64_t k = 0; k < n; ++k) dst.at(k) = src.at(k);
    break;
  case copy_mode::xor_mask:
    for (std::int64_t k = 0; k < n; ++k) dst.at(k) = static_cast<W>(dst.at(k) ^ src.at(k));
    break;
  case copy_mode::overwrite:
    for (std::int64_t k = 0; k < n; ++k)
      if (const W s = src.at(k); s != placeholder) dst.at(k) = s;
    break;
  case copy_mode::overwrite_mask:
    for (std::int64_t k = 0; k < n; ++k)
      if (mask.at(k) != 0) dst.at(k) = src.at(k);
    break;
  case copy_mode::overwrite_nan: {
    const nan_rule r = nan_rule_of(nan_dtype);
    for (std::int64_t k = 0; k < n; ++k)
      if (const W s = src.at(k); !is_nan_by(s, r)) dst.at(k) = s;
    break;
  }
  case copy_mode::add: // scratch holds add words, 0 (no change) at inactive positions
    for (std::int64_t k = 0; k < n; ++k) dst.at(k) = apply_zigzag_delta(dst.at(k), src.at(k));
    break;
  }
  return status::success();
}

/// Write `src` into `dst` at every position where `src != placeholder`.
template <word W>
status masked_overwrite(view<W> dst, std::type_identity_t<view<const W>> src, W placeholder) {
  return copy(dst, src, copy_mode::overwrite, placeholder);
}

/// Write `src` into `dst` at every position where `src` is not a NaN of `dtype`.
template <word W>
status masked_overwrite_nan(view<W> dst, std::type_identity_t<view<const W>> src, dtype_id dtype) {
  return copy(dst, src, copy_mode::overwrite_nan, W{0}, {}, dtype);
}

/// Write `src` into `dst` at every position where `mask != 0`.
template <word W>
status masked_overwrite(view<W> dst, std::type_identity_t<view<const W>> src,
                        view<const std::uint8_t> mask) {
  return copy(dst, src, copy_mode::overwrite_mask, W{0}, mask);
}

} // namespace dcr::twin
