// Property: the general path (per-shard and per-item dispatch over the policy
// lists) and a statically composed pipeline for the same configuration give
// identical payload bytes on the same random inputs, and a receiver applying
// those payloads through either path ends in identical storage, equal to a
// dense refit. A static pipeline refuses, with a typed error, shards and
// items outside its configuration.
#include "training_fixture.hpp"

#include "dcr/codec/payload.hpp"
#include "dcr/receiver/receiver.hpp"
#include "dcr/receiver/stages.hpp"
#include "dcr/receiver/tensor_set.hpp"
#include "dcr/source/builder.hpp"
#include "examples/common/training_side.hpp"

using namespace dcr;

namespace {

/// Every canonical tensor into one parameter of the same name (all copies mapped).
struct identity_loader {
  void declare(parameter_store& s, std::span<const tensor_meta> metas) const {
    for (auto& m : metas) s.add(m.name, m.shape, m.dtype);
  }
  load_report load(std::string_view name, const tensor_view& src, parameter_store& s,
                   copy_sink& sink) const {
    sink.copy(s.view(name), src);
    return {{std::string(name)}};
  }
};
static_assert(native_loader<identity_loader>);

template <class D, class E, class C>
using trainer = stages::refit_pipeline<stages::compare<D>, stages::project<piecewise_map>,
                                       stages::encode<E, codec::run_or<C>>>;
template <class D, class E, class C>
using rollout = stages::receive_pipeline<stages::decode<codec::run_or<C>>, stages::scatter<D>,
                                         stages::apply<E>>;

struct config {
  model_config c;
  trainer_layout l;
  megatron_options o;
  builder_options b;
  double fraction;
};

config random_case(std::mt19937_64& rng) {
  config k;
  auto& c = k.c;
  c.hidden = 32;
  c.head_dim = 8;
  c.kv_heads = std::vector<std::uint64_t>{1, 2, 4}[rng() % 3];
  c.heads = c.kv_heads * std::vector<std::uint64_t>{1, 2}[rng() % 2];
  c.ffn = 64;
  c.layers = 1 + rng() % 2;
  c.vocab = 50 + rng() % 60;
  c.tied_embeddings = rng() % 2;
  c.attention_bias = rng() % 2;
  c.dtype = rng() % 2 ? dtype_id::bf16 : dtype_id::f32;
  if (rng() % 3 == 0) {
    c.family = "qwen3_moe";
    c.experts = 4;
    c.moe_ffn = 16;
    c.ffn = 0;
  }
  for (;;) {
    trainer_layout l;
    l.tp = std::vector<std::uint64_t>{1, 2, 4}[rng() % 3];
    l.pp = std::vector<std::uint64_t>{1, 2}[rng() % 2];
    l.dp = std::vector<std::uint64_t>{1, 2}[rng() % 2];
    l.vocab_block = std::vector<std::uint64_t>{1, 8}[rng() % 2];
    if (c.is_moe()) l.ep = std::vector<std::uint64_t>{1, 2}[rng() % 2];
    if (validate(c, l).ok()) {
      k.l = l;
      break;
    }
  }
  const int conv = static_cast<int>(rng() % 3);
  k.o.qkv_residual = conv == 1;
  k.o.full_conversion = conv == 2;
  k.b.mode = rng() % 2 ? refit_mode::mixed : refit_mode::overwrite_all;
  k.b.encoding.locations =
      rng() % 2 ? codec::location_scheme::escape_u8 : codec::location_scheme::varint;
  k.b.encoding.filter = rng() % 2 ? codec::value_filter::byte_planes : codec::value_filter::none;
  k.b.chunk_bytes = std::vector<std::size_t>{1, 512, 4096, std::size_t{64} << 20}[rng() % 4];
  k.b.bucket_bytes = std::vector<std::size_t>{1, 2048, 65536, std::size_t{512} << 20}[rng() % 4];
  k.fraction = std::vector<double>{0.0, 0.012, 0.05, 0.5}[rng() % 4];
  return k;
}

/// Flips about `fraction` of the bits-words of every non-bf16 tensor (bf16: stress update).
void mutate(std::vector<host_tensor>& ts, double fraction, std::uint64_t seed) {
  test::stress(ts, fraction, 1e-2, seed);
  std::mt19937_64 rng(seed);
  for (auto& t : ts) {
    if (t.meta.dtype == dtype_id::bf16) continue;
    const auto w = width_of(t.meta.dtype);
    const auto n = t.meta.numel();
    for (std::uint64_t i = 0; i < static_cast<std::uint64_t>(fraction * static_cast<double>(n));
         ++i)
      t.bytes[(rng() % n) * w + rng() % w] ^= std::byte{0x10};
  }
}

tensor_set as_set(const std::vector<host_tensor>& ts) {
  tensor_set s;
  for (auto& t : ts) s.add(t);
  return s;
}

struct outcome {
  std::size_t compared = 0; ///< payloads compared byte for byte
  bool receiver_checked = false;
};

/// One case through pipeline `D x E x C` statically and through the general path.
template <class D, class E, class C>
outcome run_case(const config& k, std::uint64_t seed) {
  using P = trainer<D, E, C>;
  using R = rollout<D, E, C>;
  outcome out;
  auto plan = std::make_shared<const source_plan>(megatron_plan(k.c, k.l, k.o));
  auto v0 = test::random_checkpoint(plan->canonical, seed);
  auto v1 = v0;
  mutate(v1, k.fraction, seed + 1);
  auto s0 = source_from_canonical(*plan, v0), s1 = source_from_canonical(*plan, v1);
  training_side side(plan, s0.view());
  const auto req = side.required(s1.view());
  const payload_id base{3, 9, 0, 0};

  // Does the configuration fit one static pipeline? In mixed mode an affine
  // shard whose map is not unique gets overwrites, which an XOR pipeline refuses.
  bool fits = true;
  for (auto& sh : plan->shards)
    if (sh.affine() && E::id == value_encoding::xor_mask && !sh.map->is_unique()) fits = false;

  std::vector<std::vector<std::byte>> general, composed;
  for (auto& o : side.owners()) {
    for (auto& p : o.build(s1.view(), req, base, k.b)) general.push_back(std::move(p));
    if (!fits) {
      CHECK_THROWS_AS(o.template build<P>(s1.view(), req, base, k.b), error);
      continue;
    }
    for (auto& p : o.template build<P>(s1.view(), req, base, k.b)) composed.push_back(std::move(p));
  }
  if (!fits) return out;
  REQUIRE(general.size() == composed.size());
  for (std::size_t i = 0; i < general.size(); ++i) {
    CAPTURE(i);
    CHECK(general[i] == composed[i]);
  }
  out.compared = general.size();

  // Receiver: when every item has the pipeline's encoding (residual outputs
  // are overwrites), both apply paths must agree with each other and with a
  // dense refit of the candidate.
  receiver<identity_loader> a(identity_loader{}, plan->canonical),
      b(identity_loader{}, plan->canonical);
  const auto before = as_set(v0), after = as_set(v1);
  a.dense_refit(before);
  b.dense_refit(before);
  bool one_encoding = true;
  for (auto& p : general) {
    decoded_payload dg, ds;
    REQUIRE(a.decode(p, dg).ok());
    REQUIRE(b.template decode<typename R::decode_stage>(p, ds).ok());
    CHECK(dg == ds);
    for (auto& it : dg.items) one_encoding = one_encoding && it.encoding == E::id;
  }
  if (!one_encoding) return out;
  for (auto& p : general) {
    decoded_payload d;
    REQUIRE(a.decode(p, d).ok());
    for (auto& it : d.items) {
      REQUIRE(a.apply_item(it).ok());
      REQUIRE(b.template apply_item<R>(it).ok());
    }
  }
  CHECK(a.state_digest() == b.state_digest());
  CHECK(a.verify(after).ok());
  CHECK(b.verify(after).ok());
  out.receiver_checked = true;
  return out;
}

template <class D, class C>
outcome by_mode(const config& k, std::uint64_t seed) {
  return k.b.mode == refit_mode::mixed ? run_case<D, codec::xor_mask, C>(k, seed)
                                       : run_case<D, codec::overwrite, C>(k, seed);
}
template <class D>
outcome by_scheme(const config& k, std::uint64_t seed) {
  return k.b.encoding.locations == codec::location_scheme::escape_u8
             ? by_mode<D, codec::escape_u8>(k, seed)
             : by_mode<D, codec::varint_gaps>(k, seed);
}

} // namespace

