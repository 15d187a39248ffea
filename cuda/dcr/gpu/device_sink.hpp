#pragma once
/// \file
/// `dcr::cuda::device_sink`: a receiver storage sink (`storage_sink`,
/// receiver/storage_sink.hpp) that holds every parameter of the rank in device
/// memory and applies each mapped copy's (element, value) pairs there with
/// the scatter kernel `gpu::scatter<E>` (XOR scatter, masked overwrite at the
/// item's active positions, add), for `receiver<Loader, cuda::device_sink>`.
/// Host twin with the same semantics: `twin::device_sink`.
///
/// A plain C++ header (no CUDA types): the receiver and its dispatch table
/// (Boost.Hana) are compiled by the host compiler, the kernels by nvcc in
/// device_sink.cu, which instantiates `scatter` for the three encodings and
/// the four word widths. Link `dcr_cuda_sink_dep` (cuda/meson.build).
///
/// Each `scatter` uploads the pairs, checks the locations on the device and
/// launches, then waits for the stream, so the device copy equals the host
/// store after every receiver call (the tests compare them byte for byte).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "dcr/codec/values.hpp"
#include "dcr/core/error.hpp"
#include "dcr/receiver/storage.hpp"
#include "dcr/receiver/storage_sink.hpp"

namespace dcr::cuda {

class device_sink {
public:
  static constexpr bool mirrors = true;
  static constexpr bool concurrent = false;

  /// No device call until `attach`.
  device_sink();
  ~device_sink();
  device_sink(device_sink&&) noexcept;
  device_sink& operator=(device_sink&&) noexcept;
  device_sink(const device_sink&) = delete;
  device_sink& operator=(const device_sink&) = delete;

  /// Success when a CUDA device can be used here; otherwise why not (the
  /// device tests then report a skip with this message).
  static status available();

  /// Allocate (once) and upload every parameter of `store`.
  status attach(const parameter_store& store);
  /// Upload parameter `p` again.
  status refresh(const parameter_store& store, std::size_t p);
  /// `E` at strictly increasing elements `at` of parameter `p`, on the device.
  template <codec::delta_encoding E, class W>
  status scatter(std::size_t p, std::span<const std::uint64_t> at, std::span<const W> values);

  /// Download parameter `p` into `out` (of its size in bytes).
  status download(std::size_t p, std::span<std::byte> out) const;
  /// Parameters held.
  std::size_t size() const noexcept;
  /// Parameter `p` downloaded (for checks; throws `dcr::error` on a CUDA failure).
  std::vector<std::byte> bytes(std::size_t p) const;
  /// Kernel launches made by `scatter`, and the entries they scattered.
  std::uint64_t scatters() const noexcept;
  std::uint64_t entries() const noexcept;

private:
  struct impl;
  std::unique_ptr<impl> impl_;
};
static_assert(storage_sink<device_sink>);

} // namespace dcr::cuda
