// The application-composed pipeline of examples/custom_pipeline.hpp (BF16,
// row-split map, XOR masks, gap locations, built from the library's stage
// objects) against the library's generic builder: for random shapes, change
// rates and steps, its payload of each row-split shard is byte for byte the
// payload `dcr::owner` builds for that shard's owner (XOR items, `gaps`
// locations), and a receiver that applies those payloads through the
// pipeline's own decode and apply stages ends equal to a dense refit.
#include <doctest/doctest.h>

#include <memory>
#include <random>

#include "dcr/receiver/receiver.hpp"
#include "dcr/receiver/tensor_set.hpp"
#include "dcr/source/builder.hpp"
#include "examples/common/simulator.hpp"
#include "examples/custom_pipeline.hpp"

using namespace dcr;

TEST_CASE("custom pipeline: payload bytes equal the generic builder's, applied equals a dense "
          "refit") {
  std::mt19937_64 rng(28);
  for (int round = 0; round < 12; ++round) {
    const std::uint64_t ranks = 1 + rng() % 4;
    const std::uint64_t rows = 2 + 2 * (rng() % 40), kl = 1 + rng() % 50, cols = kl * ranks;
    const double fraction = std::array{0.0, 0.005, 0.02, 0.3, 1.0}[rng() % 5];
    CAPTURE(round);
    CAPTURE(ranks);
    CAPTURE(rows);
    CAPTURE(cols);
    CAPTURE(fraction);
    const tensor_meta meta{"w", {rows, cols}, dtype_id::bf16};

    // The generic builder's plan: one canonical tensor, rank r owns its
    // row-split shard.
    auto plan = std::make_shared<source_plan>(static_cast<std::uint32_t>(ranks));
    const auto t = plan->add_canonical(meta);
    std::vector<row_parallel_map> maps;
    for (std::uint64_t r = 0; r < ranks; ++r) {
      maps.emplace_back(t, rows, cols, ranks, r);
      plan->add_shard("w@" + std::to_string(r), "w", {rows, kl}, dtype_id::bf16,
                      {static_cast<std::uint32_t>(r)}, maps.back().pieces());
    }
    plan->finalize();
    const std::shared_ptr<const source_plan> cplan = plan;

    std::vector<std::vector<std::uint16_t>> v0;
    for (std::uint64_t r = 0; r < ranks; ++r)
      v0.push_back(sim::normal_bf16(rows * kl, 0.02f, rng()));
    auto view_of = [&](const std::vector<std::vector<std::uint16_t>>& v) {
      source_view sv;
      for (auto& s : v) sv.shards.push_back(std::as_bytes(std::span(s)));
      return sv;
    };
    auto canonical = [&](const std::vector<std::vector<std::uint16_t>>& v) {
      tensor_set s({meta});
      auto w = s.at("w").words<dcr::bf16>();
      for (std::uint64_t r = 0; r < ranks; ++r)
        for (std::uint64_t j = 0; j < v[r].size(); ++j) w[maps[r](j).index] = v[r][j];
      return s;
    };
    std::vector<owner> owners;
    for (std::uint32_t r = 0; r < ranks; ++r) owners.emplace_back(cplan, r, view_of(v0));
    const custom::split_loader loader{static_cast<std::int64_t>(rows),
                                      static_cast<std::int64_t>(cols)};
    receiver<custom::split_loader> server(loader, std::vector<tensor_meta>{meta});
    server.dense_refit(canonical(v0));

    builder_options opt;
    opt.relative = relative_choice::xor_only;
    opt.encoding = custom::payload_options();
    for (std::uint64_t step = 1; step <= 3; ++step) {
      auto v1 = v0;
      for (auto& s : v1) sim::stress_update(s, fraction, 0.01, rng());
      const required_set req = make_required(*cplan, {});
      for (std::uint32_t r = 0; r < ranks; ++r) {
        const payload_id id{step, step, r, 0};
        const auto generic = owners[r].build(view_of(v1), req, id, opt);
        REQUIRE(generic.size() <= 1); // one bucket: the whole shard
        const auto mine = custom::shard_payload(id, meta, maps[r], v0[r], v1[r]);
        if (generic.empty()) {
          // No change: the builder sends nothing; the pipeline's payload is empty.
          CHECK(decode_payload_or_throw(mine).items.empty());
          continue;
        }
        CHECK(mine == generic[0]);
        decoded_payload d;
        REQUIRE(server.decode<custom::rollout::decode_stage>(mine, d).ok());
        for (auto& it : d.items) REQUIRE(server.apply_item<custom::rollout>(it).ok());
      }
      receiver<custom::split_loader> reference(loader, std::vector<tensor_meta>{meta});
      reference.dense_refit(canonical(v1));
      CHECK(first_difference(server.storage(), reference.storage()) == "");
      for (auto& o : owners) o.commit_baseline(view_of(v1), req);
      v0 = std::move(v1);
    }
  }
}
