#pragma once
/// \file
/// A reference native loader that places Llama / Qwen3-MoE canonical tensors
/// the way vLLM's model loaders do for tensor parallel size t, rank r and
/// expert parallelism:
/// - `qkv_proj` fused [q | k | v]: q rows [r·nq_l·d, +nq_l·d) with nq_l = nh/t;
///   if t >= nkv then nkv_l = 1 and rank r takes K/V head r / (t/nkv) (one
///   canonical head feeds t/nkv ranks), else nkv_l = nkv/t, rows [r·nkv_l·d, +nkv_l·d);
/// - `gate_up_proj` fused [gate rows r·I/t, +I/t ; up rows r·I/t, +I/t];
/// - row-parallel `o_proj`, `down_proj`: columns [r·K/t, +K/t);
/// - vocab-parallel `embed_tokens` / `lm_head`: rows padded to a multiple of
///   64·t, rank r holds rows [r·P/t, +P/t); padding rows stay zero (never
///   copied); a rank holding only padding skips the tensor; tied embeddings
///   have no `lm_head` tensor;
/// - norms and the MoE router replicated;
/// - fused MoE `experts.w13_weight[e_local]` = [gate; up] TP-split and
///   `experts.w2_weight[e_local]` column-split; an expert whose EP rank is not
///   this one is skipped explicitly (linear or round-robin expert maps).
/// Every copy's source is a view of the canonical input, so every path is
/// representation preserving (XOR allowed everywhere).

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

/// How global experts are assigned to EP ranks.
enum class expert_map {
  linear,      ///< rank g / (E/ep), local g % (E/ep)
  round_robin, ///< rank g % ep, local g / ep
};

/// Parallel layout of one serving rank.
struct vllm_layout {
  std::uint64_t tp_size = 1, tp_rank = 0;
  std::uint64_t ep_size = 1, ep_rank = 0;
  expert_map experts = expert_map::linear;
};

/// vLLM-style native loader (see file comment for the placement rules).
class vllm_style_loader {
public:
  /// Throws `invalid_argument` when the layout does not divide the model.
  vllm_style_loader(model_config cfg, vllm_layout lay) : c_(std::move(cfg)), l_(lay) {
    const auto t = l_.tp_size;
    auto need = [](bool ok, const std::string& what) {
      if (!ok) throw error(errc::invalid_argument, "vllm_style_loader: " + what);
    };
    need(t > 0 && l_.tp_rank < t, "tp_rank must be < tp_size");
    need(l_.ep_size > 0 && l_.ep_rank < l_.ep_size, "ep_rank must be < ep_size");
    need(c_.heads % t == 0, "heads not divisible by tp_size");
    need(t >= c_.kv_heads ? t % c_.kv_heads == 0 : c_.kv_heads % t == 0, "kv_heads and tp_size do not divide");
    need(c_.is_moe() || c_.ffn % t == 0, "ffn not divisible by tp_size");
    need(!c_.is_moe() || (c_.moe_ffn % t == 0 && c_.experts % l_.ep_size == 0), "experts/moe_ffn do not divide");
    nq_l_ = c_.heads / t;
    nkv_l_ = t >= c_.kv_heads ? 1 : c_.kv_heads / t;
    kv_head0_ = t >= c_.kv_heads ? l_.tp_rank / (t / c_.kv_heads) : l_.tp_rank * nkv_l_;
    padded_vocab_ = (c_.vocab + 64 * t - 1) / (64 * t) * (64 * t);
    build_routes();
  }

  const model_config& config() const noexcept { return c_; }
  const vllm_layout& layout() const noexcept { return l_; }
  /// Vocabulary rows after padding to a multiple of 64·t.
  std::uint64_t padded_vocab() const noexcept { return padded_vocab_; }
  /// (EP rank, local index) of global expert `g`.
  std::pair<std::uint64_t, std::uint64_t> expert_home(std::uint64_t g) const noexcept {
    const auto per = c_.experts / l_.ep_size;
    return l_.experts == expert_map::linear ? std::pair{g / per, g % per} : std::pair{g % l_.ep_size, g / l_.ep_size};
  }

  void declare(parameter_store& s, std::span<const tensor_meta>) const {
    const auto t = l_.tp_size, d = c_.head_dim, h = c_.hidden;
    const auto dt = c_.dtype;
    const auto vrows = padded_vocab_ / t;
    s.add("model.embed_tokens.weight", {vrows, h}, dt);
    for (std::uint64_t i = 0; i < c_.layers; ++i) {
      s.add(layer_name(i, "input_layernorm.weight"), {h}, dt);
      s.add(layer_name(i, "self_attn.qkv_proj.weight"), {(nq_l_ + 2 * nkv_l_) * d, h}, dt);
      if (c_.attention_bias) s.add(layer_name(i, "self_attn.qkv_proj.bias"), {(nq_l_ + 2 * nkv_l_) * d}, dt);
      s.add(layer_name(i, "self_attn.o_proj.weight"), {h, c_.heads * d / t}, dt);
      if (c_.qk_norm) {
        s.add(layer_name(i, "self_attn.q_norm.weight"), {d}, dt);
        s.add(layer_name(i, "self_attn.k_norm.weight"), {d}, dt);
      }
      s.add(layer_name(i, "post_attention_layernorm.weight"), {h}, dt);
      if (c_.is_moe()) {
        const auto el = c_.experts / l_.ep_size, im = c_.moe_ffn / t;
        s.add(layer_name(i, "mlp.gate.weight"), {c_.experts, h}, dt);
        s.add(layer_name(i, "mlp.experts.w13_weight"), {el, 2 * im, h}, dt);
        s.add(layer_name(i, "mlp.experts.w2_weight"), {el, h, im}, dt);
      } else {
        s.add(layer_name(i, "mlp.gate_up_proj.weight"), {2 * c_.ffn / t, h}, dt);
        s.add(layer_name(i, "mlp.down_proj.weight"), {h, c_.ffn / t}, dt);
      }
    }
    s.add("model.norm.weight", {h}, dt);
    if (!c_.tied_embeddings) s.add("lm_head.weight", {vrows, h}, dt);
  }

