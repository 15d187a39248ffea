#pragma once
/// \file
/// Vocabulary: `twin/` (namespace `dcr::twin`) holds the host twins of the GPU
/// kernels in `cuda/dcr/gpu/` (namespace `dcr::gpu`) and the element-level code
/// both share; a twin has its kernel's semantics, checks and errors, runs in
/// CI, and the GPU tests compare the two.
///
/// Host twin of the CUDA scatter kernels (`cuda/dcr/gpu/scatter.cuh`):
/// records (location, value) of one item land in a destination view, XORed
/// in (`codec::xor_mask`), added as zigzag integer differences (`codec::add`,
/// "add scatter") or written (`codec::overwrite`): the loops run
/// `E::apply` of the codec's encoding type, as the kernels and the host apply
/// do; entry points that take a runtime `scatter_op` (numerically a
/// `value_encoding`) turn it into the type once. A location is a row-major
/// flat index into the view's own extents.
///
/// Semantics shared with the kernels: the destination is checked first
/// (`check_destination_view`), then the record counts, then every location
/// (strictly increasing, inside the view); on any failure nothing is written
/// and the status names the first failing record. The fused forms take the
/// item's location coding directly: a run (start, count) or gap words of
/// width 1/2/4/8 with `index_k = index_{k-1} + gap_k + 1`, first index given.

#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "dcr/codec/item.hpp"
#include "dcr/codec/values.hpp"
#include "dcr/core/error.hpp"
#include "dcr/twin/check.hpp"
#include "dcr/twin/element.hpp"
#include "dcr/twin/view.hpp"

