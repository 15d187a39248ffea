// Host twins of the CUDA kernels (dcr/twin/*.hpp) against naive
// references built on the core layout (coordinates → offset), over whole
// small domains and fixed-seed sweeps; every failure path by its errc.

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "dcr/core/tensor.hpp"
#include "dcr/twin/copy.hpp"
#include "dcr/twin/detect.hpp"
#include "dcr/twin/element.hpp"
#include "dcr/twin/scatter.hpp"
#include "dcr/twin/view.hpp"

using namespace dcr;
using twin::copy_mode;
using twin::scatter_op;

namespace {

/// Offset of row-major coordinate k through the core layout's `offset(c)`
/// (coordinates unravelled here, independently of offset_of_linear).
std::int64_t naive_offset(const strided_layout& l, std::uint64_t k) {
  std::int64_t c[max_rank] = {};
  for (std::size_t i = l.rank; i-- > 0;) {
    c[i] = static_cast<std::int64_t>(k % static_cast<std::uint64_t>(l.extents[i]));
    k /= static_cast<std::uint64_t>(l.extents[i]);
  }
  return l.offset(c);
}

struct layout_case {
  const char* name;
  std::size_t storage;
  std::int64_t base;
  strided_layout l;
};

std::vector<layout_case> layouts() {
  std::vector<layout_case> v;
  v.push_back({"empty", 0, 0, strided_layout::row_major({0})});
  v.push_back({"scalar", 1, 0, strided_layout::row_major(std::vector<std::uint64_t>{})});
  v.push_back({"1", 1, 0, strided_layout::row_major({1})});
  v.push_back({"odd", 37, 0, strided_layout::row_major({37})});
  v.push_back({"2d", 35, 0, strided_layout::row_major({5, 7})});
  v.push_back({"2d^T", 35, 0, strided_layout::row_major({5, 7}).transposed(0, 1)});
  std::int64_t b1 = 0;
  v.push_back({"3d slice", 4 * 9 * 6, 0, strided_layout::row_major({4, 9, 6}).slice(1, 2, 5, b1)});
  v.back().base = b1;
  std::int64_t b2 = 0;
  v.push_back({"3d slice^T", 4 * 9 * 6, 0,
               strided_layout::row_major({4, 9, 6}).slice(2, 1, 4, b2).transposed(0, 2)});
  v.back().base = b2;
  v.push_back({"4d perm", 2 * 3 * 4 * 5, 0,
               strided_layout::row_major({2, 3, 4, 5}).transposed(1, 3).transposed(0, 2)});
  return v;
}

template <class W>
std::vector<W> words(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 r(seed);
  std::vector<W> v(n);
  for (auto& w : v) w = static_cast<W>(r());
  return v;
}

std::vector<std::uint64_t> locations(std::uint64_t n, double density, std::uint64_t seed) {
  std::mt19937_64 r(seed);
  std::bernoulli_distribution b(density);
  std::vector<std::uint64_t> v;
  for (std::uint64_t i = 0; i < n; ++i)
    if (b(r)) v.push_back(i);
  return v;
}

std::vector<std::uint8_t> gaps_of(const std::vector<std::uint64_t>& loc, unsigned width) {
  std::vector<std::uint8_t> g;
  for (std::size_t k = 1; k < loc.size(); ++k)
    for (unsigned b = 0; b < width; ++b)
      g.push_back(static_cast<std::uint8_t>((loc[k] - loc[k - 1] - 1) >> (8 * b)));
  return g;
}

unsigned min_width(const std::vector<std::uint64_t>& loc) {
  std::uint64_t m = 0;
  for (std::size_t k = 1; k < loc.size(); ++k) m = std::max(m, loc[k] - loc[k - 1] - 1);
  return twin::gap_width_for(m);
}

const double densities[] = {0.0, 0.001, 0.01, 0.05, 0.5, 1.0};

template <class W>
bool same(const std::vector<W>& a, const std::vector<W>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(W)) == 0);
}

} // namespace

