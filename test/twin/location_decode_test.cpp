// The location decode twin (dcr/twin/locations.hpp) against the reference
// decoder codec::decode_locations: same indices, same error code, same
// message, for every coding, gap distributions from all-small to 2^63,
// adversarial 0xFF sequences, counts 0/1/2/odd/large, and corrupted,
// truncated and padded bytes. Then scatter_encoded against a reference
// decode + scatter, including that nothing is written on failure.

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "dcr/codec/locations.hpp"
#include "dcr/codec/payload.hpp"
#include "dcr/codec/values.hpp"
#include "dcr/twin/element.hpp"
#include "dcr/twin/locations.hpp"
#include "dcr/twin/row.hpp"
#include "dcr/twin/scatter.hpp"

using namespace dcr;
using codec::location_id;

namespace {

const location_id all_ids[] = {
    location_id::run,     location_id::gap_u8,     location_id::gap_u16,    location_id::gap_u32,
    location_id::gap_u64, location_id::planes_u16, location_id::planes_u32, location_id::planes_u64,
    location_id::varint,  location_id::escape_u8};

/// Gap distributions the sweep draws from.
enum class gaps_kind { zero, small, mixed, near_255, large, huge };

std::uint64_t draw_gap(gaps_kind g, std::mt19937_64& rng) {
  switch (g) {
  case gaps_kind::zero:
    return 0;
  case gaps_kind::small:
    return rng() % 8;
  case gaps_kind::mixed: {
    const unsigned r = rng() % 100;
    if (r < 80) return rng() % 200;
    if (r < 95) return 200 + rng() % 5000;
    return rng() % (std::uint64_t{1} << 40);
  }
  case gaps_kind::near_255:
    return 250 + rng() % 12; // straddles the escape at 255
  case gaps_kind::large:
    return rng() % (std::uint64_t{1} << 33);
  case gaps_kind::huge:
    return (std::uint64_t{1} << 62) + rng() % (std::uint64_t{1} << 62);
  }
  return 0;
}

/// Strictly increasing indices with `n` entries; never wraps (gaps shrink
/// to fit when a huge draw would pass 2^64 - 2).
std::vector<std::uint64_t> make_indices(std::size_t n, gaps_kind g, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::uint64_t> idx;
  if (n == 0) return idx;
  idx.push_back(g == gaps_kind::huge ? rng() % 1000 : rng() % 100);
  while (idx.size() < n) {
    const std::uint64_t room = ~std::uint64_t{0} - 1 - idx.back();
    std::uint64_t gap = draw_gap(g, rng);
    if (room == 0) break;
    if (gap >= room) gap = rng() % room;
    idx.push_back(idx.back() + gap + 1);
  }
  return idx;
}

std::vector<std::uint8_t> as_u8(const std::vector<std::byte>& b) {
  std::vector<std::uint8_t> v(b.size());
  if (!b.empty()) std::memcpy(v.data(), b.data(), b.size());
  return v;
}

struct outcome {
  status s;
  std::vector<std::uint64_t> idx;
};

outcome reference(location_id id, const std::vector<std::uint8_t>& bytes, std::uint64_t first,
                  std::uint64_t numel, std::uint64_t count) {
  outcome o;
  o.idx.assign(count, 0);
  const auto* p = reinterpret_cast<const std::byte*>(bytes.data());
  o.s =
      codec::decode_locations(id, std::span<const std::byte>(p, bytes.size()), first, numel, o.idx);
  return o;
}

int compared = 0, failures_compared = 0;

/// Twin and reference agree on this input.
void agree(location_id id, const std::vector<std::uint8_t>& bytes, std::uint64_t first,
           std::uint64_t numel, std::uint64_t count, const char* what) {
  const outcome ref = reference(id, bytes, first, numel, count);
  std::vector<std::uint64_t> got;
  const status s = twin::decode_locations(id, bytes, first, numel, count, got);
  ++compared;
  INFO(what, " ", codec::to_string(id), " count ", count, " bytes ", bytes.size(), " first ", first,
       " numel ", numel);
  CHECK(s.code == ref.s.code);
  CHECK(s.message == ref.s.message);
  if (ref.s && s) CHECK(got == ref.idx);
  if (!ref.s) ++failures_compared;
  if (!codec::is_known_location(static_cast<std::uint8_t>(id))) return;
  // The typed entry (what a pipeline that knows its coding calls) against
  // that coding's own decoder.
  codec::visit_location(id, [&](auto c) {
    using Coding = decltype(c);
    std::vector<std::uint64_t> typed, own(count, 0);
    const status t = twin::decode_locations<Coding>(bytes, first, numel, count, typed);
    const auto* p = reinterpret_cast<const std::byte*>(bytes.data());
    const status o = Coding::decode(std::span<const std::byte>(p, bytes.size()), first, numel, own);
    INFO("typed ", Coding::name);
    CHECK(t.code == o.code);
    CHECK(t.message == o.message);
    if (t && o) CHECK(typed == own);
  });
}

/// Every coding that can encode `idx`, decoded intact and corrupted.
void sweep(const std::vector<std::uint64_t>& idx, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const std::uint64_t count = idx.size();
  const std::uint64_t first = idx.empty() ? 0 : idx.front();
  const std::uint64_t last = idx.empty() ? 0 : idx.back();
  for (const location_id id : all_ids) {
    bool can = false;
    codec::visit_location(id, [&](auto c) { can = idx.empty() || decltype(c)::can_encode(idx); });
    if (!can) continue;
    std::vector<std::byte> enc;
    if (!idx.empty()) codec::encode_locations(id, idx, enc);
    const auto bytes = as_u8(enc);
    const std::uint64_t numel = last + 1 == 0 ? last : last + 1;
    agree(id, bytes, first, numel, count, "intact");
    if (count == 0) continue;
    agree(id, bytes, first, last, count, "numel = last"); // the last index is out of range
    if (count > 2) agree(id, bytes, first, idx[count / 2], count, "numel mid");
    agree(id, bytes, numel, numel, count, "first = numel");
    agree(id, bytes, first, numel, count + 1, "one more record");
    if (count > 1) agree(id, bytes, first, numel, count - 1, "one record fewer");
    if (!bytes.empty()) {
      for (std::size_t cut : {std::size_t{1}, std::size_t{2}, bytes.size() / 2, bytes.size()}) {
        if (cut > bytes.size()) continue;
        agree(id,
              std::vector<std::uint8_t>(bytes.begin(),
                                        bytes.end() - static_cast<std::ptrdiff_t>(cut)),
              first, numel, count, "truncated");
      }
      for (int t = 0; t < 12; ++t) {
        auto bad = bytes;
        const std::size_t at = rng() % bad.size();
        const std::uint8_t vals[] = {
            0x00, 0x01, 0x7F, 0x80, 0xFE, 0xFF, static_cast<std::uint8_t>(rng())};
        bad[at] = vals[rng() % 7];
        agree(id, bad, first, numel, count, "byte replaced");
        agree(id, bad, first, ~std::uint64_t{0}, count, "byte replaced, numel max");
      }
    }
    for (const std::uint8_t pad : {std::uint8_t{0x00}, std::uint8_t{0x80}, std::uint8_t{0xFF}}) {
      auto more = bytes;
      more.push_back(pad);
      agree(id, more, first, numel, count, "one byte appended");
    }
  }
}

} // namespace

