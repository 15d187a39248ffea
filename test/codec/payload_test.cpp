#include <doctest/doctest.h>

#include <algorithm>
#include <random>

#include "codec/fixtures.hpp"
#include "dcr/codec/payload.hpp"

using namespace dcr;
using namespace dcr::codec;
using dcr::test::make_item;
using dcr::test::poke;

namespace {

const dtype_id all_dtypes[] = {dtype_id::bf16, dtype_id::f16, dtype_id::f32, dtype_id::f8e4m3fn,
                               dtype_id::f8e5m2};
const location_scheme all_schemes[] = {location_scheme::gaps, location_scheme::planes,
                                       location_scheme::varint, location_scheme::escape_u8};

std::vector<item> random_items(std::mt19937_64& rng, int n) {
  std::vector<item> items;
  for (int i = 0; i < n; ++i) {
    const auto dt = all_dtypes[rng() % 5];
    const value_encoding encs[] = {value_encoding::xor_mask, value_encoding::overwrite,
                                   value_encoding::add};
    const auto enc = encs[rng() % 3];
    std::vector<std::uint64_t> shape;
    const auto rank = rng() % 4;
    for (std::uint64_t r = 0; r < rank; ++r) shape.push_back(1 + rng() % 40);
    std::uint64_t numel = 1;
    for (auto d : shape) numel *= d;
    const double density = std::array{0.0, 0.01, 0.1, 0.5, 1.0}[rng() % 5];
    auto idx = test::random_indices(rng, numel, density, rng() % 4 == 0);
    items.push_back(
        make_item("layers." + std::to_string(i) + ".w", shape, dt, enc, std::move(idx), rng));
  }
  return items;
}

status decode(std::span<const std::byte> b) {
  decoded_payload out;
  return decode_payload(b, out);
}

/// Build a body from a valid payload, let `edit` change it, reseal, decode.
template <class Edit>
status resealed(std::span<const std::byte> payload, Edit&& edit) {
  auto o = test::open_payload(payload);
  edit(o.fields, o.body);
  return decode(test::seal(o.fields, o.body));
}

} // namespace

TEST_CASE("payloads round-trip random items over dtypes, densities, runs and every option") {
  std::mt19937_64 rng(2024);
  for (int r = 0; r < 60; ++r) {
    auto items = random_items(rng, 1 + static_cast<int>(rng() % 6));
    const payload_id id{rng(), rng(), static_cast<std::uint32_t>(rng()),
                        static_cast<std::uint32_t>(rng())};
    for (auto scheme : all_schemes)
      for (auto filter : {value_filter::none, value_filter::byte_planes}) {
        encode_options opt;
        opt.locations = scheme;
        opt.filter = filter;
        opt.zstd_level = 1 + static_cast<int>(rng() % 3);
        const auto bytes = encode_payload(id, items, opt);
        const auto back = decode_payload_or_throw(bytes);
        CHECK(back.id == id);
        REQUIRE(back.items.size() == items.size());
        for (std::size_t i = 0; i < items.size(); ++i) CHECK(back.items[i] == items[i]);
        payload_id pid;
        REQUIRE(read_payload_id(bytes, pid).ok());
        CHECK(pid == id);
      }
  }
}

TEST_CASE("zero items, empty items and zero-size tensors round-trip") {
  std::mt19937_64 rng(3);
  const payload_id id{1, 2, 3, 4};
  auto none = decode_payload_or_throw(encode_payload(id, {}));
  CHECK(none.id == id);
  CHECK(none.items.empty());
  std::vector<item> items = {
      make_item("empty", {4, 4}, dtype_id::bf16, value_encoding::xor_mask, {}, rng),
      make_item("zero", {0, 8}, dtype_id::f32, value_encoding::overwrite, {}, rng),
      make_item("scalar", {}, dtype_id::f16, value_encoding::overwrite, {0}, rng)};
  auto back = decode_payload_or_throw(encode_payload(id, items));
  CHECK(back.items == items);
}

