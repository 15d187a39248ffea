// vLLM-style loader: every stored element is checked against placement
// formulas written independently of the loader, over whole parameters, for
// TP 1..8 (t > nkv included), EP with linear and round-robin expert maps,
// tied embeddings, odd vocabularies and biases. Canonical tensors are FP32
// with a unique word per element (tensor id, flat index), so each stored word
// names its source; coverage across ranks is counted too.
#include <doctest/doctest.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "dcr/loaders/cast_transpose.hpp"
#include "dcr/loaders/vllm_style.hpp"
#include "dcr/receiver/receiver.hpp"
#include "dcr/receiver/tensor_set.hpp"

using namespace dcr;
using loaders::expert_map;

namespace {

std::uint32_t tag(std::size_t tensor, std::uint64_t flat) {
  return static_cast<std::uint32_t>(((tensor + 1) << 24) | flat);
}

tensor_set tagged_model(const std::vector<tensor_meta>& metas) {
  tensor_set s(metas);
  for (std::size_t t = 0; t < metas.size(); ++t) {
    REQUIRE(metas[t].numel() < (1u << 24));
    REQUIRE(metas[t].shape.size() <= 2);
    auto w = s.tensors()[t].words<f32>();
    for (std::uint64_t i = 0; i < w.size(); ++i) w[i] = tag(t, i);
  }
  return s;
}

struct expectation {
  std::size_t tensor = 0;
  std::uint64_t row = 0, col = 0; // canonical coordinate (row only for 1-D)
  bool padding = false;
};

// Independent statement of the vLLM placement rules.
struct vllm_reference {
  model_config c;
  std::uint64_t t, r, ep, er;
  expert_map map;
  std::map<std::string, std::size_t> idx; // canonical name -> tensor index

  std::uint64_t padded() const { return ((c.vocab + 64 * t - 1) / (64 * t)) * 64 * t; }
  std::uint64_t nq_l() const { return c.heads / t; }
  std::uint64_t nkv_l() const { return c.kv_heads >= t ? c.kv_heads / t : 1; }
  std::uint64_t kv_first_head() const { return c.kv_heads >= t ? r * nkv_l() : r * c.kv_heads / t; }
  std::uint64_t global_expert(std::uint64_t local) const {
    const auto el = c.experts / ep;
    return map == expert_map::linear ? er * el + local : local * ep + er;
  }
  std::size_t at(const std::string& n) const { return idx.at(n); }

