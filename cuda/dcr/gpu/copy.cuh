#pragma once
/// \file
/// Vocabulary: `gpu/` (namespace `dcr::gpu`) holds CUDA kernels and their
/// launchers; each has a host twin in `include/dcr/twin/` (namespace
/// `dcr::twin`) with the same semantics, and the GPU tests compare them.
///
/// Device elementwise copy of a source view into a destination view in the
/// intercepting sink's modes (dense, XOR, overwrite where src is not the
/// placeholder, overwrite where an explicit mask is set), `masked_overwrite`,
/// and `device_copy_sink`, the sink the loader model calls when scratch and
/// storage live in device memory. Host twin: `dcr/twin/copy.hpp`.
///
/// Layering: entry (checks shared with the twin) → dispatch (contiguous and
/// 16-byte aligned → vector kernel over 16-byte chunks; else the strided
/// kernel) → grid-stride kernels with 64-bit indexing. In the overwrite
/// modes inactive positions are never stored to (no read-modify-write of a
/// chunk), so overwrite copies into interleaved views of one tensor on
/// different streams stay correct; dense and XOR store every position.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "dcr/core/error.hpp"
#include "dcr/gpu/runtime.cuh"
#include "dcr/twin/check.hpp"
#include "dcr/twin/element.hpp"

