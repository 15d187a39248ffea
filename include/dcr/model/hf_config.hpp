#pragma once
/// \file
/// `model_config` from a Hugging Face `config.json` (the file published with
/// a model's weights). Supported architectures: Llama (3.x), Qwen2 / Qwen2.5,
/// Qwen3 dense and Qwen3-MoE. The fields read are the ones that decide which
/// tensors exist and their shapes; fields that would change the set of
/// tensors or their shapes in a way dcr does not model (an MLP bias, shared
/// experts, a quantisation other than block-wise FP8 E4M3, another
/// activation) are refused with an error naming the field. A block-wise FP8
/// `quantization_config` sets `model_config::fp8`. Fields that change only the computation (RoPE,
/// eps, sliding window) are ignored.
///
/// Errors: `errc::bad_format` for malformed JSON or a field of the wrong JSON
/// type, `errc::invalid_argument` for a missing required field, a value out
/// of range or an unsupported feature. Messages start with "config.json:" and
/// name the field.

#include <cstdint>
#include <string>
#include <string_view>

#include "dcr/core/error.hpp"
#include "dcr/core/json.hpp"
#include "dcr/model/config.hpp"

namespace dcr {

namespace detail {

class hf_fields {
public:
  explicit hf_fields(const json_value& root) : root_(root) {}

