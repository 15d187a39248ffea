// Receiver payload ingestion: staging with header/digest validation,
// deduplication by (attempt, owner, sequence), attempt fencing, failed
// attempts, and an all-overwrite retry repairing a partial XOR attempt.
#include <doctest/doctest.h>

#include <random>

#include "dcr/codec/payload.hpp"
#include "dcr/loaders/vllm_style.hpp"
#include "dcr/receiver/receiver.hpp"
#include "receiver/workload.hpp"

using namespace dcr;
using dcr::test::delta_mode;
using rx = receiver<loaders::vllm_style_loader>;

namespace {

struct fixture {
  model_config c = tiny_llama();
  std::vector<tensor_meta> metas = canonical_tensors(c);
  loaders::vllm_style_loader loader{c, loaders::vllm_tp_rank(2, 1)};
  tensor_set v = test::random_model(metas, 31);
  tensor_set v1 = [&] {
    auto x = test::clone(v);
    test::stress(x, 0.03, 0.05, 32);
    return x;
  }();

  /// Payloads of one attempt: items dealt round-robin to `owners`, `per` items per payload.
  std::vector<std::vector<std::byte>> payloads(std::uint64_t attempt, delta_mode mode,
                                               std::uint32_t owners = 3, std::size_t per = 4) {
    auto items = test::diff_items(v, v1, mode, [](const std::string&) { return true; });
    std::vector<std::vector<item>> by_owner(owners);
    for (std::size_t i = 0; i < items.size(); ++i) by_owner[i % owners].push_back(items[i]);
    std::vector<std::vector<std::byte>> out;
    for (std::uint32_t o = 0; o < owners; ++o)
      for (std::size_t k = 0, seq = 0; k < by_owner[o].size(); k += per, ++seq) {
        const auto n = std::min(per, by_owner[o].size() - k);
        out.push_back(encode_payload({attempt, 7, o, static_cast<std::uint32_t>(seq)},
                                     std::span<const item>(by_owner[o].data() + k, n)));
      }
    return out;
  }
  digest128 target() {
    rx r(loader, metas);
    r.dense_refit(v1);
    return r.state_digest();
  }
};

} // namespace

TEST_CASE("staged payloads in any order, duplicates suppressed, equal dense refit") {
  fixture f;
  for (auto mode : {delta_mode::xor_only, delta_mode::mixed, delta_mode::overwrite_only,
                    delta_mode::add_only}) {
    CAPTURE(static_cast<int>(mode));
    auto ps = f.payloads(1, mode);
    REQUIRE(ps.size() > 4);
    std::mt19937_64 rng(33);
    std::shuffle(ps.begin(), ps.end(), rng);
    rx r(f.loader, f.metas);
    r.dense_refit(f.v);
    r.begin_attempt(1);
    for (auto& p : ps) REQUIRE(r.stage(p).ok());
    for (auto& p : ps) CHECK(r.stage(p).code == errc::duplicate);
    CHECK(r.staged_count() == ps.size());
    // Half applied, then the duplicates of the applied half arrive again.
    REQUIRE(r.apply_staged().ok());
    for (std::size_t i = 0; i < ps.size(); i += 2) CHECK(r.stage(ps[i]).code == errc::duplicate);
    CHECK(r.staged_count() == 0);
    CHECK(r.apply_staged().ok());
    CHECK(r.state_digest() == f.target());
    CHECK(r.verify(f.v1).ok());
  }
}

TEST_CASE("attempt fencing: stale payloads refused, a newer attempt drops older staged payloads") {
  fixture f;
  auto a1 = f.payloads(1, delta_mode::xor_only);
  auto a2 = f.payloads(2, delta_mode::overwrite_only);
  rx r(f.loader, f.metas);
  r.dense_refit(f.v);
  r.begin_attempt(1);
  REQUIRE(r.stage(a1[0]).ok());
  REQUIRE(r.stage(a1[1]).ok());
  REQUIRE(r.stage(a2[0]).ok()); // attempt 2 starts: attempt 1's staged payloads are gone
  CHECK(r.attempt() == 2);
  CHECK(r.staged_count() == 1);
  auto s = r.stage(a1[2]);
  CHECK(s.code == errc::stale_attempt);
  CHECK(s.message.find("attempt 1") != std::string::npos);
  r.begin_attempt(1); // older: ignored
  CHECK(r.attempt() == 2);
  for (std::size_t i = 1; i < a2.size(); ++i) REQUIRE(r.stage(a2[i]).ok());
  REQUIRE(r.apply_staged().ok());
  CHECK(r.state_digest() == f.target());
}

