#pragma once
/// \file
/// A reference native loader that places Llama / Qwen2 / Qwen3 / Qwen3-MoE
/// canonical tensors where vLLM's model classes and layers put them, for a
/// deployment given as vLLM is configured (`tensor_parallel_size`,
/// `pipeline_parallel_size`, `data_parallel_size`, `enable_expert_parallel`)
/// and one rank of it. Each rule names the vLLM function it mirrors:
/// - `qkv_proj` fused [q | k | v] (`QKVParallelLinear`): q rows
///   [r·nq_l·d, +nq_l·d) with nq_l = nh/t; if t >= nkv then nkv_l = 1 and rank
///   r takes K/V head r / (t/nkv) (one canonical head feeds t/nkv ranks), else
///   nkv_l = nkv/t, rows [r·nkv_l·d, +nkv_l·d);
/// - `gate_up_proj` fused [gate rows r·I/t, +I/t ; up rows r·I/t, +I/t]
///   (`MergedColumnParallelLinear`);
/// - row-parallel `o_proj`, `down_proj` (`RowParallelLinear`): columns [r·K/t, +K/t);
///   Llama's `o_proj` has a bias when `attention_bias` is set (`LlamaAttention`'s
///   `bias_o_proj`), which `RowParallelLinear` keeps whole on every rank;
/// - vocab-parallel `embed_tokens` / `lm_head` (`VocabParallelEmbedding`,
///   `ParallelLMHead`): the vocabulary is padded to a multiple of 64
///   (`pad_vocab_size`) and then divided by t; rank r holds padded rows
///   [r·P/t, +P/t); padding rows stay zero (never copied); a rank holding only
///   padding skips the tensor; tied embeddings have no `lm_head` tensor;
/// - norms and the MoE router replicated;
/// - fused MoE (`FusedMoE`, `FusedMoEParallelConfig.make`): with expert
///   parallelism in use (enabled and dp·t > 1) whole experts over
///   ep_size = dp·t ranks, ep_rank = dp_rank·t + tp_rank; otherwise experts
///   TP-sharded over dp·t ranks (flattened rank dp_rank·t + tp_rank).
///   `experts.w13_weight[e_local]` = [gate; up] and `experts.w2_weight[e_local]`
///   column-split; experts homed on other EP ranks are skipped explicitly.
///   Expert homes follow `determine_expert_map` (the first E mod ep ranks get
///   one expert more) with the strategy `determine_expert_placement_strategy`
///   settles on (round-robin only when it is supported, linear otherwise);
/// - pipeline parallelism (`get_pp_indices`, `make_layers`, `PPMissingLayer`):
///   stage p holds layers [start, end) (`VLLM_PP_LAYER_PARTITION` or an even
///   split whose leftover layers go to the stages before the last, from the
///   second-to-last backwards); tensors of other stages' layers are skipped.
///   Which stages hold the embedding, final norm and `lm_head` is the model
///   class's choice: Llama / Qwen2 / Qwen3 hold the embedding on the first
///   stage (and on the last when tied), the norm and `lm_head` on the last;
///   Qwen3-MoE holds all three on every stage.
/// Block-FP8 checkpoints (`model_config::fp8`, vLLM's `Fp8LinearMethod` and
/// `Fp8MoEMethod` with `weight_block_size = [bn, bk]`): the canonical tensors
/// are `fp8_checkpoint_tensors`. Each quantised linear's E4M3 codes are placed
/// exactly like its BF16 weight (its parameter declared F8_E4M3), and its F32
/// `weight_scale_inv` like vLLM's `BlockQuantScaleParameter`: the fused
/// parameter `qkv_proj.weight_scale_inv` / `gate_up_proj.weight_scale_inv` has
/// [ceil(rows/bn), ceil(cols/bk)] of the rank's fused weight; shard `s` of it
/// starts at scale row ceil(offset_s/bn), spans ceil(size_s/bn) rows and reads
/// canonical scale rows [shard_rank·that, +that) (`adjust_block_scale_shard`,
/// `load_qkv_weight` / `load_merged_column_weight`); row-parallel scales split
/// their columns (`load_row_parallel_weight`). Fused MoE:
/// `w13_weight_scale_inv` [E_l, 2·ceil(I_l/bn), ceil(H/bk)] with gate rows
/// first, `w2_weight_scale_inv` [E_l, ceil(H/bn), ceil(I_l/bk)]
/// (`FusedMoE._load_w13` / `_load_w2`). The shape conditions of vLLM's
/// `Fp8LinearMethod.create_weights` / `validate_fp8_block_shape` and
/// `Fp8MoEMethod.create_weights` are checked at prewarm (`fp8_unsupported`):
/// where they fail, a fused shard's scale tiles would straddle two tensors,
/// and `declare` throws `unsupported_loader` naming the parameter and why.
/// Every copy's source is a view of the canonical input, so every path is
/// representation preserving (XOR allowed everywhere, codes and scales too).

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "dcr/core/error.hpp"
#include "dcr/core/tensor.hpp"
#include "dcr/loaders/views.hpp"
#include "dcr/model/config.hpp"
#include "dcr/receiver/loader.hpp"
#include "dcr/receiver/storage.hpp"

