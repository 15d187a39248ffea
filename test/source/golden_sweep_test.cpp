// Golden sweep: the builder's payload bytes for random configurations
// (families, dtypes, trainer layouts, QKV residual / full conversion, block
// FP8 plans with shard-local quantisation, every builder option: mode,
// relative choice, residual XOR, payload grouping by expert and expert
// blocks, chunk and bucket sizes, 1 or 2 builder threads, location schemes,
// value filters, and the build from changes found before) against XXH3-64
// digests recorded from the builder before it was split into baseline,
// delta builder and payload grouping and its per-item work into stage
// objects. One digest per configuration, over every payload of two
// consecutive attempts (the second after a commit). A configuration the
// sweep draws is fixed by the seed, so a mismatch names it.
#include "training_fixture.hpp"

#include <xxhash.h>

#include <cstdio>
#include <string>

#include "dcr/codec/payload.hpp"
#include "dcr/model/trainer_layout.hpp"
#include "dcr/source/builder.hpp"
#include "dcr/source/fp8_plan.hpp"
#include "dcr/source/state.hpp"

using namespace dcr;

namespace {

template <class T>
T pick(std::mt19937_64& rng, std::initializer_list<T> v) {
  return *(v.begin() + static_cast<std::ptrdiff_t>(rng() % v.size()));
}

struct sweep_case {
  std::string describe;
  std::shared_ptr<const source_plan> plan;
  builder_options opt;
  bool from_changes = false;
  double fraction = 0;
  std::uint64_t seed = 0;
};

sweep_case draw(std::mt19937_64& rng) {
  for (;;) {
    static const char* families[] = {"llama", "qwen2", "qwen3", "qwen3_moe"};
    model_config c;
    c.family = families[rng() % 4];
    c.kv_heads = pick<std::uint64_t>(rng, {1, 2});
    c.heads = c.kv_heads * pick<std::uint64_t>(rng, {1, 2, 4});
    c.head_dim = pick<std::uint64_t>(rng, {8, 16});
    c.hidden = c.family == "qwen3" || c.family == "qwen3_moe" ? pick<std::uint64_t>(rng, {32, 48})
                                                              : c.heads * c.head_dim;
    c.layers = pick<std::uint64_t>(rng, {1, 2});
    c.ffn = pick<std::uint64_t>(rng, {32, 48, 64});
    c.vocab = pick<std::uint64_t>(rng, {96, 130});
    c.tied_embeddings = rng() % 3 == 0;
    c.attention_bias = c.family == "qwen2";
    c.qk_norm = c.family == "qwen3" || c.family == "qwen3_moe";
    if (c.family == "qwen3_moe") {
      c.experts = pick<std::uint64_t>(rng, {4, 6});
      c.moe_ffn = pick<std::uint64_t>(rng, {16, 32});
      if (!c.has_dense_layer()) c.ffn = 0;
    }
    const bool fp8 = rng() % 4 == 0;
    if (fp8) {
      fp8_block_quantization q;
      q.block_n = pick<std::uint64_t>(rng, {8, 16});
      q.block_k = pick<std::uint64_t>(rng, {8, 16});
      c.fp8 = q;
    } else {
      c.dtype = pick<dtype_id>(rng, {dtype_id::bf16, dtype_id::bf16, dtype_id::f16, dtype_id::f32});
    }
    trainer_layout l;
    l.tp = pick<std::uint64_t>(rng, {1, 2, 4});
    l.pp = pick<std::uint64_t>(rng, {1, 2});
    l.dp = pick<std::uint64_t>(rng, {1, 2});
    l.vocab_block = pick<std::uint64_t>(rng, {0, 8});
    if (c.is_moe()) {
      l.ep = pick<std::uint64_t>(rng, {1, 2});
      l.etp = pick<std::uint64_t>(rng, {1, 2});
    }
    if (!validate(c, l).ok()) continue;
    sweep_case k;
    megatron_options mo;
    const auto conv = rng() % 5;
    mo.qkv_residual = conv == 0;
    mo.full_conversion = conv == 1;
    mo.ownership = rng() % 2 ? ownership_policy::balanced : ownership_policy::key_hash;
    if (fp8) {
      fp8_plan_options po;
      po.ownership = mo.ownership;
      po.shard_local = rng() % 4 != 0;
      k.plan = std::make_shared<const source_plan>(megatron_fp8_plan(c, l, po));
    } else {
      k.plan = std::make_shared<const source_plan>(megatron_plan(c, l, mo));
    }
    auto& b = k.opt;
    b.mode = rng() % 4 == 0 ? refit_mode::overwrite_all : refit_mode::mixed;
    b.relative = pick<relative_choice>(rng, {relative_choice::smallest, relative_choice::smallest,
                                             relative_choice::xor_only, relative_choice::add_only});
    b.residual_xor = rng() % 3 == 0;
    b.chunk_bytes = pick<std::size_t>(rng, {1, 256, 4096, std::size_t{64} << 20});
    b.bucket_bytes = pick<std::size_t>(rng, {1, 1024, 65536, std::size_t{512} << 20});
    b.threads = pick<std::size_t>(rng, {1, 1, 2});
    b.chunks_in_flight = pick<std::size_t>(rng, {0, 1, 3});
    if (c.is_moe() && rng() % 2) {
      b.grouping = payload_grouping::by_expert;
      b.expert_blocks = pick<std::uint32_t>(rng, {0, 2});
    }
    b.encoding.locations = pick<codec::location_scheme>(
        rng, {codec::location_scheme::escape_u8, codec::location_scheme::gaps,
              codec::location_scheme::planes, codec::location_scheme::varint});
    b.encoding.filter =
        rng() % 4 == 0 ? codec::value_filter::none : codec::value_filter::byte_planes;
    k.from_changes = rng() % 3 == 0;
    k.fraction = pick<double>(rng, {0.0, 0.012, 0.05, 0.3, 1.0});
    k.seed = rng();
    k.describe = c.family + " " + std::string(name_of(c.dtype)) + (fp8 ? " fp8" : "") + " tp" +
                 std::to_string(l.tp) + " pp" + std::to_string(l.pp) + " dp" +
                 std::to_string(l.dp) + " ep" + std::to_string(l.ep) + " conv" +
                 std::to_string(conv) + " threads" + std::to_string(b.threads) +
                 (k.from_changes ? " changes" : "") + " f" + std::to_string(k.fraction);
    return k;
  }
}

/// Digest of every payload of two attempts over random shard words (three
/// versions, each `fraction` of the words of the one before changed).
std::string run_case(const sweep_case& k, std::size_t& payloads) {
  const auto& plan = *k.plan;
  source_state s0 = source_state::zeros(plan), s1 = s0, s2 = s0;
  {
    std::mt19937_64 rng(k.seed);
    for (std::size_t s = 0; s < s0.shards.size(); ++s) {
      const auto n = s0.shards[s].size();
      // Normal values (finite FP8 scales), changed by the stress update.
      host_tensor t(tensor_meta{"s", {n / width_of(plan.shards[s].dtype)}, plan.shards[s].dtype});
      t = test::random_tensor(t.meta, rng());
      std::memcpy(s0.shards[s].data(), t.bytes.data(), n);
      std::vector<host_tensor> one;
      one.push_back(std::move(t));
      test::mutate(one, k.fraction, k.seed + s);
      std::memcpy(s1.shards[s].data(), one[0].bytes.data(), n);
      test::mutate(one, k.fraction, k.seed + 7 * s + 1);
      std::memcpy(s2.shards[s].data(), one[0].bytes.data(), n);
    }
  }
  std::vector<owner> owners;
  for (std::uint32_t r = 0; r < plan.world; ++r) owners.emplace_back(k.plan, r, s0.view());
  XXH3_state_t* x3 = XXH3_createState();
  XXH3_64bits_reset(x3);
  payloads = 0;
  auto attempt = [&](const source_view& cand, const payload_id& id) {
    std::vector<std::uint32_t> flags;
    for (auto& o : owners)
      for (auto s : o.flagged_inputs(cand)) flags.push_back(s);
    const auto req = make_required(plan, flags);
    for (auto& o : owners) {
      std::vector<std::vector<std::byte>> got;
      if (k.from_changes) {
        const auto ch = o.changes(cand);
        o.build_buckets(ch, cand, req, k.opt, [&](delta_bucket&& b) {
          payload_id pid = id;
          pid.owner = o.id();
          pid.sequence = b.sequence;
          throw_if_failed(codec::encode_payload_with(
              pid, b.items, k.opt.encoding,
              pipeline::dispatched_locations{k.opt.encoding.locations}, got.emplace_back()));
        });
      } else {
        got = o.build(cand, req, id, k.opt);
      }
      for (auto& p : got) {
        const std::uint64_t n = p.size();
        XXH3_64bits_update(x3, &n, sizeof n);
        XXH3_64bits_update(x3, p.data(), p.size());
        ++payloads;
      }
    }
    return req;
  };
  const auto req = attempt(s1.view(), payload_id{1, 1, 0, 0});
  for (auto& o : owners) o.commit_baseline(s1.view(), req);
  attempt(s2.view(), payload_id{2, 2, 0, 0});
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx",
                static_cast<unsigned long long>(XXH3_64bits_digest(x3)));
  XXH3_freeState(x3);
  return buf;
}

