// Residual tasks through owners (flags -> U_req -> residual-baseline owner ->
// assemble, convert, diff -> overwrite items), against brute force: full
// conversion of both versions and a bitwise diff of every canonical tensor.
#include "training_fixture.hpp"

#include "dcr/source/builder.hpp"
#include "examples/common/training_side.hpp"

using namespace dcr;

namespace {

/// A hand-built trainer with every residual rule kind next to affine shards.
/// World of 4 ranks; TP 2 x DP 2 style replica groups.
std::shared_ptr<const source_plan> residual_plan() {
  auto p = std::make_shared<source_plan>(4);
  const std::vector<std::uint32_t> all{0, 1, 2, 3}, r0{0, 2}, r1{1, 3};
  // affine: a replicated norm
  auto norm = p->add_canonical({"model.norm.weight", {16}, dtype_id::bf16});
  p->add_shard("norm", "decoder.final_layernorm.weight", {16}, dtype_id::bf16, all,
               replicated_map(norm, 16, 1).pieces());
  // FP8 block quantisation of a column-parallel bf16 weight (rows split over TP)
  const std::uint64_t R = 160, C = 136;
  auto xa = p->add_shard("x@tp0/2", "x", {R / 2, C}, dtype_id::bf16, r0);
  auto xb = p->add_shard("x@tp1/2", "x", {R / 2, C}, dtype_id::bf16, r1);
  p->add_task(fp8_block_quant_rule("fp8:w", "model.layers.0.mlp.gate_proj.weight", R, C,
                                   dtype_id::bf16,
                                   {column_parallel_map(0, R, C, 2, 0).pieces(),
                                    column_parallel_map(0, R, C, 2, 1).pieces()}),
              {xa, xb});
  // scale and cast: lambda (f32 scalar, replicated) times a row-parallel bf16 weight
  auto lam = p->add_shard("lambda", "lambda", {1}, dtype_id::f32, all);
  auto ya = p->add_shard("y@tp0/2", "y", {8, 6}, dtype_id::bf16, r0);
  auto yb = p->add_shard("y@tp1/2", "y", {8, 6}, dtype_id::bf16, r1);
  p->add_task(scale_cast_rule("scale:y",
                              {"model.layers.0.self_attn.o_proj.weight", {8, 12}, dtype_id::bf16},
                              dtype_id::bf16,
                              {row_parallel_map(0, 8, 12, 2, 0).pieces(),
                               row_parallel_map(0, 8, 12, 2, 1).pieces()}),
              {lam, ya, yb});
  // tied outputs of a vocab-padded embedding (vocab 13, padded to 16)
  auto ea =
      p->add_shard("emb@tp0/2", "embedding.word_embeddings.weight", {8, 4}, dtype_id::bf16, r0);
  auto eb =
      p->add_shard("emb@tp1/2", "embedding.word_embeddings.weight", {8, 4}, dtype_id::bf16, r1);
  p->add_task(tied_rule("tied", {"model.embed_tokens.weight", {13, 4}, dtype_id::bf16},
                        {"lm_head.weight", {13, 4}, dtype_id::bf16},
                        {vocab_padded_map(0, 13, 4, 2, 0, 8).pieces(),
                         vocab_padded_map(0, 13, 4, 2, 1, 8).pieces()}),
              {ea, eb});
  // stacking of three experts, each owned by a different replica group
  std::vector<std::uint32_t> ex;
  for (int e = 0; e < 3; ++e)
    ex.push_back(p->add_shard("expert" + std::to_string(e), "expert", {4, 5}, dtype_id::bf16,
                              e % 2 ? r1 : r0));
  p->add_task(
      stack_rule("stack", {"model.layers.0.mlp.experts.stacked", {3, 4, 5}, dtype_id::bf16}, 3),
      ex);
  // a custom rule: transpose
  auto tr = p->add_shard("t", "t", {3, 4}, dtype_id::bf16, all);
  p->add_task(custom_rule("transpose", {{"t.T", {4, 3}, dtype_id::bf16}}, 1,
                          [](std::span<const residual_input> in, std::span<host_tensor> out) {
                            DCR_RETURN_ERROR_IF(in[0].bytes.size() != 24, shape_mismatch, "t");
                            for (std::size_t i = 0; i < 3; ++i)
                              for (std::size_t j = 0; j < 4; ++j)
                                std::memcpy(out[0].bytes.data() + 2 * (j * 3 + i),
                                            in[0].bytes.data() + 2 * (i * 4 + j), 2);
                            return status::success();
                          }),
              {tr});
  p->finalize();
  return p;
}

source_state random_source(const source_plan& p, std::uint64_t seed) {
  auto s = source_state::zeros(p);
  for (std::uint32_t i = 0; i < p.shards.size(); ++i) {
    tensor_meta m{p.shards[i].key, p.shards[i].shape, p.shards[i].dtype};
    s.shards[i] =
        test::random_tensor(m, seed * 7919 + i, p.shards[i].dtype == dtype_id::f32 ? 1.0f : 0.05f)
            .bytes;
  }
  return s;
}

std::vector<host_tensor> full_conversion(const source_plan& p, const source_state& s) {
  std::vector<host_tensor> out;
  throw_if_failed(export_canonical(p, s.view(), out));
  return out;
}

void stress_shard(source_state& s, std::uint32_t id, double fraction, std::uint64_t seed) {
  std::vector<host_tensor> one(1);
  one[0].meta = {"s", {s.shards[id].size() / 2}, dtype_id::bf16};
  one[0].bytes = s.shards[id];
  test::stress(one, fraction, 1e-2, seed);
  s.shards[id] = one[0].bytes;
}

/// Builds, checks against brute force, returns the required set.
required_set check_build(const std::shared_ptr<const source_plan>& p, training_side& side,
                         const source_state& s0, const source_state& s1, refit_mode mode) {
  builder_options opt;
  opt.mode = mode;
  opt.chunk_bytes = 512;
  opt.bucket_bytes = 4096;
  auto req = side.required(s1.view());
  auto buckets = side.build_items(s1.view(), opt);
  std::vector<item> items;
  for (auto& b : buckets)
    for (auto& it : b.items) {
      items.push_back(it);
      const auto id = p->tensor_id(it.tensor.name);
      const bool is_residual = id != p->tensor_id("model.norm.weight");
      if (is_residual) {
        CHECK(it.encoding == value_encoding::overwrite);
        // emitted by the residual-baseline owner, chosen by canonical-name hash
        for (auto& t : p->tasks)
          if (std::find(t.outputs.begin(), t.outputs.end(), id) != t.outputs.end()) {
            CHECK(b.owner == t.owner);
            CHECK(t.owner == residual_owner_of(p->canonical[t.outputs[0]].name, p->world));
          }
      } else {
        CHECK(it.encoding ==
              (mode == refit_mode::mixed ? value_encoding::xor_mask : value_encoding::overwrite));
      }
    }
  auto c0 = full_conversion(*p, s0), c1 = full_conversion(*p, s1);
  auto canon = c0;
  CHECK(test::apply_items(items, canon) == test::changed_set(c0, c1));
  CHECK(test::same_bytes(canon, c1));
  return req;
}

} // namespace