namespace dcr::loaders {

/// vLLM's `expert_placement_strategy`.
enum class expert_placement {
  linear,      ///< rank k holds a contiguous run of experts (the default)
  round_robin, ///< rank k holds experts k, k + ep, k + 2 ep, ...
};

/// vLLM's default padding of the vocabulary (`DEFAULT_VOCAB_PADDING_SIZE`).
inline constexpr std::uint64_t vllm_vocab_padding = 64;

/// `pad_vocab_size`: the vocabulary rounded up to a multiple of `pad_to`.
constexpr std::uint64_t pad_vocab_size(std::uint64_t vocab,
                                       std::uint64_t pad_to = vllm_vocab_padding) noexcept {
  return (vocab + pad_to - 1) / pad_to * pad_to;
}

/// The engine arguments of a vLLM deployment that decide placement, named as
/// vLLM's flags name them.
struct vllm_parallel_config {
  std::uint64_t tensor_parallel_size = 1;
  std::uint64_t pipeline_parallel_size = 1;
  std::uint64_t data_parallel_size = 1;
  bool enable_expert_parallel = false;
  expert_placement expert_placement_strategy = expert_placement::linear; ///< requested
  bool enable_eplb = false;
  std::uint64_t num_redundant_experts = 0;
  std::string all2all_backend = "allgather_reducescatter"; ///< `VLLM_ALL2ALL_BACKEND`
  std::string pp_layer_partition; ///< `VLLM_PP_LAYER_PARTITION`, e.g. "10,11,11"; empty: unset

  std::uint64_t world_size() const noexcept {
    return tensor_parallel_size * pipeline_parallel_size * data_parallel_size;
  }
};

/// One rank of a vLLM deployment.
struct vllm_layout {
  vllm_parallel_config parallel;
  std::uint64_t dp_rank = 0, pp_rank = 0, tp_rank = 0;

  vllm_layout() = default;
  /// A constructor, not an aggregate: `{4, 0}` must not silently mean a
  /// deployment with pipeline_parallel_size 0.
  vllm_layout(vllm_parallel_config p, std::uint64_t dp, std::uint64_t pp, std::uint64_t tp)
      : parallel(std::move(p)), dp_rank(dp), pp_rank(pp), tp_rank(tp) {}