TEST_CASE("escape transducer maps compose associatively and track the reader state") {
  // Every triple of the four maps {S,E}->{S,E}.
  for (unsigned a = 0; a < 4; ++a)
    for (unsigned b = 0; b < 4; ++b)
      for (unsigned c = 0; c < 4; ++c) {
        const auto x = static_cast<twin::escape_map>(a), y = static_cast<twin::escape_map>(b),
                   z = static_cast<twin::escape_map>(c);
        CHECK(twin::escape_then(twin::escape_then(x, y), z) ==
              twin::escape_then(x, twin::escape_then(y, z)));
        CHECK(twin::escape_then(twin::escape_identity, x) == x);
        CHECK(twin::escape_then(x, twin::escape_identity) == x);
      }
  // 0xFF starts an escape at a value start and continues one inside it.
  CHECK(twin::escape_apply(twin::escape_step(0xFF), twin::escape_at_start) == twin::escape_inside);
  CHECK(twin::escape_apply(twin::escape_step(0xFF), twin::escape_inside) == twin::escape_inside);
  CHECK(twin::escape_apply(twin::escape_step(0x80), twin::escape_at_start) ==
        twin::escape_at_start);
  CHECK(twin::escape_apply(twin::escape_step(0x7F), twin::escape_inside) == twin::escape_at_start);
  CHECK(twin::ends_value(twin::gap_form::escape, 0x80, twin::escape_at_start));
  CHECK_FALSE(twin::ends_value(twin::gap_form::escape, 0x80, twin::escape_inside));
  CHECK_FALSE(twin::ends_value(twin::gap_form::escape, 0xFF, twin::escape_at_start));
}