TEST_CASE("huge tensors with u64 gaps round-trip without allocating the tensor") {
  std::mt19937_64 rng(4);
  const std::uint64_t big = std::uint64_t{1} << 31;
  std::vector<item> items = {make_item("huge", {big, big}, dtype_id::bf16, value_encoding::xor_mask,
                                       {0, 1, 1ull << 35, (1ull << 61) + 3, big * big - 1}, rng),
                             make_item("edge", {0xFFFFFFFFFFFFFFFFull}, dtype_id::f8e5m2,
                                       value_encoding::overwrite, {0, 0xFFFFFFFFFFFFFFFEull}, rng)};
  for (auto scheme : all_schemes) {
    encode_options opt;
    opt.locations = scheme;
    CHECK(decode_payload_or_throw(encode_payload({}, items, opt)).items == items);
  }
}

TEST_CASE("encoding is deterministic: same items give byte-identical payloads") {
  std::mt19937_64 a(77), b(77);
  auto items_a = random_items(a, 8), items_b = random_items(b, 8);
  REQUIRE(items_a == items_b);
  const auto pa = encode_payload({9, 9, 9, 9}, items_a), pb = encode_payload({9, 9, 9, 9}, items_b);
  CHECK(pa == pb);
  CHECK(encode_payload({9, 9, 9, 9}, items_a) == pa); // contexts reused across calls
  CHECK(encode_payload({9, 9, 9, 10}, items_a) != pa);
}

TEST_CASE("the encoder rejects invalid items with typed errors naming the item") {
  std::mt19937_64 rng(8);
  auto good = make_item("t", {10}, dtype_id::bf16, value_encoding::xor_mask, {1, 2, 5}, rng);
  auto expect = [&](item it, errc code) {
    std::vector<item> items = {good, std::move(it)};
    std::vector<std::byte> out;
    auto s = codec::encode_payload({}, items, {}, out);
    CHECK(s.code == code);
    CHECK(s.message.find("item 1") != std::string::npos);
    CHECK_THROWS_AS(dcr::encode_payload({}, items), dcr::error);
  };
  auto it = good;
  it.indices = {1, 1, 5};
  expect(it, errc::not_increasing);
  it.indices = {5, 2, 1};
  expect(it, errc::not_increasing);
  it.indices = {1, 2, 10};
  expect(it, errc::index_out_of_range);
  it = good;
  it.values.pop_back();
  expect(it, errc::invalid_argument);
  it = good;
  it.values.resize(8);
  expect(it, errc::invalid_argument);
  it = good;
  it.tensor.dtype = static_cast<dtype_id>(77);
  expect(it, errc::bad_dtype);
  it = good;
  it.encoding = static_cast<value_encoding>(0);
  expect(it, errc::bad_encoding);
  it = good;
  it.tensor.shape = {1, 1, 1, 1, 1, 1, 10};
  expect(it, errc::shape_mismatch);
  it = good;
  it.tensor.shape = {1ull << 32, 1ull << 32};
  expect(it, errc::length_overflow);
  it = good;
  it.tensor.name.assign(70000, 'x');
  expect(it, errc::length_overflow);
  std::vector<std::byte> out;
  encode_options bad_level;
  bad_level.zstd_level = 1000;
  std::vector<item> one = {good};
  CHECK(codec::encode_payload({}, one, bad_level, out).code == errc::invalid_argument);
}

