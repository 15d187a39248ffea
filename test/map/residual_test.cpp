// Residual rules (include/dcr/map/residual.hpp, fp8.hpp, blockwise.hpp) against independent
// references written here, and every failure path of part assembly.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "dcr/core/rounding.hpp"
#include "dcr/map/blockwise.hpp"
#include "dcr/map/fp8.hpp"
#include "dcr/map/residual.hpp"

using namespace dcr;

namespace {

std::vector<std::byte> random_bf16(std::size_t n, std::uint64_t seed, float sd = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0, sd);
  std::vector<std::byte> b(2 * n);
  for (std::size_t k = 0; k < n; ++k) {
    auto w = f32_to_bf16_rne(nd(rng));
    std::memcpy(b.data() + 2 * k, &w, 2);
  }
  return b;
}
float bf16_at(const std::vector<std::byte>& b, std::size_t k) {
  std::uint16_t w;
  std::memcpy(&w, b.data() + 2 * k, 2);
  return bf16_to_f32(w);
}
/// Rows [r R/t, (r+1) R/t) of a row-major R x C matrix.
std::vector<std::byte> row_slice(const std::vector<std::byte>& full, std::size_t C, std::size_t r0,
                                 std::size_t rows, std::size_t w = 2) {
  return {full.begin() + static_cast<std::ptrdiff_t>(r0 * C * w),
          full.begin() + static_cast<std::ptrdiff_t>((r0 + rows) * C * w)};
}

} // namespace

TEST_CASE("e4m3: decode is exact, RNE encode is the nearest representable value, saturating") {
  // decode round trip for every non-NaN pattern
  for (int w = 0; w < 256; ++w) {
    if ((w & 0x7F) == 0x7F) {
      CHECK(std::isnan(e4m3_to_f32(static_cast<std::uint8_t>(w))));
      continue;
    }
    const float x = e4m3_to_f32(static_cast<std::uint8_t>(w));
    const auto back = f32_to_e4m3_rne(x);
    if (x == 0)
      CHECK((back & 0x7F) == 0);
    else
      CHECK(back == w);
  }
  CHECK(e4m3_to_f32(0x7E) == 448.0f);
  CHECK(e4m3_to_f32(0x01) == std::ldexp(1.0f, -9));
  CHECK(f32_to_e4m3_rne(1e9f) == 0x7E);
  CHECK(f32_to_e4m3_rne(-1e9f) == 0xFE);
  CHECK(f32_to_e4m3_rne(std::nanf("")) == 0x7F);
  // nearest by brute force over the finite positive patterns, ties to even
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<float> u(-9, 9);
  for (int i = 0; i < 20000; ++i) {
    const float x = std::ldexp(1.0f, static_cast<int>(u(rng))) * (1 + std::fabs(u(rng)) / 9);
    const float a = std::min(std::fabs(x), 448.0f);
    int best = 0;
    float bd = 1e30f;
    for (int w = 0; w < 0x7F; ++w) {
      const float d = std::fabs(e4m3_to_f32(static_cast<std::uint8_t>(w)) - a);
      if (d < bd || (d == bd && (w & 1) == 0)) {
        bd = d;
        best = w;
      }
    }
    CHECK(f32_to_e4m3_rne(x) == best);
  }
}

