#pragma once
/// \file
/// Shard-local block-FP8 conversion: a blockwise mapping class for a source
/// shard whose every piece holds whole quantisation tiles of its canonical
/// weight (tile boundaries aligned with the piece). Such a shard is
/// quantised on its own, without assembling the canonical tensor: each piece
/// (a row block of the shard) is quantised tile by tile, its codes keep the
/// shard's local layout and map to the canonical codes exactly as the BF16
/// elements map to the BF16 weight, and its tile scales form a small local
/// grid that maps onto the canonical `weight_scale_inv`. Both maps are
/// `piecewise_map`s, so changed codes and scales are projected directly.

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "dcr/core/tensor.hpp"
#include "dcr/map/index_map.hpp"
#include "dcr/map/residual.hpp"

namespace dcr {

/// The converted form of one shard: `scales` (F32 tile grid, piece after
/// piece; first, so that they are 4-byte aligned in an allocated buffer)
/// then `codes` (E4M3, one per local element, local layout).
struct blockwise_fp8 {
  fp8_block_shape block;
  dtype_id source_dtype = dtype_id::bf16;
  piecewise_map codes;           ///< local element -> canonical codes tensor (plan ids)
  piecewise_map scales;          ///< local tile -> canonical scale tensor (plan ids)
  std::vector<map_piece> pieces; ///< the shard's BF16 pieces (local rows, canonical ids unused)
  std::vector<std::uint64_t> scale_row; ///< per piece: its first row in the local scale grid

  std::uint64_t code_bytes() const noexcept { return codes.domain_size(); }
  std::uint64_t scale_bytes() const noexcept { return 4 * scales.domain_size(); }
  std::uint64_t converted_bytes() const noexcept { return scale_bytes() + code_bytes(); }
  /// The two parts of a converted buffer.
  std::span<const std::byte> scale_part(std::span<const std::byte> b) const {
    return b.first(scale_bytes());
  }
  std::span<const std::byte> code_part(std::span<const std::byte> b) const {
    return b.subspan(scale_bytes(), code_bytes());
  }

  /// The blockwise class of a shard with BF16 map `m` (`m`'s tensor ids are
  /// plan ids of the codes tensors), when every piece holds whole tiles:
  /// its canonical first row and column are tile aligned and it spans whole
  /// tiles or reaches the tensor's end. `code_shape(id)` gives a codes
  /// tensor's [rows, cols]; `scale_id(id)` its scale tensor's id. nullopt
  /// when some piece cuts a tile (that shard needs residual assembly).
  template <class Shape, class ScaleId>
  static std::optional<blockwise_fp8> make(const piecewise_map& m, dtype_id source_dtype,
                                           fp8_block_shape block, Shape&& code_shape,
                                           ScaleId&& scale_id) {
    const std::uint64_t lc = m.local_cols(), bn = block.rows, bk = block.cols;
    blockwise_fp8 b;
    b.block = block;
    b.source_dtype = source_dtype;
    std::vector<map_piece> sp;
    std::uint64_t srow = 0;
    for (auto& p : m.pieces()) {
      const auto [rows, cols] = code_shape(p.tensor);
      if (p.canonical_cols != cols || p.canonical_row % bn != 0 || p.canonical_col % bk != 0)
        return std::nullopt;
      if (p.rows % bn != 0 && p.canonical_row + p.rows != rows) return std::nullopt;
      if (lc % bk != 0 && p.canonical_col + lc != cols) return std::nullopt;
      const std::uint64_t tr = (p.rows + bn - 1) / bn;
      sp.push_back({srow, tr, scale_id(p.tensor), p.canonical_row / bn, p.canonical_col / bk,
                    (cols + bk - 1) / bk});
      b.scale_row.push_back(srow);
      srow += tr;
    }
    b.pieces.assign(m.pieces().begin(), m.pieces().end());
    b.codes = m;
    b.scales = piecewise_map(srow, (lc + bk - 1) / bk, std::move(sp));
    return b;
  }

  /// Converts the shard `x` (source words) into `out` (`converted_bytes()`,
  /// 4-byte aligned): the tile grid, then codes at the shard's local offsets
  /// (rows outside every piece stay 0), by `quantize_fp8_blocks` with the
  /// reference quantizer.
  void convert(std::span<const std::byte> x, std::span<std::byte> out) const {
    const std::uint64_t lc = codes.local_cols(), w = width_of(source_dtype);
    const std::uint64_t tc = scales.local_cols();
    auto* s = reinterpret_cast<float*>(out.data());
    std::byte* c = out.data() + scale_bytes();
    std::fill(out.begin(), out.end(), std::byte{0});
    for (std::size_t k = 0; k < pieces.size(); ++k) {
      const auto& p = pieces[k];
      quantize_fp8_blocks(source_dtype, x.data() + p.local_row * lc * w, p.rows, lc, block,
                          c + p.local_row * lc, s + scale_row[k] * tc);
    }
  }
};

} // namespace dcr
