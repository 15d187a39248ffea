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
using loaders::expert_map;

namespace {

enum class workload { adamw, stress_low, stress_high, nan_values };

tensor_set transition(const tensor_set& v, workload w, std::uint64_t seed) {
  auto v1 = test::clone(v);
  switch (w) {
  case workload::adamw: test::adamw_steps(v1, 2, seed); break;
  case workload::stress_low: test::stress(v1, 0.012, 0.02, seed); break;
  case workload::stress_high: test::stress(v1, 0.05, 0.2, seed); break;
  case workload::nan_values:
    test::stress(v1, 0.02, 0.05, seed);
    test::inject_nans(v1, 9, seed + 1);
    break;
  }
  return v1;
}

struct layout_case {
  model_config c;
  std::uint64_t tp, ep;
  expert_map map;
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
  std::vector<layout_case> v;
  for (std::uint64_t t : {1, 2, 4, 8}) v.push_back({llama, t, 1, expert_map::linear}); // t = 4, 8 > nkv
  for (std::uint64_t t : {1, 2, 8}) v.push_back({odd, t, 1, expert_map::linear});
  v.push_back({moe, 1, 4, expert_map::linear});
  v.push_back({moe, 2, 2, expert_map::round_robin});
  v.push_back({moe, 4, 2, expert_map::linear});
  v.push_back({moe, 2, 4, expert_map::round_robin});
  return v;
}

} // namespace

TEST_CASE("sweep: vLLM-style layouts x workloads x modes, delta refit == dense refit") {
  std::uint64_t seed = 1000;
  std::uint64_t checks = 0, changed = 0;
  for (auto& L : layouts()) {
    const auto metas = canonical_tensors(L.c);
    const auto v = test::random_model(metas, seed);
    const auto ranks = test::all_ranks(L.c, L.tp, L.ep, L.map);
    for (auto w : {workload::adamw, workload::stress_low, workload::stress_high, workload::nan_values}) {
      const auto v1 = transition(v, w, seed + 7);
      for (auto mode : {delta_mode::mixed, delta_mode::xor_only, delta_mode::overwrite_only}) {
        INFO(L.c.family << " tp " << L.tp << " ep " << L.ep << " map " << static_cast<int>(L.map) << " workload "
                        << static_cast<int>(w) << " mode " << static_cast<int>(mode));
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

TEST_CASE("sweep: cast/transpose loader x workloads x modes (overwrite through casts, NaN two-fill masks)") {
  for (auto c : {tiny_llama(), tiny_qwen3_moe()}) {
    const auto metas = canonical_tensors(c);
    const auto v = test::random_model(metas, 77);
    for (auto w : {workload::adamw, workload::stress_high, workload::nan_values}) {
      const auto v1 = transition(v, w, 78);
      for (auto mode : {delta_mode::mixed, delta_mode::xor_only, delta_mode::overwrite_only}) {
        INFO(c.family << " workload " << static_cast<int>(w) << " mode " << static_cast<int>(mode));
        auto st = test::check_delta_equals_dense(std::vector{loaders::cast_transpose_loader(c)}, metas, v, v1, mode, 79);
        CHECK(st.changed > 0);
      }
    }
  }
}
