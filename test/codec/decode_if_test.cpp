// decode_payload_if: items the predicate rejects come back without entries,
// and every payload is accepted or refused exactly as decode_payload decides
// (same code, same message), wherever the corruption lies.
#include <doctest/doctest.h>

#include <random>

#include "codec/fixtures.hpp"
#include "dcr/codec/payload.hpp"

using namespace dcr;
using namespace dcr::codec;
using dcr::test::make_item;

namespace {

/// Items "t0".."t{n-1}" of random dtype, shape, density and encoding.
std::vector<item> named_items(std::mt19937_64& rng, int n) {
  const dtype_id dtypes[] = {dtype_id::bf16, dtype_id::f16, dtype_id::f32, dtype_id::f8e4m3fn};
  std::vector<item> items;
  for (int i = 0; i < n; ++i) {
    const std::uint64_t rows = 1 + rng() % 30, cols = 1 + rng() % 30;
    const double density = std::array{0.0, 0.02, 0.3, 1.0}[rng() % 4];
    auto idx = test::random_indices(rng, rows * cols, density, rng() % 5 == 0);
    std::string name = "t"; // appended, not "t" + ...: GCC 12's -O3 -Wrestrict misfires on that
    name += std::to_string(i);
    items.push_back(make_item(std::move(name), {rows, cols}, dtypes[rng() % 4],
                              rng() % 2 ? value_encoding::xor_mask : value_encoding::overwrite,
                              std::move(idx), rng));
  }
  return items;
}

/// Rejects the tensors whose name ends in an odd digit.
bool keep_even(const item_row& row) { return (row.tensor.name.back() - '0') % 2 == 0; }

/// `decode_payload_if` under `keep` gives exactly the status `decode_payload` gives.
template <class Keep>
void check_same_verdict(std::span<const std::byte> bytes, Keep keep) {
  decoded_payload full, some;
  const status a = decode_payload(bytes, full);
  const status b = decode_payload_if(bytes, some, keep);
  CHECK(a.code == b.code);
  CHECK(a.message == b.message);
}

} // namespace

TEST_CASE(
    "decode_payload_if: kept items as decode_payload gives them, rejected ones without entries") {
  std::mt19937_64 rng(41);
  for (int r = 0; r < 20; ++r) {
    auto items = named_items(rng, 1 + static_cast<int>(rng() % 6));
    encode_options opt;
    opt.locations = std::array{location_scheme::gaps, location_scheme::planes,
                               location_scheme::varint, location_scheme::escape_u8}[rng() % 4];
    const auto bytes = encode_payload({3, 4, 5, 6}, items, opt);
    decoded_payload full, some;
    REQUIRE(decode_payload(bytes, full).ok());
    std::size_t asked = 0;
    REQUIRE(decode_payload_if(bytes, some, [&](const item_row& row) {
              ++asked;
              return keep_even(row);
            }).ok());
    CHECK(asked == items.size()); // one question per item, in table order
    CHECK(some.id == full.id);
    REQUIRE(some.items.size() == full.items.size());
    for (std::size_t i = 0; i < items.size(); ++i) {
      INFO("item " << i);
      CHECK(some.items[i].tensor == full.items[i].tensor);
      CHECK(some.items[i].encoding == full.items[i].encoding);
      if (i % 2 == 0) {
        CHECK(some.items[i] == full.items[i]);
      } else {
        CHECK(some.items[i].indices.empty());
        CHECK(some.items[i].values.empty());
      }
    }
    decoded_payload all;
    REQUIRE(decode_payload_if(bytes, all, [](const item_row&) { return true; }).ok());
    CHECK(all == full);
  }
}

