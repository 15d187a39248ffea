// End to end: Megatron-style owners (dcr::owner through training_round) →
// filesystem object store → vLLM-style receivers (dcr::receiver through
// receiver_role_adapter) → joint commit in a file commit store. After every step,
// every receiver equals a dense refit of the committed version byte for byte,
// also across injected faults.
#include <doctest/doctest.h>

#include <filesystem>
#include <random>

#include "dcr/assembly/adapters.hpp"
#include "dcr/loaders/vllm_style.hpp"
#include "dcr/model/trainer_layout.hpp"
#include "dcr/protocol/coordinator.hpp"
#include "dcr/receiver/receiver.hpp"
#include "dcr/receiver/tensor_set.hpp"
#include "dcr/source/state.hpp"
#include "dcr/transport/object_store.hpp"
#include "examples/common/simulator.hpp"
#include "support/faults.hpp"

using namespace dcr;
using namespace dcr::protocol;

namespace {

using loader_t = loaders::vllm_style_loader;
using rank_t = receiver<loader_t>;
using staged_t = support::crash_injectable<receiver_role_adapter<rank_t>>;
using endpoint_t = receiver_endpoint<staged_t>;
using member_t = training_round::member;
// Faults injected where a test asks for them; default-constructed it never fires.
using coord_t = coordinator<member_t, staged_t, transport::fs_object_store, file_commit_store,
                            support::crash_at>;

struct world {
  model_config cfg;
  trainer_layout tl;
  std::shared_ptr<const source_plan> plan;
  source_state state;
  std::filesystem::path dir;
  std::unique_ptr<transport::fs_object_store> objects;
  std::unique_ptr<file_commit_store> commits;
  std::unique_ptr<training_round> round;
  std::vector<member_t> members;
  std::vector<loader_t> layouts;
  tensor_set committed; // canonical tensors of the committed version (restore source)
  std::vector<std::unique_ptr<endpoint_t>> endpoints;
  std::uint64_t seed;

  /// Receivers: vLLM with tensor_parallel_size `rtp`, data_parallel_size
  /// `rdp`, expert parallelism enabled for MoE models.
  world(model_config c, trainer_layout t, std::uint64_t rtp, std::uint64_t rdp, std::uint64_t s,
        builder_options bo = {})
      : cfg(std::move(c)), tl(t), seed(s) {
    plan = std::make_shared<const source_plan>(megatron_plan(cfg, tl));
    std::vector<host_tensor> init;
    for (std::size_t i = 0; i < plan->canonical.size(); ++i) {
      host_tensor h(plan->canonical[i]);
      auto w = sim::normal_bf16(h.meta.numel(), 0.02f, seed * 1000 + i);
      std::memcpy(h.bytes.data(), w.data(), h.bytes.size());
      init.push_back(std::move(h));
    }
    state = source_from_canonical(*plan, init);
    char tmpl[] = "/tmp/dcr-e2e-XXXXXX";
    dir = ::mkdtemp(tmpl);
    objects = std::make_unique<transport::fs_object_store>(dir / "objects", false);
    commits = std::make_unique<file_commit_store>(dir / "control");
    round = std::make_unique<training_round>(plan, state.view(), bo);
    members = round->members();
    loaders::vllm_parallel_config vp;
    vp.tensor_parallel_size = rtp;
    vp.data_parallel_size = rdp;
    vp.enable_expert_parallel = cfg.is_moe();
    layouts = loaders::vllm_style_loaders(cfg, vp);
    snapshot();
    for (std::size_t k = 0; k < layouts.size(); ++k)
      endpoints.push_back(std::make_unique<endpoint_t>(
          id(k),
          [this, k] {
            return std::make_unique<staged_t>(
                id(k), std::make_unique<rank_t>(layouts[k], plan->canonical));
          },
          [this](staged_t& s) {
            s.inner().dense_refit(committed);
            return status::success();
          }));
  }
  ~world() { std::filesystem::remove_all(dir); }

