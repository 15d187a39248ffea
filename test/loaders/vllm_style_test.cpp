// vLLM-style loader: every stored element is checked against placement
// formulas written independently of the loader, over whole parameters, on
// every rank of deployments given as vLLM's flags give them: TP 1..8 (t > nkv
// included), PP with even, leftover and explicit partitions, DP with and
// without expert parallelism, uneven expert counts, round-robin where vLLM
// keeps it, tied embeddings, odd vocabularies and biases (Llama's o_proj one
// too). Canonical tensors are FP32 with a unique word per element (tensor id,
// flat index), so each stored word names its source; coverage across ranks is
// counted too.
#include <doctest/doctest.h>

#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "dcr/loaders/cast_transpose.hpp"
#include "dcr/loaders/vllm_style.hpp"
#include "dcr/receiver/receiver.hpp"
#include "dcr/receiver/tensor_set.hpp"

using namespace dcr;

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

// Independent statement of the vLLM placement rules (see the functions named
// in include/dcr/loaders/vllm_style.hpp).
struct vllm_reference {
  model_config c;
  loaders::vllm_parallel_config p;
  std::uint64_t dp_rank, pp_rank, r;      // r: TP rank
  std::map<std::string, std::size_t> idx; // canonical name -> tensor index

  std::uint64_t t() const { return p.tensor_parallel_size; }
  std::uint64_t padded() const { return (c.vocab + 63) / 64 * 64; }
  std::uint64_t vocab_rows() const { return padded() / t(); }
  std::uint64_t nq_l() const { return c.heads / t(); }
  std::uint64_t nkv_l() const { return c.kv_heads >= t() ? c.kv_heads / t() : 1; }
  std::uint64_t kv_first_head() const {
    return c.kv_heads >= t() ? r * nkv_l() : r * c.kv_heads / t();
  }
  // Stage sizes: even split, leftovers one each to stages P-2, P-3, ...
  std::uint64_t stage_size(std::uint64_t s) const {
    const auto P = p.pipeline_parallel_size, L = c.layers, rem = L % P;
    if (!p.pp_layer_partition.empty()) {
      std::vector<std::uint64_t> v;
      std::string x = p.pp_layer_partition + ",";
      for (std::size_t a = 0, b; (b = x.find(',', a)) != std::string::npos; a = b + 1)
        v.push_back(std::stoull(x.substr(a, b - a)));
      return v.at(s);
    }
    return L / P + (s + 1 < P && s + 1 + rem >= P ? 1 : 0);
  }
  std::uint64_t stage_of_layer(std::uint64_t layer) const {
    std::uint64_t s = 0, end = stage_size(0);
    while (layer >= end) end += stage_size(++s);
    return s;
  }
  bool first() const { return pp_rank == 0; }
  bool last() const { return pp_rank + 1 == p.pipeline_parallel_size; }
  bool holds_embed(std::uint64_t stage) const {
    return c.family == "qwen3_moe" || stage == 0 ||
           (c.tied_embeddings && stage + 1 == p.pipeline_parallel_size);
  }
  bool holds_final(std::uint64_t stage) const {
    return c.family == "qwen3_moe" || stage + 1 == p.pipeline_parallel_size;
  }
  // MoE: TP flattened over DP; with expert parallelism the flattened group is the EP group.
  bool ep() const { return p.enable_expert_parallel && p.data_parallel_size * t() > 1; }
  std::uint64_t flat_rank() const { return dp_rank * t() + r; }
  std::uint64_t ep_size() const { return ep() ? p.data_parallel_size * t() : 1; }
  std::uint64_t ep_rank() const { return ep() ? flat_rank() : 0; }
  std::uint64_t etp() const { return ep() ? 1 : p.data_parallel_size * t(); }
  std::uint64_t etp_rank() const { return ep() ? 0 : flat_rank(); }
  bool round_robin() const {
    if (p.expert_placement_strategy != loaders::expert_placement::round_robin ||
        c.expert_groups < 2)
      return false;
    if (p.data_parallel_size > 1 && ep() && p.all2all_backend != "deepep_low_latency") return false;
    return true;
  }
  // Experts held by EP rank k, in local order.
  std::vector<std::uint64_t> experts_of(std::uint64_t k) const {
    const auto E = c.experts, S = ep_size();
    std::vector<std::uint64_t> v;
    if (round_robin()) {
      for (std::uint64_t g = k; g < E; g += S) v.push_back(g);
      return v;
    }
    std::uint64_t lo = 0;
    for (std::uint64_t j = 0; j < k; ++j) lo += E / S + (j < E % S);
    for (std::uint64_t i = 0; i < E / S + (k < E % S); ++i) v.push_back(lo + i);
    return v;
  }
  std::uint64_t global_expert(std::uint64_t local) const { return experts_of(ep_rank()).at(local); }
  std::uint64_t home_of(std::uint64_t g) const {
    for (std::uint64_t k = 0; k < ep_size(); ++k)
      for (auto e : experts_of(k))
        if (e == g) return k;
    FAIL("expert without a home");
    return 0;
  }
  std::size_t at(const std::string& n) const { return idx.at(n); }