TEST_CASE("gather_rule assembles TP parts; coverage and disagreement are typed errors") {
  const std::size_t R = 8, C = 4;
  auto full = random_bf16(R * C, 1);
  std::vector<piecewise_map> maps{piecewise_map(4, C, {{0, 4, 0, 0, 0, C}}),
                                  piecewise_map(4, C, {{0, 4, 0, 4, 0, C}})};
  auto rule = gather_rule("g", {{"w", {R, C}, dtype_id::bf16}}, maps);
  auto p0 = row_slice(full, C, 0, 4), p1 = row_slice(full, C, 4, 4);
  std::vector<residual_input> in{{p0, dtype_id::bf16}, {p1, dtype_id::bf16}};
  std::vector<host_tensor> out;
  REQUIRE(run_rule(rule, in, out).ok());
  CHECK(out[0].bytes == full);
  // parts given in reverse order assemble the same bits (overlap path not taken)
  auto rev = gather_rule("g", {{"w", {R, C}, dtype_id::bf16}}, {maps[1], maps[0]});
  std::vector<residual_input> in_rev{in[1], in[0]};
  REQUIRE(run_rule(rev, in_rev, out).ok());
  CHECK(out[0].bytes == full);
  // missing part -> coverage
  auto half = gather_rule("g", {{"w", {R, C}, dtype_id::bf16}}, {maps[0]});
  std::vector<residual_input> in0{in[0]};
  CHECK(run_rule(half, in0, out).code == errc::coverage);
  // overlapping parts that agree are fine; that disagree -> parts_disagree
  std::vector<piecewise_map> ov{piecewise_map(6, C, {{0, 6, 0, 0, 0, C}}),
                                piecewise_map(4, C, {{0, 4, 0, 4, 0, C}})};
  auto over = gather_rule("g", {{"w", {R, C}, dtype_id::bf16}}, ov);
  auto q0 = row_slice(full, C, 0, 6);
  std::vector<residual_input> in_ov{{q0, dtype_id::bf16}, {p1, dtype_id::bf16}};
  REQUIRE(run_rule(over, in_ov, out).ok());
  CHECK(out[0].bytes == full);
  auto bad = p1;
  bad[3] ^= std::byte{1}; // row 4 (overlap) element 1
  std::vector<residual_input> in_bad{{q0, dtype_id::bf16}, {bad, dtype_id::bf16}};
  auto st = run_rule(over, in_bad, out);
  CHECK(st.code == errc::parts_disagree);
  CHECK(st.message.find("flat index 17") != std::string::npos);
  // wrong input count, dtype, size
  std::vector<residual_input> one{in[0]};
  CHECK(run_rule(rule, one, out).code == errc::invalid_argument);
  std::vector<residual_input> wrong_dtype{{p0, dtype_id::f16}, {p1, dtype_id::bf16}};
  CHECK(run_rule(rule, wrong_dtype, out).code == errc::bad_dtype);
  auto shorter = std::vector<std::byte>(p0.begin(), p0.end() - 2);
  std::vector<residual_input> wrong_size{{shorter, dtype_id::bf16}, {p1, dtype_id::bf16}};
  CHECK(run_rule(rule, wrong_size, out).code == errc::shape_mismatch);
  // direct assembler errors
  host_tensor t({"x", {4}, dtype_id::bf16});
  part_assembler a(std::span<host_tensor>(&t, 1));
  std::byte buf[16]{};
  CHECK(a.add_run(1, 0, buf, 1, "p").code == errc::invalid_argument);
  CHECK(a.add_run(0, 3, buf, 2, "p").code == errc::index_out_of_range);
  CHECK(a.finish().code == errc::coverage);
}

TEST_CASE("scale_cast_rule: out = RNE(lambda * x); a change of lambda changes many outputs") {
  const std::size_t R = 6, C = 5;
  auto x = random_bf16(R * C, 2);
  std::vector<piecewise_map> maps{piecewise_map(R, C, {{0, R, 0, 0, 0, C}})};
  for (auto out_dtype : {dtype_id::bf16, dtype_id::f16, dtype_id::f32}) {
    auto rule = scale_cast_rule("s", {"y", {R, C}, out_dtype}, dtype_id::bf16, maps);
    CHECK(rule.inputs == 2);
    for (float lambda : {1.0f, 0.37f, -3.5f}) {
      std::vector<std::byte> lb(4);
      std::memcpy(lb.data(), &lambda, 4);
      std::vector<residual_input> in{{lb, dtype_id::f32}, {x, dtype_id::bf16}};
      std::vector<host_tensor> out;
      REQUIRE(run_rule(rule, in, out).ok());
      for (std::size_t k = 0; k < R * C; ++k) {
        const float y = lambda * bf16_at(x, k);
        if (out_dtype == dtype_id::bf16) {
          std::uint16_t w;
          std::memcpy(&w, out[0].bytes.data() + 2 * k, 2);
          CHECK(w == f32_to_bf16_rne(y));
        } else if (out_dtype == dtype_id::f16) {
          std::uint16_t w;
          std::memcpy(&w, out[0].bytes.data() + 2 * k, 2);
          CHECK(w == f32_to_f16_rne(y));
        } else {
          float f;
          std::memcpy(&f, out[0].bytes.data() + 4 * k, 4);
          CHECK(std::memcmp(&f, &y, 4) == 0);
        }
      }
    }
    std::vector<std::byte> two(8);
    std::vector<residual_input> bad{{two, dtype_id::f32}, {x, dtype_id::bf16}};
    std::vector<host_tensor> out;
    CHECK(run_rule(rule, bad, out).code == errc::shape_mismatch);
  }
  CHECK_THROWS_AS(scale_cast_rule("s", {"y", {1}, dtype_id::f8e5m2}, dtype_id::bf16, {}),
                  dcr::error);
}

