// State digests kept incrementally (core/set_digest.hpp): the receiver's, updated
// by its sinks from the words before and after every write, and the owners',
// updated from the changed set, always equal the full recomputation, over
// random refits (XOR, overwrite, NaN values, unmapped cast copies), duplicate
// XOR items, partially failed attempts repaired by an overwrite_all retry,
// dense restores, abandoned candidates and commits.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "dcr/assembly/adapters.hpp"
#include "dcr/codec/payload.hpp"
#include "dcr/core/set_digest.hpp"
#include "dcr/loaders/cast_transpose.hpp"
#include "dcr/loaders/vllm_style.hpp"
#include "dcr/model/trainer_layout.hpp"
#include "dcr/receiver/receiver.hpp"
#include "dcr/source/fp8_plan.hpp"
#include "dcr/source/state.hpp"
#include "examples/common/simulator.hpp"
#include "examples/common/training_side.hpp"
#include "receiver/refit_check.hpp"
#include "receiver/workload.hpp"

using namespace dcr;
using dcr::test::delta_mode;

namespace {

/// Payloads of one attempt for the diff from -> to, a few items each.
std::vector<std::vector<std::byte>> payloads_of(const std::vector<item>& items,
                                                std::uint64_t attempt, std::size_t per = 3) {
  std::vector<std::vector<std::byte>> out;
  for (std::size_t k = 0, seq = 0; k < items.size(); k += per, ++seq) {
    const auto n = std::min(per, items.size() - k);
    out.push_back(codec::encode_payload({attempt, 1, 0, static_cast<std::uint32_t>(seq)},
                                        std::span<const item>(items.data() + k, n)));
  }
  return out;
}

/// Random refits, retries and restores of one receiver; the incremental
/// digest must equal the recomputation after every step, and a dense refit
/// of the state the receiver should hold.
template <class L>
void random_refits(const L& loader, const std::vector<tensor_meta>& metas, std::uint64_t seed,
                   int steps) {
  using rx = receiver<L>;
  std::mt19937_64 rng(seed);
  tensor_set cur = test::random_model(metas, seed);
  auto r = std::make_unique<rx>(loader, metas);
  r->dense_refit(cur);
  REQUIRE(r->check_state_digest().ok());
  auto xor_ok = [&](const std::string& n) { return r->xor_allowed(n); };
  auto same_as_dense = [&](const tensor_set& want) {
    rx ref(loader, metas);
    ref.dense_refit(want);
    CHECK(first_difference(r->storage(), ref.storage()) == "");
    CHECK(r->state_digest() == ref.state_digest());
  };
  std::uint64_t attempt = 0;
  int kinds[5] = {};
  for (int step = 0; step < steps; ++step) {
    const int kind = step < 5 ? step : static_cast<int>(rng() % 5); // every kind at least once
    ++kinds[kind];
    INFO("seed " << seed << " step " << step << " kind " << kind);
    auto next = test::clone(cur);
    test::stress(next, 0.002 + 0.05 * static_cast<double>(rng() % 100) / 100.0, 0.05, rng());
    if (rng() % 3 == 0) test::inject_nans(next, 2, rng());
    const delta_mode mode = kind == 1   ? delta_mode::overwrite_only
                            : rng() % 2 ? delta_mode::mixed
                                        : delta_mode::xor_only;
    auto items = test::diff_items(cur, next, mode, xor_ok, 1 + static_cast<int>(rng() % 3));
    std::shuffle(items.begin(), items.end(), rng);
    switch (kind) {
    case 0:
    case 1: // a refit, item by item
      for (auto& it : items) REQUIRE(r->apply_item(it).ok());
      cur = std::move(next);
      break;
    case 2: { // an attempt that fails part way, then an overwrite_all retry
      auto ps = payloads_of(items, ++attempt);
      item stray;
      stray.tensor = {"model.unknown.weight", {4}, dtype_id::bf16};
      stray.encoding = value_encoding::overwrite;
      stray.indices = {1};
      stray.values = {std::byte{1}, std::byte{2}};
      const auto cut = ps.empty() ? 0 : rng() % ps.size();
      r->begin_attempt(attempt);
      for (std::size_t i = 0; i < cut; ++i) REQUIRE(r->stage(ps[i]).ok());
      auto poison = codec::encode_payload({attempt, 1, 9, 0}, std::span<const item>(&stray, 1));
      REQUIRE(r->stage(poison).ok());
      for (std::size_t i = cut; i < ps.size(); ++i) REQUIRE(r->stage(ps[i]).ok());
      CHECK_FALSE(r->apply_staged().ok());
      CHECK(r->check_state_digest().ok()); // partial state: the digest follows what landed
      auto retry = test::diff_items(cur, next, delta_mode::overwrite_only, xor_ok);
      // An overwrite_all retry rewrites every changed word, landed or not.
      r->begin_attempt(++attempt);
      for (auto& p : payloads_of(retry, attempt)) REQUIRE(r->stage(p).ok());
      REQUIRE(r->apply_staged().ok());
      cur = std::move(next);
      break;
    }
    case 3: { // a duplicate XOR item reverts its words; applying it again restores them
      auto it = std::find_if(items.begin(), items.end(),
                             [](const item& x) { return x.encoding == value_encoding::xor_mask; });
      for (auto& x : items) REQUIRE(r->apply_item(x).ok());
      cur = std::move(next);
      if (it != items.end()) {
        REQUIRE(r->apply_item(*it).ok());
        CHECK(r->check_state_digest().ok());
        rx ref(loader, metas);
        ref.dense_refit(cur);
        // Reverted words (if this rank stores any of them) show in the digest.
        CHECK((first_difference(r->storage(), ref.storage()) == "") ==
              (r->state_digest() == ref.state_digest()));
        REQUIRE(r->apply_item(*it).ok());
      }
      break;
    }
    case 4: { // the receiver dies and is restored densely
      r = std::make_unique<rx>(loader, metas);
      CHECK(r->state_digest() == r->full_state_digest()); // fresh zero storage
      r->dense_refit(cur);
      break;
    }
    }
    CHECK(r->check_state_digest().ok());
    same_as_dense(cur);
  }
  for (int k : kinds) CHECK(k > 0); // every kind of step ran
}

} // namespace