TEST_CASE("every header field is validated before use") {
  std::mt19937_64 rng(11);
  auto items = random_items(rng, 3);
  const auto good = encode_payload({1, 2, 3, 4}, items);
  REQUIRE(decode(good).ok());
  auto with = [&](auto&& edit) {
    auto b = good;
    edit(b);
    return decode(b).code;
  };
  CHECK(with([](auto& b) { b[0] = std::byte{'X'}; }) == errc::bad_magic);
  CHECK(with([](auto& b) { poke<std::uint16_t>(b, 4, 3); }) == errc::unsupported_version);
  // v2 -> v1 passes the version check, then fails the v1 digest (body only).
  CHECK(with([](auto& b) { poke<std::uint16_t>(b, 4, 1); }) == errc::digest_mismatch);
  CHECK(with([](auto& b) { poke<std::uint16_t>(b, 4, 0); }) == errc::unsupported_version);
  CHECK(with([](auto& b) { poke<std::uint16_t>(b, 6, 97); }) == errc::unsupported_version);
  CHECK(with([](auto& b) { b[36] = std::byte{2}; }) == errc::compression);
  CHECK(with([](auto& b) { b[37] = std::byte{1}; }) == errc::bad_format);
  CHECK(with([](auto& b) { b[39] = std::byte{1}; }) == errc::bad_format);
  CHECK(with([](auto& b) { poke<std::uint32_t>(b, 32, 0xFFFFFFFF); }) == errc::length_overflow);
  CHECK(with([](auto& b) { poke<std::uint64_t>(b, 40, ~0ull); }) == errc::length_overflow);
  CHECK(with([](auto& b) { poke<std::uint64_t>(b, 64, 1); }) == errc::length_overflow);
  CHECK(with([&](auto& b) {
          // Consistent lengths, but more than any frame of this size can expand to.
          poke<std::uint64_t>(b, 56, 1ull << 35);
          codec::payload_header h;
          (void)parse_header(good, h);
          poke<std::uint64_t>(b, 64, h.table_length + h.location_length + (1ull << 35));
        }) == errc::length_overflow);
  CHECK(with([](auto& b) { poke<std::uint64_t>(b, 72, b.size()); }) == errc::truncated);
  CHECK(with([](auto& b) { b.push_back(std::byte{0}); }) == errc::trailing_bytes);
  CHECK(with([](auto& b) { b.pop_back(); }) == errc::truncated);
  CHECK(with([](auto& b) { b[80] ^= std::byte{1}; }) == errc::digest_mismatch);
  CHECK(with([](auto& b) { b.back() ^= std::byte{1}; }) == errc::digest_mismatch);
  CHECK(with([](auto& b) { b.resize(95); }) == errc::truncated);
  CHECK(with([](auto& b) { b.clear(); }) == errc::truncated);
  // Smaller limit on the raw body.
  codec::decode_limits tight;
  tight.max_raw_body = 10;
  decoded_payload out;
  CHECK(codec::decode_payload(good, out, tight).code == errc::length_overflow);
  // read_payload_id checks the digest too.
  auto b = good;
  b[100] ^= std::byte{0x40};
  payload_id pid;
  CHECK(read_payload_id(b, pid).code == errc::digest_mismatch);
}

TEST_CASE("a resealed body with a bad frame or wrong lengths is rejected") {
  std::mt19937_64 rng(12);
  auto items = random_items(rng, 2);
  const auto good = encode_payload({}, items);
  auto o = test::open_payload(good);
  // Declared raw length differs from what the frame holds.
  {
    auto f = o.fields;
    f.value_length += 1;
    CHECK(decode(test::seal(f, o.body)).code == errc::length_overflow);
  }
  // Two frames back to back are not one body.
  {
    auto sealed = test::seal(o.fields, o.body);
    auto frame = codec::zstd_compress_or_throw(o.body, 1);
    auto both = std::vector<std::byte>(sealed.begin() + 96, sealed.end());
    both.insert(both.end(), frame.begin(), frame.end());
    std::vector<std::byte> p(sealed.begin(), sealed.begin() + 96);
    poke<std::uint64_t>(p, 72, both.size());
    auto d = payload_digest(payload_version, p, both);
    std::memcpy(p.data() + 80, d.data(), 16);
    p.insert(p.end(), both.begin(), both.end());
    CHECK(decode(p).code == errc::trailing_bytes);
  }
  // Garbage instead of a frame, correctly digested.
  {
    std::vector<std::byte> p(good.begin(), good.begin() + 96);
    std::vector<std::byte> junk(64, std::byte{0x5A});
    poke<std::uint64_t>(p, 72, junk.size());
    auto d = payload_digest(payload_version, p, junk);
    std::memcpy(p.data() + 80, d.data(), 16);
    p.insert(p.end(), junk.begin(), junk.end());
    CHECK(decode(p).code == errc::compression);
  }
}

