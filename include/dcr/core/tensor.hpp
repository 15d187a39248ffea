#pragma once
/// \file
/// Tensor metadata and strided views (mdspan-like: extents + strides in
/// elements). A layout is a function from coordinates to an element offset:
/// `offset(c) = sum_i c[i] * stride[i]`. Canonical tensors are row-major
/// ("layout_right"); loaders build other views (slices, transposes) over them.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "dcr/core/config.hpp"
#include "dcr/core/dtype.hpp"
#include "dcr/core/error.hpp"

namespace dcr {

/// Name, shape and dtype of a canonical tensor (Hugging Face naming).
struct tensor_meta {
  std::string name;
  std::vector<std::uint64_t> shape;
  dtype_id dtype = dtype_id::bf16;

  /// Number of elements (1 for a scalar).
  std::uint64_t numel() const noexcept {
    return std::accumulate(shape.begin(), shape.end(), std::uint64_t{1},
                           [](std::uint64_t a, std::uint64_t b) { return a * b; });
  }
  /// Bytes of storage.
  std::uint64_t nbytes() const noexcept { return numel() * width_of(dtype); }
  friend bool operator==(const tensor_meta&, const tensor_meta&) = default;
};

/// Largest rank a view supports (HF weights have rank <= 4).
inline constexpr std::size_t max_rank = 6;

/// Extents and strides (in elements). Contract: for every coordinate `c` with
/// `0 <= c[i] < extent[i]`, `offset(c) < required_span_size()`.
struct strided_layout {
  std::size_t rank = 0;
  std::array<std::int64_t, max_rank> extents{};
  std::array<std::int64_t, max_rank> strides{};

  /// Row-major layout of `shape`.
  static strided_layout row_major(std::span<const std::uint64_t> shape) {
    if (shape.size() > max_rank) throw error(errc::invalid_argument, "rank exceeds max_rank");
    strided_layout l;
    l.rank = shape.size();
    std::int64_t s = 1;
    for (std::size_t i = l.rank; i-- > 0;) {
      l.extents[i] = static_cast<std::int64_t>(shape[i]);
      l.strides[i] = s;
      s *= l.extents[i];
    }
    return l;
  }
  static strided_layout row_major(std::initializer_list<std::uint64_t> shape) {
    std::vector<std::uint64_t> v(shape);
    return row_major(v);
  }

  // Members are host-only: kernels take `dcr::twin::layout` (C arrays),
  // so CUDA code needs no relaxed constexpr for std::array.

  /// Number of coordinates.
  constexpr std::int64_t size() const noexcept {
    std::int64_t n = 1;
    for (std::size_t i = 0; i < rank; ++i) n *= extents[i];
    return n;
  }
  /// Offset of a coordinate.
  constexpr std::int64_t offset(const std::int64_t* c) const noexcept {
    std::int64_t o = 0;
    for (std::size_t i = 0; i < rank; ++i) o += c[i] * strides[i];
    return o;
  }
  /// Offset of the `k`-th coordinate in row-major enumeration order of the
  /// view's own extents (0 <= k < size()).
  constexpr std::int64_t offset_of_linear(std::int64_t k) const noexcept {
    std::int64_t o = 0;
    for (std::size_t i = rank; i-- > 0;) {
      const std::int64_t e = extents[i];
      o += (k % e) * strides[i];
      k /= e;
    }
    return o;
  }
  /// Smallest number of elements the underlying storage must hold (0 if empty).
  constexpr std::int64_t required_span_size() const noexcept {
    std::int64_t hi = 0;
    for (std::size_t i = 0; i < rank; ++i) {
      if (extents[i] == 0) return 0;
      hi += (extents[i] - 1) * strides[i];
    }
    return hi + 1;
  }
  /// True when distinct coordinates have distinct offsets. Strides must be
  /// non-negative; checks the sufficient condition that, sorted by stride,
  /// each stride exceeds the span of the dimensions below it.
  bool is_unique() const noexcept {
    std::array<std::size_t, max_rank> order{};
    std::size_t n = 0;
    for (std::size_t i = 0; i < rank; ++i) {
      if (extents[i] == 0) return true;
      if (strides[i] < 0) return false;
      if (extents[i] > 1) order[n++] = i;
    }
    for (std::size_t k = 1; k < n; ++k) // insertion sort: rank is tiny
      for (std::size_t j = k; j > 0 && strides[order[j]] < strides[order[j - 1]]; --j)
        std::swap(order[j], order[j - 1]);
    std::int64_t span = 1;
    for (std::size_t k = 0; k < n; ++k) {
      const auto d = order[k];
      if (strides[d] < span) return false;
      span = strides[d] * (extents[d] - 1) + span;
    }
    return true;
  }
  /// True when the layout is row-major contiguous.
  constexpr bool is_contiguous() const noexcept {
    std::int64_t s = 1;
    for (std::size_t i = rank; i-- > 0;) {
      if (extents[i] != 1 && strides[i] != s) return false;
      s *= extents[i];
    }
    return true;
  }
  /// Sub-range `[start, start+count)` of dimension `dim`; returns the new
  /// layout and adds the element offset of the slice start to `base`.
  strided_layout slice(std::size_t dim, std::int64_t start, std::int64_t count,
                       std::int64_t& base) const {
    if (dim >= rank || start < 0 || count < 0 || start + count > extents[dim])
      throw error(errc::invalid_argument, "slice out of range: dim " + std::to_string(dim) + " [" +
                                              std::to_string(start) + ", +" +
                                              std::to_string(count) + ")");
    strided_layout l = *this;
    l.extents[dim] = count;
    base += start * strides[dim];
    return l;
  }
  /// Layout with dimensions `a` and `b` swapped.
  strided_layout transposed(std::size_t a, std::size_t b) const {
    if (a >= rank || b >= rank) throw error(errc::invalid_argument, "transpose dim out of range");
    strided_layout l = *this;
    std::swap(l.extents[a], l.extents[b]);
    std::swap(l.strides[a], l.strides[b]);
    return l;
  }
  friend bool operator==(const strided_layout& x, const strided_layout& y) noexcept {
    if (x.rank != y.rank) return false;
    for (std::size_t i = 0; i < x.rank; ++i)
      if (x.extents[i] != y.extents[i] || x.strides[i] != y.strides[i]) return false;
    return true;
  }
};

/// Typed strided view over words (or any trivially copyable element).
template <class T>
struct strided_view {
  T* data = nullptr;
  strided_layout layout;