  // Source of element `coord` (row-major coordinates) of parameter `p`.
  expectation source(const std::string& p, const std::vector<std::uint64_t>& x) const {
    const auto d = c.head_dim;
    auto layer_of = [&](const std::string& n) { return std::stoull(n.substr(13)); };
    auto L = [&](const std::string& n, const char* s) { return layer_name(layer_of(n), s); };
    auto ends = [&](const char* s) {
      const std::string suf(s);
      return p.size() >= suf.size() && p.compare(p.size() - suf.size(), suf.size(), suf) == 0;
    };
    if (p == "model.embed_tokens.weight" || p == "lm_head.weight") {
      const auto g = r * (padded() / t) + x[0];
      if (g >= c.vocab) return {0, 0, 0, true};
      return {at(p == "lm_head.weight" && !c.tied_embeddings ? p : "model.embed_tokens.weight"), g, x[1]};
    }
    if (ends("qkv_proj.weight") || ends("qkv_proj.bias")) {
      const bool bias = ends("bias");
      const auto i = x[0];
      const auto col = bias ? 0 : x[1];
      const char* sfx = bias ? "bias" : "weight";
      const auto nq = nq_l() * d, nkv = nkv_l() * d;
      if (i < nq) return {at(L(p, ("self_attn.q_proj." + std::string(sfx)).c_str())), r * nq + i, col};
      const bool is_k = i < nq + nkv;
      const auto j = i - nq - (is_k ? 0 : nkv);
      return {at(L(p, (std::string("self_attn.") + (is_k ? "k" : "v") + "_proj." + sfx).c_str())),
              kv_first_head() * d + j, col};
    }
    if (ends("o_proj.weight")) return {at(p), x[0], r * (c.heads * d / t) + x[1]};
    if (ends("gate_up_proj.weight")) {
      const auto il = c.ffn / t;
      return {at(L(p, x[0] < il ? "mlp.gate_proj.weight" : "mlp.up_proj.weight")), r * il + x[0] % il, x[1]};
    }
    if (ends("mlp.down_proj.weight")) return {at(p), x[0], r * (c.ffn / t) + x[1]};
    if (ends("w13_weight")) {
      const auto il = c.moe_ffn / t, g = global_expert(x[0]);
      return {at(expert_name(layer_of(p), g, x[1] < il ? "gate_proj.weight" : "up_proj.weight")), r * il + x[1] % il,
              x[2]};
    }
    if (ends("w2_weight")) {
      const auto il = c.moe_ffn / t, g = global_expert(x[0]);
      return {at(expert_name(layer_of(p), g, "down_proj.weight")), x[1], r * il + x[2]};
    }
    return {at(p), x[0], x.size() > 1 ? x[1] : 0}; // replicated
  }
};

std::vector<std::uint64_t> coords(std::uint64_t flat, const std::vector<std::uint64_t>& shape) {
  std::vector<std::uint64_t> x(shape.size());
  for (std::size_t i = shape.size(); i-- > 0;) {
    x[i] = flat % shape[i];
    flat /= shape[i];
  }
  return x;
}

// Smaller shapes than the defaults: every element is checked, on every rank.
model_config shrink(model_config c) {
  c.hidden = 64;
  c.head_dim = 16;
  if (c.ffn) c.ffn = 128;
  if (c.moe_ffn) c.moe_ffn = 32;
  c.dtype = dtype_id::f32;
  return c;
}

void check_layout(model_config c, std::uint64_t tp, std::uint64_t ep, expert_map map) {
  c = shrink(c);
  INFO("family " << c.family << " tp " << tp << " ep " << ep << " map " << static_cast<int>(map) << " vocab " << c.vocab
                 << " tied " << c.tied_embeddings);
  auto metas = canonical_tensors(c);
  auto model = tagged_model(metas);
  std::map<std::string, std::size_t> idx;
  for (std::size_t i = 0; i < metas.size(); ++i) idx[metas[i].name] = i;
  std::vector<std::vector<std::uint32_t>> count(metas.size());
  for (std::size_t i = 0; i < metas.size(); ++i) count[i].assign(metas[i].numel(), 0);
  for (std::uint64_t er = 0; er < ep; ++er)
    for (std::uint64_t r = 0; r < tp; ++r) {
      loaders::vllm_style_loader l(c, {tp, r, ep, er, map});
      receiver<loaders::vllm_style_loader> rc(l, metas);
      rc.dense_refit(model);
      vllm_reference ref{c, tp, r, ep, er, map, idx};
      auto& st = rc.storage();
      for (std::size_t p = 0; p < st.size(); ++p) {
        const auto& par = st[p];
        const auto* w = reinterpret_cast<const std::uint32_t*>(par.bytes.data());
        std::uint64_t bad = 0, first_bad = 0;
        for (std::uint64_t k = 0; k < par.meta.numel(); ++k) {
          auto e = ref.source(par.meta.name, coords(k, par.meta.shape));
          bool ok = true;
          if (e.padding) {
            ok = w[k] == 0;
          } else {
            const auto& cm = metas[e.tensor];
            const auto flat = cm.shape.size() == 1 ? e.row : e.row * cm.shape[1] + e.col;
            ok = w[k] == tag(e.tensor, flat);
            ++count[e.tensor][flat];
          }
          if (!ok && bad++ == 0) first_bad = k;
        }
        CHECK_MESSAGE(bad == 0, par.meta.name << ": " << bad << " wrong elements, first " << first_bad);
      }
      // Skips: exactly the experts homed on other EP ranks and vocab blocks of pure padding.
      for (auto& tp_ : rc.plan().tensors) {
        bool expect_skip = false;
        if (tp_.meta.name.find(".experts.") != std::string::npos) {
          const auto pos = tp_.meta.name.find(".experts.") + 9;
          const auto g = std::stoull(tp_.meta.name.substr(pos));
          const auto el = c.experts / ep;
          const auto home = map == expert_map::linear ? g / el : g % ep;
          expect_skip = home != er;
        }
        if (tp_.meta.name == "model.embed_tokens.weight" || tp_.meta.name == "lm_head.weight")
          expect_skip = r * (ref.padded() / tp) >= c.vocab;
        CHECK_MESSAGE(tp_.skipped == expect_skip, tp_.meta.name);
        if (!tp_.skipped) CHECK(tp_.xor_allowed);
      }
    }
  // Coverage: how many ranks hold each canonical element.
  for (std::size_t i = 0; i < metas.size(); ++i) {
    const auto& n = metas[i].name;
    std::uint32_t want = static_cast<std::uint32_t>(ep);
    const bool kv = n.find("k_proj") != std::string::npos || n.find("v_proj") != std::string::npos;
    if (kv && tp > c.kv_heads) want *= static_cast<std::uint32_t>(tp / c.kv_heads);
    if (n.find("norm") != std::string::npos || n.find("mlp.gate.weight") != std::string::npos)
      want = static_cast<std::uint32_t>(tp * ep);
    if (n.find(".experts.") != std::string::npos) want = 1;
    std::uint64_t bad = 0;
    for (auto v : count[i]) bad += v != want;
    CHECK_MESSAGE(bad == 0, n << ": " << bad << " elements held by the wrong number of ranks");
  }
}

} // namespace

TEST_CASE("vLLM-style placement: dense Llama over TP 1, 2, 4, 8 (t > nkv replicates K/V)") {
  auto c = tiny_llama();
  c.dtype = dtype_id::f32;
  for (std::uint64_t t : {1, 2, 4, 8}) check_layout(c, t, 1, expert_map::linear);
}