struct recorded {
  const char* xxh3;
  std::size_t payloads;
};

// Recorded from the builder before the split (see the file comment).
const recorded golden[] = {
    {"1d0c337812c51b2b", 4},  // llama f16 tp1 pp2 dp1 ep1 conv2 threads1 f0.300000
    {"8c45e23e30ff1944", 22}, // qwen3 f16 tp2 pp2 dp2 ep1 conv0 threads2 changes f0.050000
    {"92887bf689ff3893", 32}, // llama f16 tp4 pp2 dp2 ep1 conv3 threads1 f0.050000
    {"2a6769ec1c3c60fe", 18}, // llama bf16 tp1 pp1 dp1 ep1 conv2 threads1 f1.000000
    {"7d970d95073a18a9", 12}, // qwen3_moe bf16 fp8 tp1 pp1 dp2 ep1 conv0 threads2 changes f1.000000
    {"1accb94433869ac6", 14}, // qwen3 bf16 fp8 tp1 pp2 dp2 ep1 conv4 threads1 f0.300000
    {"e9b7851fd226ff70", 22}, // qwen3_moe bf16 tp2 pp1 dp2 ep2 conv1 threads1 f1.000000
    {"39275423d45c4d73", 2},  // qwen3_moe bf16 fp8 tp1 pp1 dp1 ep1 conv0 threads1 changes f0.300000
    {"bbd5db50d1d5f79b", 32}, // qwen2 f16 tp1 pp2 dp2 ep1 conv3 threads1 f0.300000
    {"446ca5c9bd3f208c", 16}, // qwen3 bf16 tp2 pp2 dp2 ep1 conv3 threads1 f1.000000
    {"5087cc64158ce22f", 12}, // qwen3 f32 tp1 pp1 dp2 ep1 conv0 threads1 f0.300000
    {"f2ba5f658e2679d1", 16}, // qwen3 bf16 fp8 tp4 pp1 dp1 ep1 conv0 threads1 changes f0.300000
    {"bb5543ad14ea496d", 32}, // qwen2 bf16 fp8 tp4 pp2 dp2 ep1 conv4 threads1 f1.000000
    {"285a00b39c26bd3b", 8},  // qwen3 bf16 fp8 tp4 pp1 dp1 ep1 conv0 threads1 f1.000000
    {"f9702cd536353095", 4},  // llama bf16 fp8 tp1 pp1 dp2 ep1 conv1 threads1 f1.000000
    {"2d06800538d394c2", 0},  // qwen3_moe f16 tp2 pp2 dp1 ep2 conv1 threads1 f0.000000
    {"60bc10495655bad8", 48}, // qwen3_moe bf16 fp8 tp2 pp1 dp2 ep1 conv3 threads2 changes f0.300000
    {"f0e9e6089b40042e", 106}, // qwen2 f32 tp4 pp2 dp1 ep1 conv4 threads1 changes f1.000000
    {"b5cae0cde71a0b22", 49},  // qwen3_moe bf16 fp8 tp1 pp1 dp2 ep2 conv2 threads1 f0.012000
    {"09d509c1a40f23e4", 12},  // qwen2 f32 tp1 pp2 dp1 ep1 conv3 threads1 f0.012000
    {"e72f640c65c69377", 8},   // qwen3 bf16 fp8 tp2 pp2 dp1 ep1 conv0 threads1 f1.000000
    {"f50376c49b6c452d", 8},   // llama bf16 tp2 pp1 dp2 ep1 conv2 threads1 f0.012000
    {"f1a12e8b807bac42", 16},  // qwen3_moe f16 tp4 pp2 dp1 ep2 conv1 threads1 f0.012000
    {"596bccd304c6b12d", 22},  // qwen2 bf16 tp1 pp1 dp2 ep1 conv3 threads1 f0.300000
    {"e6620adcd72e9af1", 4},   // qwen3 bf16 fp8 tp1 pp1 dp2 ep1 conv4 threads1 f0.012000
    {"efdc0759fe5e56fd", 32},  // qwen2 bf16 tp4 pp2 dp2 ep1 conv4 threads1 changes f1.000000
    {"ea6295c9a3163654", 4},   // qwen3 f16 tp2 pp1 dp1 ep1 conv4 threads1 changes f0.012000
    {"2d06800538d394c2", 0},   // llama f32 tp4 pp2 dp2 ep1 conv1 threads2 f0.000000
    {"2d06800538d394c2", 0},   // qwen3_moe bf16 tp2 pp1 dp2 ep1 conv3 threads1 f0.000000
    {"fcbb1d409ff40af6", 4},   // qwen3 bf16 tp2 pp1 dp1 ep1 conv2 threads1 changes f0.012000
    {"1cfd0861c0384674", 8},   // llama f16 tp2 pp2 dp1 ep1 conv3 threads2 f0.050000
    {"2d06800538d394c2", 0},   // qwen3 bf16 tp2 pp1 dp1 ep1 conv2 threads1 f0.000000
    {"0dc9ca0ceae8e691", 60},  // qwen3_moe bf16 tp2 pp2 dp2 ep1 conv3 threads1 f0.300000
    {"fba966ea8be32f77", 4},   // qwen3 f16 tp1 pp2 dp1 ep1 conv1 threads1 f0.012000
    {"d92c5e8fd0d14f55", 2},   // qwen2 bf16 tp1 pp1 dp1 ep1 conv1 threads1 f0.012000
    {"f54eb503f9f95c77", 8},   // llama f16 tp1 pp2 dp2 ep1 conv0 threads2 f0.300000
    {"afccaad53f565230", 8},   // qwen2 f16 tp2 pp1 dp2 ep1 conv0 threads2 changes f0.300000
    {"c465e910af6223b6", 16},  // qwen2 bf16 tp4 pp2 dp1 ep1 conv3 threads2 changes f0.012000
    {"849e5f11f4cc4ee9", 28},  // llama bf16 tp1 pp2 dp2 ep1 conv3 threads2 f1.000000
    {"56add9654890c599", 2},   // qwen2 bf16 fp8 tp1 pp1 dp1 ep1 conv3 threads1 f1.000000
};

} // namespace

TEST_CASE("random configurations: payload bytes equal the digests recorded before the split") {
  std::mt19937_64 rng(20261205);
  constexpr std::size_t n = 40;
  CHECK(std::size(golden) == n);
  bool all = true;
  for (std::size_t i = 0; i < n; ++i) {
    const auto k = draw(rng);
    CAPTURE(i);
    CAPTURE(k.describe);
    std::size_t payloads = 0;
    const auto d = run_case(k, payloads);
    const recorded g = i < std::size(golden) ? golden[i] : recorded{"", 0};
    if (d != g.xxh3 || payloads != g.payloads) {
      all = false;
      std::printf("    {\"%s\", %zu}, // %s\n", d.c_str(), payloads, k.describe.c_str());
    }
    CHECK(d == std::string(g.xxh3));
    CHECK(payloads == g.payloads);
  }
  CHECK(all);
}
