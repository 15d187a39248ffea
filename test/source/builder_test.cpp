// Delta construction (include/dcr/source/builder.hpp) against brute force:
// for random configs x layouts x modes, the union of all owners' emitted
// destinations equals the bitwise diff of the full canonical tensors before
// and after, each destination is emitted once, and applying the items (XOR,
// add or overwrite) to the old canonical tensors gives the new ones byte for
// byte. Every relative choice (per-item smallest, XOR only, add only) is in
// the mix.
// The 400-config sweep is in the test suite "slow": the 'unit' registration
// excludes it, the 'slow' registration runs only it (test/source/meson.build).
#include "training_fixture.hpp"

#include "dcr/codec/payload.hpp"
#include "dcr/source/builder.hpp"
#include "examples/common/training_side.hpp"

using namespace dcr;

namespace {

struct sweep_case {
  model_config c;
  trainer_layout l;
  megatron_options o;
  builder_options b;
  double fraction;
};

model_config random_config(std::mt19937_64& rng, bool moe) {
  model_config c;
  const std::uint64_t t3 = rng() % 2; // configs divisible by 3 (for t = 3) or by 8
  c.head_dim = t3 ? 6 : 8;
  c.kv_heads = t3 ? std::vector<std::uint64_t>{1, 3}[rng() % 2]
                  : std::vector<std::uint64_t>{1, 2, 4}[rng() % 3];
  c.heads = c.kv_heads * std::vector<std::uint64_t>{1, 2, 3}[rng() % 3];
  if (!t3) c.heads = c.kv_heads * std::vector<std::uint64_t>{1, 2, 4}[rng() % 3];
  c.hidden = t3 ? 24 : 32;
  c.layers = std::vector<std::uint64_t>{1, 2, 4}[rng() % 3];
  c.ffn = t3 ? 48 : 64;
  c.vocab = 50 + rng() % 100; // odd and even sizes
  c.tied_embeddings = rng() % 2;
  c.attention_bias = rng() % 3 == 0;
  c.qk_norm = rng() % 2;
  if (moe) {
    c.family = "qwen3_moe";
    c.experts = std::vector<std::uint64_t>{2, 4, 8}[rng() % 3];
    c.moe_ffn = t3 ? 12 : 16;
    if (rng() % 2) { // mixed dense/MoE stack (dense layers keep ffn)
      c.decoder_sparse_step = 1 + rng() % 2;
      if (rng() % 2) c.mlp_only_layers = {rng() % c.layers};
    } else {
      c.ffn = 0;
    }
  }
  return c;
}

trainer_layout random_layout(std::mt19937_64& rng, const model_config& c) {
  for (;;) {
    trainer_layout l;
    const bool t3 = c.head_dim == 6;
    l.tp = t3 ? std::vector<std::uint64_t>{1, 3}[rng() % 2]
              : std::vector<std::uint64_t>{1, 2, 4, 8}[rng() % 4];
    l.pp = std::vector<std::uint64_t>{1, 2, 4}[rng() % 3];
    l.dp = std::vector<std::uint64_t>{1, 2, 3}[rng() % 3];
    l.vocab_block = std::vector<std::uint64_t>{0, 1, 8, 128}[rng() % 4];
    if (l.pp > 1 && rng() % 3 == 0) { // uneven first and/or last stage
      if (rng() % 2) l.first_stage_layers = rng() % (c.layers + 1);
      if (rng() % 2) l.last_stage_layers = rng() % (c.layers + 1);
    }
    if (c.is_moe()) {
      l.ep = std::vector<std::uint64_t>{1, 2, 4}[rng() % 3];
      l.etp = std::vector<std::uint64_t>{1, 2}[rng() % 2];
    }
    if (validate(c, l).ok()) return l;
  }
}

std::size_t add_items = 0, xor_items = 0; // over a sweep: both encodings are reached

/// Runs one case and checks everything; returns the emitted destination count.
std::size_t run_case(const sweep_case& k, std::uint64_t seed) {
  auto plan = std::make_shared<const source_plan>(megatron_plan(k.c, k.l, k.o));
  auto v0 = test::random_checkpoint(plan->canonical, seed);
  auto v1 = v0;
  test::stress(v1, k.fraction, 1e-2, seed + 1);
  auto s0 = source_from_canonical(*plan, v0, nullptr, std::byte{0});
  auto s1 = source_from_canonical(*plan, v1, nullptr,
                                  std::byte{0x3C}); // padding changes must not be emitted
  training_side side(plan, s0.view());
  const auto mem0 = side.memory();

  auto buckets = side.build_items(s1.view(), k.b);
  std::vector<item> items;
  for (auto& b : buckets) {
    std::set<std::pair<std::string, int>>
        in_bucket; // one item per owner x tensor x encoding in a bucket
    for (auto& it : b.items) {
      CHECK(in_bucket.insert({it.tensor.name, static_cast<int>(it.encoding)}).second);
      items.push_back(it);
      const bool residual =
          plan->tasks.size() && std::any_of(plan->tasks.begin(), plan->tasks.end(), [&](auto& t) {
            return std::any_of(t.outputs.begin(), t.outputs.end(),
                               [&](auto o) { return plan->canonical[o].name == it.tensor.name; });
          });
      if (k.b.mode == refit_mode::mixed && !residual) {
        if (k.b.relative == relative_choice::xor_only)
          CHECK(it.encoding == value_encoding::xor_mask);
        else if (k.b.relative == relative_choice::add_only)
          CHECK(it.encoding == value_encoding::add);
        else
          CHECK(codec::is_relative(it.encoding));
      } else {
        CHECK(it.encoding == value_encoding::overwrite); // overwrite_all stays overwrite-only
      }
      if (it.encoding == value_encoding::add) ++add_items;
      if (it.encoding == value_encoding::xor_mask) ++xor_items;
    }
  }
  auto canon = v0;
  auto emitted = test::apply_items(items, canon);
  auto truth = test::changed_set(v0, v1);
  CHECK(emitted == truth);
  CHECK(test::same_bytes(canon, v1));

  // Building never touches the baseline, and is deterministic.
  CHECK(side.memory().total() == mem0.total());
  auto again = side.build_items(s1.view(), k.b);
  REQUIRE(again.size() == buckets.size());
  for (std::size_t i = 0; i < again.size(); ++i) {
    CHECK(again[i].owner == buckets[i].owner);
    CHECK(again[i].sequence == buckets[i].sequence);
    CHECK(again[i].items == buckets[i].items);
  }

  // Chunks built on several threads (and with the fewest chunks in flight)
  // give the payload bytes of the one-thread build.
  {
    auto one = k.b, many = k.b;
    one.threads = 1;
    many.threads = 2 + seed % 3;
    many.chunks_in_flight = seed % 2 ? 1 : 0;
    const payload_id base{1, 1, 0, 0};
    CHECK(side.build(s1.view(), base, one) == side.build(s1.view(), base, many));
  }

  // Commit moves the baseline: the same candidate is then an empty delta,
  // and the next version diffs against the committed one.
  side.commit(s1.view());
  CHECK(side.build_items(s1.view(), k.b).empty());
  auto v2 = v1;
  test::stress(v2, k.fraction, 1e-2, seed + 2);
  auto s2 = source_from_canonical(*plan, v2);
  auto items2 = side.build_items(s2.view(), k.b);
  std::vector<item> flat2;
  for (auto& b : items2)
    for (auto& it : b.items) flat2.push_back(it);
  auto canon2 = v1;
  CHECK(test::apply_items(flat2, canon2) == test::changed_set(v1, v2));
  CHECK(test::same_bytes(canon2, v2));
  return emitted.size();
}

/// `n` random configurations, layouts, ownership policies, modes and chunk
/// and bucket sizes (the same sequence for every `n`); records emitted.
std::size_t sweep(int n) {
  std::mt19937_64 rng(20260412);
  std::size_t total = 0;
  for (int i = 0; i < n; ++i) {
    sweep_case k;
    k.c = random_config(rng, i % 2 == 1);
    k.l = random_layout(rng, k.c);
    const int mode = static_cast<int>(rng() % 4);
    k.o.qkv_residual = mode == 1;
    k.o.full_conversion = mode == 2;
    k.o.ownership = i % 3 == 2 ? ownership_policy::balanced : ownership_policy::key_hash;
    k.b.mode = rng() % 3 == 0 ? refit_mode::overwrite_all : refit_mode::mixed;
    k.b.chunk_bytes = std::vector<std::size_t>{1, 512, 4096, std::size_t{64} << 20}[rng() % 4];
    k.b.bucket_bytes = std::vector<std::size_t>{1, 2048, 65536, std::size_t{512} << 20}[rng() % 4];
    k.fraction = std::vector<double>{0.0, 0.012, 0.05, 0.5, 1.0}[rng() % 5];
    k.b.relative = std::array{relative_choice::smallest, relative_choice::xor_only,
                              relative_choice::add_only}[i % 3];
    CAPTURE(i);
    CAPTURE(k.l.tp);
    CAPTURE(k.l.pp);
    CAPTURE(k.l.ep);
    CAPTURE(k.l.etp);
    CAPTURE(k.l.dp);
    CAPTURE(k.c.heads);
    CAPTURE(k.c.kv_heads);
    CAPTURE(k.c.vocab);
    CAPTURE(k.c.tied_embeddings);
    CAPTURE(mode);
    CAPTURE(static_cast<int>(k.o.ownership));
    total += run_case(k, 1000 + i);
  }
  return total;
}

} // namespace