TEST_CASE("residual tasks: U_req from flags, overwrite items equal the diff of full conversions") {
  auto p = residual_plan();
  auto s0 = random_source(*p, 1);
  training_side side(p, s0.view());
  const auto lam = p->shard_id("lambda");
  auto task_of = [&](const std::string& n) {
    for (std::uint32_t t = 0; t < p->tasks.size(); ++t)
      if (p->tasks[t].rule.name == n) return t;
    FAIL("no task " << n);
    return 0u;
  };

  for (auto mode : {refit_mode::mixed, refit_mode::overwrite_all}) {
    CAPTURE(static_cast<int>(mode));
    {
      INFO("no change: nothing required, nothing emitted");
      auto req = check_build(p, side, s0, s0, mode);
      CHECK(req.size() == 0);
      CHECK(side.build_items(s0.view()).empty());
    }
    {
      INFO("lambda changes: only the scale task is required, and most of its outputs change");
      auto s1 = s0;
      float l;
      std::memcpy(&l, s1.shards[lam].data(), 4);
      l *= 1.37f;
      std::memcpy(s1.shards[lam].data(), &l, 4);
      auto req = check_build(p, side, s0, s1, mode);
      CHECK(req.size() == 1);
      CHECK(req.contains(task_of("scale:y")));
      std::size_t n = 0;
      for (auto& b : side.build_items(s1.view()))
        for (auto& it : b.items) n += it.size();
      CHECK(n > 96 / 2);
    }
    {
      INFO("one element changes in one TP part of the FP8 weight: its tile is re-quantised");
      auto s1 = s0;
      const auto xa = p->shard_id("x@tp0/2");
      const std::uint16_t big = f32_to_bf16_rne(9.0f);
      std::memcpy(s1.shards[xa].data() + 2 * (3 * 136 + 3), &big, 2);
      auto req = check_build(p, side, s0, s1, mode);
      CHECK(req.size() == 1);
      CHECK(req.contains(task_of("fp8:w")));
    }
    {
      INFO("the tied source changes: both canonical names are emitted");
      auto s1 = s0;
      stress_shard(s1, p->shard_id("emb@tp1/2"), 1.0, 9);
      auto req = check_build(p, side, s0, s1, mode);
      CHECK(req.contains(task_of("tied")));
      std::set<std::string> names;
      for (auto& b : side.build_items(s1.view()))
        for (auto& it : b.items) names.insert(it.tensor.name);
      CHECK(names.count("model.embed_tokens.weight"));
      CHECK(names.count("lm_head.weight"));
    }
    {
      INFO("random stress of everything, then commit and a second version");
      auto s1 = s0;
      for (std::uint32_t i = 0; i < p->shards.size(); ++i)
        if (p->shards[i].dtype == dtype_id::bf16) stress_shard(s1, i, 0.3, 100 + i);
      auto req = check_build(p, side, s0, s1, mode);
      CHECK(req.size() == p->tasks.size());
      training_side side2(p, s0.view());
      side2.commit(s1.view());
      CHECK(side2.required(s1.view()).size() == 0);
      CHECK(side2.build_items(s1.view()).empty());
      auto s2 = s1;
      stress_shard(s2, p->shard_id("expert1"), 1.0, 77);
      auto req2 = check_build(p, side2, s1, s2, mode);
      CHECK(req2.size() == 1);
      CHECK(req2.contains(task_of("stack")));
    }
  }
}