TEST_CASE("dispatched and statically composed pipelines give identical payload bytes and receiver "
          "storage") {
  std::mt19937_64 rng(20261203);
  int receiver_checked = 0;
  std::size_t compared = 0;
  for (int i = 0; i < 40; ++i) {
    const auto k = random_case(rng);
    CAPTURE(i);
    CAPTURE(static_cast<int>(k.c.dtype));
    CAPTURE(static_cast<int>(k.b.mode));
    const auto r = k.c.dtype == dtype_id::bf16 ? by_scheme<dcr::bf16>(k, 500 + i)
                                               : by_scheme<dcr::f32>(k, 500 + i);
    receiver_checked += r.receiver_checked;
    compared += r.compared;
  }
  CHECK(receiver_checked >= 10);
  CHECK(compared >= 200);
  MESSAGE(compared << " payloads compared, " << receiver_checked
                   << " cases applied through both receivers");
}

TEST_CASE("a static pipeline refuses shards and items outside its configuration") {
  model_config c;
  c.hidden = 32;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 8;
  c.ffn = 64;
  c.vocab = 64;
  c.dtype = dtype_id::f32;
  auto plan = std::make_shared<const source_plan>(megatron_plan(c, {2, 1, 1, 1, 1, 8}, {}));
  auto v0 = test::random_checkpoint(plan->canonical, 1);
  auto v1 = v0;
  mutate(v1, 0.1, 2);
  auto s0 = source_from_canonical(*plan, v0), s1 = source_from_canonical(*plan, v1);
  training_side side(plan, s0.view());
  const auto req = side.required(s1.view());
  builder_options mixed;
  const auto& o = side.owners()[0];
  try {
    (void)o.build<trainer<dcr::bf16, codec::xor_mask, codec::escape_u8>>(s1.view(), req, {}, mixed);
    FAIL("no error");
  } catch (const error& e) {
    CHECK(e.code() == errc::bad_dtype);
  }
  try {
    (void)o.build<trainer<dcr::f32, codec::overwrite, codec::escape_u8>>(s1.view(), req, {}, mixed);
    FAIL("no error");
  } catch (const error& e) {
    CHECK(e.code() == errc::invalid_argument);
  }
  // Receiver: another dtype, another encoding, another location coding.
  auto payloads = o.build(s1.view(), req, {}, mixed);
  REQUIRE(!payloads.empty());
  receiver<identity_loader> r(identity_loader{}, plan->canonical);
  r.dense_refit(as_set(v0));
  decoded_payload d;
  REQUIRE(r.decode(payloads[0], d).ok());
  REQUIRE(!d.items.empty());
  CHECK(r.apply_item<rollout<dcr::bf16, codec::xor_mask, codec::escape_u8>>(d.items[0]).code ==
        errc::bad_dtype);
  CHECK(r.apply_item<rollout<dcr::f32, codec::overwrite, codec::escape_u8>>(d.items[0]).code ==
        errc::bad_encoding);
  decoded_payload v;
  auto varint = o.build(s1.view(), req, {}, [] {
    builder_options b;
    b.encoding.locations = codec::location_scheme::varint;
    return b;
  }());
  bool scattered = false;
  for (auto& p : varint) {
    decoded_payload all;
    REQUIRE(r.decode(p, all).ok());
    for (auto& it : all.items) scattered = scattered || !codec::run::can_encode(it.indices);
    if (!scattered) continue;
    CHECK(r.decode<stages::decode<codec::run_or<codec::escape_u8>>>(p, v).code ==
          errc::bad_location);
    break;
  }
  CHECK(scattered);
}
