#pragma once
// The laws of dcr::protocol::commit_store (include/dcr/protocol/commit_store.hpp),
// checked for every model: the memory and file stores in commit_store_test.cpp,
// the etcd store in test/etcd/.
#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <string>

#include "dcr/protocol/commit_store.hpp"

namespace dcr::test_laws {

using namespace dcr::protocol;

/// A record with 0-4 receivers (some ids with spaces), all fields from `seed`.
inline commit_record sample_record(std::uint64_t version, std::uint64_t attempt,
                                   std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  commit_record k;
  k.version = version;
  k.attempt = attempt;
  for (auto& b : k.source_baseline) b = static_cast<std::uint8_t>(rng());
  const auto n = rng() % 5;
  for (std::uint64_t i = 0; i < n; ++i) {
    receiver_ack a;
    a.receiver = "rank-" + std::to_string(i) + (i % 2 ? " with spaces" : "");
    for (auto& b : a.state) b = static_cast<std::uint8_t>(rng());
    k.receivers.push_back(a);
  }
  k.time_unix_ns = rng();
  digest128 inc{};
  for (auto& b : inc) b = static_cast<std::uint8_t>(rng());
  k.incarnation = to_hex(inc);
  return k;
}

/// Every law on a fresh (never written) store `s`.
template <commit_store Store>
void check_laws(Store& s) {
  stored_record r;
  REQUIRE(s.load(r).ok());
  CHECK(r == stored_record{});

  std::uint64_t e1 = 0, e2 = 0;
  REQUIRE(s.take_over(e1).ok());
  REQUIRE(s.take_over(e2).ok());
  CHECK(e2 > e1);

  // A fenced coordinator's prepare is a conflict and changes nothing.
  std::uint64_t a = 0;
  REQUIRE(s.load(r).ok());
  auto before = r;
  auto st = s.prepare(e1, a);
  CHECK(st.code == errc::conflict);
  REQUIRE(s.load(r).ok());
  CHECK(r == before);

  std::uint64_t a1 = 0, a2 = 0;
  REQUIRE(s.prepare(e2, a1).ok());
  REQUIRE(s.prepare(e2, a2).ok());
  CHECK(a2 > a1);

  const auto k = sample_record(1, a2, 7);
  // Every wrong argument is a conflict and changes nothing.
  REQUIRE(s.load(r).ok());
  before = r;
  CHECK(s.compare_and_set(e1, a2, 0, k).code == errc::conflict); // fenced coordinator
  CHECK(s.compare_and_set(e2, a1, 0, k).code == errc::conflict); // replaced attempt
  CHECK(s.compare_and_set(e2, a2, 1, k).code == errc::conflict); // wrong revision
  REQUIRE(s.load(r).ok());
  CHECK(r == before);

  REQUIRE(s.compare_and_set(e2, a2, 0, k).ok());
  REQUIRE(s.load(r).ok());
  CHECK(r.record == k);
  CHECK(r.revision == 1);
  CHECK(r.epoch == e2);
  CHECK(r.attempt == a2);
  // The same expected revision cannot win twice.
  CHECK(s.compare_and_set(e2, a2, 0, sample_record(2, a2, 8)).code == errc::conflict);
  const auto k2 = sample_record(2, a2, 9);
  REQUIRE(s.compare_and_set(e2, a2, 1, k2).ok());
  REQUIRE(s.load(r).ok());
  CHECK(r.record == k2);
  CHECK(r.revision == 2);
}

} // namespace dcr::test_laws