TEST_CASE("delta construction == brute-force diff over random configs and layouts") {
  add_items = xor_items = 0;
  CHECK(sweep(36) > 0);
  CHECK(add_items > 0);
  CHECK(xor_items > 0);
}

TEST_CASE("delta construction == brute-force diff over 400 random configs and layouts" *
          doctest::test_suite("slow")) {
  CHECK(sweep(400) > 0);
}

TEST_CASE(
    "payloads: byte-identical across builds, decode to the built items, one sequence per bucket") {
  model_config c;
  c.hidden = 32;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 8;
  c.ffn = 64;
  c.vocab = 99;
  auto plan =
      std::make_shared<const source_plan>(megatron_plan(c, {2, 2, 1, 1, 2, 8}, {true, false}));
  auto v0 = test::random_checkpoint(plan->canonical, 5);
  auto v1 = v0;
  test::stress(v1, 0.05, 1e-2, 6);
  auto s0 = source_from_canonical(*plan, v0), s1 = source_from_canonical(*plan, v1);
  training_side side(plan, s0.view());
  for (auto mode : {refit_mode::mixed, refit_mode::overwrite_all}) {
    builder_options o;
    o.mode = mode;
    o.chunk_bytes = 256;
    o.bucket_bytes = 1024;
    const payload_id base{42, 7, 0, 0};
    auto p1 = side.build(s1.view(), base, o);
    auto p2 = side.build(s1.view(), base, o);
    CHECK(p1 == p2);
    auto items = side.build_items(s1.view(), o);
    std::size_t bi = 0;
    std::vector<item> all;
    for (std::uint32_t w = 0; w < p1.size(); ++w)
      for (std::uint32_t q = 0; q < p1[w].size(); ++q) {
        auto d = decode_payload_or_throw(p1[w][q]);
        CHECK(d.id == payload_id{42, 7, w, q});
        REQUIRE(bi < items.size());
        CHECK(items[bi].owner == w);
        CHECK(items[bi].sequence == q);
        CHECK(d.items == items[bi].items);
        ++bi;
        for (auto& it : d.items) all.push_back(it);
      }
    CHECK(bi == items.size());
    CHECK(items.size() > plan->world); // small buckets: several payloads per owner
    auto canon = v0;
    CHECK(test::apply_items(all, canon) == test::changed_set(v0, v1));
    CHECK(test::same_bytes(canon, v1));
  }
}