TEST_CASE("device layout agrees with the core layout on every coordinate") {
  for (const auto& c : layouts()) {
    CAPTURE(c.name);
    const auto d = twin::to_device(c.l);
    CHECK(d.size() == c.l.size());
    CHECK(d.required_span_size() == c.l.required_span_size());
    CHECK(d.is_unique() == c.l.is_unique());
    CHECK(d.contiguous == c.l.is_contiguous());
    CHECK(twin::to_core(d) == c.l);
    for (std::int64_t k = 0; k < c.l.size(); ++k) {
      REQUIRE(d.offset_of_linear(k) == naive_offset(c.l, static_cast<std::uint64_t>(k)));
      REQUIRE(d.offset_of_linear(k) == c.l.offset_of_linear(k));
    }
    // The non-contiguous path of offset_of_linear gives the same offsets.
    auto slow = d;
    slow.contiguous = false;
    for (std::int64_t k = 0; k < c.l.size(); ++k)
      REQUIRE(slow.offset_of_linear(k) == d.offset_of_linear(k));
  }
  const std::int64_t ext[2] = {3, 4}, str[2] = {4, 0};
  CHECK_FALSE(twin::strided(ext, str, 2).is_unique());
  CHECK(twin::row_major(ext, 2).contiguous);
}

TEST_CASE("NaN rules equal the dtype NaN test on every word") {
  for (auto id : {dtype_id::bf16, dtype_id::f16, dtype_id::f8e4m3fn, dtype_id::f8e5m2}) {
    CAPTURE(name_of(id));
    const auto r = twin::nan_rule_of(id);
    const std::uint32_t words = width_of(id) == 1 ? 0x100u : 0x10000u;
    visit_dtype(id, [&](auto tag) {
      using D = decltype(tag);
      for (std::uint32_t w = 0; w < words; ++w)
        REQUIRE(twin::is_nan_by(static_cast<word_t<D>>(w), r) ==
                is_nan_word<D>(static_cast<word_t<D>>(w)));
    });
  }
  const auto r = twin::nan_rule_of(dtype_id::f32);
  std::mt19937_64 g(5);
  for (int i = 0; i < 200000; ++i) {
    auto w = static_cast<std::uint32_t>(g());
    if (i % 2) w |= 0x7F800000u; // half of them with a full exponent
    REQUIRE(twin::is_nan_by(w, r) == is_nan_word<f32>(w));
  }
  CHECK_FALSE(twin::is_nan_by(std::uint16_t{0x7FC0}, twin::nan_rule_of(static_cast<dtype_id>(99))));
}

TEST_CASE("gap words: width selection, little-endian loads, decode round trip") {
  CHECK(twin::gap_width_for(0) == 1);
  CHECK(twin::gap_width_for(0xFF) == 1);
  CHECK(twin::gap_width_for(0x100) == 2);
  CHECK(twin::gap_width_for(0xFFFF) == 2);
  CHECK(twin::gap_width_for(0x10000) == 4);
  CHECK(twin::gap_width_for(0xFFFFFFFFull) == 4);
  CHECK(twin::gap_width_for(0x100000000ull) == 8);
  const std::uint8_t b[] = {0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09};
  CHECK(twin::load_gap(b, 2, 1) == 0x0403);
  CHECK(twin::load_gap(b, 4, 0) == 0x04030201u);
  CHECK(twin::load_gap(b + 1, 8, 0) == 0x0908070605040302ull);
  for (double d : densities)
    for (std::uint64_t n : {0ull, 1ull, 1000ull, 100000ull}) {
      auto loc = locations(n, d, 17 + n);
      for (auto& l : loc) l *= 977; // gaps beyond one byte
      for (unsigned w : {1u, 2u, 4u, 8u}) {
        if (w < min_width(loc)) continue;
        std::vector<std::uint64_t> out;
        const std::uint64_t first = loc.empty() ? 5 : loc[0];
        REQUIRE(twin::decode_gaps(first, w, gaps_of(loc, w), loc.size(), out).ok());
        CHECK(out == loc);
      }
    }
}

