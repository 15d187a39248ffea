// Randomized fault sweep (fixed seeds): every transition draws a fault from
// the scenario table; after each, the invariant of docs/protocol.md holds.
#include <doctest/doctest.h>

#include <random>

#include "models.hpp"

using namespace dcr;
using namespace dcr::protocol;
using namespace dcr::test_models;

namespace {
model_config sweep_model() {
  model_config c;
  c.hidden = 48, c.heads = 4, c.kv_heads = 2, c.head_dim = 12, c.ffn = 64, c.vocab = 97,
  c.layers = 2;
  return c;
}
} // namespace

TEST_CASE(
    "fault sweep: random faults every transition, receivers always equal the committed version") {
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    CAPTURE(seed);
    std::mt19937_64 rng(seed);
    const auto metas = canonical_tensors(sweep_model());
    auto trainer = trainer_state::make(metas, seed);
    const std::uint32_t n_owners = 1 + rng() % 4;
    std::vector<std::unique_ptr<model_owner>> owners;
    std::vector<model_owner*> op;
    for (std::uint32_t k = 0; k < n_owners; ++k) {
      owners.push_back(std::make_unique<model_owner>(k, n_owners, &trainer, 1 + rng() % 4));
      op.push_back(owners.back().get());
    }
    transport::memory_object_store objects;
    faulty_store store(objects);
    memory_commit_store commits;
    auto dense = [&](model_receiver& r) {
      for (std::size_t t = 0; t < metas.size(); ++t)
        r.tensors()[t].bytes = owners[t % n_owners]->baseline(t)->bytes;
      return status::success();
    };
    const int n_receivers = 1 + static_cast<int>(rng() % 4);
    std::vector<std::unique_ptr<receiver_endpoint<model_receiver>>> eps;
    std::vector<receiver_endpoint<model_receiver>*> ep;
    for (int r = 0; r < n_receivers; ++r) {
      auto id = "r" + std::to_string(r);
      eps.push_back(std::make_unique<receiver_endpoint<model_receiver>>(
          id, [&, id] { return std::make_unique<model_receiver>(id, metas); }, dense));
      ep.push_back(eps.back().get());
    }
    using C = coordinator<model_owner, model_receiver, faulty_store, memory_commit_store>;
    using dying_t = coordinator<model_owner, model_receiver, faulty_store, memory_commit_store,
                                support::crash_at>;
    coordinator_options base;
    base.attempt_deadline = std::chrono::milliseconds(5000);
    base.mode = rng() % 2 ? rl_mode::synchronous : rl_mode::asynchronous;
    auto c = std::make_unique<C>(commits, store, op, ep, base);
    REQUIRE(c->take_over().ok());
    REQUIRE(c->bootstrap().ok());
    std::uint64_t version = 0;
    for (int step = 1; step <= 8; ++step) {
      CAPTURE(step);
      trainer.step(0.01 + 0.1 * static_cast<double>(rng() % 10) / 10.0,
                   seed * 100 + static_cast<std::uint64_t>(step));
      const int fault = static_cast<int>(rng() % 9);
      CAPTURE(fault);
      store.mode = faulty_store::fault::none;
      switch (fault) {
      case 1:
        eps[rng() % eps.size()]->with_receiver(
            [&](model_receiver& r) { r.fail_after(static_cast<long>(rng() % 3)); });
        break;
      case 2:
        support::kill_after(*eps[rng() % eps.size()], 1 + rng() % 2);
        break;
      case 3:
        store.mode = faulty_store::fault::drop, store.remaining = 1;
        break;
      case 4:
        store.mode = faulty_store::fault::corrupt, store.remaining = 1;
        break;
      case 5:
        store.mode = faulty_store::fault::truncate, store.remaining = 1;
        break;
      case 6:
        store.mode = faulty_store::fault::reverse_list;
        break;
      case 7:
        eps[rng() % eps.size()]->kill();
        break;
      default:
        break;
      }
      transition_report rep;
      if (fault == 8) {
        // The coordinator dies at a random point; a successor takes over.
        auto point = static_cast<crash_point>(rng() % 3);
        dying_t dying(commits, store, op, ep, base, support::crash_at(point));
        REQUIRE(dying.take_over().ok());
        CHECK(dying.transition().result.code == errc::aborted);
        c = std::make_unique<C>(commits, store, op, ep, base);
        REQUIRE(c->take_over().ok());
      }
      rep = c->transition();
      REQUIRE_MESSAGE(rep.result.ok(), rep.result.message);
      ++version;
      stored_record cur;
      REQUIRE(commits.load(cur).ok());
      REQUIRE(cur.record.version == version);
      for (std::size_t r = 0; r < eps.size(); ++r)
        eps[r]->with_receiver([&](model_receiver& rc) {
          for (std::size_t t = 0; t < metas.size(); ++t)
            REQUIRE(rc.tensors()[t].bytes == trainer.tensors[t].bytes);
          CHECK(cur.record.receivers[r].state == rc.state_digest());
        });
      std::vector<std::string> left;
      REQUIRE(objects.list("", left).ok());
      CHECK(left.empty());
    }
  }
}