TEST_CASE("record memory kept between builds: a reused owner's payloads are a fresh owner's") {
  // An owner keeps its record vectors between builds; a build with many
  // changes followed by one with few must not carry a record of the first
  // into the second (nor the reverse), on one thread or several, with
  // residual tasks (fused QKV) and several chunks and buckets per owner.
  model_config c;
  c.hidden = 32;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 8;
  c.ffn = 64;
  c.vocab = 99;
  auto plan =
      std::make_shared<const source_plan>(megatron_plan(c, {2, 2, 1, 1, 2, 8}, {true, false}));
  auto v0 = test::random_checkpoint(plan->canonical, 11);
  auto many = v0, few = v0;
  test::mutate(many, 0.5, 12);
  test::mutate(few, 0.01, 13);
  auto s0 = source_from_canonical(*plan, v0);
  auto sm = source_from_canonical(*plan, many), sf = source_from_canonical(*plan, few);
  auto required = [&](const source_view& cand) {
    std::vector<std::uint32_t> flags;
    for (std::uint32_t id = 0; id < plan->world; ++id)
      for (auto s : owner(plan, id, s0.view()).flagged_inputs(cand)) flags.push_back(s);
    return make_required(*plan, flags);
  };
  const auto rm = required(sm.view()), rf = required(sf.view());
  const payload_id base{3, 4, 0, 0};
  for (auto mode : {refit_mode::mixed, refit_mode::overwrite_all})
    for (std::size_t threads : {1, 3})
      for (std::uint64_t chunk : {std::uint64_t{256}, builder_options{}.chunk_bytes}) {
        CAPTURE(threads);
        CAPTURE(chunk);
        builder_options o;
        o.mode = mode;
        o.threads = threads;
        o.chunk_bytes = chunk;
        o.bucket_bytes = chunk == 256 ? 1024 : builder_options{}.bucket_bytes;
        for (std::uint32_t id = 0; id < plan->world; ++id) {
          const auto fresh_few = owner(plan, id, s0.view()).build(sf.view(), rf, base, o);
          const auto fresh_many = owner(plan, id, s0.view()).build(sm.view(), rm, base, o);
          REQUIRE(!fresh_many.empty());
          owner reused(plan, id, s0.view());
          CHECK(reused.record_memory() == 0);
          CHECK(reused.build(sm.view(), rm, base, o) == fresh_many);
          CHECK(reused.record_memory() > 0);
          CHECK(reused.build(sf.view(), rf, base, o) == fresh_few);
          CHECK(reused.build(sm.view(), rm, base, o) == fresh_many);
          // Buckets given back by a build_buckets caller serve the next build.
          std::size_t buckets = 0;
          reused.build_buckets(sm.view(), rm, o, [&](delta_bucket&& b) {
            ++buckets;
            reused.recycle(std::move(b));
          });
          CHECK(buckets == fresh_many.size());
          CHECK(reused.build(sf.view(), rf, base, o) == fresh_few);
          reused.release_record_memory();
          CHECK(reused.record_memory() == 0);
          CHECK(reused.build(sm.view(), rm, base, o) == fresh_many);
        }
      }
}

