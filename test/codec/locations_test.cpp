#include <doctest/doctest.h>

#include <random>

#include "codec/fixtures.hpp"
#include "dcr/codec/locations.hpp"

using namespace dcr;
using namespace dcr::codec;

namespace {

const location_id all_ids[] = {
    location_id::run,     location_id::gap_u8,     location_id::gap_u16,    location_id::gap_u32,
    location_id::gap_u64, location_id::planes_u16, location_id::planes_u32, location_id::planes_u64,
    location_id::varint,  location_id::escape_u8};

bool can_encode(location_id id, std::span<const std::uint64_t> idx) {
  return visit_location(id, [&](auto c) { return decltype(c)::can_encode(idx); });
}

// Law: decode(encode(idx)) == idx for every coding that can encode idx.
void check_round_trip(std::span<const std::uint64_t> idx, std::uint64_t numel) {
  REQUIRE(!idx.empty());
  for (auto id : all_ids) {
    if (!can_encode(id, idx)) continue;
    std::vector<std::byte> bytes;
    encode_locations(id, idx, bytes);
    std::vector<std::uint64_t> back(idx.size());
    auto s = decode_locations(id, bytes, idx[0], numel, back);
    INFO(to_string(id), " n=", idx.size());
    REQUIRE_MESSAGE(s.ok(), s.message);
    CHECK(std::equal(back.begin(), back.end(), idx.begin(), idx.end()));
  }
}

} // namespace

TEST_CASE("every location coding round-trips random index sets over densities") {
  std::mt19937_64 rng(1234);
  for (double density : {0.001, 0.01, 0.05, 0.3, 0.9, 1.0})
    for (std::uint64_t numel : {1ull, 2ull, 17ull, 300ull, 70000ull}) {
      auto idx = test::random_indices(rng, numel, density);
      if (idx.empty()) idx.push_back(numel - 1);
      check_round_trip(idx, numel);
    }
}

TEST_CASE("runs, single indices and gap extremes round-trip") {
  std::mt19937_64 rng(99);
  for (int r = 0; r < 50; ++r) {
    auto idx = test::random_indices(rng, 1000, 0, true);
    CHECK(choose_location(idx, location_scheme::planes) == location_id::run);
    check_round_trip(idx, 1000);
  }
  const std::uint64_t top = ~std::uint64_t{0};
  // Gap widths exactly at each word's limit and one beyond.
  for (std::uint64_t g :
       {0xFFull, 0x100ull, 0xFFFFull, 0x10000ull, 0xFFFFFFFFull, 0x100000000ull}) {
    std::vector<std::uint64_t> idx = {5, 5 + g + 1, 5 + 2 * (g + 1)};
    check_round_trip(idx, top);
  }
  // The largest gap a 64-bit index space allows: 0 then top - 1.
  std::vector<std::uint64_t> idx = {0, top - 1};
  check_round_trip(idx, top);
  CHECK(choose_location(idx, location_scheme::gaps) == location_id::gap_u64);
  CHECK(choose_location(idx, location_scheme::planes) == location_id::planes_u64);
  std::vector<std::uint64_t> one = {top - 1};
  check_round_trip(one, top);
}

TEST_CASE("choose_location picks the smallest word that holds the largest gap") {
  std::mt19937_64 rng(5);
  for (int r = 0; r < 200; ++r) {
    std::uint64_t shift = rng() % 40;
    std::vector<std::uint64_t> idx = {0};
    const int n = 2 + static_cast<int>(rng() % 20);
    for (int k = 1; k < n; ++k) idx.push_back(idx.back() + 1 + (rng() >> (24 + shift)));
    std::uint64_t m = 0;
    for (std::size_t k = 1; k < idx.size(); ++k) m = std::max(m, idx[k] - idx[k - 1] - 1);
    const auto id = choose_location(idx, location_scheme::gaps);
    if (run::can_encode(idx)) {
      CHECK(id == location_id::run);
      continue;
    }
    const std::uint64_t want = m <= 0xFF ? 1 : m <= 0xFFFF ? 2 : m <= 0xFFFFFFFFull ? 4 : 8;
    std::vector<std::byte> bytes;
    encode_locations(id, idx, bytes);
    CHECK(bytes.size() == want * (idx.size() - 1));
  }
}

