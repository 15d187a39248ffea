#pragma once
/// \file
/// Vocabulary: `gpu/` (namespace `dcr::gpu`) holds CUDA kernels and their
/// launchers; each has a host twin in `include/dcr/twin/` (namespace
/// `dcr::twin`) with the same semantics, and the GPU tests compare them.
///
/// Device scatter of one item's records into a strided device view: XOR
/// masks in (`xor_scatter`), add zigzag integer differences (`add_scatter`,
/// `scatter_op::add`) or write values (`scatter_op::overwrite`), from
/// decoded locations, from a run, or fused with the gap decode (a CUB
/// `DeviceScan` over `gap + 1`) so that only the item's compressed-then-
/// decoded buffers need to cross PCIe. Host twin: `dcr/twin/scatter.hpp`
/// (same checks, same errors, same bits).
///
/// Layering: public entry (argument checks, identical to the twin) →
/// dispatch (device facts, tuning values, workspace) → short grid-stride
/// kernels with 64-bit indexing. Every location is checked on the device
/// before the first write, so a bad list leaves the destination unchanged.

#include <cub/device/device_scan.cuh>
#include <cuda_runtime.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>

#include <cstddef>
#include <cstdint>

#include "dcr/codec/values.hpp"
#include "dcr/core/error.hpp"
#include "dcr/gpu/runtime.cuh"
#include "dcr/twin/check.hpp"
#include "dcr/twin/element.hpp"

