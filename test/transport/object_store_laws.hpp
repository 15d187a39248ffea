#pragma once
// The object_store laws, shared by the test of every backend (memory and
// filesystem in object_store_test.cpp, S3 in test/s3/). `check_laws` expects
// an empty store and leaves objects behind.
#include <doctest/doctest.h>

#include <algorithm>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dcr/transport/object_store.hpp"

namespace dcr::test_transport {

using namespace dcr::transport;

inline std::vector<std::byte> bytes_of(std::string_view s) {
  auto b = std::as_bytes(std::span(s));
  return {b.begin(), b.end()};
}

inline std::vector<std::byte> random_bytes(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::byte> v(n);
  for (auto& b : v) b = static_cast<std::byte>(rng());
  return v;
}

inline const std::vector<std::string> bad_names = {
    "",           "/abs",
    "a//b",       "a/",
    "../x",       "a/../b",
    "a/./b",      ".hidden",
    "a/.tmp.1.x", "sp ace",
    "a\\b",       std::string("nul\0x", 5),
    "ü",          std::string(max_object_name + 1, 'a')};

template <class Store>
void check_laws(Store& s) {
  std::vector<std::byte> out;
  std::vector<std::string> names;
  CHECK(s.get("nope", out).code == errc::not_found);
  CHECK(s.remove("nope").code == errc::not_found);
  REQUIRE(s.list("", names).ok());
  CHECK(names.empty());

  // put/get round trip, for every size class including empty.
  std::vector<std::string> put_names;
  for (std::size_t n : {0u, 1u, 17u, 70000u}) {
    auto name = "dir/sub-" + std::to_string(n) + "/obj_" + std::to_string(n) + ".bin";
    auto data = random_bytes(n, n);
    REQUIRE(s.put(name, data).ok());
    REQUIRE(s.get(name, out).ok());
    CHECK(out == data);
    put_names.push_back(name);
  }
  // Replacing is allowed and atomic; the new bytes win.
  REQUIRE(s.put(put_names[1], bytes_of("replaced")).ok());
  REQUIRE(s.get(put_names[1], out).ok());
  CHECK(out == bytes_of("replaced"));

  REQUIRE(s.put("other/x", bytes_of("x")).ok());
  REQUIRE(s.put("dirty", bytes_of("y")).ok());
  REQUIRE(s.list("dir/", names).ok());
  auto want = put_names;
  std::sort(want.begin(), want.end());
  CHECK(names == want);
  // A plain string prefix, as in S3: "dir" also matches "dirty".
  REQUIRE(s.list("dir", names).ok());
  CHECK(names.size() == want.size() + 1);
  REQUIRE(s.list("", names).ok());
  CHECK(names.size() == want.size() + 2);
  CHECK(std::is_sorted(names.begin(), names.end()));
  REQUIRE(s.list("dir/sub-1", names).ok());
  CHECK(names.size() == 2); // sub-1 and sub-17

  // Names after a given one (the store's own list_after where it has one,
  // S3's start-after): exactly the tail of the full listing.
  for (std::size_t k = 0; k < want.size(); ++k) {
    INFO("after " << want[k]);
    REQUIRE(transport::list_names_after(s, "dir/", want[k], names).ok());
    CHECK(names ==
          std::vector<std::string>(want.begin() + static_cast<std::ptrdiff_t>(k) + 1, want.end()));
  }
  REQUIRE(transport::list_names_after(s, "dir/", "", names).ok());
  CHECK(names == want);
  REQUIRE(transport::list_names_after(s, "dir", "dir/zzz", names).ok());
  CHECK(names == std::vector<std::string>{"dirty"});

  REQUIRE(s.remove(put_names[0]).ok());
  CHECK(s.get(put_names[0], out).code == errc::not_found);
  CHECK(s.remove(put_names[0]).code == errc::not_found);
  REQUIRE(s.list("dir/", names).ok());
  CHECK(names.size() == want.size() - 1);

  for (auto& bad : bad_names) {
    INFO(bad);
    CHECK(s.put(bad, bytes_of("z")).code == errc::invalid_argument);
    CHECK(s.get(bad, out).code == errc::invalid_argument);
    CHECK(s.remove(bad).code == errc::invalid_argument);
  }
  CHECK(s.list("../", names).code == errc::invalid_argument);
  CHECK(s.list("a//", names).code == errc::invalid_argument);
}

} // namespace dcr::test_transport