  /// Rank `rank` of the deployment, ranks numbered DP-major, then PP, then TP
  /// (the order of vLLM's `initialize_model_parallel`).
  static vllm_layout of_rank(const vllm_parallel_config& p, std::uint64_t rank) {
    const auto t = p.tensor_parallel_size, pp = p.pipeline_parallel_size;
    if (t == 0 || pp == 0 || p.data_parallel_size == 0 || rank >= p.world_size())
      throw error(errc::invalid_argument, "vllm_layout: rank " + std::to_string(rank) +
                                              " outside a world of " +
                                              std::to_string(p.world_size()));
    return {p, rank / (t * pp), rank / t % pp, rank % t};
  }
  std::uint64_t rank() const noexcept {
    return (dp_rank * parallel.pipeline_parallel_size + pp_rank) * parallel.tensor_parallel_size +
           tp_rank;
  }
};

/// Rank `tp_rank` of a deployment with tensor parallelism only
/// (`--tensor-parallel-size tp_size`).
inline vllm_layout vllm_tp_rank(std::uint64_t tp_size, std::uint64_t tp_rank) {
  vllm_parallel_config p;
  p.tensor_parallel_size = tp_size;
  return {std::move(p), 0, 0, tp_rank};
}

/// What `FusedMoEParallelConfig.make` derives for the MoE layers of a rank.
struct fused_moe_parallel {
  std::uint64_t tp_size = 1, tp_rank = 0; ///< expert tensor parallelism (1 with EP)
  std::uint64_t ep_size = 1, ep_rank = 0;
  bool use_ep = false;
  bool use_all2all_kernels = false; ///< dp > 1 and EP in use
};

/// `FusedMoEParallelConfig.make`: TP is flattened across DP (size dp·t, rank
/// dp_rank·t + tp_rank); with expert parallelism in use that flattened group
/// becomes the EP group and experts are not TP-split.
inline fused_moe_parallel fused_moe_parallel_config(const vllm_layout& l) {
  const auto& p = l.parallel;
  const auto t = p.tensor_parallel_size, dp = p.data_parallel_size;
  fused_moe_parallel m;
  m.use_ep = dp * t > 1 && p.enable_expert_parallel;
  m.use_all2all_kernels = dp > 1 && m.use_ep;
  const auto flat_size = dp * t, flat_rank = l.dp_rank * t + l.tp_rank;
  if (m.use_ep) {
    m.ep_size = flat_size;
    m.ep_rank = flat_rank;
  } else {
    m.tp_size = flat_size;
    m.tp_rank = flat_rank;
  }
  return m;
}

/// `determine_expert_placement_strategy`: round-robin is kept only for models
/// with more than one expert group, no redundant experts and no EPLB, and,
/// when all-to-all kernels are in use, a backend with round-robin routing
/// tables (DeepEP low-latency, NIXL EP); otherwise placement is linear.
inline expert_placement determine_expert_placement_strategy(const vllm_parallel_config& p,
                                                            const fused_moe_parallel& m,
                                                            std::uint64_t num_expert_group) {
  if (p.expert_placement_strategy != expert_placement::round_robin)
    return p.expert_placement_strategy;
  if (num_expert_group <= 1 || p.num_redundant_experts != 0 || p.enable_eplb)
    return expert_placement::linear;
  if (m.use_all2all_kernels && p.all2all_backend != "deepep_low_latency" &&
      p.all2all_backend != "nixl_ep")
    return expert_placement::linear;
  return expert_placement::round_robin;
}

/// `determine_expert_map`: for each global expert its local index on EP rank
/// `ep_rank`, or -1. Each rank holds E / ep experts; the first E mod ep ranks
/// hold one more (linear: a contiguous run starting at
/// rank·(E/ep) + min(rank, E mod ep); round-robin: experts rank, rank + ep, ...).
inline std::vector<std::int64_t> determine_expert_map(std::uint64_t ep_size, std::uint64_t ep_rank,
                                                      std::uint64_t experts, expert_placement s) {
  std::vector<std::int64_t> map(experts, -1);
  if (ep_size <= 1) {
    for (std::uint64_t g = 0; g < experts; ++g) map[g] = static_cast<std::int64_t>(g);
    return map;
  }
  const auto base = experts / ep_size, rem = experts % ep_size;
  const auto local = base + (ep_rank < rem ? 1 : 0);
  for (std::uint64_t i = 0; i < local; ++i) {
    const auto g = s == expert_placement::linear ? ep_rank * base + std::min(ep_rank, rem) + i
                                                 : ep_rank + i * ep_size;
    map[g] = static_cast<std::int64_t>(i);
  }
  return map;
}

/// `get_pp_indices`: layers [start, end) of pipeline stage `pp_rank`. With
/// `partition` ("a,b,c", one count per stage, summing to `layers`) the counts
/// are taken as given; otherwise each stage gets layers / pp and the leftover
/// layers go one each to stages pp-2, pp-3, ... (the last stage, which holds
/// the output layer, gets none). Throws `invalid_argument` for a malformed
/// partition.
inline std::pair<std::uint64_t, std::uint64_t> get_pp_indices(std::uint64_t layers,
                                                              std::uint64_t pp_rank,
                                                              std::uint64_t pp_size,
                                                              std::string_view partition = {}) {
  if (pp_size == 0 || pp_rank >= pp_size)
    throw error(errc::invalid_argument, "get_pp_indices: pp_rank >= pp_size");
  std::vector<std::uint64_t> parts;
  if (!partition.empty()) {
    const std::string text(partition);
    std::size_t pos = 0;
    std::uint64_t sum = 0;
    while (pos <= text.size()) {
      const auto comma = std::min(text.find(',', pos), text.size());
      auto item = text.substr(pos, comma - pos); // Python's int() accepts surrounding blanks
      item.erase(0, item.find_first_not_of(" \t"));
      item.erase(item.find_last_not_of(" \t") + 1);
      if (item.empty() || item.find_first_not_of("0123456789") != std::string::npos ||
          item.size() > 9)
        throw error(errc::invalid_argument,
                    "VLLM_PP_LAYER_PARTITION: invalid partition string: " + text);
      parts.push_back(std::stoull(item));
      sum += parts.back();
      pos = comma + 1;
    }
    if (parts.size() != pp_size)
      throw error(errc::invalid_argument,
                  "VLLM_PP_LAYER_PARTITION: " + std::to_string(parts.size()) +
                      " stages given for pipeline_parallel_size " + std::to_string(pp_size));
    if (sum != layers)
      throw error(errc::invalid_argument, "VLLM_PP_LAYER_PARTITION: " + std::to_string(sum) +
                                              " layers given for num_hidden_layers " +
                                              std::to_string(layers));
  } else {
    parts.assign(pp_size, layers / pp_size);
    for (std::uint64_t i = 2; i < layers % pp_size + 2; ++i) ++parts[pp_size - i];
  }
  std::uint64_t start = 0;
  for (std::uint64_t s = 0; s < pp_rank; ++s) start += parts[s];
  return {start, start + parts[pp_rank]};
}

/// vLLM-style native loader (see file comment for the placement rules).
class vllm_style_loader {
public:
  /// `load` only reads the loader's routes (receiver/loader.hpp).
  static constexpr bool concurrent_load = true;