namespace dcr::twin {

/// Check a decoded location list against a view of `size` elements.
inline status check_locations(std::span<const std::uint64_t> loc, std::uint64_t size) {
  for (std::uint64_t k = 0; k < loc.size(); ++k)
    if (const int c = check_location(loc.data(), k, size); c != 0)
      return location_failure(c, k, size);
  return status::success();
}

/// Decode gap words into locations: `out[0] = first`,
/// `out[k] = out[k-1] + gap_{k-1} + 1`. Fails with `bad_location` /
/// `offset_out_of_range` for a bad width or buffer length; does not check
/// the range (see `check_locations`).
inline status decode_gaps(std::uint64_t first, unsigned width, std::span<const std::uint8_t> gaps,
                          std::uint64_t count, std::vector<std::uint64_t>& out) {
  DCR_TRY(check_gap_buffer(width, gaps.size(), count));
  out.resize(count);
  std::uint64_t acc = 0;
  for (std::uint64_t k = 0; k < count; ++k) {
    acc += gap_scan_term(first, gaps.data(), width, k);
    out[k] = acc;
  }
  return status::success();
}

/// Scatter `values[k]` onto `dst` at row-major location `locations[k]`:
/// the resident word becomes `E::apply(resident, values[k])` (`E`: the
/// codec's `xor_mask`, `overwrite` or `add`). Host twin of the kernel
/// `gpu::scatter<E>`.
template <codec::delta_encoding E, word W>
status scatter(view<W> dst, std::span<const std::uint64_t> locations,
               std::type_identity_t<std::span<const W>> values) {
  DCR_TRY(check_destination_view(dst.shape, dst.data, "scatter destination"));
  DCR_RETURN_ERROR_IF(locations.size() != values.size(), invalid_argument,
                      std::to_string(locations.size()) + " locations but " +
                          std::to_string(values.size()) + " values");
  const auto size = static_cast<std::uint64_t>(dst.size());
  DCR_TRY(check_locations(locations, size));
  for (std::size_t k = 0; k < locations.size(); ++k) {
    W& d = dst.at(static_cast<std::int64_t>(locations[k]));
    d = E::apply(d, values[k]);
  }
  return status::success();
}

/// As above with the encoding as a runtime `scatter_op` (numerically a
/// `value_encoding`), turned into its type once here.
template <word W>
status scatter(view<W> dst, std::span<const std::uint64_t> locations,
               std::type_identity_t<std::span<const W>> values,
               scatter_op op = scatter_op::xor_mask) {
  return codec::visit_encoding(static_cast<value_encoding>(op), [&](auto e) {
    return scatter<decltype(e), W>(dst, locations, values);
  });
}

/// XOR `masks[k]` into `dst` at row-major location `locations[k]`.
template <word W>
status xor_scatter(view<W> dst, std::span<const std::uint64_t> locations,
                   std::type_identity_t<std::span<const W>> masks) {
  return scatter(dst, locations, masks, scatter_op::xor_mask);
}

/// Add zigzag differences `deltas[k]` (`dcr::zigzag_delta`) into `dst` at
/// row-major location `locations[k]`, modulo 2^w.
template <word W>
status add_scatter(view<W> dst, std::span<const std::uint64_t> locations,
                   std::type_identity_t<std::span<const W>> deltas) {
  return scatter(dst, locations, deltas, scatter_op::add);
}

/// Scatter onto the run `[start, start + values.size())`.
template <word W>
status scatter_run(view<W> dst, std::uint64_t start,
                   std::type_identity_t<std::span<const W>> values,
                   scatter_op op = scatter_op::xor_mask) {
  DCR_TRY(check_destination_view(dst.shape, dst.data, "scatter destination"));
  DCR_TRY(check_run(start, values.size(), static_cast<std::uint64_t>(dst.size())));
  codec::visit_encoding(static_cast<value_encoding>(op), [&](auto e) {
    using E = decltype(e);
    for (std::size_t k = 0; k < values.size(); ++k) {
      W& d = dst.at(static_cast<std::int64_t>(start + k));
      d = E::apply(d, values[k]);
    }
  });
  return status::success();
}

/// Scatter onto gap-coded locations: `values.size()` records, first index
/// `first`, `values.size() - 1` little-endian gap words of `width` bytes.
template <word W>
status scatter_gaps(view<W> dst, std::uint64_t first, unsigned width,
                    std::span<const std::uint8_t> gaps,
                    std::type_identity_t<std::span<const W>> values,
                    scatter_op op = scatter_op::xor_mask) {
  DCR_TRY(check_destination_view(dst.shape, dst.data, "scatter destination"));
  const auto size = static_cast<std::uint64_t>(dst.size());
  DCR_TRY(check_gap_buffer(width, gaps.size(), values.size()));
  // Validate every record before the first write, like the kernel does.
  std::uint64_t prev = 0;
  for (std::uint64_t k = 0; k < values.size(); ++k) {
    const std::uint64_t cur = prev + gap_scan_term(first, gaps.data(), width, k);
    if (k > 0 && cur <= prev) return location_failure(2, k, size);
    if (cur >= size) return location_failure(1, k, size);
    prev = cur;
  }
  codec::visit_encoding(static_cast<value_encoding>(op), [&](auto e) {
    using E = decltype(e);
    std::uint64_t loc = 0;
    for (std::uint64_t k = 0; k < values.size(); ++k) {
      loc += gap_scan_term(first, gaps.data(), width, k);
      W& d = dst.at(static_cast<std::int64_t>(loc));
      d = E::apply(d, values[k]);
    }
  });
  return status::success();
}

/// Scatter op of a value encoding (`xor_mask` → XOR, `add` → add, `overwrite` → write).
constexpr scatter_op op_of(value_encoding e) noexcept {
  switch (e) {
  case value_encoding::overwrite:
    return scatter_op::overwrite;
  case value_encoding::add:
    return scatter_op::add;
  default:
    return scatter_op::xor_mask;
  }
}

/// Checks that item `it` fits words of `W` over a view of `size` elements:
/// a known dtype of that width (`bad_dtype`), a known encoding
/// (`bad_encoding`), one little-endian word per index (`length_overflow`).
template <word W>
status check_item(const item& it) {
  DCR_RETURN_ERROR_IF(width_of(it.tensor.dtype) != sizeof(W), bad_dtype,
                      it.tensor.name + ": dtype " + std::string(name_of(it.tensor.dtype)) +
                          " is not " + std::to_string(sizeof(W)) + "-byte words");
  DCR_RETURN_ERROR_IF(!codec::is_known_encoding(static_cast<std::uint8_t>(it.encoding)),
                      bad_encoding, it.tensor.name + ": unknown value encoding");
  DCR_RETURN_ERROR_IF(it.values.size() != it.indices.size() * sizeof(W), length_overflow,
                      it.tensor.name + ": " + std::to_string(it.values.size()) +
                          " value bytes for " + std::to_string(it.indices.size()) + " indices");
  return status::success();
}

/// Little-endian value words of an item.
template <word W>
std::vector<W> item_words(const item& it) {
  std::vector<W> w(it.indices.size());
  for (std::size_t k = 0; k < w.size(); ++k) {
    W v = 0;
    for (std::size_t b = 0; b < sizeof(W); ++b)
      v = static_cast<W>(
          v | static_cast<W>(std::to_integer<unsigned>(it.values[k * sizeof(W) + b]) << (8 * b)));
    w[k] = v;
  }
  return w;
}

/// Apply one decoded item to `dst` (XOR or overwrite by its encoding); a
/// location is the item's canonical flat index read in `dst`'s row-major
/// order, so `dst` has the canonical extents (possibly strided storage).
template <word W>
status scatter_item(view<W> dst, const item& it) {
  DCR_TRY(check_item<W>(it));
  DCR_RETURN_ERROR_IF(static_cast<std::uint64_t>(dst.size()) != it.tensor.numel(), shape_mismatch,
                      it.tensor.name + ": view of " + std::to_string(dst.size()) +
                          " elements, tensor of " + std::to_string(it.tensor.numel()));
  const auto w = item_words<W>(it);
  return scatter<W>(dst, it.indices, w, op_of(it.encoding));
}

/// Overloads on core views.
template <word W>
status scatter(const strided_view<W>& dst, std::span<const std::uint64_t> locations,
               std::type_identity_t<std::span<const W>> values,
               scatter_op op = scatter_op::xor_mask) {
  return scatter(to_device(dst), locations, values, op);
}
template <word W>
status xor_scatter(const strided_view<W>& dst, std::span<const std::uint64_t> locations,
                   std::type_identity_t<std::span<const W>> masks) {
  return scatter(to_device(dst), locations, masks, scatter_op::xor_mask);
}
template <word W>
status add_scatter(const strided_view<W>& dst, std::span<const std::uint64_t> locations,
                   std::type_identity_t<std::span<const W>> deltas) {
  return scatter(to_device(dst), locations, deltas, scatter_op::add);
}

} // namespace dcr::twin