  std::string id(std::size_t k) const { return "rank" + std::to_string(k); }
  void snapshot() {
    std::vector<host_tensor> canon;
    throw_if_failed(export_canonical(*plan, state.view(), canon));
    committed = tensor_set{};
    for (auto& t : canon) committed.add(std::move(t));
  }
  coord_t coordinator(coordinator_options o = {}, support::crash_at faults = {}) {
    std::vector<member_t*> op;
    for (auto& m : members) op.push_back(&m);
    std::vector<endpoint_t*> ep;
    for (auto& e : endpoints) ep.push_back(e.get());
    o.attempt_deadline = std::chrono::milliseconds(20000);
    return coord_t(*commits, *objects, op, ep, std::move(o), std::move(faults));
  }
  /// A training step on the source shards (stress update: a few % of words).
  void train(double fraction, std::uint64_t step) {
    for (std::size_t s = 0; s < state.shards.size(); ++s) {
      auto& b = state.shards[s];
      std::span<std::uint16_t> w(reinterpret_cast<std::uint16_t*>(b.data()), b.size() / 2);
      sim::stress_update(w, fraction, 0.01, seed * 7777 + step * 131 + s);
    }
    round->set_candidate(state.view());
  }
  /// Every receiver vs a dense refit of the committed version, and the record.
  void check(std::uint64_t version) {
    stored_record cur;
    REQUIRE(commits->load(cur).ok());
    CHECK(cur.record.version == version);
    snapshot();
    REQUIRE(cur.record.receivers.size() == endpoints.size());
    for (std::size_t k = 0; k < endpoints.size(); ++k) {
      rank_t ref(layouts[k], plan->canonical);
      ref.dense_refit(committed);
      endpoints[k]->with_receiver([&](staged_t& s) {
        INFO("receiver " << k);
        CHECK(first_difference(s.inner().storage(), ref.storage()) == "");
        CHECK(cur.record.receivers[k].state == s.state_digest());
      });
    }
  }
};

builder_options targets(std::size_t chunk, std::size_t bucket) {
  builder_options o;
  o.chunk_bytes = chunk;
  o.bucket_bytes = bucket;
  return o;
}

model_config small_moe() {
  model_config c = tiny_qwen3_moe();
  c.layers = 2;
  return c;
}

} // namespace

TEST_CASE("e2e: Megatron TP2xEP2xDP2 owners -> fs object store -> vLLM TP 4, DP 2, expert parallel "
          "receivers, bit-exact every step") {
  world w(small_moe(), trainer_layout{2, 1, 2, 1, 2, 128}, 4, 2, 1, targets(1 << 14, 1 << 15));
  auto c = w.coordinator();
  REQUIRE(c.take_over().ok());
  REQUIRE(c.bootstrap().ok());
  w.check(0);
  for (std::uint64_t v = 1; v <= 3; ++v) {
    w.train(0.03, v);
    auto rep = c.transition();
    REQUIRE_MESSAGE(rep.result.ok(), rep.result.message);
    CHECK(rep.attempts.size() == 1);
    CHECK(rep.attempts[0].payloads > 4); // several buckets per owner: pipelined
    CHECK(w.round->emitted_records(rep.attempts[0].attempt) > 0);
    w.check(v);
  }
}

TEST_CASE("e2e: payloads per expert block, nodes fetch by the manifest index: EP receivers skip "
          "other ranks' experts, bit-exact every step, also across a receiver death") {
  for (const std::uint32_t blocks : {0u, 4u}) {
    auto bo = targets(1 << 14, 1 << 15);
    bo.grouping = payload_grouping::by_expert;
    bo.expert_blocks = blocks;
    world w(small_moe(), trainer_layout{2, 1, 2, 1, 2, 128}, 2, 2, 3 + blocks, bo);
    auto c = w.coordinator();
    for (auto* n : c.node_links()) n->fetch_all(false);
    REQUIRE(c.take_over().ok());
    REQUIRE(c.bootstrap().ok());
    w.check(0);
    for (std::uint64_t v = 1; v <= 3; ++v) {
      INFO("blocks " << blocks << " version " << v);
      w.train(0.03, v);
      if (v == 2) support::kill_after(*w.endpoints[1], 1);
      auto rep = c.transition();
      REQUIRE_MESSAGE(rep.result.ok(), rep.result.message);
      CHECK(rep.attempts.size() == (v == 2 ? 2u : 1u));
      w.check(v);
    }
    // Every node (one receiver each, vLLM EP over 4 ranks: a quarter of the
    // experts) skipped payloads, and fetched some.
    for (auto* n : c.node_links()) {
      const auto t = n->fetch_totals();
      CHECK(t.skipped_payloads > 0);
      CHECK(t.skipped_bytes > 0);
      CHECK(t.payloads > 0);
    }
  }
}