  /// Throws `invalid_argument` when the layout does not divide the model or
  /// is not a deployment vLLM would start.
  vllm_style_loader(model_config cfg, vllm_layout lay) : c_(std::move(cfg)), l_(std::move(lay)) {
    const auto& p = l_.parallel;
    const auto t = p.tensor_parallel_size;
    auto need = [](bool ok, const std::string& what) {
      if (!ok) throw error(errc::invalid_argument, "vllm_style_loader: " + what);
    };
    need(t > 0 && l_.tp_rank < t, "tp_rank must be < tensor_parallel_size");
    need(p.pipeline_parallel_size > 0 && l_.pp_rank < p.pipeline_parallel_size,
         "pp_rank must be < pipeline_parallel_size");
    need(p.data_parallel_size > 0 && l_.dp_rank < p.data_parallel_size,
         "dp_rank must be < data_parallel_size");
    need(c_.kv_heads > 0 && c_.heads % t == 0,
         "num_attention_heads not divisible by tensor_parallel_size");
    need(t >= c_.kv_heads ? t % c_.kv_heads == 0 : c_.kv_heads % t == 0,
         "num_key_value_heads and tensor_parallel_size do not divide");
    need(!c_.has_dense_layer() || c_.ffn % t == 0,
         "intermediate_size not divisible by tensor_parallel_size");
    padded_vocab_ = pad_vocab_size(c_.vocab);
    need(padded_vocab_ % t == 0, "padded vocabulary " + std::to_string(padded_vocab_) +
                                     " not divisible by tensor_parallel_size");
    nq_l_ = c_.heads / t;
    nkv_l_ = t >= c_.kv_heads ? 1 : c_.kv_heads / t;
    kv_head0_ = t >= c_.kv_heads ? l_.tp_rank / (t / c_.kv_heads) : l_.tp_rank * nkv_l_;
    moe_ = fused_moe_parallel_config(l_);
    if (c_.is_moe()) {
      need(c_.moe_ffn % moe_.tp_size == 0,
           "moe_intermediate_size not divisible by the MoE tensor-parallel size " +
               std::to_string(moe_.tp_size));
      need(c_.experts >= moe_.ep_size, "fewer experts than expert-parallel ranks");
      placement_ = determine_expert_placement_strategy(p, moe_, c_.expert_groups);
      expert_map_ = determine_expert_map(moe_.ep_size, moe_.ep_rank, c_.experts, placement_);
      for (auto x : expert_map_) local_experts_ += x >= 0;
    }
    std::tie(first_layer_, end_layer_) =
        get_pp_indices(c_.layers, l_.pp_rank, p.pipeline_parallel_size, p.pp_layer_partition);
    if (c_.fp8) {
      need(c_.fp8->block_n > 0 && c_.fp8->block_k > 0, "fp8 weight_block_size must be positive");
      // vLLM's `is_layer_skipped`: the shards of a fused module are all
      // quantised or none; a FusedMoE layer quantises every expert or none.
      for (std::uint64_t i = 0; i < c_.layers; ++i) {
        auto q = [&](const std::string& n) { return fp8_quantized(c_, layer_name(i, n)); };
        need(q("self_attn.q_proj.weight") == q("self_attn.k_proj.weight") &&
                 q("self_attn.k_proj.weight") == q("self_attn.v_proj.weight"),
             "some but not all of q_proj, k_proj, v_proj of layer " + std::to_string(i) +
                 " are quantised (qkv_proj is one layer)");
        if (!c_.is_moe_layer(i)) {
          need(q("mlp.gate_proj.weight") == q("mlp.up_proj.weight"),
               "some but not all of gate_proj, up_proj of layer " + std::to_string(i) +
                   " are quantised (gate_up_proj is one layer)");
          continue;
        }
        const bool first = fp8_quantized(c_, expert_name(i, 0, "gate_proj.weight"));
        for (std::uint64_t e = 0; e < c_.experts; ++e)
          for (auto* n : {"gate_proj.weight", "up_proj.weight", "down_proj.weight"})
            need(fp8_quantized(c_, expert_name(i, e, n)) == first,
                 "some but not all experts of layer " + std::to_string(i) +
                     " are quantised (FusedMoE is one layer)");
      }
    }
    const bool first = l_.pp_rank == 0, last = l_.pp_rank + 1 == p.pipeline_parallel_size;
    if (c_.family == "qwen3_moe") {
      has_embed_ = has_norm_ = has_lm_head_ = true; // Qwen3MoeModel builds them on every stage
    } else {
      has_embed_ = first || (c_.tied_embeddings && last);
      has_norm_ = has_lm_head_ = last;
    }
    build_routes();
  }

  const model_config& config() const noexcept { return c_; }
  const vllm_layout& layout() const noexcept { return l_; }
  /// MoE parallelism of this rank (`FusedMoEParallelConfig`).
  const fused_moe_parallel& moe_parallel() const noexcept { return moe_; }
  /// The expert placement in effect (after `determine_expert_placement_strategy`).
  expert_placement placement() const noexcept { return placement_; }
  /// Vocabulary rows after `pad_vocab_size` (all ranks together).
  std::uint64_t padded_vocab() const noexcept { return padded_vocab_; }
  /// Layers [first, end) of this rank's pipeline stage.
  std::pair<std::uint64_t, std::uint64_t> layers() const noexcept {
    return {first_layer_, end_layer_};
  }
  /// Local index of global expert `g` on this rank, if it is held here.
  std::optional<std::uint64_t> local_expert(std::uint64_t g) const noexcept {
    if (g >= expert_map_.size() || expert_map_[g] < 0) return std::nullopt;
    return static_cast<std::uint64_t>(expert_map_[g]);
  }
  std::uint64_t local_experts() const noexcept { return local_experts_; }