TEST_CASE("corrupt payloads are refused at staging with the decoder's error") {
  fixture f;
  auto ps = f.payloads(1, delta_mode::xor_only);
  rx r(f.loader, f.metas);
  auto bad = ps[0];
  bad.back() ^= std::byte{1};
  CHECK(r.stage(bad).code == errc::digest_mismatch);
  bad = ps[0];
  bad[0] = std::byte{0};
  CHECK(r.stage(bad).code == errc::bad_magic);
  CHECK(r.stage(std::span(ps[0]).first(10)).code == errc::truncated);
  CHECK(r.staged_count() == 0);
  CHECK(r.stage(ps[0]).ok()); // the intact payload was never marked as seen
}

TEST_CASE(
    "a failed attempt refuses further payloads; an all-overwrite retry repairs partial writes") {
  fixture f;
  auto a1 = f.payloads(1, delta_mode::xor_only);
  // A payload whose item names a tensor this rank does not know fails the apply.
  item stray;
  stray.tensor = {"model.unknown.weight", {4}, dtype_id::bf16};
  stray.encoding = value_encoding::overwrite;
  stray.indices = {1};
  stray.values = {std::byte{1}, std::byte{2}};
  auto poison = encode_payload({1, 7, 9, 0}, std::span<const item>(&stray, 1));
  rx r(f.loader, f.metas);
  r.dense_refit(f.v);
  for (std::size_t i = 0; i < a1.size() / 2; ++i) REQUIRE(r.stage(a1[i]).ok());
  REQUIRE(r.stage(poison).ok());
  for (std::size_t i = a1.size() / 2; i < a1.size(); ++i) REQUIRE(r.stage(a1[i]).ok());
  auto s = r.apply_staged();
  CHECK(s.code == errc::not_found);
  CHECK(s.message.find("owner 9") != std::string::npos);
  CHECK(r.attempt_failure().code == errc::not_found);
  CHECK(r.state_digest() != f.target()); // partial: half the XOR payloads landed
  CHECK(r.stage(a1[0]).code == errc::aborted);
  CHECK(r.apply_staged().code == errc::aborted);
  // Retry as attempt 2 with every record an absolute overwrite.
  r.begin_attempt(2);
  for (auto& p : f.payloads(2, delta_mode::overwrite_only)) REQUIRE(r.stage(p).ok());
  REQUIRE(r.apply_staged().ok());
  CHECK(r.state_digest() == f.target());
}

TEST_CASE("apply_staged decodes every payload into one reused buffer: no entry of an earlier "
          "payload reaches a later item") {
  // Attempt 1 applies large items (dense changes, 8 items a payload); attempt
  // 2 small ones (2 items a payload, few changes, skipped tensors of this TP
  // rank among them): the decode buffer's items shrink from payload to
  // payload. Any index or value left over from an earlier payload would
  // change storage where the later version does not: storage and digest
  // must equal dense refits of each version.
  fixture f;
  tensor_set v2 = test::clone(f.v1);
  test::stress(v2, 0.002, 0.05, 33);
  auto payloads = [&](const tensor_set& from, const tensor_set& to, std::uint64_t attempt,
                      delta_mode mode, std::size_t per) {
    auto items = test::diff_items(from, to, mode, [](const std::string&) { return true; });
    std::vector<std::vector<std::byte>> out;
    for (std::size_t k = 0, seq = 0; k < items.size(); k += per, ++seq)
      out.push_back(
          encode_payload({attempt, 7, 0, static_cast<std::uint32_t>(seq)},
                         std::span<const item>(items.data() + k, std::min(per, items.size() - k))));
    return out;
  };
  for (auto mode : {delta_mode::xor_only, delta_mode::mixed, delta_mode::overwrite_only}) {
    CAPTURE(static_cast<int>(mode));
    rx r(f.loader, f.metas), ref(f.loader, f.metas);
    r.dense_refit(f.v);
    for (auto& p : payloads(f.v, f.v1, 1, mode, 8)) REQUIRE(r.stage(p).ok());
    REQUIRE(r.apply_staged().ok());
    ref.dense_refit(f.v1);
    CHECK(first_difference(r.storage(), ref.storage()) == "");
    const auto small = payloads(f.v1, v2, 2, mode, 2);
    REQUIRE(small.size() > 2);
    for (auto& p : small) REQUIRE(r.stage(p).ok());
    REQUIRE(r.apply_staged().ok());
    ref.dense_refit(v2);
    CHECK(first_difference(r.storage(), ref.storage()) == "");
    CHECK(r.state_digest() == ref.state_digest());
    CHECK(r.check_state_digest().ok());
  }
}
