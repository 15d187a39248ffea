#pragma once
/// \file
/// Vocabulary: `gpu/` (namespace `dcr::gpu`) holds CUDA kernels and their
/// launchers; each has a host twin in `include/dcr/twin/` (namespace
/// `dcr::twin`) with the same semantics, and the GPU tests compare them.
///
/// Device change detection, the trainer-side GPU path: compare two device
/// word buffers and write `base + i` for every `i` whose stored bits differ,
/// in increasing order, with a CUB `DeviceSelect::If` over a counting
/// iterator (64-bit item counts). Host twin: `dcr/twin/detect.hpp`.

#include <cub/device/device_select.cuh>
#include <cuda_runtime.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_output_iterator.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "dcr/core/error.hpp"
#include "dcr/gpu/runtime.cuh"
#include "dcr/twin/element.hpp"

namespace dcr::gpu {

namespace detail {

/// Selects index i when the two words differ.
template <twin::word W>
struct differs {
  const W* a;
  const W* b;
  __host__ __device__ bool operator()(std::uint64_t i) const { return a[i] != b[i]; }
};

/// Adds the flat base of the buffer to a selected index.
struct add_base {
  std::uint64_t base;
  __host__ __device__ std::uint64_t operator()(std::uint64_t i) const { return base + i; }
};

} // namespace detail

/// Write `base + i` to `d_out` for every `i < n` with `d_old[i] != d_new[i]`
/// and the number written to `changed` (host). `d_out` must hold `n` words
/// (the worst case). Synchronises `stream` to read the count.
template <twin::word W>
status detect_changes(const W* d_old, const W* d_new, std::uint64_t n, std::uint64_t base,
                      std::uint64_t* d_out, std::uint64_t& changed, workspace& ws,
                      cudaStream_t stream = 0) {
  changed = 0;
  DCR_RETURN_ERROR_IF(n > 0 && (d_old == nullptr || d_new == nullptr || d_out == nullptr),
                      invalid_argument, "detect_changes: null buffer");
  DCR_RETURN_ERROR_IF(n > static_cast<std::uint64_t>(INT64_MAX), length_overflow,
                      "detect_changes: " + std::to_string(n) + " words exceed int64");
  DCR_RETURN_ERROR_IF(n != 0 && base > UINT64_MAX - (n - 1), length_overflow,
                      "detect_changes: base + length overflows 64 bits");
  DCR_TRY(require_device());
  clear_last_error();
  DCR_TRY(check_device_pointer(d_old, "detect_changes old words"));
  DCR_TRY(check_device_pointer(d_new, "detect_changes new words"));
  DCR_TRY(check_device_pointer(d_out, "detect_changes output"));
  if (n == 0) return status::success();
  const thrust::counting_iterator<std::uint64_t> in(0);
  auto out = thrust::make_transform_output_iterator(d_out, detail::add_base{base});
  const detail::differs<W> pred{d_old, d_new};
  const auto items = static_cast<std::int64_t>(n);
  std::size_t temp = 0;
  DCR_TRY(
      check(cub::DeviceSelect::If(nullptr, temp, in, out, static_cast<unsigned long long*>(nullptr),
                                  items, pred, stream),
            "cub::DeviceSelect::If(size)"));
  DCR_TRY(ws.reserve(256 + align256(temp)));
  auto* count = reinterpret_cast<unsigned long long*>(ws.data());
  DCR_TRY(check(cub::DeviceSelect::If(ws.data() + 256, temp, in, out, count, items, pred, stream),
                "cub::DeviceSelect::If"));
  unsigned long long host_count = 0;
  DCR_TRY(
      check(cudaMemcpyAsync(&host_count, count, sizeof host_count, cudaMemcpyDeviceToHost, stream),
            "cudaMemcpyAsync(selected count)"));
  DCR_TRY(synchronize(stream));
  changed = host_count;
  return status::success();
}

/// `detect_changes` with a temporary workspace.
template <twin::word W>
status detect_changes(const W* d_old, const W* d_new, std::uint64_t n, std::uint64_t base,
                      std::uint64_t* d_out, std::uint64_t& changed, cudaStream_t stream = 0) {
  workspace ws;
  return detect_changes(d_old, d_new, n, base, d_out, changed, ws, stream);
}

} // namespace dcr::gpu
