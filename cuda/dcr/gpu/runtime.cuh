#pragma once
/// \file
/// Vocabulary: `gpu/` (namespace `dcr::gpu`) holds CUDA kernels and their
/// launchers; each has a host twin in `include/dcr/twin/` (namespace
/// `dcr::twin`) with the same semantics, and the GPU tests compare them.
///
/// CUDA runtime plumbing shared by the kernels: error mapping to
/// `dcr::errc::device`, device and pointer checks, a reusable device
/// workspace, and the stateless launch-tuning selector (tuning as values, so
/// each kernel has one instantiation per word type, not one per tuning).

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "dcr/core/error.hpp"

namespace dcr::gpu {

/// `errc::device` status for a failed CUDA call, naming the call and the error.
inline status check(cudaError_t e, std::string_view what) {
  if (e == cudaSuccess) return status::success();
  return fail(errc::device,
              std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

/// Clear a non-sticky error left by earlier unrelated calls, so that the
/// next `cudaGetLastError()` reports only what this library launched.
inline void clear_last_error() noexcept { (void)cudaGetLastError(); }

/// Status of the launch just made (configuration or launch errors).
inline status check_launch(std::string_view kernel) { return check(cudaGetLastError(), kernel); }

/// Number of CUDA devices; 0 when there is none or no usable driver.
inline int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    clear_last_error();
    return 0;
  }
  return n;
}

/// Fails with `errc::device` unless a device is present.
inline status require_device() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    clear_last_error();
    return check(e, "cudaGetDeviceCount");
  }
  DCR_RETURN_ERROR_IF(n == 0, device, "no CUDA device");
  return status::success();
}

/// Fails with `errc::invalid_argument` unless `p` (when non-null) is memory
/// the device can address: device, managed, or mapped pinned host memory.
inline status check_device_pointer(const void* p, std::string_view what) {
  if (p == nullptr) return status::success();
  cudaPointerAttributes a{};
  const cudaError_t e = cudaPointerGetAttributes(&a, p);
  if (e != cudaSuccess) {
    clear_last_error();
    return check(e, std::string(what) + ": cudaPointerGetAttributes");
  }
  DCR_RETURN_ERROR_IF(a.type == cudaMemoryTypeUnregistered, invalid_argument,
                      std::string(what) + ": pointer is not device-accessible memory");
  return status::success();
}

/// Wait for `stream` and report any asynchronous error of its work.
inline status synchronize(cudaStream_t stream = 0) {
  return check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

/// Device memory reused across calls (CUB temporary storage, decoded
/// locations, check flags). Grows, never shrinks; freed in the destructor.
/// Use one workspace per stream: calls on one stream are ordered, so a call
/// may reuse what the previous call's kernels still read; calls on two
/// streams sharing a workspace would race.
class workspace {
public:
  workspace() = default;
  workspace(const workspace&) = delete;
  workspace& operator=(const workspace&) = delete;
  ~workspace() {
    if (data_ != nullptr) (void)cudaFree(data_);
  }

  /// Make at least `bytes` bytes available.
  status reserve(std::size_t bytes) {
    if (bytes <= size_) return status::success();
    if (data_ != nullptr) {
      DCR_TRY(check(cudaFree(data_), "cudaFree(workspace)"));
      data_ = nullptr;
      size_ = 0;
    }
    void* p = nullptr;
    DCR_TRY(check(cudaMalloc(&p, bytes),
                  "cudaMalloc(workspace of " + std::to_string(bytes) + " bytes)"));
    data_ = static_cast<std::byte*>(p);
    size_ = bytes;
    return status::success();
  }
  std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }

private:
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

/// Round `n` up to a multiple of 256 (CUB and vector loads want aligned parts).
constexpr std::size_t align256(std::size_t n) noexcept { return (n + 255) / 256 * 256; }

namespace detail {

/// What a launch is for; the selector returns tuning values per kind.
enum class kernel_kind { scatter, check, copy_vector, copy_scalar };

/// Launch shape: threads per block and resident blocks per SM to aim for.
/// Grid-stride loops cover any length with at most `sms * blocks_per_sm` blocks.
struct tuning {
  int block_threads = 256;
  int blocks_per_sm = 8;
};

/// Stateless tuning selector by kernel kind and compute capability major.
constexpr tuning select_tuning(kernel_kind kind, int cc_major) noexcept {
  // Memory-bound kernels: enough resident warps to cover HBM latency.
  // sm_90 has more bandwidth per SM, so more bytes in flight per SM.
  const int per_sm = cc_major >= 9 ? 16 : 8;
  switch (kind) {
  case kernel_kind::scatter:
    return {256, per_sm};
  case kernel_kind::check:
    return {256, per_sm};
  case kernel_kind::copy_vector:
    return {256, per_sm};
  case kernel_kind::copy_scalar:
    return {256, per_sm};
  }
  return {};
}

/// Properties of the current device that the dispatch layer needs.
struct device_facts {
  int sms = 1;
  int cc_major = 8;
};

inline status current_device_facts(device_facts& f) {
  int dev = 0;
  DCR_TRY(check(cudaGetDevice(&dev), "cudaGetDevice"));
  DCR_TRY(check(cudaDeviceGetAttribute(&f.sms, cudaDevAttrMultiProcessorCount, dev),
                "cudaDeviceGetAttribute(MultiProcessorCount)"));
  DCR_TRY(check(cudaDeviceGetAttribute(&f.cc_major, cudaDevAttrComputeCapabilityMajor, dev),
                "cudaDeviceGetAttribute(ComputeCapabilityMajor)"));
  return status::success();
}

/// Device, error state and pointers ready for a launch.
inline status prepare(const void* a, const void* b, const void* c, device_facts& f) {
  DCR_TRY(require_device());
  clear_last_error();
  DCR_TRY(check_device_pointer(a, "first buffer"));
  DCR_TRY(check_device_pointer(b, "second buffer"));
  DCR_TRY(check_device_pointer(c, "third buffer"));
  return current_device_facts(f);
}

/// Blocks for `work` items of `per_thread` items each, capped for grid-stride loops.
constexpr unsigned grid_for(std::uint64_t work, std::uint64_t per_thread, const tuning& t,
                            const device_facts& f) noexcept {
  const std::uint64_t per_block = static_cast<std::uint64_t>(t.block_threads) * per_thread;
  const std::uint64_t need = (work + per_block - 1) / per_block;
  const std::uint64_t cap =
      static_cast<std::uint64_t>(f.sms) * static_cast<std::uint64_t>(t.blocks_per_sm);
  return static_cast<unsigned>(std::max<std::uint64_t>(1, std::min(need, cap)));
}

/// First index and stride of a 64-bit grid-stride loop.
__device__ inline std::uint64_t grid_first() noexcept {
  return static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline std::uint64_t grid_stride() noexcept {
  return static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
}

} // namespace detail
} // namespace dcr::gpu