TEST_CASE("receiver digest: incremental equals recomputation over random refits and retries") {
  const auto c = tiny_llama();
  const auto metas = canonical_tensors(c);
  for (std::uint64_t seed = 1; seed <= 2; ++seed) {
    random_refits(loaders::vllm_style_loader(c, loaders::vllm_tp_rank(2, seed % 2)), metas, seed,
                  12);
    random_refits(loaders::cast_transpose_loader(c), metas, 100 + seed, 12);
  }
  const auto m = tiny_qwen3_moe();
  const auto mm = canonical_tensors(m);
  random_refits(loaders::vllm_style_loader(
                    m, loaders::vllm_layout::of_rank(test::vllm_deployment(2, 1, 2, true), 3)),
                mm, 7, 12);
}

TEST_CASE("receiver digest: a write outside the sinks is caught by the recomputation") {
  const auto c = tiny_llama();
  const auto metas = canonical_tensors(c);
  receiver<loaders::vllm_style_loader> r(loaders::vllm_style_loader(c, {}), metas);
  r.dense_refit(test::random_model(metas, 5));
  REQUIRE(r.check_state_digest().ok());
  const auto kept = r.state_digest();
  // Storage is the receiver's; a serving runtime that scribbles on it is what
  // the check exists for.
  const_cast<parameter_store&>(r.storage())[0].bytes[3] ^= std::byte{0x10};
  CHECK(r.state_digest() == kept);
  const auto s = r.check_state_digest();
  CHECK(s.code == errc::verification);
  CHECK(r.full_state_digest() != kept);
}