  /// Why vLLM would refuse this rank's block-FP8 shapes (the conditions of
  /// `Fp8LinearMethod.create_weights` / `validate_fp8_block_shape` and
  /// `Fp8MoEMethod.create_weights`), naming the parameter; empty when it
  /// accepts them or the checkpoint is not FP8. `declare` throws it.
  std::string fp8_unsupported() const {
    if (!c_.fp8) return {};
    const auto t = l_.parallel.tensor_parallel_size, d = c_.head_dim;
    const auto bn = c_.fp8->block_n, bk = c_.fp8->block_k;
    auto out_parts = [&](const std::string& param,
                         std::vector<std::pair<const char*, std::uint64_t>> parts) -> std::string {
      // Column-parallel (t > 1): every partition; merged on one rank: all but the last.
      const std::size_t n = t > 1 ? parts.size() : parts.size() - 1;
      for (std::size_t k = 0; k < n; ++k)
        if (parts[k].second % bn != 0)
          return param + ": output partition " + parts[k].first + " of " +
                 std::to_string(parts[k].second) +
                 " rows is not divisible by weight quantization "
                 "block_n " +
                 std::to_string(bn) +
                 " (its scale rows would share a tile with the "
                 "next tensor's)";
      return {};
    };
    auto row_parallel = [&](const std::string& param, std::uint64_t k_local) -> std::string {
      if (t > 1 && k_local % bk != 0)
        return param + ": input partition of " + std::to_string(k_local) +
               " columns is not divisible by weight quantization block_k " + std::to_string(bk) +
               " (a scale tile would straddle two ranks)";
      return {};
    };
    for (std::uint64_t i = first_layer_; i < end_layer_; ++i) {
      auto L = [&](const char* x) { return layer_name(i, x); };
      if (fp8_quantized(c_, L("self_attn.q_proj.weight")))
        if (auto w = out_parts(L("self_attn.qkv_proj.weight_scale_inv"),
                               {{"q", nq_l_ * d}, {"k", nkv_l_ * d}, {"v", nkv_l_ * d}});
            !w.empty())
          return w;
      if (fp8_quantized(c_, L("self_attn.o_proj.weight")))
        if (auto w = row_parallel(L("self_attn.o_proj.weight_scale_inv"), c_.heads * d / t);
            !w.empty())
          return w;
      if (c_.is_moe_layer(i)) {
        if (!fp8_quantized(c_, expert_name(i, 0, "gate_proj.weight"))) continue;
        const auto im = c_.moe_ffn / moe_.tp_size;
        if (im % bn != 0)
          return L("mlp.experts.w13_weight_scale_inv") +
                 ": the output size of gate's and up's "
                 "weight " +
                 std::to_string(im) +
                 " is not divisible by weight quantization "
                 "block_n " +
                 std::to_string(bn);
        // Row-parallel inside the experts: split when the MoE TP size (TP
        // flattened over DP) is > 1, where vLLM's narrow of the down scale
        // would otherwise cut a tile.
        if (moe_.tp_size > 1 && im % bk != 0)
          return L("mlp.experts.w2_weight_scale_inv") + ": the input size of down's weight " +
                 std::to_string(im) + " is not divisible by weight quantization block_k " +
                 std::to_string(bk);
        continue;
      }
      if (fp8_quantized(c_, L("mlp.gate_proj.weight")))
        if (auto w = out_parts(L("mlp.gate_up_proj.weight_scale_inv"),
                               {{"gate", c_.ffn / t}, {"up", c_.ffn / t}});
            !w.empty())
          return w;
      if (fp8_quantized(c_, L("mlp.down_proj.weight")))
        if (auto w = row_parallel(L("mlp.down_proj.weight_scale_inv"), c_.ffn / t); !w.empty())
          return w;
    }
    return {};
  }