TEST_CASE("LEB128 element rules equal the reference reader on every short form") {
  // All 1- and 2-byte forms, and 10-byte forms with every last byte.
  std::vector<std::vector<std::uint8_t>> forms;
  for (unsigned a = 0; a < 256; ++a) {
    forms.push_back({static_cast<std::uint8_t>(a)});
    for (unsigned b = 0; b < 256; ++b)
      forms.push_back({static_cast<std::uint8_t>(a), static_cast<std::uint8_t>(b)});
  }
  for (unsigned last = 0; last < 256; ++last) {
    std::vector<std::uint8_t> f(9, 0xFF);
    f.push_back(static_cast<std::uint8_t>(last));
    forms.push_back(f);
    f.push_back(0x01);
    forms.push_back(f); // 11 bytes when `last` continues
  }
  for (const auto& f : forms) {
    std::size_t pos = 0;
    std::uint64_t v = 0;
    const bool ok = codec::detail::get_varint(
        std::span<const std::byte>(reinterpret_cast<const std::byte*>(f.data()), f.size()), pos, v);
    // The element rules see the value up to its terminator.
    std::size_t len = 0;
    while (len < f.size() && f[len] >= 0x80) ++len;
    if (len == f.size()) {
      CHECK_FALSE(ok); // no terminator: truncated
      continue;
    }
    ++len;
    const bool elem_ok = !twin::leb128_malformed(f.data(), len);
    INFO("form of ", f.size(), " bytes, first ", unsigned(f[0]), " last ", unsigned(f[len - 1]));
    CHECK(elem_ok == ok);
    if (ok) {
      CHECK(pos == len);
      CHECK(twin::leb128_value(f.data(), len) == v);
    }
  }
}

TEST_CASE("byte planes: element gather inverts the codec's value filter") {
  for (unsigned width : {2u, 4u, 8u})
    for (std::size_t n : {std::size_t{1}, std::size_t{3}, std::size_t{64}}) {
      std::vector<std::byte> words(n * width), planes(n * width);
      for (std::size_t i = 0; i < words.size(); ++i) words[i] = static_cast<std::byte>(i * 37 + 11);
      codec::apply_filter(codec::value_filter::byte_planes, words, width, planes);
      const auto* p = reinterpret_cast<const std::uint8_t*>(planes.data());
      const auto* w = reinterpret_cast<const std::uint8_t*>(words.data());
      for (std::size_t k = 0; k < n; ++k)
        CHECK(twin::load_plane_word(p, width, n, k) == twin::load_gap(w, width, k));
    }
}

TEST_CASE("decode twin equals the reference decoder: every coding, gap distributions, counts, "
          "corruptions") {
  std::uint64_t seed = 1;
  for (const auto g : {gaps_kind::zero, gaps_kind::small, gaps_kind::mixed, gaps_kind::near_255,
                       gaps_kind::large, gaps_kind::huge})
    for (const std::size_t n :
         {std::size_t{0}, std::size_t{1}, std::size_t{2}, std::size_t{3}, std::size_t{9},
          std::size_t{17}, std::size_t{101}, std::size_t{4099}})
      sweep(make_indices(n, g, seed), seed), ++seed;
  MESSAGE(compared, " inputs compared, ", failures_compared, " of them failing");
  CHECK(failures_compared >
        compared / 3); // the sweep exercises the error paths, not just round trips
}

