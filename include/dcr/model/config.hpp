#pragma once
/// \file
/// Model descriptions by canonical tensors (Hugging Face names and shapes).
/// Both sides derive their layouts from these: the trainer its Megatron-style
/// shards, the receiver's native loader its fused parameters.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dcr/core/tensor.hpp"

namespace dcr {

/// Block-wise FP8 quantisation of a checkpoint, as Hugging Face's
/// `quantization_config = {"quant_method": "fp8", "fmt": "e4m3",
/// "weight_block_size": [block_n, block_k]}` describes it (DeepSeek-V3,
/// Qwen3-FP8): each quantised linear weight `x.weight` [N, K] is stored as
/// E4M3fn codes plus `x.weight_scale_inv` (F32, [ceil(N/block_n),
/// ceil(K/block_k)], one per tile, edge tiles partial).
struct fp8_block_quantization {
  std::uint64_t block_n = 128; ///< tile rows (output dimension)
  std::uint64_t block_k = 128; ///< tile columns (input dimension)
  /// Linear modules left unquantised (`modules_to_not_convert`, vLLM's
  /// `ignored_layers`): a module whose name equals an entry, or ends with
  /// "." followed by it, keeps its BF16 weight.
  std::vector<std::string> modules_to_not_convert;
};

/// Llama-style dense or Qwen3-MoE-style transformer. `experts == 0` means dense.
/// A MoE model may mix dense layers in (Qwen3-MoE's `decoder_sparse_step` and
/// `mlp_only_layers`); its dense layers use the `ffn` intermediate size.
struct model_config {
  std::string family = "llama"; ///< "llama", "qwen2", "qwen3" or "qwen3_moe"
  std::uint64_t hidden = 256;
  std::uint64_t layers = 2;
  std::uint64_t heads = 8;     ///< query heads (nh)
  std::uint64_t kv_heads = 2;  ///< key/value heads = query groups (ng)
  std::uint64_t head_dim = 32; ///< d
  std::uint64_t ffn = 512;     ///< dense MLP intermediate size
  std::uint64_t experts = 0;   ///< routed experts (0: dense MLP)
  std::uint64_t moe_ffn = 0;   ///< per-expert intermediate size
  std::uint64_t vocab = 1000;
  bool tied_embeddings = false; ///< lm_head shares embed_tokens (no lm_head tensor)
  bool qk_norm = false;         ///< Qwen3 per-head q_norm / k_norm
  bool attention_bias = false;  ///< q/k/v biases (Qwen2-style)
  /// An `o_proj` bias [hidden] too: Llama's `attention_bias` gives every
  /// attention projection one (Hugging Face's and vLLM's `LlamaAttention`),
  /// Qwen2's and Qwen3's only q/k/v. Set by `model_config_from_hf_json`.
  bool o_proj_bias = false;
  std::uint64_t decoder_sparse_step = 1;      ///< layer i is MoE when (i + 1) % step == 0 ...
  std::vector<std::uint64_t> mlp_only_layers; ///< ... and i is not listed here
  std::uint64_t expert_groups = 0; ///< grouped top-k groups (0: none; Qwen3-MoE has none)
  dtype_id dtype = dtype_id::bf16;
  /// Set when the published checkpoint is block-quantised FP8 (see
  /// `fp8_checkpoint_tensors`); training still holds `dtype` weights.
  std::optional<fp8_block_quantization> fp8;

