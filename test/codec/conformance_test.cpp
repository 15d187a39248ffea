// Conformance with docs/wire-format.md: a second, deliberately plain encoder
// written from the spec (byte pushes only, no codec helpers) must produce the
// same header fields and the same decompressed body as the library, for
// every location scheme and value filter, in both format versions (v2: the
// digest is BLAKE2b-128 of header bytes 0..79 then the body; v1: of the body).
#include <doctest/doctest.h>

#include <random>

#include "codec/fixtures.hpp"
#include "dcr/codec/payload.hpp"

using namespace dcr;
using namespace dcr::codec;

namespace {

void le(std::vector<std::uint8_t>& b, std::uint64_t v, int n) {
  for (int i = 0; i < n; ++i) b.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}
void leb(std::vector<std::uint8_t>& b, std::uint64_t v) {
  do {
    std::uint8_t x = v & 0x7F;
    v >>= 7;
    b.push_back(v ? (x | 0x80) : x);
  } while (v);
}

struct spec_body {
  std::vector<std::uint8_t> table, locs, vals;
};

// Section 3/4 of the spec, literally.
spec_body spec_encode(const std::vector<item>& items, location_scheme scheme, value_filter filter) {
  spec_body b;
  for (const auto& it : items) {
    const std::size_t c = it.indices.size(), w = width_of(it.tensor.dtype);
    std::vector<std::uint64_t> gaps;
    for (std::size_t k = 1; k < c; ++k) gaps.push_back(it.indices[k] - it.indices[k - 1] - 1);
    std::uint64_t maxg = 0;
    bool contiguous = true;
    for (auto g : gaps) {
      maxg = std::max(maxg, g);
      contiguous = contiguous && g == 0;
    }
    int loc;
    const std::size_t loc_start = b.locs.size();
    if (contiguous) {
      loc = 1;
    } else if (scheme == location_scheme::varint) {
      loc = 9;
      for (auto g : gaps) leb(b.locs, g);
    } else if (scheme == location_scheme::escape_u8) {
      loc = 10;
      for (auto g : gaps) {
        if (g < 255) {
          b.locs.push_back(static_cast<std::uint8_t>(g));
        } else {
          b.locs.push_back(0xFF);
          leb(b.locs, g - 255);
        }
      }
    } else {
      const int gw = maxg <= 0xFF ? 1 : maxg <= 0xFFFF ? 2 : maxg <= 0xFFFFFFFFull ? 4 : 8;
      const bool planes = scheme == location_scheme::planes && gw > 1;
      loc = planes ? (gw == 2   ? 6
                      : gw == 4 ? 7
                                : 8)
                   : (gw == 1   ? 2
                      : gw == 2 ? 3
                      : gw == 4 ? 4
                                : 5);
      if (planes) {
        for (int p = 0; p < gw; ++p)
          for (auto g : gaps) b.locs.push_back(static_cast<std::uint8_t>(g >> (8 * (gw - 1 - p))));
      } else {
        for (auto g : gaps) le(b.locs, g, gw);
      }
    }
    const int filt = (c > 0 && w > 1 && filter == value_filter::byte_planes) ? 1 : 0;
    const std::size_t val_start = b.vals.size();
    const auto* v = reinterpret_cast<const std::uint8_t*>(it.values.data());
    if (filt) {
      for (std::size_t p = 0; p < w; ++p)
        for (std::size_t i = 0; i < c; ++i) b.vals.push_back(v[i * w + (w - 1 - p)]);
    } else {
      b.vals.insert(b.vals.end(), v, v + c * w);
    }
    auto& t = b.table;
    le(t, it.tensor.name.size(), 2);
    t.insert(t.end(), it.tensor.name.begin(), it.tensor.name.end());
    t.push_back(static_cast<std::uint8_t>(it.tensor.dtype));
    t.push_back(static_cast<std::uint8_t>(it.encoding));
    t.push_back(static_cast<std::uint8_t>(loc));
    t.push_back(static_cast<std::uint8_t>(filt));
    t.push_back(static_cast<std::uint8_t>(it.tensor.shape.size()));
    for (auto d : it.tensor.shape) le(t, d, 8);
    le(t, c, 8);
    le(t, c ? it.indices[0] : 0, 8);
    le(t, loc_start, 8);
    le(t, b.locs.size() - loc_start, 8);
    le(t, val_start, 8);
    le(t, b.vals.size() - val_start, 8);
  }
  return b;
}

std::uint64_t rd(std::span<const std::byte> p, std::size_t off, int n) {
  std::uint64_t v = 0;
  for (int i = n; i-- > 0;) v = (v << 8) | static_cast<std::uint8_t>(p[off + i]);
  return v;
}

} // namespace

