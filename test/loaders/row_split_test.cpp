// loaders/row_split.hpp and source/row_split_plan.hpp: the generic placement
// for checkpoints of unknown architecture. Receivers of every rank count are
// refitted by deltas built through the row-split source plan and compared,
// byte for byte, with a dense refit of the same candidate.
#include <doctest/doctest.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "dcr/loaders/row_split.hpp"
#include "dcr/receiver/receiver.hpp"
#include "dcr/receiver/tensor_set.hpp"
#include "dcr/source/builder.hpp"
#include "dcr/source/row_split_plan.hpp"
#include "dcr/source/state.hpp"
#include "examples/common/simulator.hpp"
#include "examples/common/training_side.hpp"
#include "receiver/refit_check.hpp"
#include "receiver/workload.hpp"

using namespace dcr;

namespace {

std::vector<tensor_meta> random_metas(std::mt19937_64& rng) {
  std::vector<tensor_meta> metas;
  const int n = 2 + static_cast<int>(rng() % 5);
  for (int i = 0; i < n; ++i) {
    std::vector<std::uint64_t> shape;
    const int rank = 1 + static_cast<int>(rng() % 3);
    for (int d = 0; d < rank; ++d) shape.push_back(1 + rng() % 12);
    metas.push_back({"t" + std::to_string(i), shape, dtype_id::bf16});
  }
  return metas;
}

tensor_set canonical(const source_plan& plan, const source_state& state) {
  std::vector<host_tensor> tensors;
  throw_if_failed(export_canonical(plan, state.view(), tensors));
  tensor_set set;
  for (auto& t : tensors) set.add(std::move(t));
  return set;
}

} // namespace

TEST_CASE("row_split_loader: splits what divides, replicates the rest, refuses a bad rank") {
  const std::vector<tensor_meta> metas = {
      {"a", {8, 3}, dtype_id::bf16}, {"b", {3, 4}, dtype_id::bf16}, {"c", {2}, dtype_id::bf16}};
  loaders::row_split_loader l(4, 1, metas);
  CHECK(l.splits("a"));
  CHECK_FALSE(l.splits("b"));
  CHECK_FALSE(l.splits("c")); // 2 rows < 4 ranks
  receiver<loaders::row_split_loader> r(l, metas);
  const auto& st = r.storage();
  CHECK(st[*st.index_of("a")].meta.shape == std::vector<std::uint64_t>{2, 3});
  CHECK(st[*st.index_of("b")].meta.shape == std::vector<std::uint64_t>{3, 4});
  CHECK_THROWS_AS(loaders::row_split_loader(4, 4, metas), dcr::error);
  CHECK_THROWS_AS(loaders::row_split_loader(0, 0, metas), dcr::error);
}

TEST_CASE("row_split_loader: delta refits equal dense refits on random shapes and rank counts") {
  std::mt19937_64 rng(0x5eed);
  for (int round = 0; round < 12; ++round) {
    const auto metas = random_metas(rng);
    const std::uint64_t parts = 1 + rng() % 4;
    std::vector<loaders::row_split_loader> ls;
    for (std::uint64_t r = 0; r < parts; ++r) ls.emplace_back(parts, r, metas);
    auto v = test::random_model(metas, 100 + round);
    auto v1 = test::clone(v);
    test::adamw_steps(v1, 1, 200 + round);
    for (auto mode :
         {test::delta_mode::mixed, test::delta_mode::xor_only, test::delta_mode::overwrite_only}) {
      INFO("round " << round << ", " << parts << " ranks");
      auto st = test::check_delta_equals_dense(ls, metas, v, v1, mode, 300 + round);
      CHECK(st.receivers == parts);
    }
  }
}

TEST_CASE("row_split_plan -> builder -> row_split receivers equals a dense refit, every byte") {
  std::mt19937_64 rng(0xabc);
  for (int round = 0; round < 8; ++round) {
    const auto metas = random_metas(rng);
    const std::uint32_t tp = 1 + static_cast<std::uint32_t>(rng() % 3),
                        dp = 1 + static_cast<std::uint32_t>(rng() % 2);
    const std::uint64_t parts = 1 + rng() % 4;
    INFO("round " << round << ": TP" << tp << " x DP" << dp << " -> " << parts << " ranks");
    auto plan = std::make_shared<const source_plan>(row_split_plan(metas, tp, dp));
    CHECK(plan->world == tp * dp);
    std::vector<host_tensor> init;
    for (std::size_t i = 0; i < plan->canonical.size(); ++i) {
      host_tensor t(plan->canonical[i]);
      auto words = sim::normal_bf16(t.meta.numel(), 0.02f, 1000 + 10 * round + i);
      std::memcpy(t.bytes.data(), words.data(), t.bytes.size());
      init.push_back(std::move(t));
    }
    source_state state = source_from_canonical(*plan, init);
    training_side trainer(plan, state.view());
    const tensor_set v = canonical(*plan, state);
    std::vector<receiver<loaders::row_split_loader>> rs;
    for (std::uint64_t r = 0; r < parts; ++r) {
      rs.emplace_back(loaders::row_split_loader(parts, r, metas), plan->canonical);
      rs.back().dense_refit(v);
    }
    for (std::size_t s = 0; s < state.shards.size(); ++s) {
      auto& b = state.shards[s];
      sim::stress_update({reinterpret_cast<std::uint16_t*>(b.data()), b.size() / 2}, 0.05, 1e-2,
                         50 * round + s);
    }
    payload_id id;
    id.attempt = 1;
    for (auto& owner_payloads : trainer.build(state.view(), id))
      for (auto& p : owner_payloads)
        for (auto& r : rs) REQUIRE(r.stage(p).ok());
    for (auto& r : rs) REQUIRE(r.apply_staged().ok());
    const tensor_set next = canonical(*plan, state);
    for (std::uint64_t r = 0; r < parts; ++r) {
      receiver<loaders::row_split_loader> dense(loaders::row_split_loader(parts, r, metas),
                                                plan->canonical);
      dense.dense_refit(next);
      CHECK(first_difference(rs[r].storage(), dense.storage()) == "");
    }
  }
  CHECK_THROWS_AS(row_split_plan(std::vector<tensor_meta>{}, 0, 1), dcr::error);
}
