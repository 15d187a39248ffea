// Laws of the index maps (include/dcr/map/index_map.hpp), checked over every
// element of small shapes: closed form == pieces, runs == per-element map,
// injectivity, composition with the TP-gathered map, and that the ranks'
// images tile every canonical element exactly once.
#include <doctest/doctest.h>

#include <map>
#include <random>
#include <set>

#include "dcr/map/index_map.hpp"

using namespace dcr;

namespace {

/// Generic law suite for any index_map model `m` with runtime form `pm`;
/// `numel[t]` bounds canonical indices of tensor id t. Returns the image.
template <index_map M>
std::vector<destination> check_map_laws(const M& m, const piecewise_map& pm,
                                        const std::map<std::uint32_t, std::uint64_t>& numel) {
  const std::uint64_t n = m.domain_size();
  REQUIRE(pm.domain_size() == n);
  std::vector<destination> img(n);
  std::set<std::pair<std::uint32_t, std::uint64_t>> seen;
  std::uint64_t mapped = 0;
  for (std::uint64_t j = 0; j < n; ++j) {
    img[j] = m(j);
    CHECK(img[j] == pm(j));
    if (img[j].is_nowhere()) continue;
    ++mapped;
    REQUIRE(numel.count(img[j].tensor));
    CHECK(img[j].index < numel.at(img[j].tensor));
    seen.insert({img[j].tensor, img[j].index});
  }
  CHECK(pm.image_size() == mapped);
  // is_unique() is exactly injectivity on mapped elements.
  CHECK(m.is_unique() == (seen.size() == mapped));
  // Runs agree with the per-element map, over the whole domain and over random windows.
  std::mt19937_64 rng(12345);
  for (int trial = 0; trial < 40; ++trial) {
    std::uint64_t s = 0, c = n;
    if (trial > 0 && n > 0) {
      s = rng() % n;
      c = rng() % (n - s + 1);
    }
    std::vector<int> covered(c, 0);
    std::uint64_t last_end = s;
    m.map_run(s, c, [&](const canonical_run& r) {
      CHECK(r.count > 0);
      CHECK(r.local_start >= last_end); // increasing local order, disjoint
      last_end = r.local_start + r.count;
      CHECK(r.local_start + r.count <= s + c);
      for (std::uint64_t o = 0; o < r.count; ++o) {
        const auto d = img[r.local_start + o];
        CHECK(d.tensor == r.tensor);
        CHECK(d.index == r.canonical_start + o);
        covered[r.local_start + o - s]++;
      }
    });
    for (std::uint64_t k = 0; k < c; ++k) CHECK(covered[k] == (img[s + k].is_nowhere() ? 0 : 1));
  }
  // project() agrees with the per-element map on a random sorted subset.
  std::vector<std::uint64_t> sub;
  for (std::uint64_t j = 0; j < n; ++j)
    if (rng() % 3 == 0) sub.push_back(j);
  std::size_t expect_pos = 0;
  pm.project(sub, [&](std::uint32_t t, std::uint64_t k, std::size_t pos) {
    while (expect_pos < sub.size() && img[sub[expect_pos]].is_nowhere()) ++expect_pos;
    REQUIRE(expect_pos < sub.size());
    CHECK(pos == expect_pos);
    CHECK(destination{t, k} == img[sub[pos]]);
    ++expect_pos;
  });
  while (expect_pos < sub.size() && img[sub[expect_pos]].is_nowhere()) ++expect_pos;
  CHECK(expect_pos == sub.size());
  return img;
}

/// Each element of each tensor in `numel` is hit exactly once by `images`.
void check_tiling(const std::vector<std::vector<destination>>& images,
                  const std::map<std::uint32_t, std::uint64_t>& numel) {
  std::map<std::uint32_t, std::vector<int>> hits;
  for (auto& [t, n] : numel) hits[t].assign(n, 0);
  for (auto& img : images)
    for (auto& d : img)
      if (!d.is_nowhere()) hits.at(d.tensor).at(d.index)++;
  for (auto& [t, h] : hits)
    for (std::uint64_t k = 0; k < h.size(); ++k) {
      if (h[k] != 1) FAIL_CHECK("tensor " << t << " index " << k << " hit " << h[k] << " times");
    }
}

} // namespace

TEST_CASE("replicated_map is the identity") {
  for (auto [r, c] : {std::pair<std::uint64_t, std::uint64_t>{1, 1}, {7, 1}, {5, 3}}) {
    replicated_map m(4, r, c);
    auto img = check_map_laws(m, m.pieces(), {{4, r * c}});
    for (std::uint64_t j = 0; j < r * c; ++j) CHECK(img[j] == destination{4, j});
  }
}

