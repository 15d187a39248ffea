// Receivers do not expand the items of tensors their plan skips (experts of
// another EP rank): storage still equals a dense refit and an apply without
// skipping byte for byte, and a payload that is invalid in a skipped item is
// refused exactly as before, at stage or at apply.
#include <doctest/doctest.h>

#include <algorithm>
#include <random>

#include "codec/fixtures.hpp"
#include "dcr/codec/payload.hpp"
#include "dcr/loaders/vllm_style.hpp"
#include "dcr/receiver/receiver.hpp"
#include "receiver/refit_check.hpp"
#include "receiver/workload.hpp"

using namespace dcr;
using dcr::test::delta_mode;
using rx = receiver<loaders::vllm_style_loader>;

namespace {

struct moe_fixture {
  model_config c = tiny_qwen3_moe();
  std::vector<tensor_meta> metas = canonical_tensors(c);
  std::vector<loaders::vllm_style_loader> ranks =
      test::all_ranks(c, test::vllm_deployment(2, 1, 2, true));
  tensor_set v = test::random_model(metas, 51);
  tensor_set v1 = [&] {
    auto x = test::clone(v);
    test::stress(x, 0.04, 0.05, 52);
    return x;
  }();

  /// The delta v -> v1 as payloads of attempt `attempt`, `per` shuffled items each.
  std::vector<std::vector<std::byte>> payloads(std::uint64_t attempt, delta_mode mode,
                                               std::size_t per = 5) {
    auto items = test::diff_items(
        v, v1, mode, [](const std::string&) { return true; }, 2);
    std::mt19937_64 rng(53);
    std::shuffle(items.begin(), items.end(), rng);
    std::vector<std::vector<std::byte>> out;
    for (std::size_t k = 0, seq = 0; k < items.size(); k += per, ++seq)
      out.push_back(
          encode_payload({attempt, 1, 0, static_cast<std::uint32_t>(seq)},
                         std::span<const item>(items.data() + k, std::min(per, items.size() - k))));
    return out;
  }
};

/// The first scattered item of a tensor `r` skips, from the delta v -> v1.
item skipped_item(moe_fixture& f, const rx& r) {
  for (auto& it : test::diff_items(f.v, f.v1, delta_mode::overwrite_only,
                                   [](const std::string&) { return true; }))
    if (!r.holds(it.tensor.name) && it.indices.size() > 2 &&
        it.indices.back() - it.indices.front() >= it.indices.size())
      return it;
  FAIL("no scattered item of a skipped tensor");
  return {};
}

/// One item of a tensor `r` holds.
item held_item(moe_fixture& f, const rx& r) {
  for (auto& it : test::diff_items(f.v, f.v1, delta_mode::overwrite_only,
                                   [](const std::string&) { return true; }))
    if (r.holds(it.tensor.name)) return it;
  FAIL("no item of a held tensor");
  return {};
}

} // namespace

TEST_CASE("skipping items of tensors a rank stores nothing of: storage equals dense refit and a "
          "full apply") {
  moe_fixture f;
  for (auto mode : {delta_mode::mixed, delta_mode::overwrite_only}) {
    const auto ps = f.payloads(1, mode);
    REQUIRE(ps.size() > 3);
    for (std::size_t k = 0; k < f.ranks.size(); ++k) {
      INFO("rank " << k << " mode " << static_cast<int>(mode));
      rx ref(f.ranks[k], f.metas);
      ref.dense_refit(f.v1);
      // Reference apply: every item fully decoded and applied (nothing skipped).
      rx full(f.ranks[k], f.metas);
      full.dense_refit(f.v);
      std::uint64_t rejected_entries = 0;
      for (auto& p : ps) {
        decoded_payload d, s;
        REQUIRE(decode_payload(p, d).ok());
        REQUIRE(full.apply_items(d.items).ok());
        // What this rank decodes: skipped tensors' items without entries, all others unchanged.
        REQUIRE(full.decode(p, s).ok());
        REQUIRE(s.items.size() == d.items.size());
        for (std::size_t i = 0; i < d.items.size(); ++i) {
          if (full.holds(d.items[i].tensor.name)) {
            CHECK(s.items[i] == d.items[i]);
          } else {
            CHECK(s.items[i].tensor == d.items[i].tensor);
            CHECK(s.items[i].indices.empty());
            CHECK(s.items[i].values.empty());
            rejected_entries += d.items[i].indices.size();
          }
        }
      }
      CHECK(rejected_entries > 0); // every rank of EP 4 skips three quarters of the experts
      for (bool decode_now : {false, true}) {
        INFO("decode_now " << decode_now);
        rx r(f.ranks[k], f.metas);
        r.dense_refit(f.v);
        r.begin_attempt(1);
        for (auto& p : ps)
          REQUIRE(r.stage(p, {.decode_now = decode_now, .exact_attempt = true}).ok());
        auto st = r.apply_staged();
        REQUIRE_MESSAGE(st.ok(), st.message);
        CHECK(r.applied_payloads() == ps.size());
        CHECK(first_difference(r.storage(), ref.storage()) == "");
        CHECK(first_difference(r.storage(), full.storage()) == "");
        CHECK(r.state_digest() == ref.state_digest());
      }
    }
  }
}