TEST_CASE("fp8_block_quant_rule: per-128x128 scale_inv and e4m3 values match a reference") {
  const std::size_t R = 200, C = 300, B = 128; // partial edge tiles in both dimensions
  auto x = random_bf16(R * C, 4, 0.05f);
  std::vector<piecewise_map> maps{piecewise_map(100, C, {{0, 100, 0, 0, 0, C}}),
                                  piecewise_map(100, C, {{0, 100, 0, 100, 0, C}})};
  auto rule = fp8_block_quant_rule("q", "w", R, C, dtype_id::bf16, maps);
  REQUIRE(rule.outputs.size() == 2);
  CHECK(rule.outputs[1].name == "w_scale_inv");
  CHECK(rule.outputs[1].shape == std::vector<std::uint64_t>{2, 3});
  auto p0 = row_slice(x, C, 0, 100), p1 = row_slice(x, C, 100, 100);
  std::vector<residual_input> in{{p0, dtype_id::bf16}, {p1, dtype_id::bf16}};
  std::vector<host_tensor> out;
  REQUIRE(run_rule(rule, in, out).ok());
  // reference: amax per tile computed by scanning elements and indexing their tile
  std::vector<float> amax(2 * 3, 0.0f);
  for (std::size_t i = 0; i < R; ++i)
    for (std::size_t j = 0; j < C; ++j) {
      float& a = amax[(i / B) * 3 + j / B];
      a = std::max(a, std::fabs(bf16_at(x, i * C + j)));
    }
  // per_block_cast_to_fp8: amax clamped at 1e-4, x * (448 / amax), amax / 448 stored
  for (std::size_t b = 0; b < 6; ++b) {
    float s;
    std::memcpy(&s, out[1].bytes.data() + 4 * b, 4);
    CHECK(s == std::max(amax[b], 1e-4f) / 448.0f);
  }
  std::size_t bad = 0;
  for (std::size_t i = 0; i < R; ++i)
    for (std::size_t j = 0; j < C; ++j) {
      const float f = 448.0f / std::max(amax[(i / B) * 3 + j / B], 1e-4f);
      bad += static_cast<std::uint8_t>(out[0].bytes[i * C + j]) !=
             f32_to_e4m3_rne(bf16_at(x, i * C + j) * f);
    }
  CHECK(bad == 0);
  // one changed element that becomes the new tile maximum rescales its whole tile
  auto y = p0;
  const std::uint16_t big = f32_to_bf16_rne(100.0f);
  std::memcpy(y.data() + 2 * (5 * C + 7), &big, 2);
  std::vector<residual_input> in2{{y, dtype_id::bf16}, {p1, dtype_id::bf16}};
  std::vector<host_tensor> out2;
  REQUIRE(run_rule(rule, in2, out2).ok());
  std::size_t changed_in_tile = 0, changed_elsewhere = 0;
  for (std::size_t i = 0; i < R; ++i)
    for (std::size_t j = 0; j < C; ++j)
      if (out2[0].bytes[i * C + j] != out[0].bytes[i * C + j])
        (i < B && j < B ? changed_in_tile : changed_elsewhere)++;
  CHECK(changed_in_tile > B * B / 2);
  CHECK(changed_elsewhere == 0);
  // an all-zero tile: the clamped amax gives scale_inv 1e-4 / 448 and zero codes
  std::vector<std::byte> z(2 * 4 * 4);
  auto zr = fp8_block_quant_rule("z", "z", 4, 4, dtype_id::bf16,
                                 {piecewise_map(4, 4, {{0, 4, 0, 0, 0, 4}})});
  std::vector<residual_input> zin{{z, dtype_id::bf16}};
  REQUIRE(run_rule(zr, zin, out).ok());
  float s;
  std::memcpy(&s, out[1].bytes.data(), 4);
  CHECK(s == 1e-4f / 448.0f);
  for (auto b : out[0].bytes) CHECK(b == std::byte{0});
  // the division policy keeps the earlier behaviour: scale 1 for a zero tile
  auto zd =
      fp8_block_quant_rule("z", "z", 4, 4, dtype_id::bf16,
                           {piecewise_map(4, 4, {{0, 4, 0, 0, 0, 4}})}, 128, divide_by_scale_inv{});
  REQUIRE(run_rule(zd, zin, out).ok());
  std::memcpy(&s, out[1].bytes.data(), 4);
  CHECK(s == 1.0f);
}