TEST_CASE("every item table field is validated and errors name the item and byte") {
  std::mt19937_64 rng(13);
  // Item 0 is a run ("a"), item 1 is scattered ("bb"): rows at known offsets.
  std::vector<item> items = {
      make_item("a", {4, 8}, dtype_id::bf16, value_encoding::xor_mask, {3, 4, 5}, rng),
      make_item("bb", {100}, dtype_id::f32, value_encoding::overwrite, {1, 7, 50, 99}, rng)};
  const auto good = encode_payload({}, items);
  const std::size_t r0 = 0, r1 = 2 + 1 + 5 + 16 + 48;
  // Offsets inside row 1 ("bb", rank 1).
  const std::size_t ids = r1 + 2 + 2, dims = ids + 5, count = dims + 8, first = count + 8,
                    loff = first + 8, llen = loff + 8, voff = llen + 8, vlen = voff + 8;
  auto code = [&](auto&& edit) { return resealed(good, edit); };
  auto s = code([&](auto&, auto& b) { b[ids] = std::byte{99}; });
  CHECK(s.code == errc::bad_dtype);
  CHECK(s.message.find("item 1") != std::string::npos);
  CHECK(s.message.find("body byte " + std::to_string(ids)) != std::string::npos);
  CHECK(code([&](auto&, auto& b) { b[ids + 1] = std::byte{0}; }).code == errc::bad_encoding);
  CHECK(code([&](auto&, auto& b) { b[ids + 2] = std::byte{0}; }).code == errc::bad_location);
  CHECK(code([&](auto&, auto& b) { b[ids + 2] = std::byte{11}; }).code == errc::bad_location);
  CHECK(code([&](auto&, auto& b) { b[ids + 3] = std::byte{2}; }).code == errc::bad_encoding);
  CHECK(code([&](auto&, auto& b) { b[ids + 4] = std::byte{7}; }).code == errc::shape_mismatch);
  // Rank 2 instead of 1 shifts the row: whatever follows must still be caught.
  CHECK_FALSE(code([&](auto&, auto& b) { b[ids + 4] = std::byte{2}; }).ok());
  CHECK(code([&](auto&, auto& b) { poke<std::uint64_t>(b, dims, 99); }).code ==
        errc::index_out_of_range);
  CHECK(code([&](auto&, auto& b) {
          b[r0 + 2 + 1 + 4] = std::byte{2};
          poke<std::uint64_t>(b, r0 + 8, 1ull << 33);
          poke<std::uint64_t>(b, r0 + 16, 1ull << 33);
        }).code == errc::length_overflow);
  CHECK(code([&](auto&, auto& b) { poke<std::uint64_t>(b, count, 101); }).code ==
        errc::index_out_of_range);
  CHECK(code([&](auto&, auto& b) { poke<std::uint64_t>(b, count, 5); }).code ==
        errc::length_overflow);
  CHECK(code([&](auto&, auto& b) { poke<std::uint64_t>(b, first, 100); }).code ==
        errc::index_out_of_range);
  CHECK(code([&](auto&, auto& b) { poke<std::uint64_t>(b, first, 60); }).code ==
        errc::index_out_of_range);
  CHECK(code([&](auto&, auto& b) { poke<std::uint64_t>(b, loff, 1); }).code ==
        errc::offset_out_of_range);
  CHECK(code([&](auto&, auto& b) { poke<std::uint64_t>(b, llen, 1000); }).code ==
        errc::offset_out_of_range);
  CHECK(code([&](auto&, auto& b) { poke<std::uint64_t>(b, llen, 2); }).code ==
        errc::trailing_bytes);
  CHECK(code([&](auto&, auto& b) { poke<std::uint64_t>(b, voff, 8); }).code ==
        errc::offset_out_of_range);
  CHECK(code([&](auto&, auto& b) { poke<std::uint64_t>(b, vlen, 15); }).code ==
        errc::length_overflow);
  CHECK(code([&](auto&, auto& b) { poke<std::uint64_t>(b, vlen, ~0ull - 3); }).code ==
        errc::length_overflow);
  // Item 0's run: bytes in its location range, or a run leaving the tensor.
  CHECK(code([&](auto&, auto& b) { poke<std::uint64_t>(b, r0 + 2 + 1 + 5 + 16 + 8, 30); }).code ==
        errc::index_out_of_range);
  // Empty items must be canonical.
  std::vector<item> empty = {
      make_item("e", {4}, dtype_id::bf16, value_encoding::xor_mask, {}, rng)};
  const auto pe = encode_payload({}, empty);
  const std::size_t e_ids = 2 + 1;
  CHECK(resealed(pe, [&](auto&, auto& b) { b[e_ids + 2] = std::byte{2}; }).code ==
        errc::bad_location);
  CHECK(resealed(pe, [&](auto&, auto& b) { b[e_ids + 3] = std::byte{1}; }).code ==
        errc::bad_location);
  CHECK(resealed(pe, [&](auto&, auto& b) { poke<std::uint64_t>(b, e_ids + 5 + 8 + 8, 1); }).code ==
        errc::bad_location);
  // Table, location and value sections must be used exactly.
  CHECK(code([&](auto& f, auto& b) {
          f.item_count = 1;
          (void)b;
        }).code == errc::trailing_bytes);
  CHECK(code([&](auto& f, auto&) { f.item_count = 3; }).code == errc::length_overflow);
  CHECK(code([&](auto& f, auto& b) {
          b.insert(b.begin() + static_cast<std::ptrdiff_t>(f.table_length), std::byte{0});
          f.table_length += 1;
        }).code == errc::trailing_bytes);
  CHECK(code([&](auto& f, auto& b) {
          b.insert(b.begin() + static_cast<std::ptrdiff_t>(f.table_length + f.location_length),
                   std::byte{0});
          f.location_length += 1;
        }).code == errc::trailing_bytes);
  CHECK(code([&](auto& f, auto& b) {
          b.push_back(std::byte{0});
          f.value_length += 1;
        }).code == errc::trailing_bytes);
  // A name length running past the table.
  CHECK(code([&](auto&, auto& b) { poke<std::uint16_t>(b, r1, 0xFFFF); }).code == errc::truncated);
  // Location bytes that point past the tensor, found by the location decoder.
  s = code([&](auto& f, auto& b) { b[f.table_length] = std::byte{0xFF}; });
  CHECK(s.code == errc::index_out_of_range);
  CHECK(s.message.find("item 1") != std::string::npos);
}