TEST_CASE("gap decoders reject wrong lengths, out-of-range and overflowing indices") {
  std::vector<std::uint64_t> out(3);
  std::vector<std::byte> two_u16(4, std::byte{0});
  // Length must be exactly (count - 1) words.
  for (std::size_t len : {0, 3, 5, 8}) {
    std::vector<std::byte> b(len);
    CHECK(decode_locations(location_id::gap_u16, b, 0, 100, out).code == errc::bad_location);
    CHECK(decode_locations(location_id::planes_u16, b, 0, 100, out).code == errc::bad_location);
  }
  CHECK(decode_locations(location_id::gap_u16, two_u16, 0, 3, out).ok());
  CHECK(decode_locations(location_id::gap_u16, two_u16, 0, 2, out).code ==
        errc::index_out_of_range);
  CHECK(decode_locations(location_id::gap_u16, two_u16, 5, 3, out).code ==
        errc::index_out_of_range);
  // Gaps that wrap around 2^64 must not pass as small indices.
  std::vector<std::byte> wrap(16, std::byte{0xFF});
  auto s = decode_locations(location_id::gap_u64, wrap, 3, ~std::uint64_t{0}, out);
  CHECK(s.code == errc::index_out_of_range);
  CHECK(s.message.find("location 1") != std::string::npos);
  // Runs carry no bytes and must fit the tensor.
  std::vector<std::byte> one(1);
  CHECK(decode_locations(location_id::run, one, 0, 10, out).code == errc::bad_location);
  CHECK(decode_locations(location_id::run, {}, 7, 10, out).ok());
  CHECK(decode_locations(location_id::run, {}, 8, 10, out).code == errc::index_out_of_range);
  CHECK(
      decode_locations(location_id::run, {}, ~std::uint64_t{0} - 1, ~std::uint64_t{0}, out).code ==
      errc::index_out_of_range);
}

