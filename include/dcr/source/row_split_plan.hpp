#pragma once
/// \file
/// A source plan for checkpoints of any architecture (the training-side twin
/// of `loaders::row_split_loader`): `tp × dp` ranks (rank = dp_index · tp +
/// tp_index); every tensor whose first dimension divides by `tp` is split by
/// rows over the TP ranks (a column-parallel map: shard r holds rows
/// [r·n/tp, (r+1)·n/tp)), replicated over DP; every other tensor is
/// replicated on all ranks. What `dcr-demo --checkpoint` uses for a
/// safetensors file whose model class it does not know.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dcr/core/error.hpp"
#include "dcr/core/tensor.hpp"
#include "dcr/map/index_map.hpp"
#include "dcr/source/plan.hpp"

namespace dcr {

/// Row-split-over-TP, replicated-over-DP plan of `metas` (see file comment).
/// `dcr::error(invalid_argument)` for tp or dp of 0.
inline source_plan row_split_plan(std::span<const tensor_meta> metas, std::uint32_t tp = 2,
                                  std::uint32_t dp = 2) {
  if (tp == 0 || dp == 0)
    throw error(errc::invalid_argument, "row_split_plan: tp and dp must be positive");
  source_plan p(tp * dp);
  for (auto& m : metas) p.add_canonical(m);
  std::vector<std::uint32_t> all(tp * dp);
  for (std::uint32_t k = 0; k < all.size(); ++k) all[k] = k;
  for (std::uint32_t i = 0; i < metas.size(); ++i) {
    const auto& m = metas[i];
    const std::uint64_t rows = m.shape.empty() ? 1 : m.shape[0], cols = rows ? m.numel() / rows : 0;
    if (tp > 1 && rows >= tp && rows % tp == 0) {
      for (std::uint32_t r = 0; r < tp; ++r) {
        std::vector<std::uint32_t> replicas;
        for (std::uint32_t d = 0; d < dp; ++d) replicas.push_back(d * tp + r);
        p.add_shard(m.name + "@tp" + std::to_string(r) + "/" + std::to_string(tp), m.name,
                    {rows / tp, cols}, m.dtype, std::move(replicas),
                    column_parallel_map(i, rows, cols, tp, r).pieces());
      }
    } else {
      p.add_shard(m.name, m.name, {rows, cols}, m.dtype, all,
                  replicated_map(i, rows, cols).pieces());
    }
  }
  p.finalize();
  return p;
}

} // namespace dcr