namespace dcr::gpu {

namespace detail {

/// Strided copy: any layouts with equal extents.
template <twin::word W>
__global__ void copy_strided_kernel(twin::view<W> dst, twin::view<const W> src,
                                    twin::view<const std::uint8_t> mask, twin::copy_mode mode,
                                    W placeholder, twin::nan_rule nan, std::uint64_t n) {
  for (std::uint64_t k = grid_first(); k < n; k += grid_stride()) {
    const auto i = static_cast<std::int64_t>(k);
    const W s = src.at(i);
    switch (mode) {
    case twin::copy_mode::dense:
      dst.at(i) = s;
      break;
    case twin::copy_mode::xor_mask: {
      W& d = dst.at(i);
      d = static_cast<W>(d ^ s);
      break;
    }
    case twin::copy_mode::overwrite:
      if (s != placeholder) dst.at(i) = s;
      break;
    case twin::copy_mode::overwrite_mask:
      if (mask.at(i) != 0) dst.at(i) = s;
      break;
    case twin::copy_mode::overwrite_nan:
      if (!twin::is_nan_by(s, nan)) dst.at(i) = s;
      break;
    case twin::copy_mode::add: {
      W& d = dst.at(i);
      d = apply_zigzag_delta(d, s);
      break;
    }
    }
  }
}

/// 16 bytes as words.
template <twin::word W>
union chunk {
  uint4 v;
  W w[16 / sizeof(W)];
};

/// Active word of the placeholder overwrite modes.
template <twin::word W>
__device__ inline bool is_active(W s, twin::copy_mode mode, W placeholder, twin::nan_rule nan) {
  return mode == twin::copy_mode::overwrite ? s != placeholder : !twin::is_nan_by(s, nan);
}

/// Contiguous, 16-byte aligned copy over `chunks` 16-byte chunks (dense,
/// XOR, add, overwrite, overwrite_nan); the tail of fewer than one chunk goes to
/// the strided kernel.
template <twin::word W>
__global__ void copy_vector_kernel(W* DCR_RESTRICT dst, const W* DCR_RESTRICT src,
                                   twin::copy_mode mode, W placeholder, twin::nan_rule nan,
                                   std::uint64_t chunks) {
  constexpr int per = 16 / sizeof(W);
  auto* d4 = reinterpret_cast<uint4*>(dst);
  const auto* s4 = reinterpret_cast<const uint4*>(src);
  for (std::uint64_t c = grid_first(); c < chunks; c += grid_stride()) {
    chunk<W> s;
    s.v = s4[c];
    if (mode == twin::copy_mode::dense) {
      d4[c] = s.v;
    } else if (mode == twin::copy_mode::xor_mask) {
      uint4 d = d4[c];
      d.x ^= s.v.x, d.y ^= s.v.y, d.z ^= s.v.z, d.w ^= s.v.w;
      d4[c] = d;
    } else if (mode == twin::copy_mode::add) {
      chunk<W> d;
      d.v = d4[c];
#pragma unroll
      for (int j = 0; j < per; ++j) d.w[j] = apply_zigzag_delta(d.w[j], s.w[j]);
      d4[c] = d.v;
    } else {
      int active = 0;
#pragma unroll
      for (int j = 0; j < per; ++j) active += is_active(s.w[j], mode, placeholder, nan);
      if (active == per) {
        d4[c] = s.v;
      } else if (active != 0) {
#pragma unroll
        for (int j = 0; j < per; ++j)
          if (is_active(s.w[j], mode, placeholder, nan)) dst[c * per + j] = s.w[j];
      }
    }
  }
}

template <twin::word W>
status launch_copy(twin::view<W> dst, twin::view<const W> src, twin::copy_mode mode, W placeholder,
                   twin::view<const std::uint8_t> mask, twin::nan_rule nan, const device_facts& f,
                   cudaStream_t stream) {
  const auto n = static_cast<std::uint64_t>(dst.size());
  if (n == 0) return status::success();
  const bool aligned =
      (reinterpret_cast<std::uintptr_t>(dst.data) | reinterpret_cast<std::uintptr_t>(src.data)) %
          16 ==
      0;
  std::uint64_t done = 0;
  if (dst.shape.contiguous && src.shape.contiguous && aligned &&
      mode != twin::copy_mode::overwrite_mask) {
    constexpr std::uint64_t per = 16 / sizeof(W);
    const std::uint64_t chunks = n / per;
    if (chunks > 0) {
      const tuning t = select_tuning(kernel_kind::copy_vector, f.cc_major);
      copy_vector_kernel<W><<<grid_for(chunks, 1, t, f), t.block_threads, 0, stream>>>(
          dst.data, src.data, mode, placeholder, nan, chunks);
      DCR_TRY(check_launch("copy_vector_kernel"));
    }
    done = chunks * per;
    if (done == n) return status::success();
    // Tail: a contiguous piece after the chunks.
    dst = {dst.data + done, twin::linear(static_cast<std::int64_t>(n - done))};
    src = {src.data + done, twin::linear(static_cast<std::int64_t>(n - done))};
  }
  const tuning t = select_tuning(kernel_kind::copy_scalar, f.cc_major);
  copy_strided_kernel<W><<<grid_for(n - done, 1, t, f), t.block_threads, 0, stream>>>(
      dst, src, mask, mode, placeholder, nan, n - done);
  return check_launch("copy_strided_kernel");
}

} // namespace detail

/// Copy device view `src` into device view `dst` in `mode`; `placeholder`
/// is used by `overwrite`, `mask` (same extents as `src`) by
/// `overwrite_mask`, `nan_dtype` by `overwrite_nan`. Returns after the launch.
template <twin::word W>
status copy(twin::view<W> dst, std::type_identity_t<twin::view<const W>> src, twin::copy_mode mode,
            W placeholder = 0, twin::view<const std::uint8_t> mask = {},
            dtype_id nan_dtype = dtype_id::bf16, cudaStream_t stream = 0) {
  DCR_TRY(twin::check_copy(dst, src, mode, mask, nan_dtype));
  detail::device_facts f;
  DCR_TRY(detail::prepare(dst.data, src.data,
                          mode == twin::copy_mode::overwrite_mask ? mask.data : nullptr, f));
  return detail::launch_copy(dst, src, mode, placeholder, mask, twin::nan_rule_of(nan_dtype), f,
                             stream);
}

/// Write `src` into `dst` where `src != placeholder` (device memory).
template <twin::word W>
status masked_overwrite(twin::view<W> dst, std::type_identity_t<twin::view<const W>> src,
                        W placeholder, cudaStream_t stream = 0) {
  return copy(dst, src, twin::copy_mode::overwrite, placeholder, {}, dtype_id::bf16, stream);
}

/// Write `src` into `dst` where `src` is not a NaN of `dtype` (device memory).
template <twin::word W>
status masked_overwrite_nan(twin::view<W> dst, std::type_identity_t<twin::view<const W>> src,
                            dtype_id dtype, cudaStream_t stream = 0) {
  return copy(dst, src, twin::copy_mode::overwrite_nan, W{0}, {}, dtype, stream);
}

/// Write `src` into `dst` where `mask != 0` (device memory; for NaN-valued items).
template <twin::word W>
status masked_overwrite(twin::view<W> dst, std::type_identity_t<twin::view<const W>> src,
                        twin::view<const std::uint8_t> mask, cudaStream_t stream = 0) {
  return copy(dst, src, twin::copy_mode::overwrite_mask, W{0}, mask, dtype_id::bf16, stream);
}

/// Untyped device view: what a native loader hands the sink. `width` is
/// the word width in bytes (1, 2, 4 or 8).
struct device_tensor {
  void* data = nullptr;
  unsigned width = 2;
  twin::layout shape;
};

/// Intercepting copy sink for device storage. A loader calls
/// `copy(dst, src)` for every final storage write; the sink applies it in
/// its mode on `stream` and counts what it did, so the receiver can compare
/// intercepted copies with the loader's reported loads. The overwrite mode
/// takes the placeholder word (zero-extended) of the item's dtype; the
/// masked mode takes, per copy, a mask view shaped like `src`; the NaN mode
/// takes the dtype whose NaN patterns are placeholders.
class device_copy_sink {
public:
  explicit device_copy_sink(twin::copy_mode mode, std::uint64_t placeholder = 0,
                            cudaStream_t stream = 0, dtype_id nan_dtype = dtype_id::bf16)
      : mode_(mode), placeholder_(placeholder), stream_(stream), nan_dtype_(nan_dtype) {}

