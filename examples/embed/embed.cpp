// The smallest complete use of dcr: one delta refit from Megatron-style trainer
// shards to vLLM-style receivers, checked byte for byte against a dense refit.
// No protocol, no transport: payload bytes are handed over in memory. See
// examples/demo/demo.cpp for attempts, the object store and joint commits.
#include <cstdio>
#include <cstring>

#include "dcr/loaders/vllm_style.hpp"
#include "dcr/model/trainer_layout.hpp"
#include "dcr/receiver/receiver.hpp"
#include "dcr/receiver/tensor_set.hpp"
#include "dcr/source/builder.hpp"
#include "dcr/source/state.hpp"
#include "examples/common/simulator.hpp"
#include "examples/common/training_side.hpp"

using namespace dcr;

// Canonical tensors of the trainer's current state (what a dense refit loads).
static tensor_set canonical(const source_plan& plan, const source_state& state) {
  std::vector<host_tensor> tensors;
  throw_if_failed(export_canonical(plan, state.view(), tensors));
  tensor_set set;
  for (auto& t : tensors) set.add(std::move(t));
  return set;
}

int main() {
  // Training side: a small Llama-style model on TP2 x DP2.
  const model_config cfg = tiny_llama();
  auto plan =
      std::make_shared<const source_plan>(megatron_plan(cfg, trainer_layout{2, 1, 1, 1, 2}));
  std::vector<host_tensor> init;
  for (std::size_t i = 0; i < plan->canonical.size(); ++i) {
    host_tensor t(plan->canonical[i]);
    auto words = sim::normal_bf16(t.meta.numel(), 0.02f, 100 + i);
    std::memcpy(t.bytes.data(), words.data(), t.bytes.size());
    init.push_back(std::move(t));
  }
  source_state state = source_from_canonical(*plan, init);
  training_side trainer(plan, state.view()); // baseline = committed version v

  // Rollout side: vLLM-style TP4 receivers restored to version v by dense refit.
  std::vector<receiver<loaders::vllm_style_loader>> receivers;
  const tensor_set v = canonical(*plan, state);
  for (std::uint64_t r = 0; r < 4; ++r) {
    receivers.emplace_back(loaders::vllm_style_loader(cfg, loaders::vllm_tp_rank(4, r)),
                           plan->canonical);
    receivers.back().dense_refit(v);
  }

  // One training step changes ~3% of the stored BF16 words of every shard.
  for (std::size_t s = 0; s < state.shards.size(); ++s) {
    auto& b = state.shards[s];
    sim::stress_update({reinterpret_cast<std::uint16_t*>(b.data()), b.size() / 2}, 0.03, 1e-2, s);
  }

  // Delta: each owner builds payloads; every receiver stages and applies them all.
  payload_id id;
  id.attempt = 1;
  id.source_version = 0;
  std::size_t bytes = 0;
  for (auto& owner_payloads : trainer.build(state.view(), id))
    for (auto& p : owner_payloads) {
      bytes += p.size();
      for (auto& r : receivers) throw_if_failed(r.stage(p));
    }
  for (auto& r : receivers) throw_if_failed(r.apply_staged());
  trainer.commit(state.view()); // after every receiver holds v+1

  // Check: every receiver equals a dense refit of v+1, byte for byte.
  const tensor_set next = canonical(*plan, state);
  bool exact = true;
  for (std::uint64_t r = 0; r < 4; ++r) {
    receiver<loaders::vllm_style_loader> dense(
        loaders::vllm_style_loader(cfg, loaders::vllm_tp_rank(4, r)), plan->canonical);
    dense.dense_refit(next);
    const std::string diff = first_difference(receivers[r].storage(), dense.storage());
    if (!diff.empty())
      std::printf("receiver %llu differs: %s\n", static_cast<unsigned long long>(r), diff.c_str());
    exact = exact && diff.empty();
  }
  std::printf("payload bytes: %zu; 4 receivers bit-exact vs dense refit: %s\n", bytes,
              exact ? "yes" : "NO");
  return exact ? 0 : 1;
}
