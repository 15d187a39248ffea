// The refit stages (source/stages.hpp) composed statically, against a
// brute-force diff over random permutation maps, and the compile-time
// dispatch table (pipeline/dispatch.hpp) against every combination.
#include <doctest/doctest.h>

#include <numeric>
#include <random>

#include "dcr/codec/payload.hpp"
#include "dcr/pipeline/dispatch.hpp"
#include "dcr/source/stages.hpp"

using namespace dcr;

namespace {
struct table {
  std::vector<std::uint64_t> to; // local -> canonical
  std::uint64_t operator()(std::uint64_t j) const { return to[j]; }
};
using table_map = flat_map<table>;
static_assert(index_map<table_map>);

template <class E>
using pipeline_for = stages::refit_pipeline<stages::compare<dcr::bf16>, stages::project<table_map>,
                                            stages::encode<E, codec::by_scheme>>;
/// XOR masks with add differences alongside; the item takes the smaller.
using either_pipeline = stages::refit_pipeline<
    stages::compare<dcr::bf16>, stages::project<table_map>,
    stages::encode_either<codec::xor_mask, codec::add_delta, codec::by_scheme>>;

/// Every shard's records into one buffer, then one item (pipeline `P`).
template <class P>
item run_pipeline(const tensor_meta& meta, std::span<const table_map> maps,
                  std::span<const std::vector<std::uint16_t>> olds,
                  std::span<const std::vector<std::uint16_t>> news,
                  stages::record_buffer* raw = nullptr) {
  stages::record_buffer b;
  for (std::size_t s = 0; s < maps.size(); ++s)
    stages::shard_records<P>(maps[s], olds[s], news[s],
                             [&](std::uint32_t t) -> stages::record_buffer& {
                               CHECK(t == 0);
                               return b;
                             });
  if (raw) *raw = b;
  return stages::to_item<P>(meta, std::move(b));
}
template <class E>
item run_shards(const tensor_meta& meta, std::span<const table_map> maps,
                std::span<const std::vector<std::uint16_t>> olds,
                std::span<const std::vector<std::uint16_t>> news) {
  return run_pipeline<pipeline_for<E>>(meta, maps, olds, news);
}
} // namespace

TEST_CASE("compare -> project -> encode equals a brute-force diff, for XOR, add and overwrite, "
          "any permutation") {
  for (std::uint64_t seed = 0; seed < 20; ++seed) {
    std::mt19937_64 rng(seed);
    const std::uint64_t n = 1 + rng() % 700;
    tensor_meta meta{"t", {n}, dtype_id::bf16};
    // Two shards splitting a random permutation of the canonical indices.
    std::vector<std::uint64_t> perm(n);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    const auto cut = rng() % (n + 1);
    const std::vector<table_map> maps{
        table_map(0, cut, table{{perm.begin(), perm.begin() + cut}}),
        table_map(0, n - cut, table{{perm.begin() + cut, perm.end()}})};
    std::vector<std::uint16_t> old_c(n), new_c(n);
    for (auto& w : old_c) w = static_cast<std::uint16_t>(rng());
    new_c = old_c;
    for (auto& w : new_c)
      if (rng() % 5 == 0) w ^= static_cast<std::uint16_t>(1 + rng() % 0xFFFF);
    auto local = [&](const table_map& m, const std::vector<std::uint16_t>& c) {
      std::vector<std::uint16_t> v;
      for (std::uint64_t j = 0; j < m.domain_size(); ++j) v.push_back(c[m(j).index]);
      return v;
    };
    const std::vector<std::vector<std::uint16_t>> olds{local(maps[0], old_c),
                                                       local(maps[1], old_c)};
    const std::vector<std::vector<std::uint16_t>> news{local(maps[0], new_c),
                                                       local(maps[1], new_c)};
    item by_enc[4];
    for (auto enc : {value_encoding::xor_mask, value_encoding::overwrite, value_encoding::add}) {
      const item got =
          enc == value_encoding::xor_mask ? run_shards<codec::xor_mask>(meta, maps, olds, news)
          : enc == value_encoding::add    ? run_shards<codec::add_delta>(meta, maps, olds, news)
                                          : run_shards<codec::overwrite>(meta, maps, olds, news);
      by_enc[static_cast<int>(enc)] = got;
      item want;
      want.tensor = meta;
      want.encoding = enc;
      for (std::uint64_t k = 0; k < n; ++k)
        if (old_c[k] != new_c[k]) {
          want.indices.push_back(k);
          // add: zigzag of the 16-bit difference, written out here.
          const auto d = static_cast<std::int16_t>(static_cast<std::uint16_t>(new_c[k] - old_c[k]));
          const auto zz = static_cast<std::uint16_t>(d >= 0 ? 2 * d : -2 * d - 1);
          const std::uint16_t v = enc == value_encoding::xor_mask ? old_c[k] ^ new_c[k]
                                  : enc == value_encoding::add    ? zz
                                                                  : new_c[k];
          want.values.push_back(static_cast<std::byte>(v & 0xFF));
          want.values.push_back(static_cast<std::byte>(v >> 8));
        }
      CHECK(got == want);
      CHECK(codec::validate_item(got).ok());
    }
    // encode_either records both value sets in one pass; the item is the
    // XOR item or the add item, whichever the estimate says is smaller.
    stages::record_buffer raw;
    const item either = run_pipeline<either_pipeline>(meta, maps, olds, news, &raw);
    const auto& x = by_enc[1];
    const auto& a = by_enc[3];
    const double ex = codec::estimate_value_bytes(x.values, 2, codec::value_filter::byte_planes);
    const double ea = codec::estimate_value_bytes(a.values, 2, codec::value_filter::byte_planes);
    CHECK(either == (ea < ex ? a : x));
    stages::sort_records<std::uint16_t>(raw);
    CHECK(raw.indices == x.indices);
    CHECK(raw.values == x.values);
    CHECK(raw.alt_values == a.values);
  }
}