TEST_CASE("e2e: dense Llama, trainer TP2xPP2xDP2, vLLM TP4 (KV heads replicated), with faults "
          "every step") {
  model_config c = tiny_llama();
  c.layers = 2;
  world w(c, trainer_layout{2, 2, 1, 1, 2}, 4, 1, 2, targets(1 << 15, 1 << 16));
  auto co = w.coordinator();
  REQUIRE(co.take_over().ok());
  REQUIRE(co.bootstrap().ok());

  // Step 1: a receiver dies mid-refit; it is restored to v and the retry repairs.
  w.train(0.05, 1);
  support::kill_after(*w.endpoints[1], 1);
  auto rep = co.transition();
  REQUIRE_MESSAGE(rep.result.ok(), rep.result.message);
  CHECK(rep.attempts.size() == 2);
  CHECK(rep.attempts[1].mode == refit_mode::overwrite_all);
  w.check(1);

  // Step 2: the coordinator dies after some ACKs; a successor on the reopened
  // file commit store finishes the transition.
  w.train(0.05, 2);
  {
    auto dying = w.coordinator({}, support::crash_at(crash_point::after_first_ack));
    REQUIRE(dying.take_over().ok());
    CHECK(dying.transition().result.code == errc::aborted);
  }
  w.commits = std::make_unique<file_commit_store>(w.dir / "control");
  auto successor = w.coordinator();
  REQUIRE(successor.take_over().ok());
  rep = successor.transition();
  REQUIRE_MESSAGE(rep.result.ok(), rep.result.message);
  CHECK(rep.attempts[0].mode == refit_mode::overwrite_all);
  w.check(2);

  // Step 3: dies after commit, before the baseline update: roll forward.
  w.train(0.05, 3);
  {
    auto dying = w.coordinator({}, support::crash_at(crash_point::after_commit));
    REQUIRE(dying.take_over().ok());
    CHECK(dying.transition().result.code == errc::aborted);
  }
  auto third = w.coordinator();
  REQUIRE(third.take_over().ok());
  rep = third.transition();
  REQUIRE_MESSAGE(rep.result.ok(), rep.result.message);
  CHECK(rep.rolled_forward);
  w.check(3);

  // Step 4: clean, mixed again; the next delta starts from the committed baseline.
  w.train(0.05, 4);
  rep = third.transition();
  REQUIRE_MESSAGE(rep.result.ok(), rep.result.message);
  CHECK(rep.attempts.size() == 1);
  CHECK(rep.attempts[0].mode == refit_mode::mixed);
  w.check(4);
}

TEST_CASE("e2e: asynchronous RL stages while serving, applies after the gate closes") {
  world w(small_moe(), trainer_layout{2, 1, 2, 1, 2, 128}, 2, 2, 3);
  std::vector<std::unique_ptr<request_gate>> gates;
  // Rebuild endpoints with gates.
  w.endpoints.clear();
  for (std::size_t k = 0; k < w.layouts.size(); ++k) {
    gates.push_back(std::make_unique<request_gate>());
    w.endpoints.push_back(std::make_unique<endpoint_t>(
        w.id(k),
        [&w, k] {
          return std::make_unique<staged_t>(
              w.id(k), std::make_unique<rank_t>(w.layouts[k], w.plan->canonical));
        },
        [&w](staged_t& s) {
          s.inner().dense_refit(w.committed);
          return status::success();
        },
        gates.back().get()));
  }
  coordinator_options o;
  o.mode = rl_mode::asynchronous;
  auto c = w.coordinator(o);
  REQUIRE(c.take_over().ok());
  REQUIRE(c.bootstrap().ok());
  for (std::uint64_t v = 1; v <= 2; ++v) {
    w.train(0.04, v);
    auto rep = c.transition();
    REQUIRE_MESSAGE(rep.result.ok(), rep.result.message);
    for (auto& g : gates) CHECK(g->is_open());
    w.check(v);
  }
}