TEST_CASE("a corrupt location range in a skipped tensor's item refuses the whole payload") {
  moe_fixture f;
  rx probe(f.ranks[0], f.metas);
  std::vector<item> items = {held_item(f, probe), skipped_item(f, probe)};
  const auto good = encode_payload(
      {1, 1, 0, 0}, items, {1, codec::location_scheme::varint, codec::value_filter::byte_planes});
  auto o = test::open_payload(good);
  // Varint bytes of the skipped item that never end: the location decoder refuses them.
  decoded_payload d;
  REQUIRE(decode_payload(good, d).ok());
  auto body = o.body;
  codec::payload_info pi;
  REQUIRE(codec::inspect_payload(good, pi).ok());
  const auto& row = pi.rows[1];
  REQUIRE(row.location == codec::location_id::varint);
  REQUIRE(row.location_length > 0);
  const auto loc_at = pi.header.table_length + row.location_offset;
  for (std::uint64_t b = 0; b < row.location_length; ++b) body[loc_at + b] = std::byte{0x80};
  const auto bad = test::seal(o.fields, body);
  decoded_payload ignored;
  const status expected = decode_payload(bad, ignored);
  REQUIRE(expected.code == errc::bad_location);
  REQUIRE(expected.message.find("item 1") != std::string::npos);

  // Staged as bytes: refused when apply_staged decodes it, nothing of the payload applied.
  rx r(f.ranks[0], f.metas);
  r.dense_refit(f.v);
  const auto before = r.state_digest();
  REQUIRE(r.stage(bad).ok()); // header and digest are intact
  auto s = r.apply_staged();
  CHECK(s.code == expected.code);
  CHECK(s.message.find(expected.message) != std::string::npos);
  CHECK(r.state_digest() == before);

  // Decoded at stage: refused there, not marked as seen, so the intact payload still stages.
  rx q(f.ranks[0], f.metas);
  q.dense_refit(f.v);
  q.begin_attempt(1);
  const stage_policy now{.decode_now = true, .exact_attempt = true};
  s = q.stage(bad, now);
  CHECK(s.code == expected.code);
  CHECK(s.message == expected.message);
  CHECK(q.staged_count() == 0);
  REQUIRE(q.stage(good, now).ok());
  REQUIRE(q.apply_staged().ok());
  rx full(f.ranks[0], f.metas);
  full.dense_refit(f.v);
  REQUIRE(full.apply_items(d.items).ok());
  CHECK(first_difference(q.storage(), full.storage()) == "");
}

TEST_CASE("an item of a skipped tensor with another dtype or shape fails the apply as before") {
  moe_fixture f;
  rx probe(f.ranks[0], f.metas);
  for (int which : {0, 1}) {
    item it = skipped_item(f, probe);
    if (which == 0) {
      it.tensor.dtype = dtype_id::f16; // same width: the values still fit
    } else {
      it.tensor.shape = {it.tensor.numel()};
    }
    const auto p = encode_payload({1, 1, 0, 0}, std::span<const item>(&it, 1));
    rx full(f.ranks[0], f.metas);
    decoded_payload d;
    REQUIRE(decode_payload(p, d).ok());
    const status expected = full.apply_items(d.items);
    CHECK(expected.code == (which == 0 ? errc::bad_dtype : errc::shape_mismatch));
    for (bool decode_now : {false, true}) {
      rx q(f.ranks[0], f.metas);
      REQUIRE(q.stage(p, {.decode_now = decode_now}).ok());
      const status s = q.apply_staged();
      CHECK(s.code == expected.code);
      CHECK(s.message.find(expected.message) != std::string::npos);
    }
  }
}

namespace {
/// Skips tensor "b" at prewarm; at apply, while `*forget` is set, neither
/// skips nor copies it (leaves its planned path).
struct forgetful_loader {
  bool* forget = nullptr;
  void declare(parameter_store& s, std::span<const tensor_meta>) {
    s.add("pa", {8}, dtype_id::bf16);
  }
  load_report load(std::string_view name, const tensor_view& src, parameter_store& s,
                   copy_sink& sink) {
    if (name == "a") {
      sink.copy(s.view("pa"), src);
      return {{"pa"}};
    }
    if (!*forget) sink.skip(name);
    return {};
  }
};
static_assert(native_loader<forgetful_loader>);
} // namespace

TEST_CASE("the loader still reruns for a skipped tensor's item and must repeat its skip") {
  bool forget = false;
  const std::vector<tensor_meta> metas = {{"a", {8}, dtype_id::bf16}, {"b", {64}, dtype_id::bf16}};
  receiver<forgetful_loader> r(forgetful_loader{&forget}, metas);
  REQUIRE(r.plan().find("b")->skipped);
  item it;
  it.tensor = metas[1];
  it.encoding = value_encoding::xor_mask;
  it.indices = {2, 30, 63};
  it.values.assign(6, std::byte{0x11});
  const auto p1 = encode_payload({1, 1, 0, 0}, std::span<const item>(&it, 1));
  const auto p2 = encode_payload({1, 1, 0, 1}, std::span<const item>(&it, 1));
  REQUIRE(r.stage(p1).ok());
  CHECK(r.apply_staged().ok());
  forget = true;
  REQUIRE(r.stage(p2).ok());
  const auto s = r.apply_staged();
  CHECK(s.code == errc::loader_condition);
  CHECK(s.message.find("tensor b: loader did not repeat its skip") != std::string::npos);
}