TEST_CASE("records through a map that leaves the tensor or writes one element twice fail item "
          "validation") {
  tensor_meta meta{"t", {4}, dtype_id::bf16};
  const std::vector<std::vector<std::uint16_t>> o{{1, 2, 3, 4}}, c{{5, 6, 7, 8}};
  auto items_of = [&](std::vector<std::uint64_t> to) {
    const std::vector<table_map> maps{table_map(0, 4, table{std::move(to)})};
    return run_shards<codec::overwrite>(meta, maps, o, c);
  };
  CHECK(codec::validate_item(items_of({0, 1, 2, 3})).ok());
  CHECK(codec::validate_item(items_of({0, 1, 2, 9})).code == errc::index_out_of_range);
  CHECK(codec::validate_item(items_of({0, 1, 1, 2})).code == errc::not_increasing);
}

TEST_CASE("flat_map runs are the maximal stretches where the callable advances by one") {
  const table_map m(3, 7, table{{4, 5, 6, 0, 2, 3, 1}});
  std::vector<canonical_run> runs;
  m.map_run(0, m.domain_size(), [&](const canonical_run& r) { runs.push_back(r); });
  CHECK(runs == std::vector<canonical_run>{{0, 3, 3, 4}, {3, 1, 3, 0}, {4, 2, 3, 2}, {6, 1, 3, 1}});
  std::vector<canonical_run> tail;
  m.map_run(1, 3, [&](const canonical_run& r) { tail.push_back(r); });
  CHECK(tail == std::vector<canonical_run>{{1, 2, 3, 5}, {3, 1, 3, 0}});
}

namespace {
struct which {
  template <class D, class E>
  static int call(int bias) {
    return bias + 100 * static_cast<int>(dtype_traits<D>::id) + static_cast<int>(E::id);
  }
};
} // namespace

TEST_CASE(
    "the dispatch table selects the instantiation of every dtype x encoding, and nothing else") {
  constexpr pipeline::dispatch_table<which, int(int), pipeline::dtype_list, pipeline::encoding_list>
      t{};
  static_assert(decltype(t)::size == 15);
  for (auto d :
       {dtype_id::bf16, dtype_id::f16, dtype_id::f32, dtype_id::f8e4m3fn, dtype_id::f8e5m2})
    for (auto e : {value_encoding::xor_mask, value_encoding::overwrite, value_encoding::add}) {
      auto* f = t(pipeline::position_of<pipeline::dtype_list>(d),
                  pipeline::position_of<pipeline::encoding_list>(e));
      const bool found = f != nullptr;
      REQUIRE(found);
      CHECK(f(7) == 7 + 100 * static_cast<int>(d) + static_cast<int>(e));
    }
  const bool unknown_dtype =
      t(pipeline::position_of<pipeline::dtype_list>(static_cast<dtype_id>(77)), 0) == nullptr;
  const bool unknown_encoding =
      t(0, pipeline::position_of<pipeline::encoding_list>(static_cast<value_encoding>(9))) ==
      nullptr;
  CHECK(unknown_dtype);
  CHECK(unknown_encoding);
}

TEST_CASE("dispatched_locations codes and decodes exactly as codec::by_scheme, for every scheme") {
  std::mt19937_64 rng(7);
  for (int round = 0; round < 200; ++round) {
    std::vector<std::uint64_t> idx;
    std::uint64_t at = rng() % 5;
    const std::uint64_t spread =
        std::vector<std::uint64_t>{1, 2, 300, 70000, std::uint64_t{1} << 33}[rng() % 5];
    for (int k = 0, n = 1 + static_cast<int>(rng() % 50); k < n; ++k, at += 1 + rng() % spread)
      idx.push_back(at);
    for (auto scheme : {codec::location_scheme::gaps, codec::location_scheme::planes,
                        codec::location_scheme::varint, codec::location_scheme::escape_u8}) {
      std::vector<std::byte> a, b;
      const auto ia = codec::by_scheme{scheme}(idx, a);
      const auto ib = pipeline::dispatched_locations{scheme}(idx, b);
      CHECK(ia == ib);
      CHECK(a == b);
      std::vector<std::uint64_t> back(idx.size());
      REQUIRE(pipeline::dispatched_locations::decode(ib, b, idx[0], idx.back() + 1, back).ok());
      CHECK(back == idx);
    }
  }
}