TEST_CASE("varint and escape decoders reject malformed, non-minimal and trailing bytes") {
  std::vector<std::uint64_t> out(2);
  auto bytes = [](std::initializer_list<int> l) {
    std::vector<std::byte> b;
    for (int x : l) b.push_back(static_cast<std::byte>(x));
    return b;
  };
  CHECK(decode_locations(location_id::varint, bytes({0x05}), 0, 10, out).ok());
  CHECK(out[1] == 6);
  CHECK(decode_locations(location_id::varint, bytes({0x85}), 0, 10, out).code ==
        errc::bad_location);
  CHECK(decode_locations(location_id::varint, bytes({0x85, 0x00}), 0, 1000, out).code ==
        errc::bad_location);
  CHECK(decode_locations(location_id::varint, bytes({0x05, 0x00}), 0, 10, out).code ==
        errc::bad_location);
  CHECK(decode_locations(location_id::varint, bytes({}), 0, 10, out).code == errc::bad_location);
  CHECK(decode_locations(location_id::varint, bytes({0x09}), 0, 10, out).code ==
        errc::index_out_of_range);
  CHECK(decode_locations(location_id::varint, bytes({0x01}), 10, 10, out).code ==
        errc::index_out_of_range);
  // Eleven bytes or a tenth byte above 1 do not fit 64 bits.
  CHECK(decode_locations(location_id::varint,
                         bytes({0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x02}), 0,
                         ~0ull, out)
            .code == errc::bad_location);
  CHECK(decode_locations(location_id::escape_u8, bytes({0xFE}), 0, 300, out).ok());
  CHECK(out[1] == 255);
  CHECK(decode_locations(location_id::escape_u8, bytes({0xFF, 0x00}), 0, 300, out).ok());
  CHECK(out[1] == 256);
  CHECK(decode_locations(location_id::escape_u8, bytes({0xFF}), 0, 300, out).code ==
        errc::bad_location);
  CHECK(decode_locations(location_id::escape_u8, bytes({0xFF, 0x80, 0x00}), 0, 1000, out).code ==
        errc::bad_location);
  CHECK(decode_locations(location_id::escape_u8, bytes({}), 0, 300, out).code ==
        errc::bad_location);
  CHECK(decode_locations(location_id::escape_u8, bytes({1, 2}), 0, 300, out).code ==
        errc::bad_location);
  CHECK(decode_locations(location_id::escape_u8, bytes({0xFF, 0x00}), 0, 256, out).code ==
        errc::index_out_of_range);
  // Blocks of eight plain gaps take a fast path: its range check must name the location.
  std::vector<std::uint64_t> nine(9);
  auto s = decode_locations(location_id::escape_u8, bytes({0, 0, 0, 0, 0, 0, 0, 0}), 0, 5, nine);
  CHECK(s.code == errc::index_out_of_range);
  CHECK(s.message.find("location 5") != std::string::npos);
  CHECK(decode_locations(location_id::escape_u8, bytes({0, 0, 0, 0, 0, 0, 0, 0}), 0, 9, nine).ok());
  CHECK(nine[8] == 8);
  CHECK(decode_locations(location_id::escape_u8, bytes({0, 0, 0, 0, 0, 0, 0, 0, 0}), 0, 99, nine)
            .code == errc::bad_location);
  std::vector<std::uint64_t> wrap(9);
  CHECK(decode_locations(location_id::escape_u8, bytes({9, 9, 9, 9, 9, 9, 9, 9}), ~0ull - 20, ~0ull,
                         wrap)
            .code == errc::index_out_of_range);
}

TEST_CASE("location ids are closed: known ids decode, unknown ones are rejected") {
  for (int raw = 0; raw < 256; ++raw) {
    bool listed = false;
    for (auto id : all_ids) listed |= static_cast<int>(id) == raw;
    CHECK(is_known_location(static_cast<std::uint8_t>(raw)) == listed);
  }
}

// The location_coding laws, instantiated for every model.
TEST_CASE_TEMPLATE("location_coding laws hold for every model", C, run, gap_u8, gap_u16, gap_u32,
                   gap_u64, planes_u16, planes_u32, planes_u64, varint_gaps, escape_u8) {
  static_assert(location_coding<C>);
  std::mt19937_64 rng(static_cast<std::uint64_t>(C::id) * 7919);
  int checked = 0;
  for (int r = 0; r < 300; ++r) {
    const std::uint64_t numel = 1 + rng() % 5000;
    auto idx =
        test::random_indices(rng, numel, std::array{0.002, 0.02, 0.3, 1.0}[r % 4], r % 5 == 0);
    if (idx.empty() || !C::can_encode(idx)) continue;
    std::vector<std::byte> bytes;
    C::encode(idx, bytes);
    std::vector<std::uint64_t> back(idx.size());
    // decode(encode(idx)) == idx ...
    REQUIRE(C::decode(bytes, idx[0], numel, back).ok());
    CHECK(back == idx);
    // ... and a tensor one element too small is always rejected.
    CHECK(C::decode(bytes, idx[0], idx.back(), back).code == errc::index_out_of_range);
    // Appending a byte is never accepted as the same item.
    bytes.push_back(std::byte{0});
    CHECK_FALSE(C::decode(bytes, idx[0], numel, back).ok());
    ++checked;
  }
  CHECK(checked > 50);
  std::vector<std::uint64_t> none;
  CHECK(C::decode({}, 0, 10, none).code == errc::invalid_argument);
}