  load_report load(std::string_view name, const tensor_view& src, parameter_store& s, copy_sink& sink) const {
    auto it = routes_.find(std::string(name));
    if (it == routes_.end()) return {}; // vLLM would not know the weight: prewarm rejects it
    const route& r = it->second;
    const auto t = static_cast<std::int64_t>(l_.tp_size), rk = static_cast<std::int64_t>(l_.tp_rank);
    const auto d = static_cast<std::int64_t>(c_.head_dim);
    auto whole = [&](const std::string& p) {
      sink.copy(s.view(p), src);
      return load_report{{p}};
    };
    switch (r.what) {
    case kind::replicated: return whole(r.param);
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
      const auto nq = static_cast<std::int64_t>(nq_l_) * d, nkv = static_cast<std::int64_t>(nkv_l_) * d;
      const auto kv0 = static_cast<std::int64_t>(kv_head0_) * d;
      auto dst = s.view(r.param);
      if (r.what == kind::q) sink.copy(dst.slice(0, 0, nq), src.slice(0, rk * nq, nq));
      else if (r.what == kind::k) sink.copy(dst.slice(0, nq, nkv), src.slice(0, kv0, nkv));
      else sink.copy(dst.slice(0, nq + nkv, nkv), src.slice(0, kv0, nkv));
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
      auto [home, local] = expert_home(r.expert);
      if (home != l_.ep_rank) {
        sink.skip(name);
        return {};
      }
      const auto i = static_cast<std::int64_t>(c_.moe_ffn) / t;
      auto e = select(s.view(r.param), 0, static_cast<std::int64_t>(local));
      if (r.what == kind::expert_down) sink.copy(e, src.slice(1, rk * i, i));
      else sink.copy(e.slice(0, r.what == kind::expert_gate ? 0 : i, i), src.slice(0, rk * i, i));
      return {{r.param}};
    }
    }
    return {};
  }

private:
  enum class kind { replicated, vocab, q, k, v, gate, up, row_parallel, expert_gate, expert_up, expert_down };
  struct route {
    kind what;
    std::string param;
    std::uint64_t expert = 0;
  };

  void add(std::string canonical, kind k, std::string param, std::uint64_t expert = 0) {
    routes_.emplace(std::move(canonical), route{k, std::move(param), expert});
  }

  void build_routes() {
    add("model.embed_tokens.weight", kind::vocab, "model.embed_tokens.weight");
    add("model.norm.weight", kind::replicated, "model.norm.weight");
    if (!c_.tied_embeddings) add("lm_head.weight", kind::vocab, "lm_head.weight");
    for (std::uint64_t i = 0; i < c_.layers; ++i) {
      auto L = [&](const char* s) { return layer_name(i, s); };
      add(L("input_layernorm.weight"), kind::replicated, L("input_layernorm.weight"));
      add(L("post_attention_layernorm.weight"), kind::replicated, L("post_attention_layernorm.weight"));
      add(L("self_attn.q_proj.weight"), kind::q, L("self_attn.qkv_proj.weight"));
      add(L("self_attn.k_proj.weight"), kind::k, L("self_attn.qkv_proj.weight"));
      add(L("self_attn.v_proj.weight"), kind::v, L("self_attn.qkv_proj.weight"));
      if (c_.attention_bias) {
        add(L("self_attn.q_proj.bias"), kind::q, L("self_attn.qkv_proj.bias"));
        add(L("self_attn.k_proj.bias"), kind::k, L("self_attn.qkv_proj.bias"));
        add(L("self_attn.v_proj.bias"), kind::v, L("self_attn.qkv_proj.bias"));
      }
      add(L("self_attn.o_proj.weight"), kind::row_parallel, L("self_attn.o_proj.weight"));
      if (c_.qk_norm) {
        add(L("self_attn.q_norm.weight"), kind::replicated, L("self_attn.q_norm.weight"));
        add(L("self_attn.k_norm.weight"), kind::replicated, L("self_attn.k_norm.weight"));
      }
      if (c_.is_moe()) {
        add(L("mlp.gate.weight"), kind::replicated, L("mlp.gate.weight"));
        for (std::uint64_t e = 0; e < c_.experts; ++e) {
          add(expert_name(i, e, "gate_proj.weight"), kind::expert_gate, L("mlp.experts.w13_weight"), e);
          add(expert_name(i, e, "up_proj.weight"), kind::expert_up, L("mlp.experts.w13_weight"), e);
          add(expert_name(i, e, "down_proj.weight"), kind::expert_down, L("mlp.experts.w2_weight"), e);
        }
      } else {
        add(L("mlp.gate_proj.weight"), kind::gate, L("mlp.gate_up_proj.weight"));
        add(L("mlp.up_proj.weight"), kind::up, L("mlp.gate_up_proj.weight"));
        add(L("mlp.down_proj.weight"), kind::row_parallel, L("mlp.down_proj.weight"));
      }
    }
  }

  model_config c_;
  vllm_layout l_;
  std::uint64_t nq_l_ = 0, nkv_l_ = 0, kv_head0_ = 0, padded_vocab_ = 0;
  std::unordered_map<std::string, route> routes_;
};
static_assert(native_loader<vllm_style_loader>);

} // namespace dcr::loaders
