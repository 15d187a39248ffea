#pragma once
/// \file
/// A source plan whose shards are dim-0 row ranges of the canonical tensors,
/// given per tensor and per rank: the layout of a trainer that shards every
/// parameter by its first dimension (PyTorch FSDP2's `fully_shard`, whose
/// parameters are DTensors placed `Shard(0)`, or `Replicate` on a mesh
/// dimension of HSDP). The caller states which rows each rank holds; the plan
/// does not assume a chunking rule (FSDP2 chunks as `torch.chunk`: ceil(n/W)
/// rows per rank, the last ranks fewer or none), so whatever rule produced
/// the ranges, the shards are exactly what the ranks hold.
///
/// Per tensor, ranks listing the same range hold one shard (its replicas; the
/// owner among them is chosen by key hash, as `megatron_plan` does); distinct
/// ranges must be disjoint and cover every row, since a row no rank holds
/// would never reach a receiver. A shard's shape is the tensor's with the
/// first extent replaced by its row count, the shape of the rank's local
/// tensor (`DTensor.to_local()`), and its map is the identity onto rows
/// `[begin, end)`: a contiguous block of the canonical tensor.

#include <algorithm>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dcr/core/error.hpp"
#include "dcr/core/tensor.hpp"
#include "dcr/map/index_map.hpp"
#include "dcr/source/plan.hpp"

namespace dcr {

/// Rows `[begin, end)` of a tensor's first dimension held by `rank`.
struct dim0_rows {
  std::uint32_t rank = 0;
  std::uint64_t begin = 0, end = 0;
};

/// The plan of `metas` over `world` ranks where `rows[i]` lists what each
/// rank holds of tensor `i` (see the file comment). An empty range (a rank
/// holding none of a short tensor) is no shard. A scalar counts as one row.
/// Throws `dcr::error`: `invalid_argument` for a list per tensor missing, a
/// rank outside the world or listed twice for a tensor, a range past the
/// tensor's rows; `coverage` for ranges that overlap or leave rows out.
inline source_plan dim0_shard_plan(std::span<const tensor_meta> metas,
                                   std::span<const std::vector<dim0_rows>> rows,
                                   std::uint32_t world) {
  if (world == 0) throw error(errc::invalid_argument, "dim0_shard_plan: world must be positive");
  if (rows.size() != metas.size())
    throw error(errc::invalid_argument, "dim0_shard_plan: " + std::to_string(rows.size()) +
                                            " row lists for " + std::to_string(metas.size()) +
                                            " tensors");
  source_plan p(world);
  for (auto& m : metas) p.add_canonical(m);
  for (std::uint32_t i = 0; i < metas.size(); ++i) {
    const auto& m = metas[i];
    const std::uint64_t n = m.shape.empty() ? 1 : m.shape[0];
    const std::uint64_t cols = n ? m.numel() / n : 0;
    // (begin, end) -> the ranks holding exactly that range, in rank order.
    std::map<std::pair<std::uint64_t, std::uint64_t>, std::vector<std::uint32_t>> ranges;
    std::vector<bool> seen(world, false);
    for (auto& r : rows[i]) {
      if (r.rank >= world)
        throw error(errc::invalid_argument, "tensor " + m.name + ": rank " +
                                                std::to_string(r.rank) + " outside a world of " +
                                                std::to_string(world));
      if (seen[r.rank])
        throw error(errc::invalid_argument,
                    "tensor " + m.name + ": rank " + std::to_string(r.rank) + " listed twice");
      seen[r.rank] = true;
      if (r.begin > r.end || r.end > n)
        throw error(errc::invalid_argument,
                    "tensor " + m.name + ": rows [" + std::to_string(r.begin) + ", " +
                        std::to_string(r.end) + ") of rank " + std::to_string(r.rank) +
                        " outside its " + std::to_string(n) + " rows");
      if (r.begin == r.end) continue;
      ranges[{r.begin, r.end}].push_back(r.rank);
    }
    std::uint64_t next = 0;
    for (auto& [range, ranks] : ranges) {
      auto [b, e] = range;
      if (b != next)
        throw error(errc::coverage,
                    "tensor " + m.name + ": " +
                        (b < next ? "rows " + std::to_string(b) + ".." + std::to_string(next - 1) +
                                        " held in overlapping ranges"
                                  : "rows " + std::to_string(next) + ".." + std::to_string(b - 1) +
                                        " held by no rank"));
      next = e;
      std::sort(ranks.begin(), ranks.end());
      std::vector<std::uint64_t> shape = m.shape;
      if (!shape.empty()) shape[0] = e - b;
      p.add_shard(m.name + "@rows" + std::to_string(b) + ":" + std::to_string(e), m.name,
                  std::move(shape), m.dtype, std::move(ranks),
                  piecewise_map(e - b, cols, {{0, e - b, i, b, 0, cols}}));
    }
    if (next != n)
      throw error(errc::coverage, "tensor " + m.name + ": rows " + std::to_string(next) + ".." +
                                      std::to_string(n - 1) + " held by no rank");
  }
  p.finalize();
  return p;
}

} // namespace dcr
