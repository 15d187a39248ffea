// source/dim0_shard_plan.hpp: the plan of a trainer sharding every tensor by
// dim-0 row ranges (FSDP2's Shard(0), HSDP's replicated ranges). Each shard
// is exactly its rows of the canonical tensor; deltas built through the plan
// refit receivers to a dense refit of the same candidate, every byte; ranges
// that do not partition the rows are refused naming the tensor.
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
#include "dcr/source/dim0_shard_plan.hpp"
#include "dcr/source/state.hpp"
#include "examples/common/simulator.hpp"
#include "examples/common/training_side.hpp"
#include "receiver/refit_check.hpp"

using namespace dcr;

namespace {

/// torch.chunk's split of `n` rows into `k` chunks: ceil(n/k) rows each, the
/// last chunks shorter or empty.
std::pair<std::uint64_t, std::uint64_t> chunk(std::uint64_t n, std::uint64_t k, std::uint64_t i) {
  const std::uint64_t c = (n + k - 1) / k;
  return {std::min(i * c, n), std::min((i + 1) * c, n)};
}

/// FSDP2 over `shard` ranks, replicated `replicate` times (HSDP): rank
/// `g * shard + i` holds chunk i.
std::vector<std::vector<dim0_rows>> hsdp_rows(const std::vector<tensor_meta>& metas,
                                              std::uint32_t replicate, std::uint32_t shard) {
  std::vector<std::vector<dim0_rows>> rows;
  for (auto& m : metas) {
    auto& per = rows.emplace_back();
    const std::uint64_t n = m.shape.empty() ? 1 : m.shape[0];
    for (std::uint32_t g = 0; g < replicate; ++g)
      for (std::uint32_t i = 0; i < shard; ++i) {
        auto [b, e] = chunk(n, shard, i);
        per.push_back({g * shard + i, b, e});
      }
  }
  return rows;
}

tensor_set canonical(const source_plan& plan, const source_state& state) {
  std::vector<host_tensor> tensors;
  throw_if_failed(export_canonical(plan, state.view(), tensors));
  tensor_set set;
  for (auto& t : tensors) set.add(std::move(t));
  return set;
}

} // namespace

TEST_CASE("dim0_shard_plan: each shard is its rows, replicas are the ranks sharing a range") {
  const std::vector<tensor_meta> metas = {{"a", {5, 3}, dtype_id::bf16},
                                          {"b", {1}, dtype_id::bf16}};
  const auto plan = dim0_shard_plan(metas, hsdp_rows(metas, 2, 2), 4);
  REQUIRE(plan.shards.size() == 3); // a: rows 0..2 and 3..4; b: its one row, on chunk 0
  CHECK(plan.shards[0].key == "a@rows0:3");
  CHECK(plan.shards[0].shape == std::vector<std::uint64_t>{3, 3});
  CHECK(plan.shards[0].replicas == std::vector<std::uint32_t>{0, 2});
  CHECK(plan.shards[1].key == "a@rows3:5");
  CHECK(plan.shards[1].replicas == std::vector<std::uint32_t>{1, 3});
  CHECK(plan.shards[2].key == "b@rows0:1");
  CHECK(plan.shards[2].shape == std::vector<std::uint64_t>{1});
  for (auto& s : plan.shards) {
    bool in = false;
    for (auto r : s.replicas) in = in || r == s.owner;
    CHECK(in);
  }
  CHECK(plan.rank_shards[1] == std::vector<std::uint32_t>{1}); // no row of b
}

TEST_CASE("dim0_shard_plan: refuses ranges that do not partition the rows, naming the tensor") {
  const std::vector<tensor_meta> metas = {{"a", {5, 3}, dtype_id::bf16}};
  auto refused = [&](std::vector<dim0_rows> r, errc code, const std::string& what) {
    std::vector<std::vector<dim0_rows>> rows{std::move(r)};
    try {
      (void)dim0_shard_plan(metas, rows, 2);
      FAIL("accepted");
    } catch (const dcr::error& e) {
      CHECK(e.code() == code);
      CHECK(std::string(e.what()).find(what) != std::string::npos);
    }
  };
  refused({{0, 0, 3}, {1, 4, 5}}, errc::coverage, "tensor a: rows 3..3 held by no rank");
  refused({{0, 0, 3}, {1, 2, 5}}, errc::coverage, "tensor a: rows 2..2 held in overlapping");
  refused({{0, 0, 3}}, errc::coverage, "tensor a: rows 3..4 held by no rank");
  refused({{0, 0, 3}, {0, 3, 5}}, errc::invalid_argument, "rank 0 listed twice");
  refused({{0, 0, 3}, {2, 3, 5}}, errc::invalid_argument, "rank 2 outside a world of 2");
  refused({{0, 0, 3}, {1, 3, 6}}, errc::invalid_argument, "rows [3, 6) of rank 1 outside");
  CHECK_THROWS_AS(dim0_shard_plan(metas, std::vector<std::vector<dim0_rows>>{}, 2), dcr::error);
}

TEST_CASE("dim0_shard_plan -> builder -> receivers equals a dense refit, every byte") {
  std::mt19937_64 rng(0xd1a0);
  for (int round = 0; round < 10; ++round) {
    std::vector<tensor_meta> metas;
    const int n = 2 + static_cast<int>(rng() % 5);
    for (int i = 0; i < n; ++i) {
      std::vector<std::uint64_t> shape;
      const int rank = 1 + static_cast<int>(rng() % 3);
      for (int d = 0; d < rank; ++d) shape.push_back(1 + rng() % 12);
      metas.push_back({"t" + std::to_string(i), shape, dtype_id::bf16});
    }
    const std::uint32_t replicate = 1 + static_cast<std::uint32_t>(rng() % 2),
                        shard = 1 + static_cast<std::uint32_t>(rng() % 4);
    const std::uint64_t parts = 1 + rng() % 3;
    INFO("round " << round << ": " << replicate << " x " << shard << " ranks");
    auto plan = std::make_shared<const source_plan>(
        dim0_shard_plan(metas, hsdp_rows(metas, replicate, shard), replicate * shard));
    std::vector<host_tensor> init;
    for (std::size_t i = 0; i < plan->canonical.size(); ++i) {
      host_tensor t(plan->canonical[i]);
      auto words = sim::normal_bf16(t.meta.numel(), 0.02f, 1000 + 10 * round + i);
      std::memcpy(t.bytes.data(), words.data(), t.bytes.size());
      init.push_back(std::move(t));
    }
    source_state state = source_from_canonical(*plan, init);
    // A shard is the contiguous block of its rows.
    for (std::uint32_t s = 0; s < plan->shards.size(); ++s) {
      const auto& sh = plan->shards[s];
      const auto& pc = sh.map->pieces()[0];
      const auto& c = init[pc.tensor];
      REQUIRE(state.shards[s].size() == sh.nbytes());
      const auto* rows = c.bytes.data() + pc.canonical_row * pc.canonical_cols * 2;
      CHECK(std::memcmp(state.shards[s].data(), rows, sh.nbytes()) == 0);
    }
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
}