TEST_CASE("decode twin on adversarial escape_u8 and varint bytes") {
  const location_id variable[] = {location_id::varint, location_id::escape_u8};
  std::vector<std::vector<std::uint8_t>> inputs = {
      {},
      {0xFF},
      {0xFF, 0xFF},
      {0xFF, 0x00},       // escape of 0: gap 255
      {0xFF, 0x80, 0x00}, // non-minimal LEB after the escape
      {0xFF, 0xFF, 0x01}, // 0xFF as a continuation byte
      {0xFF, 0x80},       // cut inside the escape
      {0x80, 0x80, 0x80}, // varint cut off
      {0x00, 0x80},
  };
  // 9 continuation bytes then each possible 10th byte, after an escape and bare.
  for (unsigned last : {0x00u, 0x01u, 0x02u, 0x7Fu, 0x80u, 0xFFu}) {
    std::vector<std::uint8_t> v(9, 0xFF);
    v.push_back(static_cast<std::uint8_t>(last));
    inputs.push_back(v);
    v.insert(v.begin(), 0xFF);
    inputs.push_back(v);
    v.push_back(0x05);
    inputs.push_back(v);
  }
  // The largest escape: 255 + (2^64 - 256) = 2^64 - 1, and one above it.
  {
    std::vector<std::byte> e;
    codec::detail::put_varint(e, ~std::uint64_t{0} - 255);
    std::vector<std::uint8_t> v = {0xFF};
    for (auto b : e) v.push_back(static_cast<std::uint8_t>(b));
    inputs.push_back(v);
    e.clear();
    codec::detail::put_varint(e, ~std::uint64_t{0} - 254);
    v = {0xFF};
    for (auto b : e) v.push_back(static_cast<std::uint8_t>(b));
    inputs.push_back(v);
  }
  // Plain runs around fast-path blocks of 8, with an out-of-range index placed
  // at every position relative to the blocks.
  std::mt19937_64 rng(7);
  for (int t = 0; t < 300; ++t) {
    std::vector<std::uint8_t> v;
    const std::size_t n = 1 + rng() % 40;
    for (std::size_t i = 0; i < n; ++i) {
      const unsigned r = rng() % 10;
      if (r == 0) {
        v.push_back(0xFF);
        v.push_back(static_cast<std::uint8_t>(rng() % 0x80));
      } else if (r == 1) {
        v.push_back(0xFF);
        v.push_back(static_cast<std::uint8_t>(0x80 | rng()));
        v.push_back(static_cast<std::uint8_t>(1 + rng() % 0x7F));
      } else if (r == 2) {
        v.push_back(static_cast<std::uint8_t>(0x80 | rng()));
      } else {
        v.push_back(static_cast<std::uint8_t>(rng() % 0xFF));
      }
    }
    inputs.push_back(v);
  }
  for (const auto& v : inputs)
    for (const location_id id : variable)
      for (std::uint64_t count :
           {std::uint64_t{1}, std::uint64_t{2}, std::uint64_t{3}, std::uint64_t{9},
            std::uint64_t{12}, static_cast<std::uint64_t>(v.size()),
            static_cast<std::uint64_t>(v.size() + 1)}) {
        if (count == 0) continue;
        for (std::uint64_t numel : {std::uint64_t{1}, std::uint64_t{300}, std::uint64_t{2000},
                                    std::uint64_t{5000}, ~std::uint64_t{0}})
          for (std::uint64_t first : {std::uint64_t{0}, std::uint64_t{5}, ~std::uint64_t{0} - 300})
            agree(id, v, first, numel, count, "adversarial");
      }
}

TEST_CASE("decode twin: count 0, unknown coding, wrap at 2^64") {
  std::vector<std::uint64_t> out;
  for (const location_id id : all_ids) agree(id, {}, 0, 10, 0, "count 0");
  CHECK(twin::decode_locations(static_cast<location_id>(11), {}, 0, 10, 1, out).code ==
        errc::bad_location);
  CHECK(twin::decode_locations(static_cast<location_id>(0), {}, 0, 10, 1, out).code ==
        errc::bad_location);
  // gap_u64 of 2^64 - 1: the index wraps onto its predecessor.
  const std::vector<std::uint8_t> wrap(8, 0xFF);
  agree(location_id::gap_u64, wrap, 3, ~std::uint64_t{0}, 2, "wrap");
  agree(location_id::planes_u64, wrap, 3, ~std::uint64_t{0}, 2, "wrap");
  agree(location_id::varint, {0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01}, 3,
        ~std::uint64_t{0}, 2, "wrap");
}