TEST_CASE_TEMPLATE("scatter twin equals a naive scatter through core offsets", W, std::uint8_t,
                   std::uint16_t, std::uint32_t, std::uint64_t) {
  std::uint64_t seed = 1;
  for (const auto& c : layouts())
    for (double d : densities)
      for (auto op : {scatter_op::xor_mask, scatter_op::overwrite, scatter_op::add}) {
        CAPTURE(c.name);
        CAPTURE(d);
        CAPTURE(static_cast<int>(op));
        const auto size = static_cast<std::uint64_t>(c.l.size());
        const auto init = words<W>(c.storage, seed++);
        const auto loc = locations(size, d, seed++);
        const auto val = words<W>(loc.size(), seed++);
        auto ref = init;
        for (std::size_t k = 0; k < loc.size(); ++k) {
          W& r = ref[static_cast<std::size_t>(c.base + naive_offset(c.l, loc[k]))];
          // add: resident + unzigzag(value), written out in plain arithmetic.
          const W diff = static_cast<W>((val[k] >> 1) ^ static_cast<W>(W{0} - (val[k] & 1u)));
          r = op == scatter_op::xor_mask ? static_cast<W>(r ^ val[k])
              : op == scatter_op::add    ? static_cast<W>(r + diff)
                                         : val[k];
        }
        auto got = init;
        const strided_view<W> sv{got.data() + c.base, c.l};
        REQUIRE(twin::scatter<W>(sv, loc, val, op).ok());
        CHECK(same(got, ref));
        // Fused gap form, minimal and widest width.
        for (unsigned w : {min_width(loc), 8u}) {
          auto g = init;
          REQUIRE(twin::scatter_gaps<W>({g.data() + c.base, twin::to_device(c.l)},
                                        loc.empty() ? 0 : loc[0], w, gaps_of(loc, w), val, op)
                      .ok());
          CHECK(same(g, ref));
        }
        // Law: XOR scatter is an involution.
        if (op == scatter_op::xor_mask) {
          REQUIRE(twin::xor_scatter<W>(sv, loc, val).ok());
          CHECK(same(got, init));
        }
        // Law: add scatter of make(old, new) gives new; the named form equals scatter(add).
        if (op == scatter_op::add) {
          auto target = words<W>(c.storage, seed++);
          auto g = init;
          const strided_view<W> gv{g.data() + c.base, c.l};
          std::vector<W> deltas(loc.size());
          for (std::size_t k = 0; k < loc.size(); ++k) {
            const auto at = static_cast<std::size_t>(c.base + naive_offset(c.l, loc[k]));
            deltas[k] = codec::add::make(init[at], target[at]);
          }
          REQUIRE(twin::add_scatter<W>(gv, loc, deltas).ok());
          for (std::size_t k = 0; k < loc.size(); ++k) {
            const auto at = static_cast<std::size_t>(c.base + naive_offset(c.l, loc[k]));
            CHECK(g[at] == target[at]);
          }
          auto h = init;
          REQUIRE(twin::add_scatter<W>(strided_view<W>{h.data() + c.base, c.l}, loc, val).ok());
          CHECK(same(h, ref));
        }
        // Run form equals scatter over the run's locations.
        const std::uint64_t start = size / 4, count = (size - start) / 2;
        std::vector<std::uint64_t> rl(count);
        for (std::uint64_t k = 0; k < count; ++k) rl[k] = start + k;
        const auto rv = words<W>(count, seed++);
        auto a = init, b = init;
        REQUIRE(
            twin::scatter_run<W>({a.data() + c.base, twin::to_device(c.l)}, start, rv, op).ok());
        REQUIRE(twin::scatter<W>({b.data() + c.base, twin::to_device(c.l)}, rl, rv, op).ok());
        CHECK(same(a, b));
      }
}

