#pragma once
// Shared property check: dense refit of v, then the delta v -> v+1 applied
// item by item in a shuffled order, equals a dense refit of v+1 on every
// receiver, byte for byte (padding and unchanged elements included).

#include <doctest/doctest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "dcr/loaders/vllm_style.hpp"
#include "dcr/model/config.hpp"
#include "dcr/receiver/receiver.hpp"
#include "dcr/twin/device_sink.hpp"
#include "receiver/workload.hpp"

namespace dcr::test {

/// Every rank of a vLLM deployment (DP-major, then PP, then TP).
inline std::vector<loaders::vllm_style_loader> all_ranks(const model_config& c,
                                                         const loaders::vllm_parallel_config& p) {
  return loaders::vllm_style_loaders(c, p);
}

/// A deployment as vLLM's flags give it.
inline loaders::vllm_parallel_config vllm_deployment(std::uint64_t tp, std::uint64_t pp = 1,
                                                     std::uint64_t dp = 1, bool ep = false) {
  loaders::vllm_parallel_config p;
  p.tensor_parallel_size = tp;
  p.pipeline_parallel_size = pp;
  p.data_parallel_size = dp;
  p.enable_expert_parallel = ep;
  return p;
}

/// A model and the vLLM deployment its receivers are refit under.
struct layout_case {
  model_config model;
  loaders::vllm_parallel_config parallel;
};

/// The layouts the delta-vs-dense suites run over (host sink and device sink
/// twin alike): TP 1; TP 8 > kv heads; tied embeddings with an odd vocab and
/// attention bias; PP 3 over 5 layers (2, 2, 1); MoE with and without expert
/// parallelism.
inline std::vector<layout_case> refit_layouts() {
  auto tied = tiny_llama();
  tied.tied_embeddings = true;
  tied.vocab = 777;
  tied.attention_bias = true;
  auto llama5 = tiny_llama();
  llama5.layers = 5;
  return {{tiny_llama(), vllm_deployment(1)},
          {tiny_llama(), vllm_deployment(8)},
          {tied, vllm_deployment(8)},
          {llama5, vllm_deployment(2, 3)},
          {tiny_qwen3_moe(), vllm_deployment(2, 1, 2, true)},
          {tiny_qwen3_moe(), vllm_deployment(2, 2, 2, false)}};
}

/// Two versions of one model: a random one and the next.
struct version_pair {
  tensor_set from, to;
};

/// `to` is `from` after a stress update of 3 % of each tensor's elements.
inline version_pair stressed_versions(const std::vector<tensor_meta>& metas, std::uint64_t seed) {
  version_pair v{random_model(metas, seed), {}};
  v.to = clone(v.from);
  stress(v.to, 0.03, 0.05, seed + 1);
  return v;
}

/// Both versions hold NaNs (the overwrite placeholder pattern included) and
/// `to` is a stress update of `from`: what forces the two-fill active mask
/// on cast paths.
inline version_pair nan_versions(const std::vector<tensor_meta>& metas) {
  version_pair v{random_model(metas, 5), {}};
  inject_nans(v.from, 5, 6);
  v.to = clone(v.from);
  stress(v.to, 0.02, 0.1, 7);
  inject_nans(v.to, 7, 8);
  return v;
}

/// Result counters so callers can assert the check did real work.
struct refit_stats {
  std::uint64_t receivers = 0, items = 0, changed = 0, xor_items = 0, add_items = 0;
  std::uint64_t mirrored_entries = 0; ///< entries a mirroring sink scattered
};

/// `Sink`: the receivers' storage sink; one that mirrors storage (the device
/// sink's host twin) must also hold exactly the dense refit's bytes.
template <class L, class Sink = host_sink>
refit_stats check_delta_equals_dense(const std::vector<L>& loaders,
                                     const std::vector<tensor_meta>& metas, const tensor_set& v,
                                     const tensor_set& v1, delta_mode mode, std::uint64_t seed,
                                     int owners = 2) {
  std::vector<receiver<L, Sink>> rs;
  for (auto& l : loaders) rs.emplace_back(l, metas);
  auto xor_ok = [&](const std::string& n) {
    return std::all_of(rs.begin(), rs.end(), [&](auto& r) { return r.xor_allowed(n); });
  };
  auto items = diff_items(v, v1, mode, xor_ok, owners);
  std::mt19937_64 rng(seed);
  std::shuffle(items.begin(), items.end(), rng);
  refit_stats st;
  st.items = items.size();
  st.changed = changed_count(items);
  for (auto& it : items) st.xor_items += it.encoding == value_encoding::xor_mask;
  for (auto& it : items) st.add_items += it.encoding == value_encoding::add;
  for (std::size_t k = 0; k < rs.size(); ++k) {
    auto& r = rs[k];
    r.dense_refit(v);
    const auto before = r.state_digest();
    for (auto& it : items) {
      auto s = r.apply_item(it);
      REQUIRE_MESSAGE(s.ok(), s.message);
    }
    receiver<L> ref(loaders[k], metas);
    ref.dense_refit(v1);
    INFO("receiver " << k);
    CHECK(first_difference(r.storage(), ref.storage()) == "");
    if constexpr (Sink::mirrors) {
      CHECK(twin::mirror_difference(r.sink(), ref.storage()) == "");
      st.mirrored_entries += r.sink().entries();
    }
    CHECK(r.state_digest() == ref.state_digest());
    auto vs = r.verify(v1);
    CHECK_MESSAGE(vs.ok(), vs.message);
    // The candidate differs from v on this rank exactly when the dense refits differ.
    receiver<L> old(loaders[k], metas);
    old.dense_refit(v);
    CHECK(before == old.state_digest());
    ++st.receivers;
  }
  return st;
}

} // namespace dcr::test