  /// `Store`: `parameter_store`, or `plan_store` for a plan without bytes
  /// (receiver/plan.hpp); `declare` and `load` only add parameters and take views.
  template <class Store>
  void declare(Store& s, std::span<const tensor_meta>) const {
    if (auto why = fp8_unsupported(); !why.empty())
      throw error(errc::unsupported_loader, "tensor " + why);
    const auto t = l_.parallel.tensor_parallel_size, d = c_.head_dim, h = c_.hidden;
    const auto dt = c_.dtype;
    const auto vrows = padded_vocab_ / t;
    const auto bn = c_.fp8 ? c_.fp8->block_n : 1, bk = c_.fp8 ? c_.fp8->block_k : 1;
    auto tiles = [](std::uint64_t n, std::uint64_t b) { return (n + b - 1) / b; };
    // A linear's weight: F8_E4M3 codes plus its block scales when quantised.
    auto linear = [&](const std::string& param, const std::string& canonical, std::uint64_t rows,
                      std::uint64_t cols) {
      if (!fp8_quantized(c_, canonical)) {
        s.add(param, {rows, cols}, dt);
        return;
      }
      s.add(param, {rows, cols}, dtype_id::f8e4m3fn);
      s.add(fp8_scale_name(param), {tiles(rows, bn), tiles(cols, bk)}, dtype_id::f32);
    };
    if (has_embed_) s.add("model.embed_tokens.weight", {vrows, h}, dt);
    for (std::uint64_t i = first_layer_; i < end_layer_; ++i) {
      auto L = [&](const char* x) { return layer_name(i, x); };
      s.add(layer_name(i, "input_layernorm.weight"), {h}, dt);
      linear(L("self_attn.qkv_proj.weight"), L("self_attn.q_proj.weight"), (nq_l_ + 2 * nkv_l_) * d,
             h);
      if (c_.attention_bias)
        s.add(layer_name(i, "self_attn.qkv_proj.bias"), {(nq_l_ + 2 * nkv_l_) * d}, dt);
      linear(L("self_attn.o_proj.weight"), L("self_attn.o_proj.weight"), h, c_.heads * d / t);
      if (c_.o_proj_bias) s.add(layer_name(i, "self_attn.o_proj.bias"), {h}, dt);
      if (c_.qk_norm) {
        s.add(layer_name(i, "self_attn.q_norm.weight"), {d}, dt);
        s.add(layer_name(i, "self_attn.k_norm.weight"), {d}, dt);
      }
      s.add(layer_name(i, "post_attention_layernorm.weight"), {h}, dt);
      if (c_.is_moe_layer(i)) {
        const auto im = c_.moe_ffn / moe_.tp_size;
        s.add(layer_name(i, "mlp.gate.weight"), {c_.experts, h}, dt);
        if (fp8_quantized(c_, expert_name(i, 0, "gate_proj.weight"))) {
          s.add(L("mlp.experts.w13_weight"), {local_experts_, 2 * im, h}, dtype_id::f8e4m3fn);
          s.add(L("mlp.experts.w2_weight"), {local_experts_, h, im}, dtype_id::f8e4m3fn);
          s.add(L("mlp.experts.w13_weight_scale_inv"),
                {local_experts_, 2 * tiles(im, bn), tiles(h, bk)}, dtype_id::f32);
          s.add(L("mlp.experts.w2_weight_scale_inv"), {local_experts_, tiles(h, bn), tiles(im, bk)},
                dtype_id::f32);
        } else {
          s.add(layer_name(i, "mlp.experts.w13_weight"), {local_experts_, 2 * im, h}, dt);
          s.add(layer_name(i, "mlp.experts.w2_weight"), {local_experts_, h, im}, dt);
        }
      } else {
        linear(L("mlp.gate_up_proj.weight"), L("mlp.gate_proj.weight"), 2 * c_.ffn / t, h);
        linear(L("mlp.down_proj.weight"), L("mlp.down_proj.weight"), h, c_.ffn / t);
      }
    }
    if (has_norm_) s.add("model.norm.weight", {h}, dt);
    if (has_lm_head_ && !c_.tied_embeddings) s.add("lm_head.weight", {vrows, h}, dt);
  }

  /// The handle of canonical tensor `name` for `load_handle` (`no_handle`
  /// when vLLM would not know the weight): one name lookup, made once per
  /// tensor at prewarm by a receiver (`handle_loader`, receiver/loader.hpp).
  std::size_t handle(std::string_view name) const {
    auto it = route_index_.find(name);
    return it == route_index_.end() ? no_handle : it->second;
  }

  template <class Store>
  load_report load(std::string_view name, const tensor_view& src, Store& s, copy_sink& sink) const {
    return load_handle(handle(name), name, src, s, sink);
  }

  /// `load(name, ...)` for `h == handle(name)`, without looking the name up.
  template <class Store>
  load_report load_handle(std::size_t h, std::string_view name, const tensor_view& src, Store& s,
                          copy_sink& sink) const {
    if (h >= routes_.size()) return {}; // vLLM would not know the weight: prewarm rejects it
    const route& r = routes_[h];
    const auto t = static_cast<std::int64_t>(l_.parallel.tensor_parallel_size);
    const auto rk = static_cast<std::int64_t>(l_.tp_rank);
    const auto d = static_cast<std::int64_t>(c_.head_dim);
    auto whole = [&](const std::string& p) {
      sink.copy(s.view(p), src);
      return load_report{{p}};
    };
    if (r.scale) return load_scale(r, src, s, sink);
    switch (r.what) {
    case kind::absent:
      sink.skip(name);
      return {};
    case kind::replicated:
      return whole(r.param);
    case kind::vocab: {
      const auto per = static_cast<std::int64_t>(padded_vocab_) / t, lo = rk * per;
      const auto valid = std::clamp<std::int64_t>(static_cast<std::int64_t>(c_.vocab) - lo, 0, per);
      if (valid == 0) {
        sink.skip(name);
        return {};
      }
      sink.copy(s.view(r.param).slice(0, 0, valid), src.slice(0, lo, valid));
      return {{r.param}};
    }
    case kind::q:
    case kind::k:
    case kind::v: {
      const auto nq = static_cast<std::int64_t>(nq_l_) * d,
                 nkv = static_cast<std::int64_t>(nkv_l_) * d;
      const auto kv0 = static_cast<std::int64_t>(kv_head0_) * d;
      auto dst = s.view(r.param);
      if (r.what == kind::q)
        sink.copy(dst.slice(0, 0, nq), src.slice(0, rk * nq, nq));
      else if (r.what == kind::k)
        sink.copy(dst.slice(0, nq, nkv), src.slice(0, kv0, nkv));
      else
        sink.copy(dst.slice(0, nq + nkv, nkv), src.slice(0, kv0, nkv));
      return {{r.param}};
    }
    case kind::gate:
    case kind::up: {
      const auto i = static_cast<std::int64_t>(c_.ffn) / t;
      sink.copy(s.view(r.param).slice(0, r.what == kind::gate ? 0 : i, i), src.slice(0, rk * i, i));
      return {{r.param}};
    }
    case kind::row_parallel: {
      const auto k = src.layout.extents[1] / t;
      sink.copy(s.view(r.param), src.slice(1, rk * k, k));
      return {{r.param}};
    }
    case kind::expert_gate:
    case kind::expert_up:
    case kind::expert_down: {
      auto local = local_expert(r.expert);
      if (!local) {
        sink.skip(name);
        return {};
      }
      const auto mt = static_cast<std::int64_t>(moe_.tp_rank);
      const auto i = static_cast<std::int64_t>(c_.moe_ffn / moe_.tp_size);
      auto e = select(s.view(r.param), 0, static_cast<std::int64_t>(*local));
      if (r.what == kind::expert_down)
        sink.copy(e, src.slice(1, mt * i, i));
      else
        sink.copy(e.slice(0, r.what == kind::expert_gate ? 0 : i, i), src.slice(0, mt * i, i));
      return {{r.param}};
    }
    }
    return {};
  }

private:
  enum class kind {
    absent,
    replicated,
    vocab,
    q,
    k,
    v,
    gate,
    up,
    row_parallel,
    expert_gate,
    expert_up,
    expert_down
  };
  struct route {
    kind what;
    std::string param;
    std::uint64_t expert = 0;
    bool scale = false;    ///< a `weight_scale_inv` tensor (see `load_scale`)
    std::string canonical; ///< the canonical name (for skips of scale routes)
  };

