#pragma once
/// \file
/// FP8 rollout from BF16 training: the source plan of a Megatron-style
/// trainer whose rollout serves the block-quantised FP8 checkpoint
/// (`model_config::fp8`), and that checkpoint computed densely from BF16
/// canonical tensors.
///
/// Quantize-then-diff: the trainer's shards are those of `megatron_plan`
/// (same keys, same ids, same owners). Shards whose map writes only
/// unquantised tensors (embedding, norms, router, `lm_head`, and linears
/// listed in `modules_to_not_convert`) stay affine and are projected
/// directly. A quantised weight all of whose shards hold whole tiles takes
/// the shard-local path: each shard is quantised by its owner alone
/// (`blockwise_fp8`) and its codes and scales are projected directly. Every
/// other FP8-quantised weight W becomes one residual task: its
/// inputs are the shards that hold parts of W (a fused QKV or fc1 shard
/// feeds the q, k and v or the gate and up tasks), the rule assembles W in
/// BF16, quantises it tile by tile with the reference quantizer and outputs
/// the E4M3 codes `W` and the F32 `W_scale_inv`. The owner diffs both against
/// its committed converted baseline, so a tile whose scale changed re-encodes
/// all of its codes and only changed converted bits are sent; a shard whose
/// bits did not change flags none of its tasks (dependency flags).
///
/// The simulator inverse (`source_from_canonical`) runs on the training plan
/// (`megatron_plan` of the same config and layout), whose shard ids are the
/// ones of this plan; `quantize_fp8_checkpoint` of its exported BF16
/// canonical tensors is the dense FP8 checkpoint a full reload would load.

#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "dcr/core/error.hpp"
#include "dcr/core/tensor.hpp"
#include "dcr/map/blockwise.hpp"
#include "dcr/map/fp8.hpp"
#include "dcr/map/residual.hpp"
#include "dcr/model/config.hpp"
#include "dcr/model/trainer_layout.hpp"
#include "dcr/source/plan.hpp"