TEST_CASE("scatter failures carry their errc and write nothing") {
  std::vector<std::uint16_t> store = words<std::uint16_t>(100, 3);
  const auto init = store;
  const twin::view<std::uint16_t> v{store.data(), twin::linear(100)};
  const std::vector<std::uint16_t> val = {1, 2, 3, 4};
  auto code = [&](std::vector<std::uint64_t> loc) {
    return twin::scatter<std::uint16_t>(v, loc, val).code;
  };
  CHECK(code({1, 2, 3, 100}) == errc::index_out_of_range);
  CHECK(code({1, 2, 2, 5}) == errc::not_increasing);
  CHECK(code({5, 4, 6, 7}) == errc::not_increasing);
  CHECK(code({1, 2, 3}) == errc::invalid_argument);
  CHECK(twin::scatter<std::uint16_t>(v, std::vector<std::uint64_t>{1, 2, 3, 100}, val).message ==
        "record 3: location outside the view of 100 elements");
  CHECK(same(store, init));

  twin::view<std::uint16_t> alias = v;
  alias.shape = twin::linear(10);
  alias.shape.strides[0] = 0;
  alias.shape.contiguous = false;
  CHECK(twin::scatter<std::uint16_t>(alias, std::vector<std::uint64_t>{1},
                                     std::vector<std::uint16_t>{1})
            .code == errc::invalid_argument);
  twin::view<std::uint16_t> lie = v; // marked contiguous but strided
  lie.shape.rank = 2, lie.shape.extents[0] = 10, lie.shape.extents[1] = 5,
  lie.shape.strides[0] = 10, lie.shape.strides[1] = 1;
  CHECK(
      twin::scatter<std::uint16_t>(lie, std::vector<std::uint64_t>{}, std::vector<std::uint16_t>{})
          .code == errc::invalid_argument);
  twin::view<std::uint16_t> huge = v;
  huge.shape.rank = 3, huge.shape.contiguous = false;
  huge.shape.extents[0] = huge.shape.extents[1] = huge.shape.extents[2] = 1 << 22;
  huge.shape.strides[0] = huge.shape.strides[1] = huge.shape.strides[2] = 1;
  CHECK(
      twin::scatter<std::uint16_t>(huge, std::vector<std::uint64_t>{}, std::vector<std::uint16_t>{})
          .code == errc::length_overflow);
  CHECK(twin::scatter<std::uint16_t>({nullptr, twin::linear(3)}, std::vector<std::uint64_t>{},
                                     std::vector<std::uint16_t>{})
            .code == errc::invalid_argument);

  CHECK(twin::scatter_run<std::uint16_t>(v, 97, val).code == errc::index_out_of_range);
  CHECK(twin::scatter_run<std::uint16_t>(v, ~0ull - 1, val).code == errc::index_out_of_range);
  CHECK(twin::scatter_run<std::uint16_t>(v, ~0ull, std::vector<std::uint16_t>{}).ok());

  const std::vector<std::uint8_t> g3 = {0, 0, 0};
  CHECK(twin::scatter_gaps<std::uint16_t>(v, 0, 3, std::vector<std::uint8_t>(9), val).code ==
        errc::bad_location);
  CHECK(twin::scatter_gaps<std::uint16_t>(v, 0, 1, std::vector<std::uint8_t>(2), val).code ==
        errc::offset_out_of_range);
  CHECK(twin::scatter_gaps<std::uint16_t>(v, 0, 1, g3, val).ok()); // locations 0,1,2,3
  store = init;
  std::vector<std::uint8_t> wrap(24, 0xFF); // gap+1 wraps to 0: a duplicate
  CHECK(twin::scatter_gaps<std::uint16_t>(v, 0, 8, wrap, val).code == errc::not_increasing);
  wrap.assign(24, 0);
  wrap[8] = 0xFE,
  std::fill(wrap.begin() + 9, wrap.begin() + 16, 0xFF); // huge gap: the sum wraps below
  CHECK(twin::scatter_gaps<std::uint16_t>(v, 5, 8, wrap, val).code == errc::not_increasing);
  CHECK(
      twin::scatter_gaps<std::uint16_t>(v, 50, 1, std::vector<std::uint8_t>{0, 60, 0}, val).code ==
      errc::index_out_of_range);
  CHECK(same(store, init));
}