TEST_CASE("vLLM-style placement: tied embeddings, odd vocab, biases") {
  auto c = tiny_llama();
  c.dtype = dtype_id::f32;
  c.tied_embeddings = true;
  c.attention_bias = true;
  c.layers = 1;
  for (std::uint64_t vocab : {777, 63, 1}) {
    c.vocab = vocab;
    for (std::uint64_t t : {1, 2, 8}) check_layout(c, t, 1, expert_map::linear);
  }
}

TEST_CASE("vLLM-style placement: Qwen3-MoE with EP, linear and round-robin expert maps") {
  auto c = tiny_qwen3_moe();
  c.dtype = dtype_id::f32;
  c.layers = 1;
  struct lay {
    std::uint64_t t, ep;
    expert_map map;
  };
  for (auto l : {lay{1, 1, expert_map::linear}, lay{2, 2, expert_map::linear}, lay{4, 4, expert_map::linear},
                 lay{1, 2, expert_map::round_robin}, lay{2, 4, expert_map::round_robin},
                 lay{4, 2, expert_map::round_robin}})
    check_layout(c, l.t, l.ep, l.map);
}

TEST_CASE("vLLM-style loader rejects layouts that do not divide the model") {
  auto c = tiny_llama();
  auto code = [&](loaders::vllm_layout l) {
    try {
      loaders::vllm_style_loader x(c, l);
    } catch (const error& e) {
      return e.code();
    }
    return errc::ok;
  };
  CHECK(code({3, 0}) == errc::invalid_argument);   // 8 heads over 3 ranks
  CHECK(code({2, 2}) == errc::invalid_argument);   // rank out of range
  CHECK(code({1, 0, 2, 2}) == errc::invalid_argument);
  CHECK(code({16, 0}) == errc::invalid_argument);  // 8 heads over 16 ranks
  CHECK(code({8, 7}) == errc::ok);
  c = tiny_qwen3_moe();
  CHECK(code({1, 0, 3, 0}) == errc::invalid_argument); // 8 experts over 3 EP ranks
}

TEST_CASE("cast/transpose loader: stored words equal casts and transposes of the canonical tensors") {
  auto c = tiny_qwen3_moe();
  auto metas = canonical_tensors(c);
  tensor_set model(metas);
  std::uint16_t x = 1;
  for (auto& t : model.tensors())
    for (auto& w : t.words<bf16>()) w = x = static_cast<std::uint16_t>(x * 31 + 7);
  receiver<loaders::cast_transpose_loader> r(loaders::cast_transpose_loader(c), metas);
  r.dense_refit(model);
  auto& st = r.storage();
  for (auto& t : model.tensors()) {
    const auto& n = t.meta.name;
    auto src = t.words<bf16>();
    INFO(n);
    if (auto p = st.index_of(n); p && st[*p].meta.dtype == dtype_id::f32) {
      auto* w = reinterpret_cast<const std::uint32_t*>(st[*p].bytes.data());
      std::size_t bad = 0;
      for (std::size_t i = 0; i < src.size(); ++i) bad += w[i] != static_cast<std::uint32_t>(src[i]) << 16;
      CHECK(bad == 0);
    } else if (auto q = st.index_of(n + ".t")) {
      auto* w = reinterpret_cast<const std::uint16_t*>(st[*q].bytes.data());
      const auto R = t.meta.shape[0], C = t.meta.shape[1];
      std::size_t bad = 0;
      for (std::uint64_t i = 0; i < R; ++i)
        for (std::uint64_t j = 0; j < C; ++j) bad += w[j * R + i] != src[i * C + j];
      CHECK(bad == 0);
    } else if (n.find("_proj.weight") != std::string::npos && n.find("self_attn.") != std::string::npos &&
               n.find("o_proj") == std::string::npos) {
      const auto base = n.substr(0, n.find("self_attn.") + 10);
      auto* w = reinterpret_cast<const std::uint16_t*>(st[*st.index_of(base + "qkv_proj_t.weight")].bytes.data());
      const auto cols = (c.heads + 2 * c.kv_heads) * c.head_dim;
      const auto off = n.find("q_proj") != std::string::npos   ? 0
                       : n.find("k_proj") != std::string::npos ? c.heads * c.head_dim
                                                               : (c.heads + c.kv_heads) * c.head_dim;
      const auto R = t.meta.shape[0], C = t.meta.shape[1];
      std::size_t bad = 0;
      for (std::uint64_t i = 0; i < R; ++i)
        for (std::uint64_t j = 0; j < C; ++j) bad += w[j * cols + off + i] != src[i * C + j];
      CHECK(bad == 0);
    } else {
      auto p2 = st.index_of(n);
      REQUIRE(p2);
      CHECK(std::memcmp(st[*p2].bytes.data(), t.bytes.data(), t.bytes.size()) == 0);
    }
  }
}