TEST_CASE("fp8 block quantizers: the reference multiplies by 448/amax, the division policy differs "
          "on some tiles") {
  // A tile whose amax is tiny is clamped (1e-4): its values are scaled by 448e4, not by 448/amax.
  per_block_cast_to_fp8 ref;
  divide_by_scale_inv div;
  CHECK(ref.scale_inv(1e-6f) == 1e-4f / 448.0f);
  CHECK(ref.scaled(1e-6f, 1e-6f) == 1e-6f * (448.0f / 1e-4f));
  CHECK(f32_to_e4m3_rne(ref.scaled(1e-6f, 1e-6f)) != f32_to_e4m3_rne(div.scaled(1e-6f, 1e-6f)));
  // Without the clamp the two still differ where x * 448/amax is an E4M3 rounding tie: amax 2^-7,
  // x 2^-23 scales to exactly 3.5 subnormal steps (code 4 by ties-to-even), while dividing by the
  // rounded amax/448 lands just below the tie.
  const float amax = std::ldexp(1.0f, -7), x = std::ldexp(1.0f, -23);
  CHECK(ref.scaled(x, amax) == 3.5f * std::ldexp(1.0f, -9));
  CHECK(f32_to_e4m3_rne(ref.scaled(x, amax)) == 4);
  CHECK(f32_to_e4m3_rne(div.scaled(x, amax)) != f32_to_e4m3_rne(ref.scaled(x, amax)));
}

TEST_CASE("tied, stack and custom rules") {
  auto e = random_bf16(12, 5);
  auto tied = tied_rule("t", {"model.embed_tokens.weight", {3, 4}, dtype_id::bf16},
                        {"lm_head.weight", {3, 4}, dtype_id::bf16},
                        {piecewise_map(3, 4, {{0, 3, 0, 0, 0, 4}})});
  std::vector<residual_input> in{{e, dtype_id::bf16}};
  std::vector<host_tensor> out;
  REQUIRE(run_rule(tied, in, out).ok());
  CHECK(out[0].bytes == e);
  CHECK(out[1].bytes == e);
  CHECK(out[1].meta.name == "lm_head.weight");
  CHECK_THROWS_AS(tied_rule("t", {"a", {3, 4}, dtype_id::bf16}, {"b", {4, 3}, dtype_id::bf16}, {}),
                  dcr::error);

  auto s0 = random_bf16(6, 6), s1 = random_bf16(6, 7), s2 = random_bf16(6, 8);
  auto st = stack_rule("s", {"experts", {3, 2, 3}, dtype_id::bf16}, 3);
  std::vector<residual_input> sin{{s0, dtype_id::bf16}, {s1, dtype_id::bf16}, {s2, dtype_id::bf16}};
  REQUIRE(run_rule(st, sin, out).ok());
  std::vector<std::byte> cat = s0;
  cat.insert(cat.end(), s1.begin(), s1.end());
  cat.insert(cat.end(), s2.begin(), s2.end());
  CHECK(out[0].bytes == cat);
  std::vector<residual_input> sbad{{s0, dtype_id::bf16}, {s1, dtype_id::f16}, {s2, dtype_id::bf16}};
  CHECK(run_rule(st, sbad, out).code == errc::bad_dtype);
  auto shorter = std::vector<std::byte>(s1.begin(), s1.end() - 2);
  std::vector<residual_input> ssize{
      {s0, dtype_id::bf16}, {shorter, dtype_id::bf16}, {s2, dtype_id::bf16}};
  CHECK(run_rule(st, ssize, out).code == errc::shape_mismatch);
  CHECK_THROWS_AS(stack_rule("s", {"x", {5}, dtype_id::bf16}, 2), dcr::error);

  // a user-defined transpose
  auto tr = custom_rule("T", {{"t.T", {4, 3}, dtype_id::bf16}}, 1,
                        [](std::span<const residual_input> in, std::span<host_tensor> out) {
                          for (std::size_t i = 0; i < 3; ++i)
                            for (std::size_t j = 0; j < 4; ++j)
                              std::memcpy(out[0].bytes.data() + 2 * (j * 3 + i),
                                          in[0].bytes.data() + 2 * (i * 4 + j), 2);
                          return status::success();
                        });
  REQUIRE(run_rule(tr, in, out).ok());
  for (std::size_t i = 0; i < 3; ++i)
    for (std::size_t j = 0; j < 4; ++j)
      CHECK(bf16_at(out[0].bytes, j * 3 + i) == bf16_at(e, i * 4 + j));
}

