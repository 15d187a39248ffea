// The refit stages against a brute-force diff, over random permutation maps.
#include <doctest/doctest.h>

#include <numeric>
#include <random>

#include "dcr/pipeline/stages.hpp"

using namespace dcr;
using namespace dcr::pipeline;

namespace {
struct table_map {
  std::vector<std::uint64_t> to; // local -> canonical
  std::uint64_t operator()(std::uint64_t j) const { return to[j]; }
};
static_assert(flat_index_map<table_map>);
} // namespace

TEST_CASE("compare | project | encode equals a brute-force diff, for XOR and overwrite, any permutation") {
  for (std::uint64_t seed = 0; seed < 20; ++seed) {
    std::mt19937_64 rng(seed);
    const std::uint64_t n = 1 + rng() % 700;
    tensor_meta meta{"t", {n}, dtype_id::bf16};
    // Two shards splitting a random permutation of the canonical indices.
    std::vector<std::uint64_t> perm(n);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    const auto cut = rng() % (n + 1);
    table_map a{{perm.begin(), perm.begin() + cut}}, b{{perm.begin() + cut, perm.end()}};
    std::vector<std::uint16_t> old_c(n), new_c(n);
    for (auto& w : old_c) w = static_cast<std::uint16_t>(rng());
    new_c = old_c;
    for (auto& w : new_c)
      if (rng() % 5 == 0) w ^= static_cast<std::uint16_t>(1 + rng() % 0xFFFF);
    auto local = [&](const table_map& m, const std::vector<std::uint16_t>& c) {
      std::vector<std::uint16_t> v;
      for (auto k : m.to) v.push_back(c[k]);
      return v;
    };
    const auto ao = local(a, old_c), an = local(a, new_c), bo = local(b, old_c), bn = local(b, new_c);
    for (auto enc : {value_encoding::xor_mask, value_encoding::overwrite}) {
      bucket<dcr::bf16, table_map> bk{{meta, a, ao, an, {}}, {meta, b, bo, bn, {}}};
      std::vector<item> items;
      auto sink = [&](std::vector<item> v) { items = std::move(v); };
      auto src = [&](auto&& emit) { emit(bk); };
      if (enc == value_encoding::xor_mask)
        run<decltype(bk)>(compare<dcr::bf16>() | project<table_map>() | encode<value_encoding::xor_mask>(), src, sink);
      else
        run<decltype(bk)>(compare<dcr::bf16>() | project<table_map>() | encode<value_encoding::overwrite>(), src, sink);
      item want;
      want.tensor = meta;
      want.encoding = enc;
      for (std::uint64_t k = 0; k < n; ++k)
        if (old_c[k] != new_c[k]) {
          want.indices.push_back(k);
          const std::uint16_t v = enc == value_encoding::xor_mask ? old_c[k] ^ new_c[k] : new_c[k];
          want.values.push_back(static_cast<std::byte>(v & 0xFF));
          want.values.push_back(static_cast<std::byte>(v >> 8));
        }
      if (want.indices.empty()) {
        CHECK(items.empty());
      } else {
        REQUIRE(items.size() == 1);
        CHECK(items[0] == want);
      }
    }
  }
}

TEST_CASE("project rejects maps that leave the tensor or write one element twice") {
  tensor_meta meta{"t", {4}, dtype_id::bf16};
  std::vector<std::uint16_t> o{1, 2, 3, 4}, c{5, 6, 7, 8};
  auto run_with = [&](table_map m) {
    bucket<dcr::bf16, table_map> bk{{meta, std::move(m), o, c, {}}};
    run<decltype(bk)>(compare<dcr::bf16>() | project<table_map>(), [&](auto&& emit) { emit(bk); }, [](auto) {});
  };
  try {
    run_with({{0, 1, 2, 9}});
    FAIL("no error");
  } catch (const error& e) {
    CHECK(e.code() == errc::index_out_of_range);
  }
  try {
    run_with({{0, 1, 1, 2}});
    FAIL("no error");
  } catch (const error& e) {
    CHECK(e.code() == errc::parts_disagree);
  }
}

TEST_CASE("compress | send, then receive | decode | apply, round trip through an object store") {
  transport::memory_object_store store;
  item it{{"t", {8}, dtype_id::bf16}, value_encoding::overwrite, {1, 6}, {std::byte{1}, std::byte{2}, std::byte{3}, std::byte{4}}};
  auto writer = std::make_shared<transport::attempt_writer<transport::memory_object_store>>(store, 7, 3);
  std::vector<std::string> names;
  run<std::vector<item>>(compress(payload_id{7, 1, 3, 0}, zstd{3}) | send(writer),
                         [&](auto&& emit) { emit(std::vector<item>{it}), emit(std::vector<item>{it}); },
                         [&](std::string n) { names.push_back(n); });
  REQUIRE(writer->finish().ok());
  CHECK(names == std::vector<std::string>{transport::payload_name(7, 3, 0), transport::payload_name(7, 3, 1)});
  struct collect {
    std::vector<item> got;
    status apply_item(const item& i) {
      got.push_back(i);
      return status::success();
    }
  } r;
  run<fetched>(as_chain(decode(7)), receive(store, 7, {3}), apply(r));
  REQUIRE(r.got.size() == 2);
  CHECK(r.got[0] == it);
  // Another attempt's reader rejects these payloads: as stale (decode), or
  // as listed by no manifest (the reader), whichever thread tells first.
  std::vector<std::byte> p;
  REQUIRE(store.get(transport::payload_name(7, 3, 0), p).ok());
  REQUIRE(store.put(transport::payload_name(8, 3, 0), p).ok());
  transport::attempt_writer<transport::memory_object_store> w8(store, 8, 3);
  REQUIRE(w8.finish().ok());
  try {
    run<fetched>(as_chain(decode(8)), receive(store, 8, {3}), apply(r));
    FAIL("no error");
  } catch (const error& e) {
    CHECK((e.code() == errc::stale_attempt || e.code() == errc::verification));
  }
}