TEST_CASE("baseline memory: trackers hold one copy of the source, plus residual outputs") {
  auto p = residual_plan();
  auto s0 = random_source(*p, 2);
  training_side side(p, s0.view());
  const auto m = side.memory();
  CHECK(m.tracker_bytes == p->source_bytes());
  std::uint64_t res = 0;
  for (auto& t : p->tasks) res += t.output_bytes;
  CHECK(m.residual_bytes == res);
  CHECK(side.memory_vs_checkpoint() == doctest::Approx(static_cast<double>(m.total()) /
                                                       static_cast<double>(p->checkpoint_bytes())));
  auto bal = side.memory_balance();
  CHECK(bal.total == m.total());

  model_config c;
  auto direct = megatron_plan(c, {2, 1, 1, 1, 2, 8});
  auto qkv = megatron_plan(c, {2, 1, 1, 1, 2, 8}, {true, false});
  auto canon = test::random_checkpoint(direct.canonical, 3);
  training_side sd(std::make_shared<const source_plan>(direct),
                   source_from_canonical(direct, canon).view());
  training_side sq(std::make_shared<const source_plan>(qkv),
                   source_from_canonical(qkv, canon).view());
  CHECK(sd.memory().residual_bytes == 0);
  CHECK(sd.memory().tracker_bytes == direct.source_bytes());
  std::uint64_t qkv_bytes = 0;
  for (auto& t : direct.canonical)
    if (t.name.find("q_proj") != std::string::npos || t.name.find("k_proj") != std::string::npos ||
        t.name.find("v_proj") != std::string::npos)
      qkv_bytes += t.nbytes();
  CHECK(sq.memory().residual_bytes == qkv_bytes);
  CHECK(sd.memory_vs_checkpoint() >= 1.0); // vocab padding makes the source a little larger
}