  /// Apply one intercepted copy; both views must have the same word width.
  status copy(const device_tensor& dst, const device_tensor& src,
              twin::view<const std::uint8_t> mask = {}) {
    DCR_RETURN_ERROR_IF(dst.width != src.width, bad_dtype,
                        "sink copy: destination words of " + std::to_string(dst.width) +
                            " bytes, source words of " + std::to_string(src.width));
    status s = by_width(dst, src, mask);
    if (s.ok()) {
      ++copies_;
      elements_ += static_cast<std::uint64_t>(dst.shape.size());
    }
    return s;
  }
  /// Wait for every copy issued so far.
  status synchronize() const { return gpu::synchronize(stream_); }

  twin::copy_mode mode() const noexcept { return mode_; }
  std::uint64_t copies() const noexcept { return copies_; }
  std::uint64_t elements() const noexcept { return elements_; }

private:
  status by_width(const device_tensor& dst, const device_tensor& src,
                  twin::view<const std::uint8_t> mask) {
    if (is_word_width(dst.width))
      return visit_word(dst.width,
                        [&](auto word) { return typed<decltype(word)>(dst, src, mask); });
    return fail(errc::bad_dtype, "sink copy: word width " + std::to_string(dst.width));
  }

  template <twin::word W>
  status typed(const device_tensor& dst, const device_tensor& src,
               twin::view<const std::uint8_t> mask) {
    DCR_RETURN_ERROR_IF(mode_ == twin::copy_mode::overwrite && placeholder_ > static_cast<W>(~W{0}),
                        invalid_argument, "sink: placeholder wider than the words");
    return gpu::copy<W>({static_cast<W*>(dst.data), dst.shape},
                        {static_cast<const W*>(src.data), src.shape}, mode_,
                        static_cast<W>(placeholder_), mask, nan_dtype_, stream_);
  }

  twin::copy_mode mode_;
  std::uint64_t placeholder_;
  cudaStream_t stream_;
  dtype_id nan_dtype_;
  std::uint64_t copies_ = 0, elements_ = 0;
};

} // namespace dcr::gpu
