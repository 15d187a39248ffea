#pragma once
/// \file
/// Vocabulary: `gpu/` (namespace `dcr::gpu`) holds CUDA kernels and their
/// launchers; each has a host twin in `include/dcr/twin/` (namespace
/// `dcr::twin`) with the same semantics, and the GPU tests compare them.
///
/// Apply one item table row of a decompressed payload body to a device view
/// straight from its wire sections: the row's location bytes (any coding)
/// and value bytes (plain or byte planes) are uploaded as they are, decoded
/// and scattered on the device. Twin: `dcr::twin::scatter_row`
/// (`dcr/twin/row.hpp`); same checks, same errors, same bits.
///
/// Includes only the payload format (codec/payload_format.hpp: no Boost, no
/// zstd; BLAKE2 for the digest check); unlike `item.cuh` it uploads only the
/// wire bytes (about 1-2 bytes per location instead of 8).

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include "dcr/codec/payload_format.hpp"
#include "dcr/gpu/locations.cuh"
#include "dcr/gpu/runtime.cuh"
#include "dcr/twin/row.hpp"

namespace dcr::gpu {

/// Upload row `i`'s sections of `body` (host memory) into `ws` and scatter
/// them onto device view `dst`; synchronises `stream`.
template <twin::word W>
status scatter_row(twin::view<W> dst, std::span<const std::byte> body,
                   const codec::payload_header& h, const codec::item_row& row, std::size_t i,
                   workspace& ws, cudaStream_t stream = 0) {
  std::span<const std::uint8_t> loc, val;
  DCR_TRY(twin::row_sections<W>(body, h, row, static_cast<std::uint64_t>(dst.size()), loc, val));
  const auto fail_row = [&](const status& s) { return twin::row_error(s, h, row, i); };
  DCR_TRY(fail_row(twin::check_encoded_args(dst, val.data(), val.size(), row.count)));
  if (row.count == 0) {
    if (!loc.empty())
      return fail_row(codec::detail::length_error(codec::to_string(row.location), loc.size(), 0));
    return status::success();
  }
  bool done = false;
  DCR_TRY(
      fail_row(twin::precheck_locations(row.location, loc.size(), row.first,
                                        static_cast<std::uint64_t>(dst.size()), row.count, done)));
  detail::device_facts f;
  DCR_TRY(detail::prepare(dst.data, nullptr, nullptr, f));
  // Workspace: [0, +loc) location bytes, [.., +val) value bytes, then the decode.
  const std::size_t val_at = align256(loc.size());
  const std::size_t base = val_at + align256(val.size());
  detail::decode_layout L;
  DCR_TRY(detail::plan_encoded(row.location, loc.size(), row.count, base, L, stream));
  DCR_TRY(ws.reserve(L.total));
  auto* d_loc = reinterpret_cast<std::uint8_t*>(ws.data());
  auto* d_val = reinterpret_cast<std::uint8_t*>(ws.data() + val_at);
  if (!loc.empty())
    DCR_TRY(check(cudaMemcpyAsync(d_loc, loc.data(), loc.size(), cudaMemcpyHostToDevice, stream),
                  "cudaMemcpyAsync(row locations)"));
  DCR_TRY(check(cudaMemcpyAsync(d_val, val.data(), val.size(), cudaMemcpyHostToDevice, stream),
                "cudaMemcpyAsync(row values)"));
  DCR_TRY(fail_row(detail::scatter_encoded_planned(
      dst, row.first, row.count, row.location, d_loc, loc.size(), d_val, twin::row_planes(row),
      twin::op_of(row.encoding), done, L, f, ws, stream)));
  return synchronize(stream);
}

} // namespace dcr::gpu