TEST_CASE("a residual conversion failure is a typed error and leaves the baseline untouched") {
  auto p = std::make_shared<source_plan>(1);
  auto a = p->add_shard("a", "a", {2, 2}, dtype_id::bf16, {0});
  p->add_task(gather_rule("g", {{"w", {4, 2}, dtype_id::bf16}},
                          {piecewise_map(2, 2, {{0, 2, 0, 0, 0, 2}})}),
              {a});
  p->finalize();
  auto s = source_state::zeros(*p);
  try {
    owner o(p, 0, s.view());
    FAIL_CHECK("expected coverage error");
  } catch (const dcr::error& e) {
    CHECK(e.code() == errc::coverage);
  }
  // a rule that fails only for some candidates
  auto q = std::make_shared<source_plan>(1);
  auto b = q->add_shard("b", "b", {2}, dtype_id::bf16, {0});
  q->add_task(custom_rule("picky", {{"o", {2}, dtype_id::bf16}}, 1,
                          [](std::span<const residual_input> in, std::span<host_tensor> out) {
                            DCR_RETURN_ERROR_IF(in[0].bytes[0] != std::byte{0}, parts_disagree,
                                                "picky: first byte set");
                            std::memcpy(out[0].bytes.data(), in[0].bytes.data(), 4);
                            return status::success();
                          }),
              {b});
  q->finalize();
  auto z = source_state::zeros(*q);
  owner o(q, 0, z.view());
  auto bad = z;
  bad.shards[0][0] = std::byte{1};
  auto req = make_required(*q, o.flagged_inputs(bad.view()));
  CHECK(req.size() == 1);
  try {
    (void)o.build_items(bad.view(), req);
    FAIL_CHECK("expected parts_disagree");
  } catch (const dcr::error& e) {
    CHECK(e.code() == errc::parts_disagree);
  }
  CHECK_THROWS_AS(o.commit_baseline(bad.view(), req), dcr::error);
  // the failed commit changed nothing: the zero state is still the baseline
  CHECK(o.flagged_inputs(z.view()).empty());
}

TEST_CASE("owners read only their owned shards and their residual tasks' inputs") {
  auto p = residual_plan();
  auto s0 = random_source(*p, 4);
  auto s1 = s0;
  for (std::uint32_t i = 0; i < p->shards.size(); ++i)
    if (p->shards[i].dtype == dtype_id::bf16) stress_shard(s1, i, 0.2, 300 + i);
  training_side side(p, s0.view());
  const auto req = side.required(s1.view());
  for (std::uint32_t r = 0; r < p->world; ++r) {
    owner o(p, r, owned_view(*p, s0.view(), r));
    auto full = side.owners()[r].build_items(s1.view(), req);
    auto mine = o.build_items(owned_view(*p, s1.view(), r), req);
    REQUIRE(full.size() == mine.size());
    for (std::size_t b = 0; b < full.size(); ++b) CHECK(full[b].items == mine[b].items);
    // a rank's own view holds every shard it owns
    auto rv = rank_view(*p, s1.view(), r);
    for (auto s : p->owned_shards(r)) CHECK(rv.shards[s].size() == p->shards[s].nbytes());
  }
  // a view that lacks an owned shard is a typed error
  const auto victim = p->owned_shards(0);
  if (!victim.empty()) {
    auto v = owned_view(*p, s1.view(), 0);
    v.shards[victim[0]] = {};
    try {
      (void)side.owners()[0].build_items(v, req);
      FAIL_CHECK("expected not_found");
    } catch (const dcr::error& e) {
      CHECK(e.code() == errc::not_found);
    }
  }
}