TEST_CASE("column- and row-parallel maps tile the tensor; composition with the gathered map") {
  for (std::uint64_t t : {1, 2, 3, 4, 8}) {
    const std::uint64_t N = 24, K = 24;
    std::vector<std::vector<destination>> col, row;
    std::vector<piecewise_map> col_parts;
    const replicated_map full(0, N, K);
    for (std::uint64_t r = 0; r < t; ++r) {
      column_parallel_map cm(0, N, K, t, r);
      col.push_back(check_map_laws(cm, cm.pieces(), {{0, N * K}}));
      col_parts.push_back(cm.pieces());
      // composition: column shard r == full map after shifting by r*N/t rows
      for (std::uint64_t j = 0; j < cm.domain_size(); ++j)
        CHECK(cm(j) == full(r * (N / t) * K + j));
      row_parallel_map rm(0, N, K, t, r);
      row.push_back(check_map_laws(rm, rm.pieces(), {{0, N * K}}));
      // composition: row shard r == full map after embedding (i, j) -> (i, r K/t + j)
      for (std::uint64_t j = 0; j < rm.domain_size(); ++j)
        CHECK(rm(j) == full((j / (K / t)) * K + r * (K / t) + j % (K / t)));
    }
    check_tiling(col, {{0, N * K}});
    check_tiling(row, {{0, N * K}});
    // the TP-gathered column-parallel map is the identity
    auto gathered = piecewise_map::concat_rows(col_parts);
    for (std::uint64_t j = 0; j < N * K; ++j) CHECK(gathered(j) == destination{0, j});
  }
  CHECK_THROWS_AS(column_parallel_map(0, 10, 4, 3, 0), dcr::error);
  CHECK_THROWS_AS(row_parallel_map(0, 4, 10, 4, 1), dcr::error);
  CHECK_THROWS_AS(row_parallel_map(0, 4, 8, 4, 4), dcr::error);
}

TEST_CASE("vocab_padded_map: padding maps nowhere, real rows tile the vocabulary") {
  for (std::uint64_t vocab : {1, 7, 13, 64, 100, 129}) {
    for (std::uint64_t t : {1, 2, 3, 4, 8}) {
      for (std::uint64_t block : {1, 8, 128}) {
        const std::uint64_t H = 3;
        const auto vp = padded_vocab(vocab, t, block);
        CHECK(vp % (t * block) == 0);
        CHECK(vp >= vocab);
        CHECK(vp - vocab < t * block);
        std::vector<std::vector<destination>> imgs;
        std::uint64_t nowhere_count = 0;
        for (std::uint64_t r = 0; r < t; ++r) {
          vocab_padded_map m(2, vocab, H, t, r, block);
          CHECK(m.local_rows() * t == vp);
          imgs.push_back(check_map_laws(m, m.pieces(), {{2, vocab * H}}));
          for (auto& d : imgs.back()) nowhere_count += d.is_nowhere();
        }
        CHECK(nowhere_count == (vp - vocab) * H);
        check_tiling(imgs, {{2, vocab * H}});
      }
    }
  }
}

TEST_CASE(
    "fused_qkv_map matches Megatron's per-group interleaving, whole groups and raw row slices") {
  struct shape {
    std::uint64_t nh, ng, d;
  };
  for (auto s : {shape{8, 2, 4}, shape{4, 4, 2}, shape{6, 1, 4}, shape{6, 3, 2}, shape{8, 8, 1},
                 shape{12, 2, 2}}) {
    const std::uint64_t p = s.nh / s.ng, F = s.ng * (p + 2) * s.d;
    for (std::uint64_t cols : {1, 3}) {
      const std::map<std::uint32_t, std::uint64_t> numel{
          {10, s.nh * s.d * cols}, {11, s.ng * s.d * cols}, {12, s.ng * s.d * cols}};
      // Independent reference: the fused matrix Megatron builds by concatenating,
      // per group g, the p query heads, then key head g, then value head g.
      std::vector<destination> ref;
      for (std::uint64_t g = 0; g < s.ng; ++g) {
        for (std::uint64_t h = g * p; h < (g + 1) * p; ++h)
          for (std::uint64_t j = 0; j < s.d; ++j)
            for (std::uint64_t c = 0; c < cols; ++c)
              ref.push_back({10, ((h * s.d) + j) * cols + c});
        for (std::uint32_t kv : {11u, 12u})
          for (std::uint64_t j = 0; j < s.d; ++j)
            for (std::uint64_t c = 0; c < cols; ++c)
              ref.push_back({kv, ((g * s.d) + j) * cols + c});
      }
      REQUIRE(ref.size() == F * cols);
      for (std::uint64_t t : {1, 2, 3, 4, 8}) {
        if (F % t) {
          CHECK_THROWS_AS(fused_qkv_map(10, 11, 12, s.nh, s.ng, s.d, cols, t, 0), dcr::error);
          continue;
        }
        std::vector<std::vector<destination>> imgs;
        std::vector<piecewise_map> parts;
        for (std::uint64_t r = 0; r < t; ++r) {
          fused_qkv_map m(10, 11, 12, s.nh, s.ng, s.d, cols, t, r);
          imgs.push_back(check_map_laws(m, m.pieces(), numel));
          parts.push_back(m.pieces());
          // composition: rank r's map is the reference after a shift of r F/t rows
          for (std::uint64_t j = 0; j < m.domain_size(); ++j)
            CHECK(m(j) == ref[r * (F / t) * cols + j]);
        }
        check_tiling(imgs, numel);
        auto gathered = piecewise_map::concat_rows(parts);
        for (std::uint64_t j = 0; j < F * cols; ++j) CHECK(gathered(j) == ref[j]);
        CHECK(gathered.is_unique());
      }
    }
  }
  CHECK_THROWS_AS(fused_qkv_map(0, 1, 2, 6, 4, 2, 1, 1, 0), dcr::error); // heads % groups
}