TEST_CASE_TEMPLATE(
    "scatter_encoded twin equals reference decode + scatter; nothing written on failure", W,
    std::uint8_t, std::uint16_t, std::uint32_t, std::uint64_t) {
  std::mt19937_64 rng(11);
  const std::int64_t ext[] = {13, 17, 5};
  const auto base = twin::row_major(ext, 3);
  twin::layout trans = base; // a transposed destination: locations read in its own row-major order
  std::swap(trans.extents[0], trans.extents[2]);
  std::swap(trans.strides[0], trans.strides[2]);
  trans.contiguous = trans.is_row_major();
  const auto numel = static_cast<std::uint64_t>(base.size());
  for (const twin::layout& shape : {base, trans})
    for (const location_id id : all_ids)
      for (const double density : {0.0, 0.01, 0.3, 1.0})
        for (const bool planes : {false, true})
          for (const auto op : {twin::scatter_op::xor_mask, twin::scatter_op::overwrite}) {
            std::vector<std::uint64_t> idx;
            for (std::uint64_t i = 0; i < numel; ++i)
              if (static_cast<double>(rng() % 1000) < density * 1000) idx.push_back(i);
            bool can = true;
            codec::visit_location(
                id, [&](auto c) { can = idx.empty() || decltype(c)::can_encode(idx); });
            if (!can || (id == location_id::run && idx.empty())) continue;
            std::vector<std::byte> enc;
            if (!idx.empty()) codec::encode_locations(id, idx, enc);
            const auto loc = as_u8(enc);
            std::vector<std::byte> words(idx.size() * sizeof(W)), filtered(words.size());
            for (auto& b : words) b = static_cast<std::byte>(rng());
            codec::apply_filter(planes ? codec::value_filter::byte_planes
                                       : codec::value_filter::none,
                                words, sizeof(W), filtered);
            const auto val = as_u8(filtered);
            std::vector<W> store(static_cast<std::size_t>(numel));
            for (auto& w : store) w = static_cast<W>(rng());
            auto want = store;
            const twin::view<W> dst{store.data(), shape};
            const twin::view<W> ref{want.data(), shape};
            for (std::size_t k = 0; k < idx.size(); ++k) {
              W v = 0;
              std::memcpy(&v, words.data() + k * sizeof(W), sizeof(W));
              W& d = ref.at(static_cast<std::int64_t>(idx[k]));
              d = twin::scatter_word(d, v, op);
            }
            const std::uint64_t first = idx.empty() ? 0 : idx.front();
            REQUIRE(twin::scatter_encoded<W>(dst, first, idx.size(), id, loc, val, planes, op));
            CHECK(store == want);
            if (idx.empty()) continue;
            // Failures: first index past the view, truncated locations, a wrong value length.
            const auto before = store;
            const auto r1 =
                twin::scatter_encoded<W>(dst, numel, idx.size(), id, loc, val, planes, op);
            CHECK(r1.code == errc::index_out_of_range);
            if (!loc.empty()) {
              const std::vector<std::uint8_t> cut(loc.begin(), loc.end() - 1);
              const auto r2 =
                  twin::scatter_encoded<W>(dst, first, idx.size(), id, cut, val, planes, op);
              CHECK(r2.code == errc::bad_location);
              const outcome o = reference(id, cut, first, numel, idx.size());
              CHECK(r2.message == o.s.message);
            }
            const std::vector<std::uint8_t> short_val(val.begin(), val.end() - 1);
            CHECK(twin::scatter_encoded<W>(dst, first, idx.size(), id, loc, short_val, planes, op)
                      .code == errc::length_overflow);
            CHECK(store == before);
          }
  // Empty items and a bad destination.
  std::vector<W> s(4, 0);
  const twin::view<W> v{s.data(), twin::linear(4)};
  CHECK(twin::scatter_encoded<W>(v, 0, 0, location_id::run, {}, {}, false));
  const std::vector<std::uint8_t> one = {1};
  CHECK(twin::scatter_encoded<W>(v, 0, 0, location_id::gap_u8, one, {}, false).code ==
        errc::bad_location);
  twin::view<W> alias{s.data(), twin::linear(4)};
  alias.shape.strides[0] = 0;
  alias.shape.contiguous = false;
  CHECK(twin::scatter_encoded<W>(alias, 0, 1, location_id::run, {},
                                 std::vector<std::uint8_t>(sizeof(W)), false)
            .code == errc::invalid_argument);
}