TEST_CASE_TEMPLATE("copy twin equals naive copies in every mode", W, std::uint8_t, std::uint16_t,
                   std::uint32_t) {
  const W ph = static_cast<W>(0x7FC0);
  std::uint64_t seed = 500;
  const auto ls = layouts();
  for (std::size_t i = 0; i < ls.size(); ++i)
    for (double d : densities) {
      const auto& dc = ls[i];
      // Source: a row-major tensor with the destination's extents.
      std::vector<std::uint64_t> ext(dc.l.extents.begin(),
                                     dc.l.extents.begin() + static_cast<std::ptrdiff_t>(dc.l.rank));
      const auto sl = strided_layout::row_major(ext);
      const auto n = static_cast<std::size_t>(sl.size());
      auto src = words<W>(n, seed++);
      std::vector<std::uint8_t> mask(n);
      const auto act = locations(n, d, seed++);
      std::vector<bool> active(n);
      for (auto a : act) active[a] = true;
      for (std::size_t k = 0; k < n; ++k) {
        if (!active[k])
          src[k] = ph;
        else if (src[k] == ph)
          src[k] = static_cast<W>(ph ^ 1);
        mask[k] = active[k] ? static_cast<std::uint8_t>(1 + k % 200) : 0;
      }
      const auto init = words<W>(dc.storage, seed++);
      const dtype_id nd = sizeof(W) == 1   ? dtype_id::f8e5m2
                          : sizeof(W) == 2 ? dtype_id::f16
                                           : dtype_id::f32;
      for (auto mode : {copy_mode::dense, copy_mode::xor_mask, copy_mode::overwrite,
                        copy_mode::overwrite_mask, copy_mode::overwrite_nan, copy_mode::add}) {
        CAPTURE(dc.name);
        CAPTURE(static_cast<int>(mode));
        auto ref = init;
        for (std::size_t k = 0; k < n; ++k) {
          W& r = ref[static_cast<std::size_t>(dc.base + naive_offset(dc.l, k))];
          if (mode == copy_mode::dense) r = src[k];
          if (mode == copy_mode::xor_mask) r = static_cast<W>(r ^ src[k]);
          if (mode == copy_mode::add) // plain arithmetic: resident + unzigzag(src)
            r = static_cast<W>(
                r + static_cast<W>((src[k] >> 1) ^ static_cast<W>(W{0} - (src[k] & 1u))));
          if ((mode == copy_mode::overwrite || mode == copy_mode::overwrite_mask) && active[k])
            r = src[k];
          if (mode == copy_mode::overwrite_nan) {
            const bool nan = visit_dtype(nd, [&](auto tag) {
              using D = decltype(tag);
              return is_nan_word<D>(static_cast<word_t<D>>(src[k]));
            });
            if (!nan) r = src[k];
          }
        }
        auto got = init;
        const status s = twin::copy<W>({got.data() + dc.base, twin::to_device(dc.l)},
                                       {src.data(), twin::to_device(sl)}, mode, ph,
                                       {mask.data(), twin::to_device(sl)}, nd);
        REQUIRE(s.ok());
        CHECK(same(got, ref));
      }
    }
}

TEST_CASE("copy failures carry their errc") {
  std::vector<std::uint16_t> a(64), b(64);
  std::vector<std::uint8_t> m(64);
  const twin::view<std::uint16_t> da{a.data(), twin::linear(64)};
  const twin::view<const std::uint16_t> sb{b.data(), twin::linear(64)};
  CHECK(twin::copy<std::uint16_t>(da, {b.data(), twin::linear(63)}, copy_mode::dense).code ==
        errc::shape_mismatch);
  CHECK(twin::copy<std::uint16_t>(da, {a.data() + 63, twin::linear(64)}, copy_mode::dense).code ==
        errc::invalid_argument);
  // Adjacent ranges do not overlap.
  CHECK(twin::copy<std::uint16_t>({a.data(), twin::linear(32)}, {a.data() + 32, twin::linear(32)},
                                  copy_mode::dense)
            .ok());
  CHECK(twin::copy<std::uint16_t>(da, sb, static_cast<copy_mode>(7)).code ==
        errc::invalid_argument);
  CHECK(twin::masked_overwrite_nan<std::uint16_t>(da, sb, dtype_id::f32).code == errc::bad_dtype);
  CHECK(twin::masked_overwrite_nan<std::uint16_t>(da, sb, static_cast<dtype_id>(42)).code ==
        errc::bad_dtype);
  CHECK(twin::masked_overwrite<std::uint16_t>(
            da, sb, twin::view<const std::uint8_t>{m.data(), twin::linear(8)})
            .code == errc::shape_mismatch);
  CHECK(twin::masked_overwrite<std::uint16_t>(
            da, sb, twin::view<const std::uint8_t>{nullptr, twin::linear(64)})
            .code == errc::invalid_argument);
  twin::view<std::uint16_t> alias = da;
  alias.shape.strides[0] = 0;
  alias.shape.contiguous = false;
  CHECK(twin::masked_overwrite<std::uint16_t>(alias, sb, std::uint16_t{0}).code ==
        errc::invalid_argument);
}

