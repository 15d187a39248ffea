// Placement property sweep: random real-shaped models (Llama GQA, Qwen2 q/k/v
// biases, Qwen3 head_dim != hidden / heads and q/k norms, Qwen3-MoE with
// uneven expert counts and mixed dense/MoE stacks, tied embeddings, odd
// vocabularies) on random Megatron layouts (TP, PP with uneven first/last
// stages, EP, expert-TP, DP, vocabulary padding or none) refitted into random
// vLLM deployments (TP, PP, DP, expert parallelism on or off). Each case runs
// the real path: trainer shards -> delta payloads -> every receiver stages and
// applies them through its loader; then every receiver's storage must equal a
// dense refit of the new version byte for byte, padding included. Fixed seeds.
#include <doctest/doctest.h>

#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "dcr/loaders/vllm_style.hpp"
#include "dcr/model/trainer_layout.hpp"
#include "dcr/receiver/receiver.hpp"
#include "dcr/receiver/tensor_set.hpp"
#include "dcr/source/builder.hpp"
#include "dcr/source/state.hpp"
#include "examples/common/simulator.hpp"
#include "examples/common/training_side.hpp"

using namespace dcr;

namespace {

template <class T>
T pick(std::mt19937_64& rng, std::initializer_list<T> v) {
  return *(v.begin() + rng() % v.size());
}

/// A model with the structure of a real family, at a size a test can refit.
/// `llama_bias`: every case a Llama with `attention_bias` (q/k/v and o_proj biased).
model_config random_model_config(std::mt19937_64& rng, int index, bool llama_bias = false) {
  static const char* families[] = {"llama", "qwen2", "qwen3", "qwen3_moe", "qwen3_moe"};
  model_config c;
  c.family = llama_bias ? "llama" : families[index % 5];
  // Query heads per KV head as in Llama-3 (4), Qwen2.5-7B (7), Qwen3-30B-A3B (8), MHA (1).
  c.kv_heads = pick<std::uint64_t>(rng, {1, 2, 4});
  c.heads = c.kv_heads * pick<std::uint64_t>(rng, {1, 4, 7, 8});
  c.head_dim = pick<std::uint64_t>(rng, {8, 16});
  c.hidden = c.family == "qwen3" || c.family == "qwen3_moe" ? pick<std::uint64_t>(rng, {32, 64})
                                                            : c.heads * c.head_dim;
  c.layers = pick<std::uint64_t>(rng, {1, 2, 3, 4, 5});
  c.ffn = pick<std::uint64_t>(rng, {48, 64, 96});
  c.vocab = pick<std::uint64_t>(rng, {128, 257, 320, 777});
  c.tied_embeddings = rng() % 3 == 0;
  c.attention_bias = c.family == "qwen2" || llama_bias;
  c.o_proj_bias = llama_bias;
  c.qk_norm = c.family == "qwen3" || c.family == "qwen3_moe";
  if (c.family == "qwen3_moe") {
    c.experts = pick<std::uint64_t>(rng, {4, 6, 6, 8});
    c.moe_ffn = pick<std::uint64_t>(rng, {16, 24});
    c.decoder_sparse_step = pick<std::uint64_t>(rng, {1, 1, 2});
    if (rng() % 3 == 0) c.mlp_only_layers = {rng() % c.layers};
    if (!c.has_dense_layer()) c.ffn = 0;
  }
  return c;
}

std::optional<trainer_layout> random_trainer(std::mt19937_64& rng, const model_config& c) {
  for (int tries = 0; tries < 200; ++tries) {
    trainer_layout l;
    l.tp = pick<std::uint64_t>(rng, {1, 2, 4});
    l.pp = pick<std::uint64_t>(rng, {1, 2, 3});
    l.dp = pick<std::uint64_t>(rng, {1, 2});
    l.vocab_block = pick<std::uint64_t>(rng, {0, 0, 128});
    if (l.pp > 1 && rng() % 3 == 0) l.first_stage_layers = rng() % (c.layers + 1);
    if (l.pp > 1 && rng() % 3 == 0) l.last_stage_layers = rng() % (c.layers + 1);
    if (c.is_moe()) {
      l.ep = pick<std::uint64_t>(rng, {1, 2, 4});
      l.etp = pick<std::uint64_t>(rng, {1, 2});
    }
    if (validate(c, l).ok()) return l;
  }
  return std::nullopt;
}

std::optional<loaders::vllm_parallel_config> random_vllm(std::mt19937_64& rng,
                                                         const model_config& c) {
  for (int tries = 0; tries < 200; ++tries) {
    loaders::vllm_parallel_config p;
    p.tensor_parallel_size = pick<std::uint64_t>(rng, {1, 2, 4, 8});
    p.pipeline_parallel_size = pick<std::uint64_t>(rng, {1, 2, 3});
    p.data_parallel_size = pick<std::uint64_t>(rng, {1, 2});
    p.enable_expert_parallel = c.is_moe() && rng() % 3 != 0;
    if (p.pipeline_parallel_size > 1 && c.layers >= 2 && rng() % 4 == 0) { // an explicit partition
      std::uint64_t left = c.layers;
      for (std::uint64_t s = 0; s + 1 < p.pipeline_parallel_size; ++s) {
        const auto n = rng() % (left + 1);
        p.pp_layer_partition += std::to_string(n) + ",";
        left -= n;
      }
      p.pp_layer_partition += std::to_string(left);
    }
    try {
      for (std::uint64_t r = 0; r < p.world_size(); ++r)
        loaders::vllm_style_loader(c, loaders::vllm_layout::of_rank(p, r));
      return p;
    } catch (const error&) {
    }
  }
  return std::nullopt;
}

tensor_set canonical(const source_plan& plan, const source_state& state) {
  std::vector<host_tensor> tensors;
  throw_if_failed(export_canonical(plan, state.view(), tensors));
  tensor_set set;
  for (auto& t : tensors) set.add(std::move(t));
  return set;
}

std::string describe(const model_config& c, const trainer_layout& t,
                     const loaders::vllm_parallel_config& p) {
  std::ostringstream o;
  o << c.family << " L" << c.layers << " h" << c.hidden << " nh" << c.heads << " nkv" << c.kv_heads
    << " d" << c.head_dim << " V" << c.vocab << (c.tied_embeddings ? " tied" : "")
    << (c.o_proj_bias ? " o_bias" : "") << " E" << c.experts << " step" << c.decoder_sparse_step
    << " | megatron tp" << t.tp << " pp" << t.pp << " ep" << t.ep << " etp" << t.etp << " dp"
    << t.dp << " vb" << t.vocab_block << " first" << t.first_stage_layers.value_or(0) << " last"
    << t.last_stage_layers.value_or(0) << " | vllm tp" << p.tensor_parallel_size << " pp"
    << p.pipeline_parallel_size << " dp" << p.data_parallel_size
    << (p.enable_expert_parallel ? " ep" : "") << " part'" << p.pp_layer_partition << "'";
  return o.str();
}

struct sweep_stats {
  int cases = 0;
  std::uint64_t receivers = 0, payload_bytes = 0;
  bool pp_both = false, ep_dp = false, uneven_experts = false, tied_pp = false, mixed = false,
       o_proj_bias = false;
};

/// Runs `n` random cases, two refit steps each; returns what was covered.
sweep_stats sweep(int n, std::uint64_t seed, bool llama_bias = false) {
  std::mt19937_64 rng(seed);
  sweep_stats st;
  while (st.cases < n) {
    const auto c = random_model_config(rng, st.cases, llama_bias);
    auto tl = random_trainer(rng, c);
    if (!tl) continue;
    auto vp = random_vllm(rng, c);
    if (!vp) continue;
    INFO(describe(c, *tl, *vp));
    auto plan = std::make_shared<const source_plan>(megatron_plan(c, *tl));
    std::vector<host_tensor> init;
    for (std::size_t i = 0; i < plan->canonical.size(); ++i) {
      host_tensor t(plan->canonical[i]);
      auto words = sim::normal_bf16(t.meta.numel(), 0.02f, rng());
      std::memcpy(t.bytes.data(), words.data(), t.bytes.size());
      init.push_back(std::move(t));
    }
    source_state state = source_from_canonical(*plan, init);
    training_side trainer(plan, state.view());
    const auto loaders_ = loaders::vllm_style_loaders(c, *vp);
    std::vector<receiver<loaders::vllm_style_loader>> rs;
    const tensor_set v0 = canonical(*plan, state);
    for (auto& l : loaders_) {
      rs.emplace_back(l, plan->canonical);
      rs.back().dense_refit(v0);
    }
    for (std::uint64_t step = 1; step <= 2; ++step) {
      for (std::size_t s = 0; s < state.shards.size(); ++s) {
        auto& b = state.shards[s];
        sim::stress_update({reinterpret_cast<std::uint16_t*>(b.data()), b.size() / 2},
                           step == 1 ? 0.03 : 0.3, 1e-2, rng());
      }
      payload_id id;
      id.attempt = step;
      id.source_version = step - 1;
      for (auto& owner_payloads : trainer.build(state.view(), id))
        for (auto& p : owner_payloads) {
          st.payload_bytes += p.size();
          for (auto& r : rs) REQUIRE(r.stage(p).ok());
        }
      for (auto& r : rs) {
        auto s = r.apply_staged();
        REQUIRE_MESSAGE(s.ok(), s.message);
      }
      trainer.commit(state.view());
      const tensor_set next = canonical(*plan, state);
      for (std::size_t k = 0; k < rs.size(); ++k) {
        receiver<loaders::vllm_style_loader> dense(loaders_[k], plan->canonical);
        dense.dense_refit(next);
        INFO("step " << step << " receiver " << k);
        CHECK(first_difference(rs[k].storage(), dense.storage()) == "");
        ++st.receivers;
      }
    }
    st.pp_both = st.pp_both || (tl->pp > 1 && vp->pipeline_parallel_size > 1);
    st.ep_dp = st.ep_dp || (vp->enable_expert_parallel && vp->data_parallel_size > 1);
    for (auto& l : loaders_)
      st.uneven_experts = st.uneven_experts || l.local_experts() != loaders_[0].local_experts();
    st.tied_pp = st.tied_pp || (c.tied_embeddings && tl->pp > 1 && vp->pipeline_parallel_size > 1);
    st.mixed = st.mixed || (c.is_moe() && c.has_dense_layer());
    st.o_proj_bias = st.o_proj_bias || c.o_proj_bias;
    ++st.cases;
  }
  return st;
}

} // namespace

TEST_CASE("placement sweep: random real-shaped models, Megatron layouts and vLLM deployments (unit "
          "subset)") {
  auto st = sweep(40, 20261203);
  MESSAGE("cases " << st.cases << ", receivers compared " << st.receivers << ", payload bytes "
                   << st.payload_bytes);
  CHECK(st.pp_both);
  CHECK(st.ep_dp);
  CHECK(st.uneven_experts);
  CHECK(st.tied_pp);
  CHECK(st.mixed);
}

TEST_CASE("placement sweep: Llama with attention_bias, o_proj's bias placed on both sides") {
  // Megatron holds `linear_proj.bias` whole on every TP rank, vLLM's
  // RowParallelLinear too; a refit through the plan equals a dense refit.
  auto st = sweep(8, 20261205, true);
  CHECK(st.o_proj_bias);
  CHECK(st.pp_both);
}

TEST_CASE("placement sweep: 300 random cases" * doctest::test_suite("slow")) {
  auto st = sweep(300, 77);
  MESSAGE("cases " << st.cases << ", receivers compared " << st.receivers);
}
