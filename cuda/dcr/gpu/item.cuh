#pragma once
/// \file
/// Vocabulary: `gpu/` (namespace `dcr::gpu`) holds CUDA kernels and their
/// launchers; each has a host twin in `include/dcr/twin/` (namespace
/// `dcr::twin`) with the same semantics, and the GPU tests compare them.
///
/// Apply one decoded `dcr::item` (codec/item.hpp) to a device view: its
/// indices and little-endian value words are copied to the device and
/// scattered (XOR, add or overwrite by the item's encoding). Same checks and
/// errors as the twin `dcr::twin::scatter_item`.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "dcr/codec/item.hpp"
#include "dcr/gpu/runtime.cuh"
#include "dcr/gpu/scatter.cuh"
#include "dcr/twin/scatter.hpp"

namespace dcr::gpu {

/// Upload `it` into `ws` and scatter it onto device view `dst`; synchronises
/// `stream` (the host buffers of `it` must outlive the copies).
template <twin::word W>
status scatter_item(twin::view<W> dst, const item& it, workspace& ws, cudaStream_t stream = 0) {
  DCR_TRY(twin::check_item<W>(it));
  DCR_RETURN_ERROR_IF(static_cast<std::uint64_t>(dst.size()) != it.tensor.numel(), shape_mismatch,
                      it.tensor.name + ": view of " + std::to_string(dst.size()) +
                          " elements, tensor of " + std::to_string(it.tensor.numel()));
  DCR_TRY(detail::check_scatter_args(dst, it.values.data(), it.size()));
  DCR_TRY(require_device());
  if (it.size() == 0) return status::success();
  // Items own their upload area after the 256-byte flag and a CUB-sized gap
  // that `scatter` does not use: [256, +8n) locations, then the words.
  const std::size_t loc_bytes = align256(it.indices.size() * sizeof(std::uint64_t));
  DCR_TRY(ws.reserve(256 + loc_bytes + it.values.size()));
  auto* loc = reinterpret_cast<std::uint64_t*>(ws.data() + 256);
  auto* val = reinterpret_cast<W*>(ws.data() + 256 + loc_bytes);
  DCR_TRY(check(cudaMemcpyAsync(loc, it.indices.data(), it.indices.size() * sizeof(std::uint64_t),
                                cudaMemcpyHostToDevice, stream),
                "cudaMemcpyAsync(item indices)"));
  DCR_TRY(check(
      cudaMemcpyAsync(val, it.values.data(), it.values.size(), cudaMemcpyHostToDevice, stream),
      "cudaMemcpyAsync(item values)"));
  DCR_TRY(scatter(dst, loc, val, it.size(), twin::op_of(it.encoding), ws, stream));
  return synchronize(stream);
}

} // namespace dcr::gpu