TEST_CASE("single-byte corruption and truncation anywhere never crash and always fail") {
  std::mt19937_64 rng(14);
  auto items = random_items(rng, 3);
  const auto good = encode_payload({5, 6, 7, 8}, items);
  // v2: every header byte is covered by the digest or checked before it,
  // so every flip fails, and every flip of an id byte fails as a digest
  // mismatch, i.e. before decompression.
  for (std::size_t i = 0; i < good.size(); ++i) {
    auto b = good;
    b[i] ^= static_cast<std::byte>(1u << (i % 8));
    auto s = decode(b);
    CHECK_FALSE(s.ok());
    if (i >= 8 && i < 32) CHECK(s.code == errc::digest_mismatch);
  }
  // v1 (still read): the id fields are outside the digest, every other byte is covered.
  std::vector<item> v1_items;
  for (auto& it : items)
    if (it.encoding != value_encoding::add) v1_items.push_back(it);
  encode_options v1;
  v1.format_version = 1;
  const auto old = encode_payload({5, 6, 7, 8}, v1_items, v1);
  REQUIRE(decode(old).ok());
  for (std::size_t i = 0; i < old.size(); ++i) {
    auto b = old;
    b[i] ^= static_cast<std::byte>(1u << (i % 8));
    const bool id_field = i >= 8 && i < 32;
    CHECK(decode(b).ok() == id_field);
  }
  for (std::size_t n = 0; n < good.size(); ++n) {
    CHECK_FALSE(decode(std::span(good).first(n)).ok());
  }
}