TEST_CASE_TEMPLATE("detect twin equals a naive comparison and appends", W, std::uint8_t,
                   std::uint16_t, std::uint32_t, std::uint64_t) {
  std::uint64_t seed = 900;
  for (std::size_t n : {0u, 1u, 7u, 63u, 64u, 65u, 4097u})
    for (double d : densities) {
      const auto a = words<W>(n, seed++);
      auto b = a;
      for (auto i : locations(n, d, seed++))
        b[i] = static_cast<W>(b[i] ^ (1u << (i % (8 * sizeof(W) > 16 ? 16 : 8 * sizeof(W)))));
      std::vector<std::uint64_t> want = {7};
      for (std::size_t i = 0; i < n; ++i)
        if (a[i] != b[i]) want.push_back(1000 + i);
      std::vector<std::uint64_t> got = {7};
      REQUIRE(twin::detect_changes<W>(a, b, 1000, got).ok());
      CHECK(got == want);
    }
  std::vector<W> a(4), b(3);
  std::vector<std::uint64_t> out;
  CHECK(twin::detect_changes<W>(a, b, 0, out).code == errc::invalid_argument);
  CHECK(twin::detect_changes<W>(a, a, ~0ull - 2, out).code == errc::length_overflow);
  CHECK(twin::detect_changes<W>(a, a, ~0ull - 3, out).ok());
  CHECK(out.empty());
}

TEST_CASE("scatter_item applies an item's little-endian words by its encoding") {
  for (auto enc : {value_encoding::xor_mask, value_encoding::overwrite, value_encoding::add}) {
    item it;
    it.tensor = {"w", {6, 7}, dtype_id::f16};
    it.encoding = enc;
    it.indices = locations(42, 0.3, 8);
    const auto w = words<std::uint16_t>(it.indices.size(), 9);
    for (auto x : w)
      it.values.push_back(std::byte(x & 0xFF)), it.values.push_back(std::byte(x >> 8));
    const auto init = words<std::uint16_t>(42, 10);
    const auto l = strided_layout::row_major({7, 6}).transposed(0, 1);
    auto got = init, ref = init;
    REQUIRE(twin::scatter_item<std::uint16_t>({got.data(), twin::to_device(l)}, it).ok());
    for (std::size_t k = 0; k < it.indices.size(); ++k) {
      auto& r = ref[static_cast<std::size_t>(naive_offset(l, it.indices[k]))];
      r = enc == value_encoding::xor_mask ? static_cast<std::uint16_t>(r ^ w[k])
          : enc == value_encoding::add    ? codec::add::apply(r, w[k])
                                          : w[k];
    }
    CHECK(same(got, ref));
    CHECK(twin::op_of(enc) == (enc == value_encoding::xor_mask ? scatter_op::xor_mask
                               : enc == value_encoding::add    ? scatter_op::add
                                                               : scatter_op::overwrite));
  }
  item it;
  it.tensor = {"w", {4}, dtype_id::bf16};
  it.indices = {1, 2};
  it.values.resize(4);
  std::vector<std::uint16_t> s(4);
  const twin::view<std::uint16_t> v{s.data(), twin::linear(4)};
  auto bad = it;
  bad.tensor.dtype = dtype_id::f8e5m2;
  CHECK(twin::scatter_item<std::uint16_t>(v, bad).code == errc::bad_dtype);
  bad = it;
  bad.encoding = static_cast<value_encoding>(9);
  CHECK(twin::scatter_item<std::uint16_t>(v, bad).code == errc::bad_encoding);
  bad = it;
  bad.values.resize(3);
  CHECK(twin::scatter_item<std::uint16_t>(v, bad).code == errc::length_overflow);
  bad = it;
  bad.tensor.shape = {5};
  CHECK(twin::scatter_item<std::uint16_t>(v, bad).code == errc::shape_mismatch);
  bad = it;
  bad.indices = {2, 1};
  CHECK(twin::scatter_item<std::uint16_t>(v, bad).code == errc::not_increasing);
  CHECK(twin::scatter_item<std::uint16_t>(v, it).ok());
}
