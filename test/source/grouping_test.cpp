// Payloads grouped by expert (builder_options::grouping = by_expert): each
// payload updates the tensors of one expert (or one block of experts,
// expert_blocks) or of no expert; a vLLM-style
// expert-parallel rank that is given only the payloads naming a tensor it
// needs (what a node with a manifest index fetches) ends, every byte of its
// storage, equal to a dense refit of the new version, and so does the
// ungrouped build delivered in full, over random models, trainer layouts,
// deployments, change rates and bucket sizes. The grouping is deterministic
// and changes nothing when it is off.
#include <doctest/doctest.h>

#include <cstring>
#include <map>
#include <random>
#include <set>

#include "dcr/codec/payload.hpp"
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

using rank_t = receiver<loaders::vllm_style_loader>;

tensor_set canonical_of(const source_plan& plan, const source_view& v) {
  std::vector<host_tensor> canon;
  throw_if_failed(export_canonical(plan, v, canon));
  tensor_set s;
  for (auto& t : canon) s.add(std::move(t));
  return s;
}

std::vector<std::string> tensors_of(std::span<const std::byte> p) {
  std::vector<std::string> names;
  throw_if_failed(codec::payload_tensors(p, names));
  return names;
}

} // namespace

TEST_CASE("expert_group: the expert index of canonical MoE names, 0 for everything else") {
  CHECK(expert_group("model.layers.3.mlp.experts.0.gate_proj.weight") == 1);
  CHECK(expert_group("model.layers.3.mlp.experts.17.down_proj.weight") == 18);
  CHECK(expert_group("model.layers.3.mlp.gate.weight") == 0);
  CHECK(expert_group("model.layers.3.mlp.experts.x.w") == 0);
  CHECK(expert_group("model.layers.3.mlp.experts.5") == 0); // no dot after the index
  CHECK(expert_group("model.embed_tokens.weight") == 0);
}

TEST_CASE("payload_tensors: the sorted tensor names of a payload's table, damage refused") {
  auto plan =
      std::make_shared<const source_plan>(megatron_plan(tiny_qwen3_moe(), trainer_layout{}));
  std::vector<host_tensor> init;
  for (std::size_t i = 0; i < plan->canonical.size(); ++i) {
    host_tensor h(plan->canonical[i]);
    auto w = sim::normal_bf16(h.meta.numel(), 0.02f, 3 + i);
    std::memcpy(h.bytes.data(), w.data(), h.bytes.size());
    init.push_back(std::move(h));
  }
  auto s0 = source_from_canonical(*plan, init);
  auto s1 = s0;
  for (auto& b : s1.shards) {
    std::span<std::uint16_t> w(reinterpret_cast<std::uint16_t*>(b.data()), b.size() / 2);
    sim::stress_update(w, 0.05, 0.01, 4);
  }
  training_side ts(plan, s0.view());
  builder_options bo;
  bo.bucket_bytes = 1 << 16;
  const auto items = ts.build_items(s1.view(), bo);
  const auto payloads = ts.build(s1.view(), {1, 1, 0, 0}, bo);
  REQUIRE(payloads.size() == 1);
  REQUIRE(payloads[0].size() == items.size());
  for (std::size_t k = 0; k < items.size(); ++k) {
    std::set<std::string> want;
    for (auto& it : items[k].items) want.insert(it.tensor.name);
    const auto got = tensors_of(payloads[0][k]);
    CHECK(got == std::vector<std::string>(want.begin(), want.end()));
  }
  auto p = payloads[0].at(0);
  std::vector<std::string> names;
  CHECK(!codec::payload_tensors(std::span(p).first(p.size() - 1), names));
  CHECK(!codec::payload_tensors(std::span(p).first(40), names));
  p[100] ^= std::byte{0xff}; // inside the compressed body
  const auto st = codec::payload_tensors(p, names);
  // Either the frame or the table no longer reads; never a wrong list of names.
  if (st) CHECK(names == tensors_of(payloads[0][0]));
}