  bool is_moe() const noexcept { return experts > 0; }
  /// Whether layer `i` has a routed-expert MLP, by the rule of vLLM's and
  /// Hugging Face's `Qwen3MoeDecoderLayer`: experts > 0, `i` not in
  /// `mlp_only_layers`, and `(i + 1) % decoder_sparse_step == 0`.
  bool is_moe_layer(std::uint64_t i) const noexcept {
    if (!is_moe() || decoder_sparse_step == 0 || (i + 1) % decoder_sparse_step != 0) return false;
    for (auto l : mlp_only_layers)
      if (l == i) return false;
    return true;
  }
  /// Whether some layer has a dense MLP.
  bool has_dense_layer() const noexcept {
    for (std::uint64_t i = 0; i < layers; ++i)
      if (!is_moe_layer(i)) return true;
    return false;
  }
};

/// Name of a per-layer tensor, e.g. layer_name(3, "self_attn.q_proj.weight").
inline std::string layer_name(std::uint64_t layer, const std::string& suffix) {
  return "model.layers." + std::to_string(layer) + "." + suffix;
}

/// Name of a per-expert tensor, e.g. expert_name(3, 7, "gate_proj.weight").
inline std::string expert_name(std::uint64_t layer, std::uint64_t expert,
                               const std::string& suffix) {
  return layer_name(layer, "mlp.experts." + std::to_string(expert) + "." + suffix);
}

/// Canonical tensors of a model in checkpoint order (HF names, row-major
/// shapes [out, in] for linear weights).
inline std::vector<tensor_meta> canonical_tensors(const model_config& c) {
  std::vector<tensor_meta> t;
  auto add = [&](std::string name, std::vector<std::uint64_t> shape) {
    t.push_back({std::move(name), std::move(shape), c.dtype});
  };
  const auto q = c.heads * c.head_dim, kv = c.kv_heads * c.head_dim;
  add("model.embed_tokens.weight", {c.vocab, c.hidden});
  for (std::uint64_t i = 0; i < c.layers; ++i) {
    add(layer_name(i, "input_layernorm.weight"), {c.hidden});
    add(layer_name(i, "self_attn.q_proj.weight"), {q, c.hidden});
    add(layer_name(i, "self_attn.k_proj.weight"), {kv, c.hidden});
    add(layer_name(i, "self_attn.v_proj.weight"), {kv, c.hidden});
    if (c.attention_bias) {
      add(layer_name(i, "self_attn.q_proj.bias"), {q});
      add(layer_name(i, "self_attn.k_proj.bias"), {kv});
      add(layer_name(i, "self_attn.v_proj.bias"), {kv});
    }
    add(layer_name(i, "self_attn.o_proj.weight"), {c.hidden, q});
    if (c.o_proj_bias) add(layer_name(i, "self_attn.o_proj.bias"), {c.hidden});
    if (c.qk_norm) {
      add(layer_name(i, "self_attn.q_norm.weight"), {c.head_dim});
      add(layer_name(i, "self_attn.k_norm.weight"), {c.head_dim});
    }
    add(layer_name(i, "post_attention_layernorm.weight"), {c.hidden});
    if (c.is_moe_layer(i)) {
      add(layer_name(i, "mlp.gate.weight"), {c.experts, c.hidden});
      for (std::uint64_t e = 0; e < c.experts; ++e) {
        add(expert_name(i, e, "gate_proj.weight"), {c.moe_ffn, c.hidden});
        add(expert_name(i, e, "up_proj.weight"), {c.moe_ffn, c.hidden});
        add(expert_name(i, e, "down_proj.weight"), {c.hidden, c.moe_ffn});
      }
    } else {
      add(layer_name(i, "mlp.gate_proj.weight"), {c.ffn, c.hidden});
      add(layer_name(i, "mlp.up_proj.weight"), {c.ffn, c.hidden});
      add(layer_name(i, "mlp.down_proj.weight"), {c.hidden, c.ffn});
    }
  }
  add("model.norm.weight", {c.hidden});
  if (!c.tied_embeddings) add("lm_head.weight", {c.vocab, c.hidden});
  return t;
}

/// Whether canonical tensor `name` of `c` is an FP8-quantised linear weight
/// in the checkpoint: `c.fp8` is set, the tensor is the weight of an
/// attention or MLP projection (q/k/v/o, gate/up/down, routed experts) and
/// its module is not listed in `modules_to_not_convert`. Embeddings,
/// `lm_head`, norms, biases and the MoE router always stay unquantised.
inline bool fp8_quantized(const model_config& c, const std::string& name) {
  if (!c.fp8) return false;
  static constexpr const char* projections[] = {
      "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
      "self_attn.o_proj.weight", "gate_proj.weight",        "up_proj.weight",
      "down_proj.weight"};
  auto ends_with = [](const std::string& s, const std::string& x) {
    return s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  bool linear = false;
  for (auto* p : projections) linear = linear || ends_with(name, std::string(".") + p);
  if (!linear || name.rfind("model.layers.", 0) != 0) return false;
  const std::string module = name.substr(0, name.size() - 7); // drop ".weight"
  for (auto& m : c.fp8->modules_to_not_convert)
    if (!m.empty() && (module == m || ends_with(module, "." + m))) return false;
  return true;
}

/// Name of the FP8 inverse-scale tensor of a quantised weight
/// ("x.weight" -> "x.weight_scale_inv").
inline std::string fp8_scale_name(const std::string& weight) { return weight + "_scale_inv"; }

/// Tensors of the checkpoint as published (the rollout's canonical form): the
/// `canonical_tensors` of `c`, where each FP8-quantised weight (see
/// `fp8_quantized`) becomes its E4M3fn codes followed by its F32
/// `weight_scale_inv` tile scales. Without `c.fp8` this is `canonical_tensors(c)`.
inline std::vector<tensor_meta> fp8_checkpoint_tensors(const model_config& c) {
  if (c.fp8 && (c.fp8->block_n == 0 || c.fp8->block_k == 0))
    throw error(errc::invalid_argument, "fp8 weight_block_size must be positive");
  std::vector<tensor_meta> out;
  for (auto& m : canonical_tensors(c)) {
    if (!fp8_quantized(c, m.name)) {
      out.push_back(m);
      continue;
    }
    const auto bn = c.fp8->block_n, bk = c.fp8->block_k;
    out.push_back({m.name, m.shape, dtype_id::f8e4m3fn});
    out.push_back({fp8_scale_name(m.name),
                   {(m.shape[0] + bn - 1) / bn, (m.shape[1] + bk - 1) / bk},
                   dtype_id::f32});
  }
  return out;
}

/// Small Llama-style dense config for tests (GQA: 8 query heads, 2 KV heads).
inline model_config tiny_llama() { return {}; }

/// Small Qwen3-MoE-style config for tests (8 experts, q/k norms).
inline model_config tiny_qwen3_moe() {
  model_config c;
  c.family = "qwen3_moe";
  c.hidden = 128;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 32;
  c.experts = 8;
  c.moe_ffn = 64;
  c.ffn = 0;
  c.vocab = 777;
  c.qk_norm = true;
  return c;
}

} // namespace dcr
