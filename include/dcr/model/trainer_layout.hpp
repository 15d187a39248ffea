#pragma once
/// \file
/// Megatron-style trainer layout: tensor (TP), pipeline (PP), expert (EP),
/// expert-tensor (ETP) and data (DP) parallel degrees, and rank coordinates.
///
/// Ranks are numbered `stage * (tp * dp) + i`, `0 <= i < tp * dp`. Dense
/// parameters see `i` as (dp rank `i / tp`, tp rank `i % tp`); expert
/// parameters fold the same `tp * dp` ranks of a stage into (expert-DP rank,
/// EP rank, ETP rank) = (`i / (ep etp)`, `(i / etp) % ep`, `i % etp`), as
/// Megatron's MoE parallel folding does. DP replicas hold bitwise-identical
/// copies of their parameters.

#include <cstdint>
#include <string>

#include "dcr/core/error.hpp"
#include "dcr/model/config.hpp"

namespace dcr {

/// Parallel degrees of the trainer.
struct trainer_layout {
  std::uint64_t tp = 1, pp = 1, ep = 1, etp = 1, dp = 1;
  std::uint64_t vocab_block = 128; ///< vocab rows padded to a multiple of vocab_block * tp

  std::uint64_t ranks_per_stage() const noexcept { return tp * dp; }
  std::uint64_t world() const noexcept { return pp * tp * dp; }
  /// Expert-data-parallel degree: replicas of each expert shard per stage.
  std::uint64_t edp() const noexcept { return (ep * etp) != 0 ? tp * dp / (ep * etp) : 0; }
  std::uint64_t rank(std::uint64_t stage, std::uint64_t dp_rank, std::uint64_t tp_rank) const noexcept {
    return stage * ranks_per_stage() + dp_rank * tp + tp_rank;
  }
  friend bool operator==(const trainer_layout&, const trainer_layout&) = default;
};

/// Checks that `l` can shard `c` (every split divides evenly); names the
/// first violated condition.
inline status validate(const model_config& c, const trainer_layout& l) {
  auto bad = [](const std::string& m) { return fail(errc::invalid_argument, "trainer_layout: " + m); };
  if (!l.tp || !l.pp || !l.ep || !l.etp || !l.dp) return bad("degrees must be >= 1");
  if (c.layers % l.pp) return bad("layers % pp != 0");
  if (!c.kv_heads || c.heads % c.kv_heads) return bad("heads % kv_heads != 0");
  const auto fused = c.kv_heads * (c.heads / c.kv_heads + 2) * c.head_dim;
  if (fused % l.tp) return bad("fused QKV rows % tp != 0");
  if ((c.heads * c.head_dim) % l.tp) return bad("heads * head_dim % tp != 0");
  if (c.is_moe()) {
    if (c.experts % l.ep) return bad("experts % ep != 0");
    if (c.moe_ffn % l.etp) return bad("moe_ffn % etp != 0");
    if ((l.tp * l.dp) % (l.ep * l.etp)) return bad("tp * dp % (ep * etp) != 0");
  } else {
    if (c.ffn % l.tp) return bad("ffn % tp != 0");
    if (l.ep != 1 || l.etp != 1) return bad("ep/etp > 1 on a dense model");
  }
  return status::success();
}

/// A larger Llama-style preset: 8B-like proportions scaled by `scale`
/// layers (for benches). hidden 4096, 32 heads, 8 KV heads, ffn 14336.
inline model_config llama3_8b_like(std::uint64_t layers = 32) {
  model_config c;
  c.family = "llama";
  c.hidden = 4096;
  c.layers = layers;
  c.heads = 32;
  c.kv_heads = 8;
  c.head_dim = 128;
  c.ffn = 14336;
  c.vocab = 128256;
  return c;
}

/// A Qwen3-30B-A3B-like MoE preset with `layers` layers (48 in the real model).
inline model_config qwen3_30b_a3b_like(std::uint64_t layers = 48) {
  model_config c;
  c.family = "qwen3_moe";
  c.hidden = 2048;
  c.layers = layers;
  c.heads = 32;
  c.kv_heads = 4;
  c.head_dim = 128;
  c.ffn = 0;
  c.experts = 128;
  c.moe_ffn = 768;
  c.vocab = 151936;
  c.qk_norm = true;
  return c;
}

} // namespace dcr