  // Source of element `coord` (row-major coordinates) of parameter `p`.
  expectation source(const std::string& pn, const std::vector<std::uint64_t>& x) const {
    const auto d = c.head_dim;
    auto layer_of = [&](const std::string& n) { return std::stoull(n.substr(13)); };
    auto L = [&](const std::string& n, const char* s) { return layer_name(layer_of(n), s); };
    auto ends = [&](const char* s) {
      const std::string suf(s);
      return pn.size() >= suf.size() && pn.compare(pn.size() - suf.size(), suf.size(), suf) == 0;
    };
    if (pn == "model.embed_tokens.weight" || pn == "lm_head.weight") {
      const auto g = r * vocab_rows() + x[0];
      if (g >= c.vocab) return {0, 0, 0, true};
      return {at(pn == "lm_head.weight" && !c.tied_embeddings ? pn : "model.embed_tokens.weight"),
              g, x[1]};
    }
    if (ends("qkv_proj.weight") || ends("qkv_proj.bias")) {
      const bool bias = ends("bias");
      const auto i = x[0];
      const auto col = bias ? 0 : x[1];
      const char* sfx = bias ? "bias" : "weight";
      const auto nq = nq_l() * d, nkv = nkv_l() * d;
      if (i < nq)
        return {at(L(pn, ("self_attn.q_proj." + std::string(sfx)).c_str())), r * nq + i, col};
      const bool is_k = i < nq + nkv;
      const auto j = i - nq - (is_k ? 0 : nkv);
      return {at(L(pn, (std::string("self_attn.") + (is_k ? "k" : "v") + "_proj." + sfx).c_str())),
              kv_first_head() * d + j, col};
    }
    if (ends("o_proj.weight")) return {at(pn), x[0], r * (c.heads * d / t()) + x[1]};
    if (ends("gate_up_proj.weight")) {
      const auto il = c.ffn / t();
      return {at(L(pn, x[0] < il ? "mlp.gate_proj.weight" : "mlp.up_proj.weight")),
              r * il + x[0] % il, x[1]};
    }
    if (ends("mlp.down_proj.weight")) return {at(pn), x[0], r * (c.ffn / t()) + x[1]};
    if (ends("w13_weight")) {
      const auto il = c.moe_ffn / etp(), g = global_expert(x[0]);
      return {at(expert_name(layer_of(pn), g, x[1] < il ? "gate_proj.weight" : "up_proj.weight")),
              etp_rank() * il + x[1] % il, x[2]};
    }
    if (ends("w2_weight")) {
      const auto il = c.moe_ffn / etp(), g = global_expert(x[0]);
      return {at(expert_name(layer_of(pn), g, "down_proj.weight")), x[1], etp_rank() * il + x[2]};
    }
    return {at(pn), x[0], x.size() > 1 ? x[1] : 0}; // replicated
  }

  // Whether this rank holds nothing of canonical tensor `n`.
  bool skips(const std::string& n) const {
    if (n == "model.embed_tokens.weight" || n == "lm_head.weight") {
      const bool held = n == "lm_head.weight" ? holds_final(pp_rank) : holds_embed(pp_rank);
      return !held || r * vocab_rows() >= c.vocab;
    }
    if (n == "model.norm.weight") return !holds_final(pp_rank);
    const auto layer = std::stoull(n.substr(13));
    if (stage_of_layer(layer) != pp_rank) return true;
    if (n.find(".experts.") != std::string::npos)
      return home_of(std::stoull(n.substr(n.find(".experts.") + 9))) != ep_rank();
    return false;
  }