TEST_CASE("decode_payload_if: a corrupt location range of a rejected item is refused like "
          "decode_payload refuses it") {
  std::mt19937_64 rng(42);
  // Item 1 ("t1", rejected by keep_even) is scattered: its gap bytes follow item 0's run.
  std::vector<item> items = {
      make_item("t0", {4, 8}, dtype_id::bf16, value_encoding::xor_mask, {3, 4, 5}, rng),
      make_item("t1", {100}, dtype_id::f32, value_encoding::overwrite, {1, 7, 50, 99}, rng),
      make_item("t2", {10}, dtype_id::bf16, value_encoding::overwrite, {0, 9}, rng)};
  const auto good =
      encode_payload({}, items, {1, location_scheme::gaps, value_filter::byte_planes});
  auto o = test::open_payload(good);
  // A gap that carries index 50 past the tensor end.
  auto body = o.body;
  body[o.fields.table_length + 1] = std::byte{0xF0};
  const auto bad = test::seal(o.fields, body);
  decoded_payload out;
  const status s = decode_payload_if(bad, out, keep_even);
  CHECK(s.code == errc::index_out_of_range);
  CHECK(s.message.find("item 1 't1'") != std::string::npos);
  check_same_verdict(bad, keep_even);
  check_same_verdict(bad, [](const item_row&) { return false; });
  // Item 1's location range one byte short: the rows no longer tile the buffer.
  auto f = o.fields;
  auto shorter = o.body;
  shorter.erase(shorter.begin() + static_cast<std::ptrdiff_t>(f.table_length));
  f.location_length -= 1;
  const auto cut = test::seal(f, shorter);
  CHECK_FALSE(decode_payload_if(cut, out, keep_even).ok());
  check_same_verdict(cut, keep_even);
}

TEST_CASE("decode_payload_if: same verdict as decode_payload under byte flips, truncation and "
          "resealed mutations") {
  std::mt19937_64 rng(43);
  const auto reject_all = [](const item_row&) { return false; };
  for (int r = 0; r < 10; ++r) {
    auto items = named_items(rng, 2 + static_cast<int>(rng() % 4));
    encode_options opt;
    opt.locations = r % 2 ? location_scheme::escape_u8 : location_scheme::gaps;
    const auto good = encode_payload({1, 2, 3, 4}, items, opt);
    for (std::size_t i = 0; i < good.size(); i += 1 + good.size() / 97) {
      auto b = good;
      b[i] ^= static_cast<std::byte>(1u << (i % 8));
      check_same_verdict(b, keep_even);
      check_same_verdict(b, reject_all);
    }
    for (std::size_t n = 0; n < good.size(); n += 1 + good.size() / 31)
      check_same_verdict(std::span(good).first(n), reject_all);
    auto o = test::open_payload(good);
    std::size_t refused = 0;
    for (int m = 0; m < 150; ++m) {
      auto body = o.body;
      body[rng() % body.size()] = static_cast<std::byte>(rng());
      const auto p = test::seal(o.fields, body);
      decoded_payload out;
      refused += !decode_payload(p, out).ok();
      check_same_verdict(p, keep_even);
      check_same_verdict(p, reject_all);
    }
    CHECK(refused > 0); // the mutations reach the checks
  }
}

TEST_CASE("decode_payload_if: a reused output holds exactly the new payload, nothing of the last") {
  std::mt19937_64 rng(83);
  // Large items first, then payloads with fewer, smaller, empty and rejected
  // items: every decode into the one reused `out` (and one reused
  // workspace) must equal a decode into a fresh object.
  decoded_payload out;
  payload_info ws;
  auto dense = [&](const std::string& name, std::uint64_t n, value_encoding e) {
    std::vector<std::uint64_t> idx(n);
    for (std::uint64_t i = 0; i < n; ++i) idx[i] = i;
    return make_item(name, {n + 5}, dtype_id::f32, e, std::move(idx), rng);
  };
  std::vector<std::vector<item>> rounds;
  rounds.push_back({dense("t0", 900, value_encoding::xor_mask),
                    dense("t2", 700, value_encoding::overwrite),
                    dense("t4", 500, value_encoding::xor_mask)});
  rounds.push_back(
      {dense("t0", 3, value_encoding::overwrite), dense("t1", 400, value_encoding::xor_mask)});
  rounds.push_back(named_items(rng, 9));
  rounds.push_back({dense("t2", 0, value_encoding::xor_mask)});
  rounds.push_back(named_items(rng, 5));
  std::uint32_t seq = 0;
  for (auto& items : rounds) {
    const auto bytes = encode_payload({1, 0, 0, seq++}, items);
    for (bool with_ws : {false, true}) {
      decoded_payload fresh;
      REQUIRE(decode_payload_if(bytes, fresh, keep_even).ok());
      REQUIRE(
          decode_payload_if(bytes, out, keep_even, decode_limits{}, with_ws ? &ws : nullptr).ok());
      CHECK(out == fresh);
      REQUIRE(out.items.size() == items.size());
      for (std::size_t i = 0; i < items.size(); ++i)
        if (keep_even(item_row{items[i].tensor})) CHECK(out.items[i] == items[i]);
    }
  }
}