  [[noreturn]] static void bad(errc code, const std::string& field, const std::string& why) {
    throw error(code, "config.json: field '" + field + "' " + why);
  }
  const json_value* find(const std::string& field) const {
    const auto* v = root_.get(field);
    return v && v->type != json_value::kind::null ? v : nullptr;
  }
  std::uint64_t u64(const std::string& field) const {
    const auto* v = find(field);
    if (!v) bad(errc::invalid_argument, field, "is required");
    return u64_of(*v, field);
  }
  std::uint64_t u64_or(const std::string& field, std::uint64_t fallback) const {
    const auto* v = find(field);
    return v ? u64_of(*v, field) : fallback;
  }
  bool flag_or(const std::string& field, bool fallback) const {
    const auto* v = find(field);
    if (!v) return fallback;
    if (v->type != json_value::kind::boolean) bad(errc::bad_format, field, "must be true or false");
    return v->boolean;
  }
  std::string text_or(const std::string& field, std::string fallback) const {
    const auto* v = find(field);
    if (!v) return fallback;
    if (!v->is_string()) bad(errc::bad_format, field, "must be a string");
    return v->text;
  }

private:
  static std::uint64_t u64_of(const json_value& v, const std::string& field) {
    std::uint64_t out = 0;
    if (v.type != json_value::kind::number || !v.as_u64(out))
      bad(errc::bad_format, field, "must be a non-negative integer (got '" + v.text + "')");
    return out;
  }
  const json_value& root_;
};

/// `quantization_config`: only block-wise FP8 E4M3 with dynamic activation
/// scales (the form vLLM's `Fp8Config` accepts with `weight_block_size`).
inline fp8_block_quantization fp8_from_hf(const json_value& q) {
  const std::string qc = "quantization_config";
  if (!q.is_object()) hf_fields::bad(errc::bad_format, qc, "must be an object");
  hf_fields f(q);
  const auto method = f.text_or("quant_method", "");
  if (method != "fp8")
    hf_fields::bad(errc::invalid_argument, qc + ".quant_method",
                   "= \"" + method + "\" is not supported (fp8)");
  if (const auto fmt = f.text_or("fmt", "e4m3"); fmt != "e4m3")
    hf_fields::bad(errc::invalid_argument, qc + ".fmt",
                   "= \"" + fmt + "\" is not supported (e4m3)");
  if (const auto act = f.text_or("activation_scheme", "dynamic"); act != "dynamic")
    hf_fields::bad(errc::invalid_argument, qc + ".activation_scheme",
                   "= \"" + act +
                       "\" is not supported: block-wise FP8 needs dynamic activation "
                       "scales");
  const auto* b = f.find("weight_block_size");
  if (!b)
    hf_fields::bad(errc::invalid_argument, qc + ".weight_block_size",
                   "is absent: per-tensor FP8 is not supported");
  fp8_block_quantization out;
  std::uint64_t dims[2] = {0, 0};
  if (!b->is_array() || b->items.size() != 2)
    hf_fields::bad(errc::bad_format, qc + ".weight_block_size", "must be [block_n, block_k]");
  for (int i = 0; i < 2; ++i)
    if (b->items[i].type != json_value::kind::number || !b->items[i].as_u64(dims[i]) ||
        dims[i] == 0)
      hf_fields::bad(errc::invalid_argument, qc + ".weight_block_size",
                     "holds '" + b->items[i].text + "', not a positive integer");
  out.block_n = dims[0];
  out.block_k = dims[1];
  for (const char* key : {"modules_to_not_convert", "ignored_layers"}) {
    const auto* m = f.find(key);
    if (!m) continue;
    if (!m->is_array()) hf_fields::bad(errc::bad_format, qc + "." + key, "must be an array");
    for (auto& x : m->items) {
      if (!x.is_string())
        hf_fields::bad(errc::bad_format, qc + "." + key, "must hold module names");
      out.modules_to_not_convert.push_back(x.text);
    }
  }
  return out;
}

} // namespace detail

/// Parse a Hugging Face `config.json`. Throws `dcr::error` (see file comment).
inline model_config model_config_from_hf_json(std::string_view json) {
  json_value root;
  throw_if_failed(parse_json(json, root, "config.json"));
  if (!root.is_object()) throw error(errc::bad_format, "config.json: top level must be an object");
  detail::hf_fields f(root);
  using detail::hf_fields;

  const std::string type = f.text_or("model_type", "");
  if (type.empty()) hf_fields::bad(errc::invalid_argument, "model_type", "is required");
  if (type != "llama" && type != "qwen2" && type != "qwen3" && type != "qwen3_moe")
    hf_fields::bad(errc::invalid_argument, "model_type",
                   "= \"" + type + "\" is not supported (llama, qwen2, qwen3, qwen3_moe)");
  if (const auto* a = f.find("architectures")) {
    static constexpr std::string_view known[] = {"LlamaForCausalLM", "Qwen2ForCausalLM",
                                                 "Qwen3ForCausalLM", "Qwen3MoeForCausalLM"};
    if (!a->is_array()) hf_fields::bad(errc::bad_format, "architectures", "must be an array");
    for (auto& x : a->items) {
      bool ok = false;
      for (auto k : known) ok = ok || (x.is_string() && x.text == k);
      if (!ok)
        hf_fields::bad(errc::invalid_argument, "architectures",
                       "lists \"" + x.text + "\", which is not supported");
    }
  }
  if (const auto act = f.text_or("hidden_act", "silu"); act != "silu")
    hf_fields::bad(errc::invalid_argument, "hidden_act",
                   "= \"" + act + "\" is not supported (silu)");
  if (f.flag_or("mlp_bias", false))
    hf_fields::bad(errc::invalid_argument, "mlp_bias", "= true is not supported");
  if (f.u64_or("shared_expert_intermediate_size", 0) != 0)
    hf_fields::bad(errc::invalid_argument, "shared_expert_intermediate_size",
                   "> 0 (shared experts) is not supported");

  model_config c;
  c.family = type;
  c.hidden = f.u64("hidden_size");
  c.layers = f.u64("num_hidden_layers");
  c.heads = f.u64("num_attention_heads");
  c.kv_heads = f.u64_or("num_key_value_heads", c.heads); // absent: multi-head attention
  if (c.hidden == 0) hf_fields::bad(errc::invalid_argument, "hidden_size", "must be > 0");
  if (c.layers == 0) hf_fields::bad(errc::invalid_argument, "num_hidden_layers", "must be > 0");
  if (c.heads == 0) hf_fields::bad(errc::invalid_argument, "num_attention_heads", "must be > 0");
  if (c.kv_heads == 0 || c.heads % c.kv_heads != 0)
    hf_fields::bad(errc::invalid_argument, "num_key_value_heads",
                   "must divide num_attention_heads");
  // head_dim defaults to hidden / heads in LlamaConfig, Qwen2Config and Qwen3Config.
  if (!f.find("head_dim") && c.hidden % c.heads != 0)
    hf_fields::bad(errc::invalid_argument, "head_dim",
                   "is absent and hidden_size % num_attention_heads != 0");
  c.head_dim = f.u64_or("head_dim", c.hidden / c.heads);
  if (c.head_dim == 0) hf_fields::bad(errc::invalid_argument, "head_dim", "must be > 0");
  c.ffn = f.u64("intermediate_size");
  c.vocab = f.u64("vocab_size");
  if (c.vocab == 0) hf_fields::bad(errc::invalid_argument, "vocab_size", "must be > 0");
  c.tied_embeddings = f.flag_or("tie_word_embeddings", false);
  // Qwen2's attention always has q/k/v biases (no config field); Llama and
  // Qwen3 read `attention_bias`, which in Llama biases `o_proj` as well. q_norm / k_norm exist in
  // every Qwen3 layer.
  c.attention_bias = type == "qwen2" ? true : f.flag_or("attention_bias", false);
  c.o_proj_bias = type == "llama" && c.attention_bias;
  c.qk_norm = type == "qwen3" || type == "qwen3_moe";
  if (type == "qwen3_moe") {
    // transformers 5 writes Qwen3-MoE's expert count as `num_local_experts`,
    // earlier versions as `num_experts`; either, or both when they agree.
    const bool has_n = f.find("num_experts") != nullptr,
               has_local = f.find("num_local_experts") != nullptr;
    if (has_n && has_local && f.u64("num_experts") != f.u64("num_local_experts"))
      hf_fields::bad(errc::invalid_argument, "num_local_experts",
                     "= " + std::to_string(f.u64("num_local_experts")) +
                         " disagrees with num_experts = " + std::to_string(f.u64("num_experts")));
    c.experts = f.u64(has_local && !has_n ? "num_local_experts" : "num_experts");
    c.moe_ffn = c.experts ? f.u64("moe_intermediate_size") : 0;
    c.decoder_sparse_step = f.u64_or("decoder_sparse_step", 1);
    if (c.decoder_sparse_step == 0)
      hf_fields::bad(errc::invalid_argument, "decoder_sparse_step", "must be >= 1");
    if (const auto* m = f.find("mlp_only_layers")) {
      if (!m->is_array())
        hf_fields::bad(errc::bad_format, "mlp_only_layers", "must be an array of layer indices");
      for (auto& x : m->items) {
        std::uint64_t l = 0;
        if (x.type != json_value::kind::number || !x.as_u64(l) || l >= c.layers)
          hf_fields::bad(errc::invalid_argument, "mlp_only_layers",
                         "holds '" + x.text + "', not a layer index");
        c.mlp_only_layers.push_back(l);
      }
    }
    if (c.experts && c.moe_ffn == 0)
      hf_fields::bad(errc::invalid_argument, "moe_intermediate_size", "must be > 0");
  } else {
    for (auto* k : {"num_experts", "num_local_experts", "n_routed_experts"})
      if (f.u64_or(k, 0) != 0)
        hf_fields::bad(errc::invalid_argument, k, "> 0 on a dense model_type \"" + type + "\"");
  }
  if (c.has_dense_layer() && c.ffn == 0)
    hf_fields::bad(errc::invalid_argument, "intermediate_size", "must be > 0");
  if (const auto* q = f.find("quantization_config")) c.fp8 = detail::fp8_from_hf(*q);
  const auto dt = f.text_or("torch_dtype", f.text_or("dtype", "bfloat16"));
  if (dt == "bfloat16")
    c.dtype = dtype_id::bf16;
  else if (dt == "float16")
    c.dtype = dtype_id::f16;
  else if (dt == "float32")
    c.dtype = dtype_id::f32;
  else
    hf_fields::bad(errc::invalid_argument, "torch_dtype",
                   "= \"" + dt + "\" is not supported (bfloat16, float16, float32)");
  return c;
}

} // namespace dcr