  /// A `weight_scale_inv` tensor, placed as vLLM places `BlockQuantScaleParameter`s
  /// (see the file comment): row counts in tiles of `bn`, columns in tiles of `bk`.
  template <class Store>
  load_report load_scale(const route& r, const tensor_view& src, Store& s, copy_sink& sink) const {
    using i64 = std::int64_t;
    const auto t = static_cast<i64>(l_.parallel.tensor_parallel_size);
    const auto rk = static_cast<i64>(l_.tp_rank);
    const auto d = static_cast<i64>(c_.head_dim);
    const auto bn = static_cast<i64>(c_.fp8->block_n);
    auto tiles = [bn](i64 n) { return (n + bn - 1) / bn; };
    auto dst = s.view(r.param);
    // `adjust_block_scale_shard` then `narrow(output_dim, shard_rank * size, size)`.
    auto rows = [&](tensor_view into, i64 offset, i64 size, i64 shard_rank) {
      const i64 off_t = tiles(offset), size_t_ = tiles(size);
      sink.copy(into.slice(0, off_t, size_t_), src.slice(0, shard_rank * size_t_, size_t_));
    };
    switch (r.what) {
    case kind::q:
    case kind::k:
    case kind::v: {
      const auto nq = static_cast<i64>(nq_l_) * d, nkv = static_cast<i64>(nkv_l_) * d;
      const auto kv_rank =
          t >= static_cast<i64>(c_.kv_heads) ? rk / (t / static_cast<i64>(c_.kv_heads)) : rk;
      if (r.what == kind::q)
        rows(dst, 0, nq, rk);
      else if (r.what == kind::k)
        rows(dst, nq, nkv, kv_rank);
      else
        rows(dst, nq + nkv, nkv, kv_rank);
      return {{r.param}};
    }
    case kind::gate:
    case kind::up: {
      const auto i = static_cast<i64>(c_.ffn) / t;
      rows(dst, r.what == kind::gate ? 0 : i, i, rk);
      return {{r.param}};
    }
    case kind::row_parallel: {
      const auto k = dst.layout.extents[1];
      sink.copy(dst, src.slice(1, rk * k, k));
      return {{r.param}};
    }
    case kind::expert_gate:
    case kind::expert_up:
    case kind::expert_down: {
      auto local = local_expert(r.expert);
      if (!local) {
        sink.skip(r.canonical);
        return {};
      }
      const auto mt = static_cast<i64>(moe_.tp_rank);
      auto e = select(dst, 0, static_cast<i64>(*local));
      if (r.what == kind::expert_down) {
        const auto k = e.layout.extents[1]; // `_load_w2`: shard size = the parameter's columns
        sink.copy(e, src.slice(1, mt * k, k));
      } else {
        const auto n = e.layout.extents[0] / 2; // `_load_w13`: half the parameter's rows
        sink.copy(e.slice(0, r.what == kind::expert_gate ? 0 : n, n), src.slice(0, mt * n, n));
      }
      return {{r.param}};
    }
    default:
      break;
    }
    return {};
  }

