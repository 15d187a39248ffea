#pragma once
/// \file
/// Element-level pieces shared by the CUDA kernels (`cuda/dcr/cuda/*.cuh`) and
/// their host twins (`dcr/device/*.hpp`): a plain layout with C arrays (usable
/// in kernels without relaxed-constexpr), the word operations, and the gap
/// location decode. Everything here is `constexpr DCR_HOST_DEVICE`,
/// allocation-free and exception-free, so a kernel and its twin run the same
/// code per element. Includes only core/config.hpp and core/dtype.hpp.

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "dcr/core/config.hpp"
#include "dcr/core/dtype.hpp"

namespace dcr::device {

/// Largest rank of a device layout; equals `dcr::max_rank` (checked in view.hpp).
inline constexpr int layout_max_rank = 6;

/// Extents and strides in elements, like `dcr::strided_layout`, but trivially
/// copyable with C arrays so it can be a kernel parameter. `contiguous` caches
/// the row-major-contiguous test so that the common case maps `k -> k` without
/// 64-bit divisions.
struct layout {
  int rank = 0;
  bool contiguous = true;
  std::int64_t extents[layout_max_rank] = {};
  std::int64_t strides[layout_max_rank] = {};

  /// Number of coordinates (1 for rank 0).
  constexpr DCR_HOST_DEVICE std::int64_t size() const noexcept {
    std::int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= extents[i];
    return n;
  }
  /// Element offset of the `k`-th coordinate in row-major order of the
  /// layout's own extents (0 <= k < size()). The contract is the one of
  /// `strided_layout::offset_of_linear`.
  constexpr DCR_HOST_DEVICE std::int64_t offset_of_linear(std::int64_t k) const noexcept {
    if (contiguous) return k;
    std::int64_t o = 0;
    for (int i = rank; i-- > 0;) {
      const std::int64_t e = extents[i];
      const std::int64_t q = k / e;
      o += (k - q * e) * strides[i];
      k = q;
    }
    return o;
  }
  /// Smallest number of elements the storage must hold (0 when empty).
  constexpr DCR_HOST_DEVICE std::int64_t required_span_size() const noexcept {
    std::int64_t hi = 0;
    for (int i = 0; i < rank; ++i) {
      if (extents[i] == 0) return 0;
      hi += (extents[i] - 1) * strides[i];
    }
    return hi + 1;
  }
  /// True when every extent is >= 0 and every stride >= 0.
  constexpr DCR_HOST_DEVICE bool is_non_negative() const noexcept {
    if (rank < 0 || rank > layout_max_rank) return false;
    for (int i = 0; i < rank; ++i)
      if (extents[i] < 0 || strides[i] < 0) return false;
    return true;
  }
  /// True when distinct coordinates have distinct offsets (same sufficient
  /// test as `strided_layout::is_unique`). Required of every destination:
  /// XOR through an aliasing view cancels itself, and racing writes are
  /// unordered.
  constexpr DCR_HOST_DEVICE bool is_unique() const noexcept {
    int order[layout_max_rank] = {};
    int n = 0;
    for (int i = 0; i < rank; ++i) {
      if (extents[i] == 0) return true;
      if (strides[i] < 0) return false;
      if (extents[i] > 1) order[n++] = i;
    }
    for (int a = 1; a < n; ++a)
      for (int b = a; b > 0 && strides[order[b]] < strides[order[b - 1]]; --b) {
        const int t = order[b];
        order[b] = order[b - 1];
        order[b - 1] = t;
      }
    std::int64_t span = 1;
    for (int a = 0; a < n; ++a) {
      const int d = order[a];
      if (strides[d] < span) return false;
      span = strides[d] * (extents[d] - 1) + span;
    }
    return true;
  }
  /// True when the strides are exactly row-major for the extents.
  constexpr DCR_HOST_DEVICE bool is_row_major() const noexcept {
    std::int64_t s = 1;
    for (int i = rank; i-- > 0;) {
      if (extents[i] != 1 && strides[i] != s) return false;
      s *= extents[i];
    }
    return true;
  }
  /// True when both layouts have the same rank and extents (strides may differ).
  constexpr DCR_HOST_DEVICE bool same_extents(const layout& o) const noexcept {
    if (rank != o.rank) return false;
    for (int i = 0; i < rank; ++i)
      if (extents[i] != o.extents[i]) return false;
    return true;
  }
};

/// Row-major layout of `extents[0..rank)`; `rank` must be <= layout_max_rank.
constexpr DCR_HOST_DEVICE layout row_major(const std::int64_t* extents, int rank) noexcept {
  layout l;
  l.rank = rank;
  std::int64_t s = 1;
  for (int i = rank; i-- > 0;) {
    l.extents[i] = extents[i];
    l.strides[i] = s;
    s *= extents[i];
  }
  l.contiguous = true;
  return l;
}

/// Layout with the given extents and strides; `contiguous` is computed.
constexpr DCR_HOST_DEVICE layout strided(const std::int64_t* extents, const std::int64_t* strides,
                                         int rank) noexcept {
  layout l;
  l.rank = rank;
  for (int i = 0; i < rank; ++i) {
    l.extents[i] = extents[i];
    l.strides[i] = strides[i];
  }
  l.contiguous = l.is_row_major();
  return l;
}

/// One-dimensional contiguous layout of `n` elements.
constexpr DCR_HOST_DEVICE layout linear(std::int64_t n) noexcept {
  layout l;
  l.rank = 1;
  l.extents[0] = n;
  l.strides[0] = 1;
  l.contiguous = true;
  return l;
}

/// Words plus a layout; the memory may be host or device memory.
template <class W> struct view {
  W* data = nullptr;
  layout shape;

  constexpr DCR_HOST_DEVICE std::int64_t size() const noexcept { return shape.size(); }
  /// Element at row-major linear coordinate `k`.
  constexpr DCR_HOST_DEVICE W& at(std::int64_t k) const noexcept { return data[shape.offset_of_linear(k)]; }
};

/// A stored word of 1, 2, 4 or 8 bytes.
template <class W>
concept word = std::is_same_v<W, std::uint8_t> || std::is_same_v<W, std::uint16_t> ||
               std::is_same_v<W, std::uint32_t> || std::is_same_v<W, std::uint64_t>;

/// How a scattered value lands. Numeric values equal `dcr::value_encoding`.
enum class scatter_op : std::uint8_t {
  xor_mask = 1,  ///< dst ^= value
  overwrite = 2, ///< dst = value
};

/// How a copy from a source view into a destination view lands (the three
/// modes of the intercepting copy sink, plus the explicit-mask overwrite).
enum class copy_mode : std::uint8_t {
  dense = 0,          ///< dst = src
  xor_mask = 1,       ///< dst ^= src
  overwrite = 2,      ///< dst = src where src != placeholder
  overwrite_mask = 3, ///< dst = src where mask != 0 (NaN-valued items)
  overwrite_nan = 4,  ///< dst = src where src is not a NaN of the dtype (any NaN is the placeholder)
};

/// NaN test of a dtype as two masks: a word is NaN when all `exponent` bits
/// are set and some `mantissa` bit is set. For f8e4m3fn (NaN only at
/// S.1111.111) both masks are 0x7F, which states exactly that.
struct nan_rule {
  std::uint64_t exponent = 0;
  std::uint64_t mantissa = 0;
};

/// NaN rule of a dtype (an unknown id gives a rule that matches nothing).
constexpr DCR_HOST_DEVICE nan_rule nan_rule_of(dtype_id id) noexcept {
  switch (id) {
  case dtype_id::bf16: return {dtype_traits<bf16>::exponent_mask, dtype_traits<bf16>::mantissa_mask};
  case dtype_id::f16: return {dtype_traits<f16>::exponent_mask, dtype_traits<f16>::mantissa_mask};
  case dtype_id::f32: return {dtype_traits<f32>::exponent_mask, dtype_traits<f32>::mantissa_mask};
  case dtype_id::f8e4m3fn: return {0x7F, 0x7F};
  case dtype_id::f8e5m2: return {dtype_traits<f8e5m2>::exponent_mask, dtype_traits<f8e5m2>::mantissa_mask};
  }
  return {0, 0};
}

/// True when `w` is NaN under `r`.
template <class W> constexpr DCR_HOST_DEVICE bool is_nan_by(W w, nan_rule r) noexcept {
  const auto v = static_cast<std::uint64_t>(w);
  return r.mantissa != 0 && (v & r.exponent) == r.exponent && (v & r.mantissa) != 0;
}

/// Result of scattering `value` onto resident word `dst`.
template <word W> constexpr DCR_HOST_DEVICE W scatter_word(W dst, W value, scatter_op op) noexcept {
  return op == scatter_op::xor_mask ? static_cast<W>(dst ^ value) : value;
}

/// Width in bytes of gap words (1, 2, 4 or 8); anything else is not a width.
constexpr DCR_HOST_DEVICE bool is_gap_width(unsigned width) noexcept {
  return width == 1 || width == 2 || width == 4 || width == 8;
}

/// The `j`-th little-endian gap word of `width` bytes. Assembled from bytes:
/// the gap buffer is a slice of the location buffer and carries no alignment.
constexpr DCR_HOST_DEVICE std::uint64_t load_gap(const std::uint8_t* gaps, unsigned width,
                                                 std::uint64_t j) noexcept {
  const std::uint8_t* p = gaps + j * width;
  std::uint64_t g = 0;
  for (unsigned b = 0; b < width; ++b) g |= static_cast<std::uint64_t>(p[b]) << (8 * b);
  return g;
}

/// Term `k` of the inclusive scan that yields locations from gaps:
/// `first` for k = 0, else `gap_{k-1} + 1`, so that
/// `index_k = index_{k-1} + gap_k + 1` (the shared gap semantics; the k-th
/// record uses the (k-1)-th stored gap word).
constexpr DCR_HOST_DEVICE std::uint64_t gap_scan_term(std::uint64_t first, const std::uint8_t* gaps,
                                                      unsigned width, std::uint64_t k) noexcept {
  return k == 0 ? first : load_gap(gaps, width, k - 1) + 1;
}

/// Smallest gap width (1, 2, 4 or 8) that holds `max_gap`.
constexpr DCR_HOST_DEVICE unsigned gap_width_for(std::uint64_t max_gap) noexcept {
  return max_gap <= 0xFFu ? 1u : max_gap <= 0xFFFFu ? 2u : max_gap <= 0xFFFFFFFFu ? 4u : 8u;
}

/// "No failure" marker of the location checks below.
inline constexpr std::uint64_t no_failure = ~std::uint64_t{0};

/// Check of record `k` of a location list: returns 0 when fine, 1 when
/// `loc[k] >= size` (out of range), 2 when `k > 0 && loc[k] <= loc[k-1]`
/// (not strictly increasing; also catches a wrapped 64-bit sum).
constexpr DCR_HOST_DEVICE int check_location(const std::uint64_t* loc, std::uint64_t k,
                                             std::uint64_t size) noexcept {
  if (k > 0 && loc[k] <= loc[k - 1]) return 2;
  if (loc[k] >= size) return 1;
  return 0;
}

} // namespace dcr::device