TEST_CASE("owner digests: candidate and baseline digests from the changed set equal "
          "recomputation") {
  for (auto [cfg, tl] : {std::pair{tiny_llama(), trainer_layout{2, 1, 1, 1, 2, 128}},
                         std::pair{tiny_qwen3_moe(), trainer_layout{2, 1, 2, 1, 2, 128}}}) {
    auto plan = std::make_shared<const source_plan>(megatron_plan(cfg, tl));
    std::vector<host_tensor> init;
    for (std::size_t i = 0; i < plan->canonical.size(); ++i) {
      host_tensor h(plan->canonical[i]);
      auto w = sim::normal_bf16(h.meta.numel(), 0.02f, 50 + i);
      std::memcpy(h.bytes.data(), w.data(), h.bytes.size());
      init.push_back(std::move(h));
    }
    source_state committed = source_from_canonical(*plan, init);
    protocol::training_round round(plan, committed.view());
    auto members = round.members();
    std::mt19937_64 rng(9);
    int commits = 0, abandoned = 0;
    for (int step = 0; step < 12; ++step) {
      source_state cand = committed;
      for (std::size_t s = 0; s < cand.shards.size(); ++s) {
        if (rng() % 3 == 0) continue; // some shards unchanged
        auto& b = cand.shards[s];
        std::span<std::uint16_t> w(reinterpret_cast<std::uint16_t*>(b.data()), b.size() / 2);
        sim::stress_update(w, 0.001 + 0.03 * static_cast<double>(rng() % 10) / 10.0, 0.01, rng());
      }
      round.set_candidate(cand.view());
      std::uint64_t changed = 0;
      for (std::uint32_t r = 0; r < round.size(); ++r) {
        INFO("step " << step << " owner " << r);
        changed += round.changes(r).count();
        CHECK(members[r].candidate_digest() == round.full_candidate_digest(r));
        CHECK(members[r].baseline_digest() == round.full_baseline_digest(r));
      }
      CHECK(changed > 0);
      // A build from the changed set equals a build that compares, bucket for bucket.
      for (std::uint32_t r = 0; r < round.size(); ++r)
        for (auto mode : {refit_mode::mixed, refit_mode::overwrite_all}) {
          owner o(plan, r, committed.view());
          const auto ch = o.changes(cand.view());
          CHECK(ch.count() == round.changes(r).count());
          builder_options bo;
          bo.mode = mode;
          bo.chunk_bytes = 1 << 12;
          bo.bucket_bytes = 1 << 14;
          const auto req = training_side(plan, committed.view()).required(cand.view());
          CHECK(req == round.required());
          auto scanned = o.build_items(cand.view(), req, bo);
          std::vector<delta_bucket> sparse;
          o.build_buckets(ch, cand.view(), req, bo,
                          [&](delta_bucket&& b) { sparse.push_back(std::move(b)); });
          REQUIRE(scanned.size() == sparse.size());
          for (std::size_t b = 0; b < scanned.size(); ++b) {
            CHECK(scanned[b].sequence == sparse[b].sequence);
            CHECK(scanned[b].input_bytes == sparse[b].input_bytes);
            REQUIRE(scanned[b].items.size() == sparse[b].items.size());
            for (std::size_t k = 0; k < scanned[b].items.size(); ++k) {
              const auto &x = scanned[b].items[k], &y = sparse[b].items[k];
              CHECK(x.tensor.name == y.tensor.name);
              CHECK(x.encoding == y.encoding);
              CHECK(x.indices == y.indices);
              CHECK(x.values == y.values);
            }
          }
        }
      if (rng() % 3 == 0) {
        ++abandoned; // this candidate is never committed
        continue;
      }
      std::vector<digest128> cands;
      for (auto& m : members) cands.push_back(m.candidate_digest());
      for (auto& m : members) m.commit_baseline();
      committed = std::move(cand);
      ++commits;
      // A round built afresh at the committed state (full digests) agrees,
      // and the sparse baseline update left nothing behind.
      protocol::training_round fresh(plan, committed.view());
      auto fm = fresh.members();
      round.set_candidate(committed.view());
      for (std::uint32_t r = 0; r < round.size(); ++r) {
        CHECK(members[r].baseline_digest() == cands[r]);
        CHECK(members[r].baseline_digest() == fm[r].baseline_digest());
        CHECK(round.changes(r).count() == 0);
        CHECK(members[r].candidate_digest() == members[r].baseline_digest());
      }
    }
    CHECK(commits > 0);
    CHECK(abandoned > 0);
  }
}

