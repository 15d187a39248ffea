#pragma once
/// \file
/// View helpers that native loaders use on top of `tensor_view::slice` and
/// `transposed`: selecting one index of a dimension (e.g. one expert of a
/// fused expert tensor) and casting into a loader-owned temporary.

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "dcr/core/error.hpp"
#include "dcr/core/tensor.hpp"
#include "dcr/receiver/view_map.hpp"

namespace dcr::loaders {

/// View of `v` at index `i` of dimension `dim`, with that dimension removed.
inline tensor_view select(const tensor_view& v, std::size_t dim, std::int64_t i) {
  if (dim >= v.layout.rank || i < 0 || i >= v.layout.extents[dim])
    throw error(errc::invalid_argument,
                "select out of range: dim " + std::to_string(dim) + " index " + std::to_string(i));
  tensor_view out{
      v.data + i * v.layout.strides[dim] * static_cast<std::int64_t>(v.width()), v.dtype, {}};
  for (std::size_t d = 0, k = 0; d < v.layout.rank; ++d) {
    if (d == dim) continue;
    out.layout.extents[k] = v.layout.extents[d];
    out.layout.strides[k] = v.layout.strides[d];
    ++k;
  }
  out.layout.rank = v.layout.rank - 1;
  return out;
}

/// Elementwise BF16 -> FP32 widening of `src` into `tmp` (resized; row-major
/// of src's extents). Exact for every pattern, NaN payloads included.
inline tensor_view widen_bf16_to_f32(const tensor_view& src, std::vector<std::uint32_t>& tmp) {
  if (src.dtype != dtype_id::bf16)
    throw error(errc::bad_dtype, "widen_bf16_to_f32 on a non-bf16 view");
  tmp.resize(static_cast<std::size_t>(src.size()));
  strided_layout out = src.layout;
  std::int64_t s = 1;
  for (std::size_t i = out.rank; i-- > 0;) {
    out.strides[i] = s;
    s *= out.extents[i];
  }
  const auto* S = reinterpret_cast<const std::uint16_t*>(src.data);
  auto* D = tmp.data();
  for_each_offset_pair(out, src.layout, [&](std::int64_t d, std::int64_t si) {
    D[d] = static_cast<std::uint32_t>(S[si]) << 16;
  });
  return {reinterpret_cast<std::byte*>(tmp.data()), dtype_id::f32, out};
}

} // namespace dcr::loaders