TEST_CASE("an encoder written from the spec produces the library's header and body") {
  std::mt19937_64 rng(555);
  const dtype_id dts[] = {dtype_id::bf16, dtype_id::f16, dtype_id::f32, dtype_id::f8e4m3fn,
                          dtype_id::f8e5m2};
  for (int r = 0; r < 40; ++r) {
    std::vector<item> items;
    const int n = static_cast<int>(rng() % 5);
    for (int i = 0; i < n; ++i) {
      const std::uint64_t numel = 1 + rng() % (r % 3 == 0 ? 200000 : 300);
      auto idx = test::random_indices(rng, numel, std::array{0.0, 0.003, 0.05, 0.6}[rng() % 4],
                                      rng() % 5 == 0);
      const value_encoding encs[] = {value_encoding::xor_mask, value_encoding::overwrite,
                                     value_encoding::add};
      items.push_back(test::make_item("w" + std::to_string(i), {numel}, dts[rng() % 5],
                                      encs[rng() % (r % 2 ? 2 : 3)], idx, rng));
    }
    // Odd rounds have no add items, so they are written as v1 too.
    const std::uint16_t version = r % 2 ? 1 : 2;
    for (auto scheme : {location_scheme::gaps, location_scheme::planes, location_scheme::varint,
                        location_scheme::escape_u8})
      for (auto filter : {value_filter::none, value_filter::byte_planes}) {
        encode_options opt;
        opt.locations = scheme;
        opt.filter = filter;
        opt.format_version = version;
        const payload_id id{rng(), rng(), static_cast<std::uint32_t>(rng()),
                            static_cast<std::uint32_t>(rng())};
        const auto p = encode_payload(id, items, opt);
        const auto want = spec_encode(items, scheme, filter);
        std::vector<std::uint8_t> body = want.table;
        body.insert(body.end(), want.locs.begin(), want.locs.end());
        body.insert(body.end(), want.vals.begin(), want.vals.end());
        // Header, field by field (section 1).
        REQUIRE(p.size() >= 96);
        CHECK(rd(p, 0, 4) == 0x50524344u);
        CHECK(rd(p, 4, 2) == version);
        CHECK(rd(p, 6, 2) == 96);
        CHECK(rd(p, 8, 8) == id.attempt);
        CHECK(rd(p, 16, 8) == id.source_version);
        CHECK(rd(p, 24, 4) == id.owner);
        CHECK(rd(p, 28, 4) == id.sequence);
        CHECK(rd(p, 32, 4) == items.size());
        CHECK(rd(p, 36, 4) == 1);
        CHECK(rd(p, 40, 8) == want.table.size());
        CHECK(rd(p, 48, 8) == want.locs.size());
        CHECK(rd(p, 56, 8) == want.vals.size());
        CHECK(rd(p, 64, 8) == body.size());
        CHECK(rd(p, 72, 8) == p.size() - 96);
        const auto frame = std::span(p).subspan(96);
        blake2b_128 signer;
        if (version == 2) signer.update(std::span(p).first(80));
        const auto d = signer.update(frame).final();
        CHECK(std::memcmp(d.data(), p.data() + 80, 16) == 0);
        // Body: the frame decompresses to exactly the spec's bytes.
        std::vector<std::byte> got(body.size());
        REQUIRE(zstd_decompress(frame, got).ok());
        // memcmp only on non-empty bodies: an empty vector's data() may be null.
        CHECK((body.empty() || std::memcmp(got.data(), body.data(), body.size()) == 0));
      }
  }
}

TEST_CASE("the annotated example of docs/wire-format.md, in v1 and v2") {
  // Section 6: two bf16 items; the body is the same in both versions, the
  // version field and the digest differ (v2 signs header bytes 0..79 too).
  item a{{"a", {2, 4}, dtype_id::bf16}, value_encoding::xor_mask, {5, 6}, {}};
  for (std::uint16_t w : {0x0001, 0x0003}) {
    a.values.push_back(static_cast<std::byte>(w & 0xFF));
    a.values.push_back(static_cast<std::byte>(w >> 8));
  }
  item b{{"b", {300}, dtype_id::bf16}, value_encoding::overwrite, {0, 5, 299}, {}};
  for (std::uint16_t w : {0x3f80, 0x4000, 0x7fc0}) {
    b.values.push_back(static_cast<std::byte>(w & 0xFF));
    b.values.push_back(static_cast<std::byte>(w >> 8));
  }
  const std::vector<item> items = {a, b};
  encode_options v1;
  v1.format_version = 1;
  const auto p1 = encode_payload({42, 7, 3, 1}, items, v1);
  const auto p2 = encode_payload({42, 7, 3, 1}, items);
  REQUIRE(p1.size() == 96 + 77);
  REQUIRE(p2.size() == 96 + 77);
  CHECK(to_hex(std::span(reinterpret_cast<const std::uint8_t*>(p1.data()) + 80, 16)) ==
        "c2e4267eb9ac6d997875b8480e626580");
  CHECK(to_hex(std::span(reinterpret_cast<const std::uint8_t*>(p2.data()) + 80, 16)) ==
        "70fadf38fde9b442b9a9a9792309636b");
  CHECK(rd(p1, 4, 2) == 1);
  CHECK(rd(p2, 4, 2) == 2);
  CHECK(std::equal(p1.begin() + 96, p1.end(), p2.begin() + 96));
  CHECK(decode_payload_or_throw(p1) == decode_payload_or_throw(p2));
}
