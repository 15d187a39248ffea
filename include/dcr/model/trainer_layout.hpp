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
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dcr/core/error.hpp"
#include "dcr/model/config.hpp"

namespace dcr {

/// Parallel degrees of the trainer.
struct trainer_layout {
  std::uint64_t tp = 1, pp = 1, ep = 1, etp = 1, dp = 1;
  /// Megatron's `make_vocab_size_divisible_by`: vocab rows padded to a
  /// multiple of vocab_block * tp. 0: no padding (Megatron-Bridge's default
  /// for converted Hugging Face models); then the vocabulary must divide by tp.
  std::uint64_t vocab_block = 0;
  /// `num_layers_in_first_pipeline_stage` / `num_layers_in_last_pipeline_stage`
  /// (unset: every stage gets layers / pp).
  std::optional<std::uint64_t> first_stage_layers, last_stage_layers;

  /// Degrees in Megatron's order of mention (tp, pp, ep, etp, dp), then the vocabulary padding.
  constexpr trainer_layout(std::uint64_t tp_ = 1, std::uint64_t pp_ = 1, std::uint64_t ep_ = 1,
                           std::uint64_t etp_ = 1, std::uint64_t dp_ = 1,
                           std::uint64_t vocab_block_ = 0) noexcept
      : tp(tp_), pp(pp_), ep(ep_), etp(etp_), dp(dp_), vocab_block(vocab_block_) {}

  std::uint64_t ranks_per_stage() const noexcept { return tp * dp; }
  std::uint64_t world() const noexcept { return pp * tp * dp; }
  /// Expert-data-parallel degree: replicas of each expert shard per stage.
  std::uint64_t edp() const noexcept { return (ep * etp) != 0 ? tp * dp / (ep * etp) : 0; }
  std::uint64_t rank(std::uint64_t stage, std::uint64_t dp_rank,
                     std::uint64_t tp_rank) const noexcept {
    return stage * ranks_per_stage() + dp_rank * tp + tp_rank;
  }
  friend bool operator==(const trainer_layout&, const trainer_layout&) = default;
};

namespace detail {
/// Layers of every stage; on a layout that does not split them, `why` says why.
inline std::vector<std::uint64_t> megatron_stage_sizes(std::uint64_t layers,
                                                       const trainer_layout& l, std::string& why) {
  std::vector<std::uint64_t> v(l.pp, 0);
  auto refuse = [&](const char* reason) {
    why = reason;
    return v;
  };
  if (l.pp == 0) return refuse("pp must be >= 1");
  if (!l.first_stage_layers && !l.last_stage_layers) {
    if (layers % l.pp) return refuse("layers % pp != 0");
    for (auto& x : v) x = layers / l.pp;
    return v;
  }
  // Megatron's get_num_layers_to_build: the given stages take their counts,
  // the remaining layers split evenly over the remaining stages.
  if (l.pp < 2) return refuse("an uneven first/last pipeline stage needs pp >= 2");
  std::uint64_t rest = layers, stages = l.pp;
  for (auto& x : {l.first_stage_layers, l.last_stage_layers})
    if (x) {
      if (*x > rest) return refuse("first/last stage layers exceed the model's layers");
      rest -= *x;
      --stages;
    }
  if (stages == 0 ? rest != 0 : rest % stages != 0)
    return refuse("layers left after the first/last stage do not divide over the middle stages");
  for (std::uint64_t s = 0; s < l.pp; ++s) v[s] = stages ? rest / stages : 0;
  if (l.first_stage_layers) v.front() = *l.first_stage_layers;
  if (l.last_stage_layers) v.back() = *l.last_stage_layers;
  return v;
}
} // namespace detail

/// Global layers [start, end) of pipeline stage `s` (Megatron's
/// `get_transformer_layer_offset` and `get_num_layers_to_build`, without
/// virtual pipeline stages). Throws `invalid_argument` for a layout that
/// does not split the layers.
inline std::pair<std::uint64_t, std::uint64_t>
megatron_stage_layers(const model_config& c, const trainer_layout& l, std::uint64_t s) {
  std::string why;
  auto v = detail::megatron_stage_sizes(c.layers, l, why);
  if (!why.empty()) throw error(errc::invalid_argument, "trainer_layout: " + why);
  if (s >= l.pp) throw error(errc::invalid_argument, "trainer_layout: stage >= pp");
  std::uint64_t a = 0;
  for (std::uint64_t k = 0; k < s; ++k) a += v[k];
  return {a, a + v[s]};
}

/// Checks that `l` can shard `c` (every split divides evenly); names the
/// first violated condition.
inline status validate(const model_config& c, const trainer_layout& l) {
  auto bad = [](const std::string& m) {
    return fail(errc::invalid_argument, "trainer_layout: " + m);
  };
  if (!l.tp || !l.pp || !l.ep || !l.etp || !l.dp) return bad("degrees must be >= 1");
  std::string why;
  (void)detail::megatron_stage_sizes(c.layers, l, why);
  if (!why.empty()) return bad(why);
  if (!c.kv_heads || c.heads % c.kv_heads) return bad("heads % kv_heads != 0");
  const auto fused = c.kv_heads * (c.heads / c.kv_heads + 2) * c.head_dim;
  if (fused % l.tp) return bad("fused QKV rows % tp != 0");
  if ((c.heads * c.head_dim) % l.tp) return bad("heads * head_dim % tp != 0");
  if (l.vocab_block == 0 && c.vocab % l.tp)
    return bad("vocab % tp != 0 without vocabulary padding (set vocab_block, Megatron's "
               "make_vocab_size_divisible_by)");
  if (c.has_dense_layer() && c.ffn % l.tp) return bad("ffn % tp != 0");
  if (c.is_moe()) {
    if (c.experts % l.ep) return bad("experts % ep != 0");
    if (c.moe_ffn % l.etp) return bad("moe_ffn % etp != 0");
    if ((l.tp * l.dp) % (l.ep * l.etp)) return bad("tp * dp % (ep * etp) != 0");
  } else {
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