  /// The route of `canonical` (the first one set stays: `emplace`).
  void add(std::string canonical, kind k, std::string param, std::uint64_t expert = 0) {
    if (route_index_.count(canonical)) return;
    put(std::move(canonical), route{k, std::move(param), expert, false, {}});
  }
  /// Set the route of `canonical`, replacing any earlier one.
  void put(std::string canonical, route r) {
    auto [it, fresh] = route_index_.emplace(std::move(canonical), routes_.size());
    if (fresh)
      routes_.push_back(std::move(r));
    else
      routes_[it->second] = std::move(r);
  }

  void build_routes() {
    // Every canonical tensor gets a route; those this rank does not hold are
    // skipped explicitly, as vLLM's `is_pp_missing_parameter` skips them.
    for (auto& m : fp8_checkpoint_tensors(c_)) add(m.name, kind::absent, {});
    auto set = [&](const std::string& canonical, kind k, std::string param,
                   std::uint64_t expert = 0) {
      if (fp8_quantized(c_, canonical))
        put(fp8_scale_name(canonical),
            route{k, fp8_scale_name(param), expert, true, fp8_scale_name(canonical)});
      put(canonical, route{k, std::move(param), expert, false, {}});
    };
    if (has_embed_) set("model.embed_tokens.weight", kind::vocab, "model.embed_tokens.weight");
    if (has_norm_) set("model.norm.weight", kind::replicated, "model.norm.weight");
    if (has_lm_head_ && !c_.tied_embeddings) set("lm_head.weight", kind::vocab, "lm_head.weight");
    for (std::uint64_t i = first_layer_; i < end_layer_; ++i) {
      auto L = [&](const char* s) { return layer_name(i, s); };
      set(L("input_layernorm.weight"), kind::replicated, L("input_layernorm.weight"));
      set(L("post_attention_layernorm.weight"), kind::replicated,
          L("post_attention_layernorm.weight"));
      set(L("self_attn.q_proj.weight"), kind::q, L("self_attn.qkv_proj.weight"));
      set(L("self_attn.k_proj.weight"), kind::k, L("self_attn.qkv_proj.weight"));
      set(L("self_attn.v_proj.weight"), kind::v, L("self_attn.qkv_proj.weight"));
      if (c_.attention_bias) {
        set(L("self_attn.q_proj.bias"), kind::q, L("self_attn.qkv_proj.bias"));
        set(L("self_attn.k_proj.bias"), kind::k, L("self_attn.qkv_proj.bias"));
        set(L("self_attn.v_proj.bias"), kind::v, L("self_attn.qkv_proj.bias"));
      }
      set(L("self_attn.o_proj.weight"), kind::row_parallel, L("self_attn.o_proj.weight"));
      if (c_.o_proj_bias) // `RowParallelLinear`'s bias: the whole [hidden] on every rank
        set(L("self_attn.o_proj.bias"), kind::replicated, L("self_attn.o_proj.bias"));
      if (c_.qk_norm) {
        set(L("self_attn.q_norm.weight"), kind::replicated, L("self_attn.q_norm.weight"));
        set(L("self_attn.k_norm.weight"), kind::replicated, L("self_attn.k_norm.weight"));
      }
      if (c_.is_moe_layer(i)) {
        set(L("mlp.gate.weight"), kind::replicated, L("mlp.gate.weight"));
        for (std::uint64_t e = 0; e < c_.experts; ++e) {
          set(expert_name(i, e, "gate_proj.weight"), kind::expert_gate, L("mlp.experts.w13_weight"),
              e);
          set(expert_name(i, e, "up_proj.weight"), kind::expert_up, L("mlp.experts.w13_weight"), e);
          set(expert_name(i, e, "down_proj.weight"), kind::expert_down, L("mlp.experts.w2_weight"),
              e);
        }
      } else {
        set(L("mlp.gate_proj.weight"), kind::gate, L("mlp.gate_up_proj.weight"));
        set(L("mlp.up_proj.weight"), kind::up, L("mlp.gate_up_proj.weight"));
        set(L("mlp.down_proj.weight"), kind::row_parallel, L("mlp.down_proj.weight"));
      }
    }
  }

  model_config c_;
  vllm_layout l_;
  fused_moe_parallel moe_;
  expert_placement placement_ = expert_placement::linear;
  std::vector<std::int64_t> expert_map_;
  std::uint64_t local_experts_ = 0;
  std::uint64_t nq_l_ = 0, nkv_l_ = 0, kv_head0_ = 0, padded_vocab_ = 0;
  std::uint64_t first_layer_ = 0, end_layer_ = 0;
  bool has_embed_ = false, has_norm_ = false, has_lm_head_ = false;
  std::vector<route> routes_;                 ///< by handle
  detail::name_map<std::size_t> route_index_; ///< canonical name -> handle
};
static_assert(native_loader<vllm_style_loader>);
static_assert(handle_loader<vllm_style_loader>);

/// Loaders for every rank of a deployment, in rank order (DP-major, then PP, then TP).
inline std::vector<vllm_style_loader> vllm_style_loaders(const model_config& c,
                                                         const vllm_parallel_config& p) {
  std::vector<vllm_style_loader> v;
  v.reserve(p.world_size());
  for (std::uint64_t r = 0; r < p.world_size(); ++r) v.emplace_back(c, vllm_layout::of_rank(p, r));
  return v;
}

} // namespace dcr::loaders
