#pragma once
/// \file
/// Vocabulary: `twin/` (namespace `dcr::twin`) holds the host twins of the GPU
/// kernels in `cuda/dcr/gpu/` (namespace `dcr::gpu`) and the element-level code
/// both share; a twin has its kernel's semantics, checks and errors, runs in
/// CI, and the GPU tests compare the two.
///
/// Conversions from the core views (`dcr::strided_view`, `dcr::tensor_view`)
/// to the kernel-side `dcr::twin::view`. Host code (the core layouts'
/// members are host-only; kernels take `twin::layout`).

#include <cstdint>
#include <string>

#include "dcr/core/error.hpp"
#include "dcr/core/tensor.hpp"
#include "dcr/twin/element.hpp"

namespace dcr::twin {

static_assert(static_cast<int>(dcr::max_rank) == layout_max_rank);

/// Device layout with the same extents and strides as `l`.
inline layout to_device(const strided_layout& l) noexcept {
  return strided(l.extents.data(), l.strides.data(), static_cast<int>(l.rank));
}

/// Core layout with the same extents and strides as `l`.
inline strided_layout to_core(const layout& l) noexcept {
  strided_layout c;
  c.rank = static_cast<std::size_t>(l.rank);
  for (int i = 0; i < l.rank; ++i) {
    c.extents[static_cast<std::size_t>(i)] = l.extents[i];
    c.strides[static_cast<std::size_t>(i)] = l.strides[i];
  }
  return c;
}

/// Device view over the same words as `v`.
template <class W>
view<W> to_device(const strided_view<W>& v) noexcept {
  return {v.data, to_device(v.layout)};
}

/// Typed device view of an untyped tensor view; throws `dcr::error`
/// (`bad_dtype`) when `W` is not the view's word width.
template <word W>
view<W> to_device_as(const tensor_view& v) {
  if (v.width() != sizeof(W))
    throw error(errc::bad_dtype, "view of " + std::string(name_of(v.dtype)) + " is not " +
                                     std::to_string(sizeof(W)) + "-byte words");
  return {reinterpret_cast<W*>(v.data), to_device(v.layout)};
}

/// Read-only view over the same words.
template <class W>
view<const W> as_const(const view<W>& v) noexcept {
  return {v.data, v.shape};
}

} // namespace dcr::twin