namespace dcr::gpu {

namespace detail {

/// Smallest `(k << 2) | code` over failing records (see `twin::check_location`).
/// A template only so that the header can be included by several translation
/// units of one program (templates have vague linkage).
template <class Key = unsigned long long>
__global__ void check_locations_kernel(const std::uint64_t* DCR_RESTRICT loc, std::uint64_t n,
                                       std::uint64_t size, Key* DCR_RESTRICT fail_key) {
  for (std::uint64_t k = grid_first(); k < n; k += grid_stride()) {
    const int c = twin::check_location(loc, k, size);
    if (c != 0) atomicMin(fail_key, static_cast<Key>((k << 2) | static_cast<unsigned>(c)));
  }
}

/// Record k lands at `loc[k]`, or at `start + k` when `loc` is null (a run):
/// the resident word becomes `E::apply(resident, values[k])` (`E`: the
/// codec's `xor_mask`, `overwrite` or `add`, the types the host apply uses).
template <codec::delta_encoding E, twin::word W>
__global__ void scatter_kernel(twin::view<W> dst, const std::uint64_t* DCR_RESTRICT loc,
                               std::uint64_t start, const W* DCR_RESTRICT values, std::uint64_t n) {
  for (std::uint64_t k = grid_first(); k < n; k += grid_stride()) {
    const std::uint64_t l = loc != nullptr ? loc[k] : start + k;
    W& d = dst.at(static_cast<std::int64_t>(l));
    d = E::apply(d, values[k]);
  }
}

/// Scan input term k of the gap decode.
struct gap_term {
  std::uint64_t first;
  const std::uint8_t* gaps;
  unsigned width;
  __host__ __device__ std::uint64_t operator()(std::uint64_t k) const {
    return twin::gap_scan_term(first, gaps, width, k);
  }
};

/// Wrapping 64-bit sum (a wrap is caught afterwards as "not increasing").
struct add_u64 {
  __host__ __device__ std::uint64_t operator()(std::uint64_t a, std::uint64_t b) const {
    return a + b;
  }
};

/// Checks shared by every scatter entry before any CUDA call beyond the
/// device query: destination, value pointer, count.
template <twin::word W>
status check_scatter_args(const twin::view<W>& dst, const void* values, std::uint64_t count) {
  DCR_TRY(twin::check_destination_view(dst.shape, dst.data, "scatter destination"));
  DCR_RETURN_ERROR_IF(count > 0 && values == nullptr, invalid_argument, "scatter: null values");
  return status::success();
}

/// Check `n` device locations against `size`, using `ws` bytes [0, 256) for the flag.
inline status check_device_locations(const std::uint64_t* loc, std::uint64_t n, std::uint64_t size,
                                     const device_facts& f, workspace& ws, cudaStream_t stream) {
  if (n == 0) return status::success();
  auto* key = reinterpret_cast<unsigned long long*>(ws.data());
  DCR_TRY(check(cudaMemsetAsync(key, 0xFF, sizeof *key, stream), "cudaMemsetAsync(check flag)"));
  const tuning t = select_tuning(kernel_kind::check, f.cc_major);
  check_locations_kernel<unsigned long long>
      <<<grid_for(n, 1, t, f), t.block_threads, 0, stream>>>(loc, n, size, key);
  DCR_TRY(check_launch("check_locations_kernel"));
  unsigned long long host_key = 0;
  DCR_TRY(check(cudaMemcpyAsync(&host_key, key, sizeof host_key, cudaMemcpyDeviceToHost, stream),
                "cudaMemcpyAsync(check flag)"));
  DCR_TRY(synchronize(stream));
  if (host_key != twin::no_failure)
    return twin::location_failure(static_cast<int>(host_key & 3u), host_key >> 2, size);
  return status::success();
}

template <codec::delta_encoding E, twin::word W>
status launch_scatter(const twin::view<W>& dst, const std::uint64_t* loc, std::uint64_t start,
                      const W* values, std::uint64_t n, const device_facts& f,
                      cudaStream_t stream) {
  if (n == 0) return status::success();
  const tuning t = select_tuning(kernel_kind::scatter, f.cc_major);
  scatter_kernel<E, W>
      <<<grid_for(n, 1, t, f), t.block_threads, 0, stream>>>(dst, loc, start, values, n);
  return check_launch("scatter_kernel");
}

/// The runtime `scatter_op` of the older entry points, turned into its
/// encoding type once per launch.
template <twin::word W>
status launch_scatter(const twin::view<W>& dst, const std::uint64_t* loc, std::uint64_t start,
                      const W* values, std::uint64_t n, twin::scatter_op op, const device_facts& f,
                      cudaStream_t stream) {
  return codec::visit_encoding(static_cast<value_encoding>(op), [&](auto e) {
    return launch_scatter<decltype(e), W>(dst, loc, start, values, n, f, stream);
  });
}

} // namespace detail

/// Scatter `count` records (`d_locations[k]`, `d_values[k]`) onto `dst`,
/// applying encoding `E` (`codec::xor_mask`, `codec::overwrite`,
/// `codec::add`); all pointers in device memory. Locations are checked on
/// the device first (strictly increasing, inside the view); on failure
/// nothing is written. Returns after the launch; call `synchronize(stream)`
/// before reading. Host twin: `twin::scatter<E>`.
template <codec::delta_encoding E, twin::word W>
status scatter(twin::view<W> dst, const std::uint64_t* d_locations, const W* d_values,
               std::uint64_t count, workspace& ws, cudaStream_t stream = 0) {
  DCR_TRY(detail::check_scatter_args(dst, d_values, count));
  DCR_RETURN_ERROR_IF(count > 0 && d_locations == nullptr, invalid_argument,
                      "scatter: null locations");
  detail::device_facts f;
  DCR_TRY(detail::prepare(dst.data, d_locations, d_values, f));
  if (count == 0) return status::success();
  DCR_TRY(ws.reserve(256));
  DCR_TRY(detail::check_device_locations(d_locations, count, static_cast<std::uint64_t>(dst.size()),
                                         f, ws, stream));
  return detail::launch_scatter<E, W>(dst, d_locations, 0, d_values, count, f, stream);
}

/// `scatter<E>` for the encoding as a runtime `scatter_op` (numerically a
/// `value_encoding`), turned into its type once.
template <twin::word W>
status scatter(twin::view<W> dst, const std::uint64_t* d_locations, const W* d_values,
               std::uint64_t count, twin::scatter_op op, workspace& ws, cudaStream_t stream = 0) {
  return codec::visit_encoding(static_cast<value_encoding>(op), [&](auto e) {
    return scatter<decltype(e), W>(dst, d_locations, d_values, count, ws, stream);
  });
}

/// `scatter` with a temporary workspace.
template <twin::word W>
status scatter(twin::view<W> dst, const std::uint64_t* d_locations, const W* d_values,
               std::uint64_t count, twin::scatter_op op = twin::scatter_op::xor_mask,
               cudaStream_t stream = 0) {
  workspace ws;
  return scatter(dst, d_locations, d_values, count, op, ws, stream);
}

/// XOR `d_masks[k]` into `dst` at `d_locations[k]`.
template <twin::word W>
status xor_scatter(twin::view<W> dst, const std::uint64_t* d_locations, const W* d_masks,
                   std::uint64_t count, workspace& ws, cudaStream_t stream = 0) {
  return scatter(dst, d_locations, d_masks, count, twin::scatter_op::xor_mask, ws, stream);
}

/// Add zigzag differences `d_deltas[k]` (`dcr::zigzag_delta`) into `dst` at
/// `d_locations[k]`, modulo 2^w: the device twin of `twin::add_scatter`.
template <twin::word W>
status add_scatter(twin::view<W> dst, const std::uint64_t* d_locations, const W* d_deltas,
                   std::uint64_t count, workspace& ws, cudaStream_t stream = 0) {
  return scatter(dst, d_locations, d_deltas, count, twin::scatter_op::add, ws, stream);
}

/// Scatter onto the run `[start, start + count)` (checked on the host).
template <twin::word W>
status scatter_run(twin::view<W> dst, std::uint64_t start, const W* d_values, std::uint64_t count,
                   twin::scatter_op op = twin::scatter_op::xor_mask, cudaStream_t stream = 0) {
  DCR_TRY(detail::check_scatter_args(dst, d_values, count));
  DCR_TRY(twin::check_run(start, count, static_cast<std::uint64_t>(dst.size())));
  detail::device_facts f;
  DCR_TRY(detail::prepare(dst.data, d_values, nullptr, f));
  return detail::launch_scatter<W>(dst, nullptr, start, d_values, count, op, f, stream);
}

/// Decode `count` gap-coded locations on the device into `d_out` (device
/// memory, `count` words): `d_out[0] = first`, `d_out[k] = d_out[k-1] +
/// gap_{k-1} + 1`. Checks width and buffer length; not the range.
inline status decode_gaps(std::uint64_t first, unsigned width, const std::uint8_t* d_gaps,
                          std::uint64_t gap_bytes, std::uint64_t count, std::uint64_t* d_out,
                          workspace& ws, cudaStream_t stream = 0) {
  DCR_TRY(twin::check_gap_buffer(width, gap_bytes, count));
  DCR_RETURN_ERROR_IF(count > 0 && d_out == nullptr, invalid_argument, "decode_gaps: null output");
  DCR_RETURN_ERROR_IF(count > 1 && d_gaps == nullptr, invalid_argument, "decode_gaps: null gaps");
  detail::device_facts f;
  DCR_TRY(detail::prepare(d_gaps, d_out, nullptr, f));
  if (count == 0) return status::success();
  auto in = thrust::make_transform_iterator(thrust::counting_iterator<std::uint64_t>(0),
                                            detail::gap_term{first, d_gaps, width});
  std::size_t temp = 0;
  DCR_TRY(check(
      cub::DeviceScan::InclusiveScan(nullptr, temp, in, d_out, detail::add_u64{}, count, stream),
      "cub::DeviceScan::InclusiveScan(size)"));
  DCR_TRY(ws.reserve(align256(temp) + 256));
  // Bytes [0, 256) of the workspace stay free for the check flag.
  DCR_TRY(check(cub::DeviceScan::InclusiveScan(ws.data() + 256, temp, in, d_out, detail::add_u64{},
                                               count, stream),
                "cub::DeviceScan::InclusiveScan"));
  return status::success();
}

/// Fused gap decode and scatter: `count` records with first index `first`
/// and `count - 1` gap words of `width` bytes at `d_gaps` (`gap_bytes`
/// long); values at `d_values`. Decoded locations live in `ws`.
template <twin::word W>
status scatter_gaps(twin::view<W> dst, std::uint64_t first, unsigned width,
                    const std::uint8_t* d_gaps, std::uint64_t gap_bytes, const W* d_values,
                    std::uint64_t count, twin::scatter_op op, workspace& ws,
                    cudaStream_t stream = 0) {
  DCR_TRY(detail::check_scatter_args(dst, d_values, count));
  DCR_TRY(twin::check_gap_buffer(width, gap_bytes, count));
  DCR_RETURN_ERROR_IF(count > 1 && d_gaps == nullptr, invalid_argument, "scatter_gaps: null gaps");
  detail::device_facts f;
  DCR_TRY(detail::prepare(dst.data, d_gaps, d_values, f));
  if (count == 0) return status::success();
  // Workspace: [0, 256) flag, then CUB temp storage, then the locations.
  auto in = thrust::make_transform_iterator(thrust::counting_iterator<std::uint64_t>(0),
                                            detail::gap_term{first, d_gaps, width});
  std::size_t temp = 0;
  DCR_TRY(
      check(cub::DeviceScan::InclusiveScan(nullptr, temp, in, static_cast<std::uint64_t*>(nullptr),
                                           detail::add_u64{}, count, stream),
            "cub::DeviceScan::InclusiveScan(size)"));
  const std::size_t loc_at = 256 + align256(temp);
  DCR_TRY(ws.reserve(loc_at + count * sizeof(std::uint64_t)));
  auto* loc = reinterpret_cast<std::uint64_t*>(ws.data() + loc_at);
  DCR_TRY(check(cub::DeviceScan::InclusiveScan(ws.data() + 256, temp, in, loc, detail::add_u64{},
                                               count, stream),
                "cub::DeviceScan::InclusiveScan"));
  DCR_TRY(detail::check_device_locations(loc, count, static_cast<std::uint64_t>(dst.size()), f, ws,
                                         stream));
  return detail::launch_scatter(dst, loc, 0, d_values, count, op, f, stream);
}

} // namespace dcr::gpu