TEST_CASE("one owner per process: a round over only the shards one owner reads gives the "
          "full round's digests, payloads and committed shards") {
  for (auto [cfg, tl] : {std::pair{tiny_llama(), trainer_layout{2, 1, 1, 1, 2, 128}},
                         std::pair{tiny_qwen3_moe(), trainer_layout{2, 1, 2, 1, 2, 128}}}) {
    auto plan = std::make_shared<const source_plan>(megatron_plan(cfg, tl));
    std::vector<host_tensor> init;
    for (std::size_t i = 0; i < plan->canonical.size(); ++i) {
      host_tensor h(plan->canonical[i]);
      auto w = sim::normal_bf16(h.meta.numel(), 0.02f, 70 + i);
      std::memcpy(h.bytes.data(), w.data(), h.bytes.size());
      init.push_back(std::move(h));
    }
    source_state full = source_from_canonical(*plan, init);
    protocol::training_round whole(plan, full.view());
    auto whole_members = whole.members();
    // One process per owner: its shards made one canonical tensor at a time.
    std::vector<source_state> own;
    std::vector<std::unique_ptr<protocol::training_round>> rounds;
    std::vector<std::vector<protocol::training_round::member>> members;
    for (std::uint32_t r = 0; r < plan->world; ++r) {
      const std::vector<std::uint32_t> ids{r};
      std::vector<std::uint32_t> asked;
      own.push_back(owned_source_from_canonical(*plan, ids, [&](std::uint32_t t) {
        asked.push_back(t);
        return init[t].bytes; // a copy, dropped after its last shard
      }));
      std::sort(asked.begin(), asked.end());
      CHECK(std::adjacent_find(asked.begin(), asked.end()) == asked.end()); // each tensor once
      const auto held = owned_inputs(*plan, ids);
      for (std::uint32_t s = 0; s < plan->shards.size(); ++s) {
        const bool is_held = std::binary_search(held.begin(), held.end(), s);
        INFO("owner " << r << " shard " << plan->shards[s].key);
        if (is_held)
          CHECK(own[r].shards[s] == full.shards[s]);
        else
          CHECK(own[r].shards[s].empty());
      }
      rounds.push_back(
          std::make_unique<protocol::training_round>(plan, own[r].view(), builder_options{}, ids));
      members.push_back(rounds.back()->members());
      REQUIRE(members[r].size() == 1);
      CHECK(members[r][0].owner_id() == r);
    }
    std::mt19937_64 rng(31);
    for (int step = 0; step < 4; ++step) {
      // The same update on the full state and on each owner's own shards.
      for (std::uint32_t s = 0; s < plan->shards.size(); ++s) {
        const auto seed = rng();
        const double frac = 0.002 + 0.02 * static_cast<double>(seed % 7) / 7.0;
        auto update = [&](std::vector<std::byte>& b) {
          std::span<std::uint16_t> w(reinterpret_cast<std::uint16_t*>(b.data()), b.size() / 2);
          sim::stress_update(w, frac, 0.01, seed);
        };
        update(full.shards[s]);
        for (auto& o : own)
          if (!o.shards[s].empty()) update(o.shards[s]);
      }
      whole.set_candidate(full.view());
      for (std::uint32_t r = 0; r < plan->world; ++r) {
        INFO("step " << step << " owner " << r);
        rounds[r]->set_candidate(own[r].view());
        CHECK(members[r][0].candidate_digest() == whole_members[r].candidate_digest());
        CHECK(members[r][0].baseline_digest() == whole_members[r].baseline_digest());
        for (auto mode : {refit_mode::mixed, refit_mode::overwrite_all}) {
          std::vector<std::vector<std::byte>> a, b;
          const protocol::build_request rq{static_cast<std::uint64_t>(step + 1),
                                           static_cast<std::uint64_t>(step + 1), mode};
          REQUIRE(members[r][0].build(rq, [&](std::vector<std::byte>&& p) {
            a.push_back(std::move(p));
            return status::success();
          }));
          REQUIRE(whole_members[r].build(rq, [&](std::vector<std::byte>&& p) {
            b.push_back(std::move(p));
            return status::success();
          }));
          CHECK(a == b);
        }
      }
      for (std::uint32_t r = 0; r < plan->world; ++r) {
        members[r][0].commit_baseline();
        whole_members[r].commit_baseline();
      }
      // A dense export from the committed shards of every owner equals the
      // full state's.
      source_state gathered;
      gathered.shards.resize(plan->shards.size());
      for (std::uint32_t r = 0; r < plan->world; ++r)
        for (auto s : plan->owned_shards(r)) {
          auto c = rounds[r]->baseline(r).committed_shard(s);
          gathered.shards[s].assign(c.begin(), c.end());
        }
      std::vector<host_tensor> want, got;
      REQUIRE(export_canonical(*plan, full.view(), want));
      REQUIRE(export_canonical(*plan, gathered.view(), got));
      REQUIRE(want.size() == got.size());
      for (std::size_t i = 0; i < want.size(); ++i) CHECK(want[i].bytes == got[i].bytes);
    }
    // Owner 0 does not own every shard: asking it for another's is typed.
    std::uint32_t other = 0;
    while (plan->shards[other].owner == 0) ++other;
    CHECK_THROWS_AS(rounds[0]->baseline(0).committed_shard(other), error);
    CHECK_THROWS_AS(rounds[0]->baseline(1), error);
  }
}

TEST_CASE("one owner per process: residual tasks across owners are refused, typed") {
  auto cfg = tiny_llama();
  fp8_block_quantization q;
  q.block_n = 16;
  q.block_k = 16;
  cfg.fp8 = q;
  fp8_plan_options po;
  po.shard_local = false; // every quantised weight assembled from its TP shards
  auto plan = std::make_shared<const source_plan>(
      megatron_fp8_plan(cfg, trainer_layout{2, 1, 1, 1, 1, 128}, po));
  REQUIRE(!plan->tasks.empty());
  source_state full = source_state::zeros(*plan);
  CHECK_NOTHROW(protocol::training_round(plan, full.view()));
  int refused = 0;
  for (std::uint32_t r = 0; r < plan->world; ++r) {
    try {
      protocol::training_round one(plan, full.view(), builder_options{}, {r});
    } catch (const error& e) {
      CHECK(e.code() == errc::invalid_argument);
      CHECK(std::string(e.what()).find("all-gather") != std::string::npos);
      ++refused;
    }
  }
  CHECK(refused > 0);
  CHECK_THROWS_AS(protocol::training_round(plan, full.view(), builder_options{}, {0, 0}), error);
}