namespace {

/// Items over bf16 and f32 tensors with scattered, contiguous and empty
/// index sets, so that the encoder picks every coding of a scheme.
std::vector<item> row_items(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<item> items;
  const auto add = [&](const char* name, dtype_id dt, std::vector<std::uint64_t> shape,
                       std::vector<std::uint64_t> idx) {
    item it;
    it.tensor = {name, std::move(shape), dt};
    it.encoding = rng() % 2 ? value_encoding::xor_mask : value_encoding::overwrite;
    it.indices = std::move(idx);
    it.values.resize(it.indices.size() * width_of(dt));
    for (auto& b : it.values) b = static_cast<std::byte>(rng());
    items.push_back(std::move(it));
  };
  std::vector<std::uint64_t> sparse, dense, wide;
  for (std::uint64_t i = 0; i < 4096; ++i)
    if (rng() % 100 < 3) sparse.push_back(i);
  for (std::uint64_t i = 100; i < 400; ++i) dense.push_back(i);
  for (std::uint64_t i = 0; i < (1u << 20); i += 1 + rng() % 70000) wide.push_back(i);
  add("a.weight", dtype_id::bf16, {64, 64}, sparse);
  add("b.weight", dtype_id::f32, {1000}, dense);
  add("c.weight", dtype_id::bf16, {1024, 1024}, wide);
  add("d.weight", dtype_id::f32, {8}, {});
  add("e.weight", dtype_id::bf16, {4096},
      std::vector<std::uint64_t>(sparse.begin(), sparse.begin() + 1));
  add("f.weight", dtype_id::f32, {1u << 20}, wide);
  add("g.weight", dtype_id::f32, {64, 64}, sparse);
  return items;
}

} // namespace

TEST_CASE_TEMPLATE("scatter_row twin equals decode_row + scatter_item, errors worded as decode_row",
                   W, std::uint16_t, std::uint32_t) {
  const codec::location_scheme schemes[] = {
      codec::location_scheme::gaps, codec::location_scheme::planes, codec::location_scheme::varint,
      codec::location_scheme::escape_u8};
  std::uint64_t seed = 3;
  int rows_applied = 0, corrupt_compared = 0;
  for (const auto scheme : schemes)
    for (const auto filter : {codec::value_filter::none, codec::value_filter::byte_planes}) {
      const auto items = row_items(seed++);
      encode_options opt;
      opt.locations = scheme;
      opt.filter = filter;
      const auto bytes = encode_payload(payload_id{1, 2, 3, 4}, items, opt);
      codec::payload_info pi;
      REQUIRE(codec::inspect_payload(bytes, pi));
      for (std::size_t i = 0; i < pi.rows.size(); ++i) {
        const auto& row = pi.rows[i];
        if (width_of(row.tensor.dtype) != sizeof(W)) {
          std::vector<W> s(row.tensor.numel());
          CHECK(twin::scatter_row<W>(
                    twin::view<W>{s.data(), twin::linear(static_cast<std::int64_t>(s.size()))},
                    pi.body, pi.header, row, i)
                    .code == errc::bad_dtype);
          continue;
        }
        item it;
        REQUIRE(codec::decode_row(pi.body, pi.header, row, i, it));
        std::vector<W> got(row.tensor.numel());
        std::mt19937_64 rng(i);
        for (auto& w : got) w = static_cast<W>(rng());
        auto want = got;
        const auto n = static_cast<std::int64_t>(got.size());
        REQUIRE(twin::scatter_item<W>(twin::view<W>{want.data(), twin::linear(n)}, it));
        REQUIRE(twin::scatter_row<W>(twin::view<W>{got.data(), twin::linear(n)}, pi.body, pi.header,
                                     row, i));
        CHECK(got == want);
        ++rows_applied;
        // Corrupt each location section: same code and message as decode_row.
        if (row.location_length == 0) continue;
        std::mt19937_64 crng(seed * 31 + i);
        for (int t = 0; t < 20; ++t) {
          auto body = pi.body;
          const std::size_t at =
              pi.header.table_length + row.location_offset + crng() % row.location_length;
          body[at] = static_cast<std::byte>(crng());
          item ref;
          const status r = codec::decode_row(body, pi.header, row, i, ref);
          const auto before = got;
          const status s = twin::scatter_row<W>(twin::view<W>{got.data(), twin::linear(n)}, body,
                                                pi.header, row, i);
          CHECK(s.code == r.code);
          CHECK(s.message == r.message);
          if (!s) CHECK(got == before);
          if (!s) ++corrupt_compared;
          got = before;
        }
      }
    }
  CHECK(rows_applied > 8);
  CHECK(corrupt_compared > 20);
}
