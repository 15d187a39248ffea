#pragma once
/// \file
/// Element maps between a copy's source and destination views, and the
/// strided copy primitive. Delta apply needs the inverse direction: from an
/// active scratch offset (a canonical flat index) back to the coordinate in
/// the copy's source view, then forward to the destination offset.

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include "dcr/core/config.hpp"
#include "dcr/core/dtype.hpp"
#include "dcr/core/tensor.hpp"

namespace dcr {

/// Map from element offsets of a unique source layout to element offsets of
/// a destination layout with the same extents.
///
/// Contract: for every coordinate `c` of the source view,
/// `map(src_base + src.offset(c)) == dst_base + dst.offset(c)`, and `map(o)`
/// is `-1` for every offset `o` that no coordinate reaches. Requires
/// `src.is_unique()` (non-negative strides, each exceeding the span of the
/// dimensions below it), which makes the greedy division below exact.
struct view_inverse {
  std::size_t n = 0; ///< dimensions with extent > 1, by decreasing source stride
  std::array<std::int64_t, max_rank> src_stride{}, extent{}, dst_stride{};
  std::int64_t src_base = 0, span = 0, dst_base = 0;
  /// Both views are contiguous blocks with the same row-major order: the map
  /// is `o - src_base + dst_base` on `[src_base, src_base + span)`.
  bool shift_only = false;

  static view_inverse make(const strided_layout& src, std::int64_t src_base_,
                           const strided_layout& dst, std::int64_t dst_base_) {
    view_inverse v;
    v.src_base = src_base_;
    v.dst_base = dst_base_;
    v.span = src.required_span_size();
    std::array<std::size_t, max_rank> order{};
    for (std::size_t i = 0; i < src.rank; ++i)
      if (src.extents[i] > 1) order[v.n++] = i;
    for (std::size_t k = 1; k < v.n; ++k) // insertion sort by decreasing stride: rank is tiny
      for (std::size_t j = k; j > 0 && src.strides[order[j]] > src.strides[order[j - 1]]; --j)
        std::swap(order[j], order[j - 1]);
    for (std::size_t k = 0; k < v.n; ++k) {
      v.src_stride[k] = src.strides[order[k]];
      v.extent[k] = src.extents[order[k]];
      v.dst_stride[k] = dst.strides[order[k]];
    }
    // Contiguous when the sorted strides are the suffix products of the extents.
    bool contiguous = true;
    std::int64_t s = 1;
    for (std::size_t k = v.n; k-- > 0;) {
      contiguous = contiguous && v.src_stride[k] == s && v.dst_stride[k] == s;
      s *= v.extent[k];
    }
    v.shift_only = contiguous;
    return v;
  }

  /// Destination offset for source offset `o`, or -1 when `o` is outside the view.
  constexpr DCR_HOST_DEVICE std::int64_t map(std::int64_t o) const noexcept {
    std::int64_t rel = o - src_base;
    if (rel < 0 || rel >= span) return -1;
    std::int64_t d = dst_base;
    for (std::size_t k = 0; k < n; ++k) {
      const std::int64_t c = rel / src_stride[k];
      if (c >= extent[k]) return -1;
      rel -= c * src_stride[k];
      d += c * dst_stride[k];
    }
    return rel == 0 ? d : -1;
  }

  /// The entries `for_each_sorted` visits, a block at a time: from
  /// `idx[from]` on (strictly increasing offsets), writes `j` and
  /// `map(idx[j])` of each offset the view reaches into `out_j[i]`,
  /// `out_e[i]` until `cap` are written or the offsets run out, sets `from`
  /// past the last offset it looked at and returns how many it wrote (0 only
  /// when `from` reached `count`). Views whose innermost source stride is 1
  /// (row or column blocks of a row-major tensor, any destination layout)
  /// take a division only when the walk enters a new row; other views fall
  /// back to `map`. No callback: the caller's loop over the block keeps its
  /// own state in registers (see `apply_mapped_entries`).
  std::size_t map_sorted(const std::uint64_t* idx, std::size_t count, std::size_t& from,
                         std::size_t* out_j, std::int64_t* out_e, std::size_t cap) const noexcept {
    // Locals: the output stores may alias this view's fields and `from`.
    const std::int64_t sb = src_base, sp = span, db = dst_base;
    std::size_t j = from, w = 0;
    if (shift_only) { // whole rows on both sides: every offset inside the span maps
      const std::int64_t shift = db - sb;
      const auto lo = static_cast<std::uint64_t>(sb), hi = static_cast<std::uint64_t>(sb + sp);
      while (j < count && idx[j] < lo) ++j;
      for (; j < count && w < cap; ++j) {
        const auto o = idx[j];
        if (o >= hi) { // sorted: no later offset maps either
          j = count;
          break;
        }
        out_j[w] = j;
        out_e[w] = static_cast<std::int64_t>(o) + shift;
        ++w;
      }
    } else if (n == 1 && src_stride[0] == 1) {
      const std::int64_t e0 = extent[0], d0 = dst_stride[0];
      for (; j < count && w < cap; ++j) {
        const std::int64_t rel = static_cast<std::int64_t>(idx[j]) - sb;
        out_j[w] = j;
        out_e[w] = db + rel * d0;
        // 0 <= rel < e0 in one unsigned test; branch-free as below.
        w += static_cast<std::size_t>(static_cast<std::uint64_t>(rel) <
                                      static_cast<std::uint64_t>(e0));
      }
    } else if (n == 2 && src_stride[1] == 1) {
      const std::int64_t s0 = src_stride[0], e1 = extent[1], d0 = dst_stride[0], d1 = dst_stride[1];
      std::int64_t row_start = 0, row_end = -1, row_dst = 0;
      for (; j < count && w < cap; ++j) {
        const std::int64_t rel = static_cast<std::int64_t>(idx[j]) - sb;
        if (rel < 0 || rel >= sp) continue;
        if (rel >= row_end) {
          const std::int64_t row = rel / s0;
          row_start = row * s0;
          row_end = row_start + s0;
          row_dst = db + row * d0;
        }
        // A column block (TP's column split) drops the entries of the other
        // ranks' columns, in an order as random as the changes: an append
        // that always writes and advances by the test costs no mispredicted
        // branch (`w < cap` keeps the slot in bounds).
        const std::int64_t col = rel - row_start;
        out_j[w] = j;
        out_e[w] = row_dst + col * d1;
        w += static_cast<std::size_t>(col < e1);
      }
    } else {
      for (; j < count && w < cap; ++j) {
        const std::int64_t e = map(static_cast<std::int64_t>(idx[j]));
        if (e < 0) continue;
        out_j[w] = j;
        out_e[w] = e;
        ++w;
      }
    }
    from = j;
    return w;
  }