TEST_CASE(
    "chunks and buckets: whole tasks, bucket input bytes reach the target before a bucket closes") {
  model_config c;
  c.hidden = 32;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 8;
  c.ffn = 64;
  c.vocab = 64;
  c.layers = 4;
  auto plan = std::make_shared<const source_plan>(megatron_plan(c, {1, 1, 1, 1, 1, 8}));
  auto v0 = test::random_checkpoint(plan->canonical, 1);
  auto v1 = v0;
  test::stress(v1, 1.0, 1e-2, 2);
  auto s0 = source_from_canonical(*plan, v0), s1 = source_from_canonical(*plan, v1);
  owner o(plan, 0, s0.view());
  required_set none = make_required(*plan, {});
  builder_options opt;
  opt.chunk_bytes = 1; // one task per chunk
  opt.bucket_bytes = 20000;
  auto b = o.build_items(s1.view(), none, opt);
  REQUIRE(b.size() > 1);
  for (std::size_t i = 0; i + 1 < b.size(); ++i) CHECK(b[i].input_bytes >= opt.bucket_bytes);
  std::uint64_t sum = 0;
  for (auto& x : b) sum += x.input_bytes;
  CHECK(sum == plan->source_bytes()); // every chunk emitted (all elements changed)
  // One bucket for everything: exactly one item per canonical tensor.
  opt.bucket_bytes = std::size_t{1} << 40;
  auto one = o.build_items(s1.view(), none, opt);
  REQUIRE(one.size() == 1);
  CHECK(one[0].items.size() == plan->canonical.size());
}

TEST_CASE("owner errors: missing or mis-sized candidate shards") {
  model_config c;
  auto plan = std::make_shared<const source_plan>(megatron_plan(c, {1, 1, 1, 1, 1, 8}));
  auto s0 = source_from_canonical(*plan, test::random_checkpoint(plan->canonical, 1));
  owner o(plan, 0, s0.view());
  source_view empty;
  try {
    (void)o.build_items(empty, make_required(*plan, {}));
    FAIL_CHECK("expected a throw");
  } catch (const dcr::error& e) {
    CHECK(e.code() == errc::not_found);
  }
  auto v = s0.view();
  v.shards[1] = v.shards[1].first(2);
  try {
    (void)o.build_items(v, make_required(*plan, {}));
    FAIL_CHECK("expected a throw");
  } catch (const dcr::error& e) {
    CHECK(e.code() == errc::shape_mismatch);
  }
}

