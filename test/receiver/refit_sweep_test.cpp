// Property sweep (slow suite): rollout layouts × workloads × modes. For each,
// every receiver's storage after dense refit of v plus the delta v -> v+1
// (items from the bitwise canonical diff, applied in a shuffled order) equals
// a dense refit of v+1, byte for byte, including padding and unchanged
// elements. Fixed seeds throughout.
#include <doctest/doctest.h>

#include "dcr/loaders/cast_transpose.hpp"
#include "receiver/refit_check.hpp"

using namespace dcr;
using dcr::test::delta_mode;

namespace {

enum class workload { adamw, stress_low, stress_high, nan_values };

tensor_set transition(const tensor_set& v, workload w, std::uint64_t seed) {
  auto v1 = test::clone(v);
  switch (w) {
  case workload::adamw:
    test::adamw_steps(v1, 2, seed);
    break;
  case workload::stress_low:
    test::stress(v1, 0.012, 0.02, seed);
    break;
  case workload::stress_high:
    test::stress(v1, 0.05, 0.2, seed);
    break;
  case workload::nan_values:
    test::stress(v1, 0.02, 0.05, seed);
    test::inject_nans(v1, 9, seed + 1);
    break;
  }
  return v1;
}

struct layout_case {
  model_config c;
  loaders::vllm_parallel_config p;
};

std::vector<layout_case> layouts() {
  auto llama = tiny_llama();
  auto odd = tiny_llama();
  odd.tied_embeddings = true;
  odd.vocab = 777;
  odd.attention_bias = true;
  odd.layers = 1;
  auto moe = tiny_qwen3_moe();
  moe.layers = 1;
  auto moe6 = tiny_qwen3_moe(); // 6 experts: uneven over 4 EP ranks
  moe6.experts = 6;
  moe6.layers = 3;
  moe6.decoder_sparse_step = 2; // layer 1 MoE, layers 0 and 2 dense
  moe6.ffn = 96;
  auto grouped = tiny_qwen3_moe(); // expert groups: round-robin placement is honoured
  grouped.layers = 1;
  grouped.expert_groups = 2;
  using test::vllm_deployment;
  std::vector<layout_case> v;
  for (std::uint64_t t : {1, 2, 4, 8}) v.push_back({llama, vllm_deployment(t)}); // t = 4, 8 > nkv
  for (std::uint64_t t : {1, 2, 8}) v.push_back({odd, vllm_deployment(t)});
  v.push_back({llama, vllm_deployment(2, 2)});
  v.push_back({moe, vllm_deployment(4, 1, 1, true)});
  v.push_back({moe, vllm_deployment(2, 1, 2, true)});
  v.push_back({moe, vllm_deployment(2, 1, 2, false)}); // experts TP-sharded over dp x tp = 4
  v.push_back({moe6, vllm_deployment(2, 3, 2, true)});
  auto rr = vllm_deployment(2, 1, 1, true);
  rr.expert_placement_strategy = loaders::expert_placement::round_robin;
  v.push_back({grouped, rr});
  return v;
}

} // namespace

TEST_CASE("sweep: vLLM-style layouts x workloads x modes, delta refit == dense refit") {
  std::uint64_t seed = 1000;
  std::uint64_t checks = 0, changed = 0;
  for (auto& L : layouts()) {
    const auto metas = canonical_tensors(L.c);
    const auto v = test::random_model(metas, seed);
    const auto ranks = test::all_ranks(L.c, L.p);
    for (auto w :
         {workload::adamw, workload::stress_low, workload::stress_high, workload::nan_values}) {
      const auto v1 = transition(v, w, seed + 7);
      for (auto mode : {delta_mode::mixed, delta_mode::xor_only, delta_mode::overwrite_only}) {
        INFO(L.c.family << " tp " << L.p.tensor_parallel_size << " pp "
                        << L.p.pipeline_parallel_size << " dp " << L.p.data_parallel_size << " ep "
                        << L.p.enable_expert_parallel << " workload " << static_cast<int>(w)
                        << " mode " << static_cast<int>(mode));
        auto st = test::check_delta_equals_dense(ranks, metas, v, v1, mode, seed + 11, 3);
        CHECK(st.changed > 0);
        changed += st.changed;
        checks += st.receivers;
      }
      ++seed;
    }
  }
  MESSAGE("receivers checked: " << checks << ", changed entries applied: " << changed);
}

TEST_CASE("sweep: cast/transpose loader x workloads x modes (overwrite through casts, NaN two-fill "
          "masks)") {
  for (auto c : {tiny_llama(), tiny_qwen3_moe()}) {
    const auto metas = canonical_tensors(c);
    const auto v = test::random_model(metas, 77);
    for (auto w : {workload::adamw, workload::stress_high, workload::nan_values}) {
      const auto v1 = transition(v, w, 78);
      for (auto mode : {delta_mode::mixed, delta_mode::xor_only, delta_mode::overwrite_only}) {
        INFO(c.family << " workload " << static_cast<int>(w) << " mode " << static_cast<int>(mode));
        auto st = test::check_delta_equals_dense(std::vector{loaders::cast_transpose_loader(c)},
                                                 metas, v, v1, mode, 79);
        CHECK(st.changed > 0);
      }
    }
  }
}