TEST_CASE("resealed random body mutations give a typed error or equal re-encodable items") {
  std::mt19937_64 rng(15);
  for (int r = 0; r < 20; ++r) {
    auto items = random_items(rng, 1 + static_cast<int>(rng() % 4));
    encode_options opt;
    opt.locations = all_schemes[rng() % 4];
    const auto good = encode_payload({}, items, opt);
    auto o = test::open_payload(good);
    for (int m = 0; m < 200; ++m) {
      auto body = o.body;
      const auto pos = rng() % body.size();
      body[pos] = static_cast<std::byte>(rng());
      decoded_payload out;
      auto s = decode_payload(test::seal(o.fields, body), out);
      if (s.ok()) {
        // Whatever decodes must satisfy the item invariants.
        for (std::size_t i = 0; i < out.items.size(); ++i)
          CHECK(validate_item(out.items[i], i).ok());
      } else {
        CHECK(s.code != errc::ok);
        CHECK_FALSE(s.message.empty());
      }
    }
  }
}

TEST_CASE("format v1 payloads still decode; v2 is the default; add items need v2") {
  std::mt19937_64 rng(16);
  for (int r = 0; r < 30; ++r) {
    auto items = random_items(rng, 1 + static_cast<int>(rng() % 5));
    const payload_id id{rng(), rng(), static_cast<std::uint32_t>(rng()),
                        static_cast<std::uint32_t>(rng())};
    const auto v2 = encode_payload(id, items);
    codec::payload_header h;
    REQUIRE(read_payload_header(v2, h).ok());
    CHECK(h.version == 2);
    CHECK(decode_payload_or_throw(v2).items == items);
    encode_options o1;
    o1.format_version = 1;
    const bool has_add = std::any_of(items.begin(), items.end(), [](const item& it) {
      return it.encoding == value_encoding::add;
    });
    std::vector<std::byte> v1;
    const auto s = codec::encode_payload(id, items, o1, v1);
    if (has_add) {
      CHECK(s.code == errc::bad_encoding);
      continue;
    }
    REQUIRE(s.ok());
    REQUIRE(read_payload_header(v1, h).ok());
    CHECK(h.version == 1);
    // Same body, same items, same id; only the version and the digest differ.
    CHECK(std::equal(v1.begin() + 96, v1.end(), v2.begin() + 96, v2.end()));
    CHECK(std::equal(v1.begin() + 6, v1.begin() + 80, v2.begin() + 6));
    const auto d1 = decode_payload_or_throw(v1);
    CHECK(d1 == decode_payload_or_throw(v2));
  }
  // A v1 header over a body with an add row: the row is unknown in v1.
  std::vector<item> one = {make_item("a", {10}, dtype_id::bf16, value_encoding::add, {1, 2}, rng)};
  auto o = test::open_payload(encode_payload({}, one));
  o.fields.version = 1;
  const auto s = decode(test::seal(o.fields, o.body));
  CHECK(s.code == errc::bad_encoding);
  CHECK(s.message.find("format v1") != std::string::npos);
  o.fields.version = 2;
  CHECK(decode(test::seal(o.fields, o.body)).ok());
  encode_options o3;
  o3.format_version = 3;
  std::vector<std::byte> out;
  CHECK(codec::encode_payload({}, one, o3, out).code == errc::unsupported_version);
}

TEST_CASE("v2: a header field changed and resealed by v1 rules is refused before decompression") {
  // An attacker-free model of a damaged id: the body and its v1 digest are
  // intact, only the owner changed. v1 accepted it; v2 refuses it.
  std::mt19937_64 rng(17);
  auto items = random_items(rng, 2);
  auto p = encode_payload({1, 2, 3, 4}, items);
  poke<std::uint32_t>(p, 24, 99);
  const auto d1 = digest(std::span(p).subspan(96));
  std::memcpy(p.data() + 80, d1.data(), 16);
  codec::payload_header h;
  CHECK(read_payload_header(p, h).code == errc::digest_mismatch);
  payload_id pid;
  CHECK(read_payload_id(p, pid).code == errc::digest_mismatch);
}
