#pragma once
/// \file
/// Vocabulary: `gpu/` (namespace `dcr::gpu`) holds CUDA kernels and their
/// launchers; each has a host twin in `include/dcr/twin/` (namespace
/// `dcr::twin`) with the same semantics, and the GPU tests compare them.
///
/// `device_loader_sink`: the rollout side's `dcr::copy_sink` interface
/// (receiver/loader.hpp) over device storage, so a native loader's copies
/// into GPU-resident parameters are intercepted and applied by the device
/// kernels (dense, XOR, add, overwrite with the dtype's placeholder, or overwrite
/// where the source is not NaN). Like every sink it never throws from
/// `copy`: the first failure is kept and reported by `finish()`, and later
/// copies are not applied (the attempt fails anyway).
///

#include <cuda_runtime.h>

#include <string>
#include <string_view>
#include <vector>

#include "dcr/core/error.hpp"
#include "dcr/core/tensor.hpp"
#include "dcr/gpu/copy.cuh"
#include "dcr/receiver/loader.hpp"
#include "dcr/twin/view.hpp"

namespace dcr::gpu {

/// Intercepting sink for a native loader writing device storage from device scratch.
class device_loader_sink final : public copy_sink {
public:
  /// `mode` is dense, xor_mask, add, overwrite (placeholder: the default of
  /// `dtype`) or overwrite_nan; overwrite_mask needs a mask per copy and is
  /// refused (`invalid_argument`, thrown).
  device_loader_sink(twin::copy_mode mode, dtype_id dtype, cudaStream_t stream = 0)
      : sink_(mode, placeholder_of(dtype), stream, dtype) {
    if (mode == twin::copy_mode::overwrite_mask || static_cast<unsigned>(mode) > 5)
      throw error(errc::invalid_argument,
                  "device_loader_sink: mode needs a per-copy mask or is unknown");
  }

  void copy(const tensor_view& dst, const tensor_view& src) override {
    if (!first_failure_.ok()) return;
    if (dst.dtype != src.dtype) {
      // (void): nvcc flags assignment of a [[nodiscard]] type as a discarded result.
      (void)(first_failure_ = fail(errc::loader_condition,
                                   "copy from " + std::string(name_of(src.dtype)) + " into " +
                                       std::string(name_of(dst.dtype)) + " storage"));
      return;
    }
    const auto w = static_cast<unsigned>(dst.width());
    status s = sink_.copy({dst.data, w, twin::to_device(dst.layout)},
                          {src.data, w, twin::to_device(src.layout)});
    if (!s.ok()) (void)(first_failure_ = std::move(s));
  }
  void skip(std::string_view canonical) override { skipped_.emplace_back(canonical); }

  /// First failure of any copy, else the stream's completion status.
  status finish() const {
    if (!first_failure_.ok()) return first_failure_;
    return sink_.synchronize();
  }
  std::uint64_t copies() const noexcept { return sink_.copies(); }
  std::uint64_t elements() const noexcept { return sink_.elements(); }
  const std::vector<std::string>& skipped() const noexcept { return skipped_; }

private:
  static std::uint64_t placeholder_of(dtype_id d) {
    const auto i = info(d);
    if (!i) throw error(errc::bad_dtype, "device_loader_sink: unknown dtype id");
    return i->placeholder;
  }

  device_copy_sink sink_;
  status first_failure_;
  std::vector<std::string> skipped_;
};

} // namespace dcr::gpu