  constexpr std::int64_t size() const noexcept { return layout.size(); }
  template <class... I>
  constexpr T& operator()(I... idx) const noexcept {
    const std::int64_t c[] = {static_cast<std::int64_t>(idx)...};
    return data[layout.offset(c)];
  }
  std::int64_t required_span_size() const noexcept { return layout.required_span_size(); }
  bool is_unique() const noexcept { return layout.is_unique(); }
  strided_view slice(std::size_t dim, std::int64_t start, std::int64_t count) const {
    std::int64_t base = 0;
    auto l = layout.slice(dim, start, count, base);
    return {data + base, l};
  }
  strided_view transposed(std::size_t a, std::size_t b) const {
    return {data, layout.transposed(a, b)};
  }
};

/// Untyped view: bytes, a runtime dtype and a layout in elements. What native
/// loaders pass around, since they handle tensors of any dtype.
struct tensor_view {
  std::byte* data = nullptr;
  dtype_id dtype = dtype_id::bf16;
  strided_layout layout;

  std::int64_t size() const noexcept { return layout.size(); }
  std::size_t width() const noexcept { return width_of(dtype); }
  /// View of dimension `dim` restricted to `[start, start+count)`.
  tensor_view slice(std::size_t dim, std::int64_t start, std::int64_t count) const {
    std::int64_t base = 0;
    auto l = layout.slice(dim, start, count, base);
    return {data + base * static_cast<std::int64_t>(width()), dtype, l};
  }
  tensor_view transposed(std::size_t a, std::size_t b) const {
    return {data, dtype, layout.transposed(a, b)};
  }
  /// Typed view; throws when `D` is not this view's dtype.
  template <storage_dtype D>
  strided_view<word_t<D>> as() const {
    if (dtype_traits<D>::id != dtype)
      throw error(errc::bad_dtype, "view is " + std::string(name_of(dtype)) + ", not " +
                                       std::string(name_of(dtype_traits<D>::id)));
    return {reinterpret_cast<word_t<D>*>(data), layout};
  }
  /// Byte range [lo, hi) of storage this view may touch.
  std::pair<const std::byte*, const std::byte*> byte_range() const noexcept {
    const auto n = layout.required_span_size();
    return {data, data + n * static_cast<std::int64_t>(width())};
  }
};

/// Owning contiguous canonical tensor (row-major), used by tests, the trainer
/// simulator and dense refit.
struct host_tensor {
  tensor_meta meta;
  std::vector<std::byte> bytes;

  host_tensor() = default;
  explicit host_tensor(tensor_meta m) : meta(std::move(m)), bytes(meta.nbytes()) {}
  tensor_view view() { return {bytes.data(), meta.dtype, strided_layout::row_major(meta.shape)}; }
  template <storage_dtype D>
  std::span<word_t<D>> words() {
    if (dtype_traits<D>::id != meta.dtype)
      throw error(errc::bad_dtype, meta.name + ": dtype mismatch");
    return {reinterpret_cast<word_t<D>*>(bytes.data()), bytes.size() / sizeof(word_t<D>)};
  }
};

} // namespace dcr
