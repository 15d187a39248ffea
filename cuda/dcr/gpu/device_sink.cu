// The device sink's CUDA side (see device_sink.hpp).
#include "dcr/gpu/device_sink.hpp"

#include <cuda_runtime.h>

#include <vector>

#include "dcr/gpu/runtime.cuh"
#include "dcr/gpu/scatter.cuh"
#include "dcr/twin/element.hpp"

namespace dcr::cuda {

namespace {
/// Device memory freed with cudaFree.
struct device_buffer {
  void* ptr = nullptr;
  std::size_t bytes = 0;
  device_buffer() = default;
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  device_buffer(device_buffer&& o) noexcept : ptr(o.ptr), bytes(o.bytes) { o.ptr = nullptr; }
  ~device_buffer() {
    if (ptr) cudaFree(ptr);
  }
  /// At least `n` bytes (contents not kept).
  status reserve(std::size_t n, const char* what) {
    if (n <= bytes && ptr) return status::success();
    if (ptr) cudaFree(ptr);
    ptr = nullptr;
    bytes = 0;
    DCR_TRY(gpu::check(cudaMalloc(&ptr, n ? n : 1), what));
    bytes = n;
    return status::success();
  }
};
} // namespace

struct device_sink::impl {
  std::vector<device_buffer> params;
  std::vector<std::size_t> sizes;
  device_buffer locations, values;
  gpu::workspace ws;
  std::uint64_t scatters = 0, entries = 0;
};

device_sink::device_sink() : impl_(std::make_unique<impl>()) {}
device_sink::~device_sink() = default;
device_sink::device_sink(device_sink&&) noexcept = default;
device_sink& device_sink::operator=(device_sink&&) noexcept = default;

status device_sink::available() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  DCR_RETURN_ERROR_IF(e != cudaSuccess, io,
                      std::string("no usable CUDA device: ") + cudaGetErrorString(e));
  DCR_RETURN_ERROR_IF(n == 0, io, "no CUDA device on this machine");
  return status::success();
}

status device_sink::attach(const parameter_store& store) {
  auto& m = *impl_;
  if (m.params.size() != store.size()) {
    m.params.clear();
    m.params.resize(store.size());
    m.sizes.assign(store.size(), 0);
  }
  for (std::size_t p = 0; p < store.size(); ++p) DCR_TRY(refresh(store, p));
  return status::success();
}

status device_sink::refresh(const parameter_store& store, std::size_t p) {
  auto& m = *impl_;
  DCR_RETURN_ERROR_IF(p >= m.params.size(), invalid_argument,
                      "device sink: parameter " + std::to_string(p) + " not attached");
  const auto& b = store[p].bytes;
  DCR_TRY(m.params[p].reserve(b.size(), "cudaMalloc(parameter)"));
  m.sizes[p] = b.size();
  if (!b.empty())
    DCR_TRY(gpu::check(cudaMemcpy(m.params[p].ptr, b.data(), b.size(), cudaMemcpyHostToDevice),
                       "cudaMemcpy(parameter upload)"));
  return status::success();
}

template <codec::delta_encoding E, class W>
status device_sink::scatter(std::size_t p, std::span<const std::uint64_t> at,
                            std::span<const W> values) {
  auto& m = *impl_;
  DCR_RETURN_ERROR_IF(p >= m.params.size(), invalid_argument,
                      "device sink: parameter " + std::to_string(p) + " not attached");
  DCR_RETURN_ERROR_IF(at.size() != values.size(), invalid_argument,
                      "device sink: locations and values differ in count");
  if (at.empty()) return status::success();
  DCR_TRY(m.locations.reserve(at.size_bytes(), "cudaMalloc(locations)"));
  DCR_TRY(m.values.reserve(values.size_bytes(), "cudaMalloc(values)"));
  DCR_TRY(
      gpu::check(cudaMemcpy(m.locations.ptr, at.data(), at.size_bytes(), cudaMemcpyHostToDevice),
                 "cudaMemcpy(locations)"));
  DCR_TRY(gpu::check(
      cudaMemcpy(m.values.ptr, values.data(), values.size_bytes(), cudaMemcpyHostToDevice),
      "cudaMemcpy(values)"));
  const twin::view<W> dst{static_cast<W*>(m.params[p].ptr),
                          twin::linear(static_cast<std::int64_t>(m.sizes[p] / sizeof(W)))};
  DCR_TRY((gpu::scatter<E, W>(dst, static_cast<const std::uint64_t*>(m.locations.ptr),
                              static_cast<const W*>(m.values.ptr), at.size(), m.ws)));
  DCR_TRY(gpu::synchronize(0));
  ++m.scatters;
  m.entries += at.size();
  return status::success();
}

status device_sink::download(std::size_t p, std::span<std::byte> out) const {
  const auto& m = *impl_;
  DCR_RETURN_ERROR_IF(p >= m.params.size() || out.size() != m.sizes[p], invalid_argument,
                      "device sink: download of parameter " + std::to_string(p));
  if (out.empty()) return status::success();
  return gpu::check(cudaMemcpy(out.data(), m.params[p].ptr, out.size(), cudaMemcpyDeviceToHost),
                    "cudaMemcpy(parameter download)");
}

std::size_t device_sink::size() const noexcept { return impl_->params.size(); }

std::vector<std::byte> device_sink::bytes(std::size_t p) const {
  std::vector<std::byte> out(p < impl_->sizes.size() ? impl_->sizes[p] : 0);
  throw_if_failed(download(p, out));
  return out;
}

std::uint64_t device_sink::scatters() const noexcept { return impl_->scatters; }
std::uint64_t device_sink::entries() const noexcept { return impl_->entries; }

#define DCR_DEVICE_SINK_SCATTER(E, W)                                                              \
  template status device_sink::scatter<E, W>(std::size_t, std::span<const std::uint64_t>,          \
                                             std::span<const W>);
#define DCR_DEVICE_SINK_WORDS(E)                                                                   \
  DCR_DEVICE_SINK_SCATTER(E, std::uint8_t)                                                         \
  DCR_DEVICE_SINK_SCATTER(E, std::uint16_t)                                                        \
  DCR_DEVICE_SINK_SCATTER(E, std::uint32_t)                                                        \
  DCR_DEVICE_SINK_SCATTER(E, std::uint64_t)
DCR_DEVICE_SINK_WORDS(codec::xor_mask)
DCR_DEVICE_SINK_WORDS(codec::overwrite)
DCR_DEVICE_SINK_WORDS(codec::add)
#undef DCR_DEVICE_SINK_WORDS
#undef DCR_DEVICE_SINK_SCATTER

} // namespace dcr::cuda