  // Ranks of the whole deployment holding each element of canonical tensor `n`.
  std::uint32_t holders(const std::string& n) const {
    const auto dp = p.data_parallel_size, T = t();
    std::uint64_t stages = 0;
    if (n == "model.embed_tokens.weight" || n == "lm_head.weight" || n == "model.norm.weight") {
      for (std::uint64_t s = 0; s < p.pipeline_parallel_size; ++s)
        stages += n == "model.embed_tokens.weight" ? holds_embed(s) : holds_final(s);
      return static_cast<std::uint32_t>(stages * dp * (n == "model.norm.weight" ? T : 1));
    }
    if (n.find(".experts.") != std::string::npos)
      return 1; // one rank of the dp x tp group of its stage
    const bool kv = n.find("k_proj") != std::string::npos || n.find("v_proj") != std::string::npos;
    std::uint64_t per = 1;
    if (kv && T > c.kv_heads) per = T / c.kv_heads;
    if (n.find("norm") != std::string::npos || n.find("mlp.gate.weight") != std::string::npos ||
        n.find("o_proj.bias") != std::string::npos) // RowParallelLinear keeps its bias whole
      per = T;
    return static_cast<std::uint32_t>(dp * per);
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

loaders::vllm_parallel_config deployment(std::uint64_t tp, std::uint64_t pp = 1,
                                         std::uint64_t dp = 1, bool ep = false) {
  loaders::vllm_parallel_config p;
  p.tensor_parallel_size = tp;
  p.pipeline_parallel_size = pp;
  p.data_parallel_size = dp;
  p.enable_expert_parallel = ep;
  return p;
}

void check_layout(model_config c, const loaders::vllm_parallel_config& p) {
  c = shrink(c);
  INFO("family " << c.family << " tp " << p.tensor_parallel_size << " pp "
                 << p.pipeline_parallel_size << " dp " << p.data_parallel_size << " ep "
                 << p.enable_expert_parallel << " placement "
                 << static_cast<int>(p.expert_placement_strategy) << " vocab " << c.vocab
                 << " tied " << c.tied_embeddings << " experts " << c.experts);
  auto metas = canonical_tensors(c);
  auto model = tagged_model(metas);
  std::map<std::string, std::size_t> idx;
  for (std::size_t i = 0; i < metas.size(); ++i) idx[metas[i].name] = i;
  std::vector<std::vector<std::uint32_t>> count(metas.size());
  for (std::size_t i = 0; i < metas.size(); ++i) count[i].assign(metas[i].numel(), 0);
  for (std::uint64_t rank = 0; rank < p.world_size(); ++rank) {
    const auto lay = loaders::vllm_layout::of_rank(p, rank);
    loaders::vllm_style_loader l(c, lay);
    receiver<loaders::vllm_style_loader> rc(l, metas);
    rc.dense_refit(model);
    vllm_reference ref{c, p, lay.dp_rank, lay.pp_rank, lay.tp_rank, idx};
    INFO("rank " << rank << " (dp " << lay.dp_rank << ", pp " << lay.pp_rank << ", tp "
                 << lay.tp_rank << ")");
    auto& st = rc.storage();
    for (std::size_t q = 0; q < st.size(); ++q) {
      const auto& par = st[q];
      const auto& n = par.meta.name;
      // Declared only where vLLM builds the module (PPMissingLayer elsewhere).
      if (n.rfind("model.layers.", 0) == 0)
        CHECK_MESSAGE(ref.stage_of_layer(std::stoull(n.substr(13))) == lay.pp_rank, n);
      else if (n == "model.embed_tokens.weight")
        CHECK(ref.holds_embed(lay.pp_rank));
      else
        CHECK_MESSAGE(ref.holds_final(lay.pp_rank), n);
      if (n == "model.embed_tokens.weight" || n == "lm_head.weight")
        CHECK(par.meta.shape[0] == ref.vocab_rows());
      const auto* w = reinterpret_cast<const std::uint32_t*>(par.bytes.data());
      std::uint64_t bad = 0, first_bad = 0;
      for (std::uint64_t k = 0; k < par.meta.numel(); ++k) {
        auto e = ref.source(n, coords(k, par.meta.shape));
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
      CHECK_MESSAGE(bad == 0, n << ": " << bad << " wrong elements, first " << first_bad);
    }
    for (auto& tp_ : rc.plan().tensors) {
      CHECK_MESSAGE(tp_.skipped == ref.skips(tp_.meta.name), tp_.meta.name);
      if (!tp_.skipped) CHECK(tp_.xor_allowed);
    }
  }
  for (std::size_t i = 0; i < metas.size(); ++i) {
    const auto want = vllm_reference{c, p, 0, 0, 0, idx}.holders(metas[i].name);
    std::uint64_t bad = 0;
    for (auto v : count[i]) bad += v != want;
    CHECK_MESSAGE(bad == 0, metas[i].name << ": " << bad
                                          << " elements held by the wrong number of ranks (want "
                                          << want << ")");
  }
}

} // namespace

TEST_CASE("vLLM-style placement: dense Llama over TP 1, 2, 4, 8 (t > nkv replicates K/V)") {
  auto c = tiny_llama();
  for (std::uint64_t t : {1, 2, 4, 8}) check_layout(c, deployment(t));
}

TEST_CASE("vLLM-style placement: tied embeddings, odd vocab, biases") {
  auto c = tiny_llama();
  c.tied_embeddings = true;
  c.attention_bias = true;
  c.o_proj_bias = true; // Llama: o_proj biased too, replicated on every rank
  c.layers = 1;
  for (std::uint64_t vocab : {777, 63, 1}) {
    c.vocab = vocab;
    for (std::uint64_t t : {1, 2, 8}) check_layout(c, deployment(t));
  }
}

TEST_CASE("vLLM-style placement: pipeline stages (get_pp_indices, PPMissingLayer, first/last stage "
          "modules)") {
  auto c = tiny_llama();
  c.layers = 5;
  for (bool tied : {false, true}) {
    c.tied_embeddings = tied;
    check_layout(c, deployment(1, 2));
    check_layout(c, deployment(2, 3));
    check_layout(c, deployment(1, 4, 2));
    auto p = deployment(2, 3);
    p.pp_layer_partition = "3,0,2";
    check_layout(c, p);
  }
  auto q = tiny_qwen3_moe(); // Qwen3-MoE builds embedding, norm and lm_head on every stage
  q.layers = 3;
  check_layout(q, deployment(2, 2));
  q.tied_embeddings = true;
  check_layout(q, deployment(1, 3, 2, true));
}

TEST_CASE("vLLM-style placement: Qwen3-MoE under FusedMoEParallelConfig (EP over dp x tp, or "
          "TP-sharded experts)") {
  auto c = tiny_qwen3_moe();
  c.layers = 1;
  check_layout(c, deployment(1));
  check_layout(c, deployment(2));              // experts TP-split over 2
  check_layout(c, deployment(2, 1, 1, true));  // EP 2
  check_layout(c, deployment(4, 1, 1, true));  // EP 4
  check_layout(c, deployment(2, 1, 2, true));  // EP 4 = dp 2 x tp 2
  check_layout(c, deployment(1, 1, 8, true));  // EP 8, one expert each
  check_layout(c, deployment(2, 1, 2, false)); // experts TP-split over dp x tp = 4
  check_layout(c, deployment(1, 1, 2, false)); // dense layers replicated, experts split over 2
  c.experts = 6;                               // uneven: the first E mod ep ranks hold one more
  check_layout(c, deployment(4, 1, 1, true));
  check_layout(c, deployment(2, 1, 2, true));
}

TEST_CASE(
    "vLLM-style placement: round-robin only where determine_expert_placement_strategy keeps it") {
  auto c = tiny_qwen3_moe();
  c.layers = 1;
  c.experts = 6;
  for (std::uint64_t groups : {0, 2}) {
    c.expert_groups = groups;
    auto p = deployment(4, 1, 1, true);
    p.expert_placement_strategy = loaders::expert_placement::round_robin;
    check_layout(c, p); // groups 0: falls back to linear; 2: round-robin
    p = deployment(2, 1, 2, true);
    p.expert_placement_strategy = loaders::expert_placement::round_robin;
    check_layout(c, p); // all-to-all without DeepEP low-latency: linear
    p.all2all_backend = "deepep_low_latency";
    check_layout(c, p);
  }
}

TEST_CASE("vLLM-style placement: mixed dense/MoE stack (decoder_sparse_step, mlp_only_layers) "
          "under PP and EP") {
  auto c = tiny_qwen3_moe();
  c.layers = 4;
  c.ffn = 96;
  c.decoder_sparse_step = 2;
  c.mlp_only_layers = {3};
  check_layout(c, deployment(2, 2, 2, true));
}

TEST_CASE("vLLM rule functions at real sizes") {
  using namespace loaders;
  // Qwen3 vocabulary 151936 over TP 4: 37984 rows per rank (padding to 64, then / TP).
  CHECK(pad_vocab_size(151936) == 151936);
  CHECK(pad_vocab_size(151936) / 4 == 37984);
  CHECK(pad_vocab_size(128256) == 128256);
  CHECK(pad_vocab_size(777) == 832);
  // get_pp_indices: 32 layers over 3 stages -> 11, 11, 10; 48 over 5 -> 9, 10, 10, 10, 9.
  CHECK(get_pp_indices(32, 0, 3) == std::pair<std::uint64_t, std::uint64_t>{0, 11});
  CHECK(get_pp_indices(32, 1, 3) == std::pair<std::uint64_t, std::uint64_t>{11, 22});
  CHECK(get_pp_indices(32, 2, 3) == std::pair<std::uint64_t, std::uint64_t>{22, 32});
  CHECK(get_pp_indices(48, 0, 5) == std::pair<std::uint64_t, std::uint64_t>{0, 9});
  CHECK(get_pp_indices(48, 3, 5) == std::pair<std::uint64_t, std::uint64_t>{29, 39});
  CHECK(get_pp_indices(48, 4, 5) == std::pair<std::uint64_t, std::uint64_t>{39, 48});
  CHECK(get_pp_indices(30, 1, 4) == std::pair<std::uint64_t, std::uint64_t>{7, 15}); // 7, 8, 8, 7
  CHECK(get_pp_indices(32, 1, 3, "10,11,11") == std::pair<std::uint64_t, std::uint64_t>{10, 21});
  CHECK(get_pp_indices(32, 2, 3, "10, 11 ,11") == std::pair<std::uint64_t, std::uint64_t>{21, 32});
  for (auto bad : {"10,11", "10,11,12", "10,x,11", "10,,22", ""})
    if (*bad) CHECK_THROWS_AS(get_pp_indices(32, 0, 3, bad), error);
  // determine_expert_map: 6 experts over 4 EP ranks.
  CHECK(determine_expert_map(4, 0, 6, expert_placement::linear) ==
        std::vector<std::int64_t>{0, 1, -1, -1, -1, -1});
  CHECK(determine_expert_map(4, 2, 6, expert_placement::linear) ==
        std::vector<std::int64_t>{-1, -1, -1, -1, 0, -1});
  CHECK(determine_expert_map(4, 1, 6, expert_placement::round_robin) ==
        std::vector<std::int64_t>{-1, 0, -1, -1, -1, 1});
  CHECK(determine_expert_map(4, 3, 6, expert_placement::round_robin) ==
        std::vector<std::int64_t>{-1, -1, -1, 0, -1, -1});
  // FusedMoEParallelConfig: "TP 4, DP 2, expert parallel" = EP 8; rank (dp 1, tp 2) is EP rank 6.
  auto p = deployment(4, 1, 2, true);
  auto m = fused_moe_parallel_config(vllm_layout::of_rank(p, 6));
  CHECK(m.use_ep);
  CHECK(m.ep_size == 8);
  CHECK(m.ep_rank == 6);
  CHECK(m.tp_size == 1);
  p.enable_expert_parallel = false;
  m = fused_moe_parallel_config(vllm_layout::of_rank(p, 6));
  CHECK_FALSE(m.use_ep);
  CHECK(m.tp_size == 8);
  CHECK(m.tp_rank == 6);
  m = fused_moe_parallel_config(vllm_layout::of_rank(deployment(1, 1, 1, true), 0));
  CHECK_FALSE(m.use_ep); // dp x tp == 1: nothing to spread experts over
  // Rank order: DP-major, then PP, then TP.
  auto l = vllm_layout::of_rank(deployment(2, 3, 2), 9);
  CHECK(l.dp_rank == 1);
  CHECK(l.pp_rank == 1);
  CHECK(l.tp_rank == 1);
  CHECK(l.rank() == 9);
}

TEST_CASE("vLLM-style loader rejects layouts that do not divide the model") {
  auto c = tiny_llama();
  auto code = [&](loaders::vllm_parallel_config p, std::uint64_t rank = 0) {
    try {
      loaders::vllm_style_loader x(c, loaders::vllm_layout::of_rank(p, rank));
    } catch (const error& e) {
      return e.code();
    }
    return errc::ok;
  };
  CHECK(code(deployment(3)) == errc::invalid_argument);    // 8 heads over 3 ranks
  CHECK(code(deployment(2), 2) == errc::invalid_argument); // rank out of range
  CHECK(code(deployment(16)) == errc::invalid_argument);   // 8 heads over 16 ranks
  CHECK(code(deployment(8), 7) == errc::ok);
  auto partition = deployment(1, 2);
  partition.pp_layer_partition = "1,2"; // sums to 3, the model has 2 layers
  CHECK(code(partition) == errc::invalid_argument);
  c = tiny_qwen3_moe();
  CHECK(code(deployment(1, 1, 16, true)) == errc::invalid_argument); // 8 experts over 16 EP ranks
  c.moe_ffn = 36;
  CHECK(code(deployment(4, 1, 2, false)) ==
        errc::invalid_argument); // 36 rows over 8 expert-TP ranks
  CHECK(code(deployment(4, 1, 2, true)) == errc::ok);
}

TEST_CASE(
    "cast/transpose loader: stored words equal casts and transposes of the canonical tensors") {
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
      for (std::size_t i = 0; i < src.size(); ++i)
        bad += w[i] != static_cast<std::uint32_t>(src[i]) << 16;
      CHECK(bad == 0);
    } else if (auto q = st.index_of(n + ".t")) {
      auto* w = reinterpret_cast<const std::uint16_t*>(st[*q].bytes.data());
      const auto R = t.meta.shape[0], C = t.meta.shape[1];
      std::size_t bad = 0;
      for (std::uint64_t i = 0; i < R; ++i)
        for (std::uint64_t j = 0; j < C; ++j) bad += w[j * R + i] != src[i * C + j];
      CHECK(bad == 0);
    } else if (n.find("_proj.weight") != std::string::npos &&
               n.find("self_attn.") != std::string::npos && n.find("o_proj") == std::string::npos) {
      const auto base = n.substr(0, n.find("self_attn.") + 10);
      auto* w = reinterpret_cast<const std::uint16_t*>(
          st[*st.index_of(base + "qkv_proj_t.weight")].bytes.data());
      const auto cols = (c.heads + 2 * c.kv_heads) * c.head_dim;
      const auto off = n.find("q_proj") != std::string::npos ? 0
                       : n.find("k_proj") != std::string::npos
                           ? c.heads * c.head_dim
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

TEST_CASE("vLLM-style loader handles: one per known canonical tensor, none for unknown names") {
  // `load_handle(handle(name), ...)` is the receiver's per-item path; every
  // receiver test compares the copies it makes with the plan recorded through
  // `load(name, ...)` at prewarm, so a handle that led elsewhere fails them.
  // Here: the handles themselves.
  for (auto c : {tiny_llama(), tiny_qwen3_moe()}) {
    loaders::vllm_style_loader l(c, loaders::vllm_tp_rank(2, 1));
    std::set<std::size_t> seen;
    for (const auto& m : canonical_tensors(c)) {
      const auto h = l.handle(m.name);
      CHECK(h != no_handle);
      CHECK(seen.insert(h).second);
    }
    CHECK(l.handle("model.layers.0.no_such.weight") == no_handle);
    CHECK(l.handle("") == no_handle);
  }
}