TEST_CASE("payloads grouped by expert: EP ranks given only the payloads they need equal a dense "
          "refit, every byte") {
  std::mt19937_64 rng(2026);
  const trainer_layout layouts[] = {
      trainer_layout{1, 1, 1, 1, 1, 128}, trainer_layout{2, 1, 2, 1, 2, 128},
      trainer_layout{1, 1, 2, 1, 2, 128}, trainer_layout{2, 1, 1, 1, 2, 128}};
  std::uint64_t skipped_total = 0, payloads_total = 0, changed_ranks = 0;
  for (int round = 0; round < 24; ++round) {
    auto cfg = tiny_qwen3_moe();
    cfg.experts = 4u << (rng() % 2);
    const auto tl = layouts[rng() % std::size(layouts)];
    auto plan = std::make_shared<const source_plan>(megatron_plan(cfg, tl));
    std::vector<host_tensor> init;
    for (std::size_t i = 0; i < plan->canonical.size(); ++i) {
      host_tensor h(plan->canonical[i]);
      auto w = sim::normal_bf16(h.meta.numel(), 0.02f, rng());
      std::memcpy(h.bytes.data(), w.data(), h.bytes.size());
      init.push_back(std::move(h));
    }
    auto s0 = source_from_canonical(*plan, init);
    auto s1 = s0;
    const double rate = 0.002 + 0.05 * static_cast<double>(rng() % 10) / 10.0;
    for (auto& b : s1.shards) {
      if (rng() % 4 == 0) continue;
      std::span<std::uint16_t> w(reinterpret_cast<std::uint16_t*>(b.data()), b.size() / 2);
      sim::stress_update(w, rate, 0.01, rng());
    }
    builder_options bo;
    bo.chunk_bytes = std::size_t{1} << (10 + rng() % 8);
    bo.bucket_bytes = std::size_t{1} << (12 + rng() % 10);
    bo.mode = rng() % 3 ? refit_mode::mixed : refit_mode::overwrite_all;
    training_side ts(plan, s0.view());
    auto plain = ts.build(s1.view(), {1, 1, 0, 0}, bo);
    auto grouped_opt = bo;
    grouped_opt.grouping = payload_grouping::by_expert;
    const std::uint32_t blocks = static_cast<std::uint32_t>(rng() % 4); // 0: one per expert
    grouped_opt.expert_blocks = blocks;
    auto block = [&](const std::string& n) -> std::uint64_t {
      const auto g = expert_group(n);
      return g == 0 || blocks == 0 ? g : 1 + (g - 1) * blocks / cfg.experts;
    };
    auto grouped = ts.build(s1.view(), {1, 1, 0, 0}, grouped_opt);
    // Deterministic: the same inputs give the same bytes.
    CHECK(ts.build(s1.view(), {1, 1, 0, 0}, grouped_opt) == grouped);
    // Off is the ungrouped build; on, each payload is of one group.
    CHECK(ts.build(s1.view(), {1, 1, 0, 0}, bo) == plain);
    for (auto& per_owner : grouped)
      for (auto& p : per_owner) {
        const auto names = tensors_of(p);
        REQUIRE(!names.empty());
        for (auto& n : names) CHECK(block(n) == block(names.front()));
      }

    const auto v0 = canonical_of(*plan, s0.view()), v1 = canonical_of(*plan, s1.view());
    loaders::vllm_parallel_config vp;
    vp.tensor_parallel_size = 1 + rng() % 2;
    vp.data_parallel_size = 2;
    vp.enable_expert_parallel = true;
    INFO("round " << round << " experts " << cfg.experts << " blocks " << blocks << " tp "
                  << vp.tensor_parallel_size << " chunk " << bo.chunk_bytes << " bucket "
                  << bo.bucket_bytes);
    for (const auto& layout : loaders::vllm_style_loaders(cfg, vp)) {
      rank_t ref(layout, plan->canonical);
      ref.dense_refit(v1);
      {
        rank_t old(layout, plan->canonical);
        old.dense_refit(v0);
        changed_ranks += old.state_digest() != ref.state_digest();
      }
      for (const bool filtered : {false, true}) {
        const auto& set = filtered ? grouped : plain;
        rank_t r(layout, plan->canonical);
        r.dense_refit(v0);
        r.begin_attempt(1);
        std::size_t given = 0, all = 0;
        for (auto& per_owner : set)
          for (auto& p : per_owner) {
            ++all;
            bool need = !filtered;
            for (auto& n : tensors_of(p)) need = need || r.needs(n);
            if (!need) continue;
            ++given;
            REQUIRE(r.stage(p).ok());
          }
        REQUIRE(r.apply_staged().ok());
        CHECK(first_difference(r.storage(), ref.storage()) == "");
        CHECK(r.state_digest() == ref.state_digest());
        if (filtered) {
          skipped_total += all - given;
          payloads_total += all;
        }
      }
    }
  }
  // The grouping is there to be skipped: EP ranks did skip payloads.
  CHECK(skipped_total > 0);
  CHECK(skipped_total < payloads_total);
  CHECK(changed_ranks > 0); // the refits had something to do
}