TEST_CASE("AdamW-trained versions (lr 1e-6, BF16 RNE storage): several steps, each committed") {
  model_config c = tiny_qwen3_moe();
  c.layers = 2;
  c.hidden = 64;
  c.moe_ffn = 32;
  c.experts = 4;
  auto plan = std::make_shared<const source_plan>(megatron_plan(c, {2, 1, 2, 1, 2, 8}));
  std::vector<host_tensor> canon;
  std::vector<sim::adamw_trainer> trainers;
  for (std::size_t i = 0; i < plan->canonical.size(); ++i) {
    host_tensor t(plan->canonical[i]);
    auto w = sim::normal_bf16(t.meta.numel(), 0.02f, 900 + i);
    std::memcpy(t.bytes.data(), w.data(), t.bytes.size());
    trainers.emplace_back(std::span<const std::uint16_t>(w), 100 + i);
    canon.push_back(std::move(t));
  }
  training_side side(plan, source_from_canonical(*plan, canon).view());
  std::size_t emitted_total = 0;
  for (int step = 0; step < 3; ++step) {
    auto next = canon;
    for (std::size_t i = 0; i < trainers.size(); ++i) {
      trainers[i].step();
      std::memcpy(next[i].bytes.data(), trainers[i].bf16().data(), next[i].bytes.size());
    }
    auto cand = source_from_canonical(*plan, next);
    std::vector<item> items;
    for (auto& b : side.build_items(cand.view()))
      for (auto& it : b.items) items.push_back(it);
    auto applied = canon;
    auto emitted = test::apply_items(items, applied);
    CHECK(emitted == test::changed_set(canon, next));
    CHECK(test::same_bytes(applied, next));
    emitted_total += emitted.size();
    side.commit(cand.view());
    canon = std::move(next);
  }
  CHECK(emitted_total > 0);
}

TEST_CASE("relative items: per item the smaller of XOR and add, and a v1 build offers XOR only") {
  model_config c;
  c.hidden = 32;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 8;
  c.ffn = 64;
  c.vocab = 99;
  c.layers = 2;
  auto plan = std::make_shared<const source_plan>(megatron_plan(c, {2, 1, 1, 1, 1, 8}));
  auto v0 = test::random_checkpoint(plan->canonical, 31);
  auto v1 = v0;
  test::stress(v1, 0.05, 1e-2, 32);
  auto s0 = source_from_canonical(*plan, v0), s1 = source_from_canonical(*plan, v1);
  training_side side(plan, s0.view());
  auto flat = [&](const builder_options& o) {
    std::vector<item> all;
    for (auto& b : side.build_items(s1.view(), o))
      for (auto& it : b.items) all.push_back(std::move(it));
    return all;
  };
  builder_options best, xors, adds, v1_opt;
  xors.relative = relative_choice::xor_only;
  adds.relative = relative_choice::add_only;
  v1_opt.encoding.format_version = 1;
  const auto b = flat(best), x = flat(xors), a = flat(adds), old = flat(v1_opt);
  REQUIRE(b.size() == x.size());
  REQUIRE(b.size() == a.size());
  CHECK(old == x); // v1 cannot carry add items: the choice is XOR
  std::size_t chose_add = 0, chose_xor = 0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    CHECK(b[i].indices == x[i].indices);
    CHECK(b[i].indices == a[i].indices);
    const auto w = width_of(b[i].tensor.dtype);
    const auto f = best.encoding.filter;
    const double ex = codec::estimate_value_bytes(x[i].values, w, f);
    const double ea = codec::estimate_value_bytes(a[i].values, w, f);
    if (b[i].encoding == value_encoding::add) {
      CHECK(b[i] == a[i]);
      CHECK(ea < ex);
      ++chose_add;
    } else {
      CHECK(b[i] == x[i]);
      CHECK(ex <= ea);
      ++chose_xor;
    }
  }
  // Stress updates move values by a few units in the last place: add wins
  // on most items, and the payloads are no larger than either fixed choice.
  CHECK(chose_add > chose_xor);
  auto bytes = [&](const builder_options& o) {
    std::size_t n = 0;
    for (auto& owner : side.build(s1.view(), payload_id{1, 1, 0, 0}, o))
      for (auto& p : owner) n += p.size();
    return n;
  };
  const auto nb = bytes(best), nx = bytes(xors), na = bytes(adds);
  MESSAGE("payload bytes: smallest " << nb << ", xor " << nx << ", add " << na);
  CHECK(nb <= std::min(nx, na) + std::min(nx, na) / 100);
  CHECK(nb < nx);
}