  /// Calls `f(j, map(idx[j]))` for every `j < count` whose offset the view
  /// reaches, in order, for strictly increasing `idx` (`map_sorted` a block
  /// at a time).
  template <class F>
  void for_each_sorted(const std::uint64_t* idx, std::size_t count, F&& f) const {
    constexpr std::size_t block = 256;
    std::size_t js[block];
    std::int64_t es[block];
    for (std::size_t from = 0; from < count;) {
      const std::size_t m = map_sorted(idx, count, from, js, es, block);
      for (std::size_t k = 0; k < m; ++k) f(js[k], es[k]);
    }
  }
};

/// Calls `f(dst_offset, src_offset)` for every coordinate of two layouts with
/// equal extents, in row-major coordinate order (an odometer: no divisions).
template <class F>
void for_each_offset_pair(const strided_layout& dst, const strided_layout& src, F&& f) {
  const std::size_t r = dst.rank;
  for (std::size_t i = 0; i < r; ++i)
    if (dst.extents[i] == 0) return;
  if (r == 0) {
    f(std::int64_t{0}, std::int64_t{0});
    return;
  }
  std::array<std::int64_t, max_rank> c{};
  std::int64_t d = 0, s = 0;
  const std::int64_t inner = dst.extents[r - 1], ds = dst.strides[r - 1], ss = src.strides[r - 1];
  for (;;) {
    for (std::int64_t k = 0; k < inner; ++k) f(d + k * ds, s + k * ss);
    std::size_t dim = r - 1;
    for (;;) {
      if (dim == 0) return;
      --dim;
      ++c[dim];
      d += dst.strides[dim];
      s += src.strides[dim];
      if (c[dim] < dst.extents[dim]) break;
      d -= c[dim] * dst.strides[dim];
      s -= c[dim] * src.strides[dim];
      c[dim] = 0;
    }
  }
}

/// Plain strided copy of `src` into `dst` (equal extents and dtypes; not checked here).
inline void strided_copy(const tensor_view& dst, const tensor_view& src) {
  const auto w = static_cast<std::int64_t>(dst.width());
  const auto r = dst.layout.rank;
  if (r > 0 && dst.layout.strides[r - 1] == 1 && src.layout.strides[r - 1] == 1) {
    // Rows are contiguous on both sides: one memcpy per row.
    strided_layout dl = dst.layout, sl = src.layout;
    const std::int64_t row = dl.extents[r - 1];
    dl.extents[r - 1] = 1;
    sl.extents[r - 1] = 1;
    for_each_offset_pair(dl, sl, [&](std::int64_t d, std::int64_t s) {
      std::memcpy(dst.data + d * w, src.data + s * w, static_cast<std::size_t>(row * w));
    });
    return;
  }
  visit_word(static_cast<std::size_t>(w), [&](auto word) {
    using W = decltype(word);
    auto* D = reinterpret_cast<W*>(dst.data);
    auto* S = reinterpret_cast<const W*>(src.data);
    for_each_offset_pair(dst.layout, src.layout,
                         [&](std::int64_t d, std::int64_t s) { D[d] = S[s]; });
  });
}

/// True when two layouts have the same rank and extents.
inline bool same_extents(const strided_layout& a, const strided_layout& b) noexcept {
  if (a.rank != b.rank) return false;
  for (std::size_t i = 0; i < a.rank; ++i)
    if (a.extents[i] != b.extents[i]) return false;
  return true;
}

/// "[a, b, c]" of a layout's extents, for messages.
inline std::string extents_string(const strided_layout& l) {
  std::string s = "[";
  for (std::size_t i = 0; i < l.rank; ++i) s += (i ? ", " : "") + std::to_string(l.extents[i]);
  return s + "]";
}

} // namespace dcr