TEST_CASE("blockwise fp8: a row-parallel shard holding whole tiles quantises like the whole "
          "tensor; a shard cutting a tile is refused") {
  // W [20, 48] with [8, 16] tiles: 3 x 3 tiles, the last tile row partial.
  const std::uint64_t n = 20, k = 48;
  const fp8_block_shape block{8, 16};
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  std::vector<std::uint16_t> w(n * k);
  for (auto& x : w) x = f32_to_bf16_rne(nd(rng));
  std::vector<std::byte> codes(n * k);
  std::vector<float> scales(3 * 3);
  quantize_fp8_blocks(dtype_id::bf16, reinterpret_cast<const std::byte*>(w.data()), n, k, block,
                      codes.data(), scales.data());
  auto shape = [&](std::uint32_t) { return std::pair<std::uint64_t, std::uint64_t>{n, k}; };
  auto scale_id = [](std::uint32_t) { return std::uint32_t{1}; };
  for (std::uint64_t t : {1u, 3u}) // 48 / 3 = 16 columns per rank: whole tiles
    for (std::uint64_t r = 0; r < t; ++r) {
      const piecewise_map m = row_parallel_map(0, n, k, t, r).pieces();
      auto b = blockwise_fp8::make(m, dtype_id::bf16, block, shape, scale_id);
      REQUIRE(b);
      const std::uint64_t lc = k / t;
      std::vector<std::uint16_t> shard(n * lc);
      for (std::uint64_t i = 0; i < n; ++i)
        for (std::uint64_t j = 0; j < lc; ++j) shard[i * lc + j] = w[i * k + r * lc + j];
      std::vector<std::byte> out(b->converted_bytes());
      b->convert(std::as_bytes(std::span(shard)), out);
      const auto c = b->code_part(out), s = b->scale_part(out);
      b->codes.map_run(0, b->codes.domain_size(), [&](const canonical_run& run) {
        CHECK(run.tensor == 0);
        for (std::uint64_t o = 0; o < run.count; ++o)
          CHECK(c[run.local_start + o] == codes[run.canonical_start + o]);
      });
      std::uint64_t mapped = 0;
      b->scales.map_run(0, b->scales.domain_size(), [&](const canonical_run& run) {
        CHECK(run.tensor == 1);
        for (std::uint64_t o = 0; o < run.count; ++o, ++mapped) {
          float f;
          std::memcpy(&f, s.data() + 4 * (run.local_start + o), 4);
          CHECK(f == scales[run.canonical_start + o]);
        }
      });
      CHECK(mapped == 3 * 3 / t);
    }
  // 48 / 2 = 24 columns per rank: rank 0's last tile column would be cut.
  CHECK_FALSE(blockwise_fp8::make(row_parallel_map(0, n, k, 2, 0).pieces(), dtype_id::bf16, block,
                                  shape, scale_id));
  // A column-parallel shard of 10 rows cuts the second tile row.
  const piecewise_map rows10(10, k, {map_piece{0, 10, 0, 10, 0, k}});
  CHECK_FALSE(blockwise_fp8::make(rows10, dtype_id::bf16, block, shape, scale_id));
  // ... while the last 4 rows (16..19) reach the tensor's end: accepted.
  const piecewise_map tail(4, k, {map_piece{0, 4, 0, 16, 0, k}});
  CHECK(blockwise_fp8::make(tail, dtype_id::bf16, block, shape, scale_id));
}