TEST_CASE("gated_fc1_map: gathered fc1 is the concatenation of [G_r; U_r]") {
  for (std::uint64_t t : {1, 2, 3, 4, 8}) {
    const std::uint64_t I = 24, H = 2;
    std::vector<destination> ref; // concatenation over r of [G_r; U_r]
    for (std::uint64_t r = 0; r < t; ++r)
      for (std::uint32_t which : {0u, 1u})
        for (std::uint64_t i = r * I / t; i < (r + 1) * I / t; ++i)
          for (std::uint64_t c = 0; c < H; ++c) ref.push_back({which, i * H + c});
    std::vector<std::vector<destination>> imgs;
    std::vector<piecewise_map> parts;
    for (std::uint64_t r = 0; r < t; ++r) {
      gated_fc1_map m(0, 1, I, H, t, r);
      imgs.push_back(check_map_laws(m, m.pieces(), {{0, I * H}, {1, I * H}}));
      parts.push_back(m.pieces());
    }
    check_tiling(imgs, {{0, I * H}, {1, I * H}});
    auto gathered = piecewise_map::concat_rows(parts);
    for (std::uint64_t j = 0; j < 2 * I * H; ++j) CHECK(gathered(j) == ref[j]);
    if (t > 1) CHECK(gathered((I / t) * H).tensor == 1); // not [G; U]: row I/t is already an up row
  }
}

TEST_CASE("experts over EP and layers over PP are partitions") {
  for (std::uint64_t E : {1, 4, 8, 12})
    for (std::uint64_t S : {1, 2, 4}) {
      if (E % S) continue;
      std::vector<int> hit(E, 0);
      for (std::uint64_t k = 0; k < S; ++k)
        for (std::uint64_t L = 0; L < E / S; ++L) hit.at(global_expert(L, k, E, S))++;
      for (auto h : hit) CHECK(h == 1);
    }
  for (std::uint64_t layers : {1, 2, 4, 6, 12})
    for (std::uint64_t pp : {1, 2, 3, 4}) {
      if (layers % pp) {
        CHECK_THROWS_AS(pp_stage_layers(layers, pp, 0), dcr::error);
        continue;
      }
      std::uint64_t next = 0;
      for (std::uint64_t s = 0; s < pp; ++s) {
        auto [a, b] = pp_stage_layers(layers, pp, s);
        CHECK(a == next);
        CHECK(b - a == layers / pp);
        next = b;
      }
      CHECK(next == layers);
    }
}

TEST_CASE("piecewise_map validates pieces and detects non-unique maps") {
  CHECK_THROWS_AS(piecewise_map(4, 2, {{2, 2, 0, 0, 0, 2}, {1, 1, 0, 4, 0, 2}}),
                  dcr::error);                                            // unsorted
  CHECK_THROWS_AS(piecewise_map(4, 2, {{0, 5, 0, 0, 0, 2}}), dcr::error); // out of range
  CHECK_THROWS_AS(piecewise_map(4, 3, {{0, 4, 0, 0, 0, 2}}), dcr::error); // columns exceed
  CHECK_THROWS_AS(piecewise_map(4, 2, {{0, 4, nowhere, 0, 0, 2}}), dcr::error);
  // two pieces writing the same canonical rows: not unique, and the law suite agrees
  piecewise_map dup(4, 2, {{0, 2, 0, 0, 0, 2}, {2, 2, 0, 1, 0, 2}});
  CHECK_FALSE(dup.is_unique());
  check_map_laws(dup, dup, {{0, 6}});
  // a reversed (non-monotone) but unique map
  piecewise_map rev(4, 2, {{0, 2, 0, 2, 0, 2}, {2, 2, 0, 0, 0, 2}});
  CHECK(rev.is_unique());
  CHECK_FALSE(rev.is_monotone());
  check_map_laws(rev, rev, {{0, 8}});
  // retargeting renames tensors only
  std::vector<std::uint32_t> ids{7};
  auto rt = rev.retargeted(ids);
  for (std::uint64_t j = 0; j < 8; ++j) CHECK(rt(j) == destination{7, rev(j).index});
  std::vector<std::uint32_t> none;
  CHECK_THROWS_AS(rev.retargeted(none), dcr::error);
}