namespace dcr {

/// Options of `megatron_fp8_plan`.
struct fp8_plan_options {
  ownership_policy ownership = ownership_policy::key_hash;
  /// Shards holding whole tiles of their weights quantise locally and
  /// project directly (`blockwise_fp8`), for weights all of whose shards do;
  /// false: residual assembly for every quantised weight.
  bool shard_local = true;
};

/// Source plan of a Megatron-style BF16 trainer refitting an FP8 rollout
/// (see the file comment). `c.fp8` must be set. The shard-local path needs
/// the reference quantizer; with another one every weight is assembled.
template <fp8_block_quantizer Quantizer = per_block_cast_to_fp8>
source_plan megatron_fp8_plan(const model_config& c, const trainer_layout& l,
                              const fp8_plan_options& o = {}, Quantizer quantizer = {}) {
  if (!c.fp8)
    throw error(errc::invalid_argument, "megatron_fp8_plan: config has no fp8 block quantization");
  megatron_options bo;
  bo.ownership = o.ownership;
  const source_plan train = megatron_plan(c, l, bo);
  source_plan p(train.world);
  for (auto& m : fp8_checkpoint_tensors(c)) p.add_canonical(m);

  // BF16 tensor id of the training plan -> id in this plan (unquantised) or nowhere.
  std::vector<std::uint32_t> slot(train.canonical.size(), nowhere);
  std::vector<std::uint8_t> quantized(train.canonical.size(), 0);
  for (std::uint32_t id = 0; id < train.canonical.size(); ++id) {
    if (fp8_quantized(c, train.canonical[id].name))
      quantized[id] = 1;
    else
      slot[id] = p.tensor_id(train.canonical[id].name);
  }
  const fp8_block_shape block{c.fp8->block_n, c.fp8->block_k};
  // Shard-local path: a shard whose pieces all hold whole tiles, for weights
  // all of whose shards do (a fixpoint: one cut shard sends its weights, and
  // with them their other shards, to residual assembly).
  std::vector<std::optional<blockwise_fp8>> local(train.shards.size());
  if (o.shard_local && std::is_same_v<Quantizer, per_block_cast_to_fp8>) {
    auto codes_shape = [&](std::uint32_t id) {
      const auto& m = p.canonical[id];
      return std::pair<std::uint64_t, std::uint64_t>{m.shape[0], m.shape[1]};
    };
    auto scale_id = [&](std::uint32_t id) {
      return p.tensor_id(fp8_scale_name(p.canonical[id].name));
    };
    std::vector<std::uint32_t> fp8_id(train.canonical.size(), 0);
    for (std::uint32_t id = 0; id < train.canonical.size(); ++id)
      if (quantized[id]) fp8_id[id] = p.tensor_id(train.canonical[id].name);
    std::vector<std::uint8_t> cut(train.canonical.size(), 0);
    for (std::uint32_t s = 0; s < train.shards.size(); ++s) {
      const auto& m = *train.shards[s].map;
      bool all_q = !m.pieces().empty();
      for (auto& pc : m.pieces()) all_q = all_q && quantized[pc.tensor];
      if (all_q)
        local[s] = blockwise_fp8::make(m.retargeted(fp8_id), train.shards[s].dtype, block,
                                       codes_shape, scale_id);
      if (!local[s])
        for (auto& pc : m.pieces()) cut[pc.tensor] = 1;
    }
    for (bool changed = true; changed;) {
      changed = false;
      for (std::uint32_t s = 0; s < train.shards.size(); ++s) {
        if (!local[s]) continue;
        bool ok = true;
        for (auto& pc : train.shards[s].map->pieces()) ok = ok && !cut[pc.tensor];
        if (ok) continue;
        local[s].reset();
        for (auto& pc : train.shards[s].map->pieces()) cut[pc.tensor] = 1;
        changed = true;
      }
    }
  }
  std::vector<std::vector<std::uint32_t>> holders(train.canonical.size()); // shards writing W
  for (std::uint32_t s = 0; s < train.shards.size(); ++s) {
    const auto& sh = train.shards[s];
    bool any_q = false, any_plain = false;
    for (auto& pc : sh.map->pieces()) (quantized[pc.tensor] ? any_q : any_plain) = true;
    if (any_q && any_plain)
      throw error(errc::invalid_argument,
                  sh.key + ": holds quantised and unquantised tensors in one shard");
    std::optional<piecewise_map> map;
    if (!any_q) map = sh.map->retargeted(slot);
    const auto id = p.add_shard(sh.key, sh.param, sh.shape, sh.dtype, sh.replicas, std::move(map));
    p.shards[id].renamed = sh.renamed;
    if (local[s]) {
      p.shards[id].direct = false;
      p.shards[id].blockwise = std::move(local[s]);
      continue;
    }
    if (any_q) {
      p.shards[id].direct = false;
      for (auto& pc : sh.map->pieces())
        if (holders[pc.tensor].empty() || holders[pc.tensor].back() != s)
          holders[pc.tensor].push_back(s);
    }
  }
  for (std::uint32_t id = 0; id < train.canonical.size(); ++id) {
    if (!quantized[id] || holders[id].empty()) continue; // shard-local weights have no task
    const auto& m = train.canonical[id];
    std::vector<piecewise_map> maps;
    for (auto s : holders[id]) {
      const auto& full = *train.shards[s].map;
      std::vector<map_piece> mine;
      for (auto pc : full.pieces())
        if (pc.tensor == id) {
          pc.tensor = 0;
          mine.push_back(pc);
        }
      maps.emplace_back(full.local_rows(), full.local_cols(), std::move(mine));
    }
    p.add_task(fp8_block_quant_rule("fp8:" + m.name, m.name, m.shape[0], m.shape[1], m.dtype,
                                    std::move(maps), block, quantizer),
               holders[id]);
  }
  p.ownership = o.ownership;
  p.finalize();
  return p;
}

/// The FP8 checkpoint of `c` (`fp8_checkpoint_tensors` order) from its
/// unquantised canonical tensors `bf16` (any order, found by name): every
/// quantised weight through `quantize_fp8_blocks` whole, every other tensor
/// copied. Throws `not_found` / `shape_mismatch` for a missing or misshaped
/// tensor.
template <fp8_block_quantizer Quantizer = per_block_cast_to_fp8>
std::vector<host_tensor> quantize_fp8_checkpoint(const model_config& c,
                                                 std::span<const host_tensor> bf16,
                                                 Quantizer quantizer = {}) {
  if (!c.fp8)
    throw error(errc::invalid_argument,
                "quantize_fp8_checkpoint: config has no fp8 block quantization");
  std::unordered_map<std::string, const host_tensor*> by_name;
  for (auto& t : bf16) by_name[t.meta.name] = &t;
  auto find = [&](const tensor_meta& m) -> const host_tensor& {
    auto it = by_name.find(m.name);
    if (it == by_name.end())
      throw error(errc::not_found, "quantize_fp8_checkpoint: no tensor " + m.name);
    if (it->second->meta != m)
      throw error(errc::shape_mismatch,
                  "quantize_fp8_checkpoint: " + m.name + " differs from the config");
    return *it->second;
  };
  const auto plain = canonical_tensors(c);
  std::unordered_map<std::string, const tensor_meta*> plain_meta;
  for (auto& m : plain) plain_meta[m.name] = &m;
  std::vector<host_tensor> out;
  const fp8_block_shape block{c.fp8->block_n, c.fp8->block_k};
  for (auto& m : fp8_checkpoint_tensors(c)) {
    if (m.dtype == dtype_id::f8e4m3fn && fp8_quantized(c, m.name)) {
      const auto& src = find(*plain_meta.at(m.name));
      out.emplace_back(m);
      out.emplace_back(tensor_meta{
          fp8_scale_name(m.name),
          {(m.shape[0] + block.rows - 1) / block.rows, (m.shape[1] + block.cols - 1) / block.cols},
          dtype_id::f32});
      auto& codes = out[out.size() - 2];
      quantize_fp8_blocks(src.meta.dtype, src.bytes.data(), m.shape[0], m.shape[1], block,
                          codes.bytes.data(), reinterpret_cast<float*>(out.back().bytes.data()),
                          quantizer);
    } else if (plain_meta.count(m.name)) {
      out.push_back(find(m));
    }
  }
  return out;
}

} // namespace dcr
