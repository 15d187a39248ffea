// project<Map> over each mapping class as its own type (replicated box,
// column and row splits, vocabulary padding, the piecewise fused QKV and
// gate-up maps, a per-expert column split) gives, through the same
// stages::delta composition, exactly the records of the class's runtime form
// (`piecewise_map`, what the builder's shards carry), and those records are
// the changed elements at the destinations the class's closed form names.
#include <doctest/doctest.h>

#include <map>
#include <random>

#include "dcr/map/index_map.hpp"
#include "dcr/source/stages.hpp"

using namespace dcr;

namespace {

using E = stages::encode<codec::xor_mask, codec::by_scheme>;

template <class M>
std::map<std::uint32_t, stages::record_buffer> records(const M& m, std::span<const std::uint16_t> o,
                                                       std::span<const std::uint16_t> c) {
  std::map<std::uint32_t, stages::record_buffer> out;
  const stages::delta<stages::compare<dcr::bf16>, stages::project<M>, E> run{stages::project<M>{m}};
  run(o, c, [&](std::uint32_t t) -> stages::record_buffer& { return out[t]; });
  for (auto& [t, b] : out) stages::sort_records<std::uint16_t>(b);
  return out;
}

template <class M>
void check_class(const M& m, std::mt19937_64& rng) {
  static_assert(maps::affine_map<M>);
  const auto n = m.domain_size();
  std::vector<std::uint16_t> o(n), c(n);
  for (auto& w : o) w = static_cast<std::uint16_t>(rng());
  c = o;
  for (std::uint64_t j = 0; j < n; ++j)
    if (rng() % 7 == 0) c[j] ^= static_cast<std::uint16_t>(1 + rng() % 0xFFFF);
  const auto typed = records(m, o, c);
  const auto runtime = records(m.pieces(), o, c);
  REQUIRE(typed.size() == runtime.size());
  for (auto& [t, b] : typed) {
    const auto& r = runtime.at(t);
    CHECK(b.indices == r.indices);
    CHECK(b.values == r.values);
  }
  // Every changed element with a destination, at that destination, once.
  std::map<std::pair<std::uint32_t, std::uint64_t>, std::uint16_t> want;
  for (std::uint64_t j = 0; j < n; ++j) {
    const auto d = m(j);
    if (o[j] != c[j] && !d.is_nowhere()) want[{d.tensor, d.index}] = o[j] ^ c[j];
  }
  std::size_t got = 0;
  for (auto& [t, b] : typed)
    for (std::size_t k = 0; k < b.indices.size(); ++k, ++got) {
      std::uint16_t v;
      std::memcpy(&v, b.values.data() + 2 * k, 2);
      auto it = want.find({t, b.indices[k]});
      REQUIRE(it != want.end());
      CHECK(it->second == v);
    }
  CHECK(got == want.size());
}

} // namespace

TEST_CASE("project<Map> per mapping class type equals its piecewise form and its closed form") {
  std::mt19937_64 rng(5);
  for (int round = 0; round < 20; ++round) {
    const std::uint64_t t = 1 + rng() % 4, r = rng() % t;
    const std::uint64_t n = t * (1 + rng() % 12), k = t * (1 + rng() % 12);
    CAPTURE(round);
    check_class(replicated_map(3, n, k), rng);
    check_class(column_parallel_map(1, n, k, t, r), rng);
    check_class(row_parallel_map(2, n, k, t, r), rng);
    check_class(vocab_padded_map(4, n + 1 + rng() % 5, k, t, r, 1 + rng() % 4), rng);
    const std::uint64_t ng = t * (1 + rng() % 2), nh = ng * (1 + rng() % 3), d = 1 + rng() % 4;
    check_class(fused_qkv_map(5, 6, 7, nh, ng, d, 1 + rng() % 5, t, r), rng);
    check_class(gated_fc1_map(8, 9, t * (1 + rng() % 6), 1 + rng() % 6, t, r), rng);
    // A per-expert slice: expert e's fc2 on expert-tensor-parallel rank r
    // is a row split of that expert's canonical tensor.
    check_class(row_parallel_map(10 + static_cast<std::uint32_t>(rng() % 8), n, k, t, r), rng);
  }
}
