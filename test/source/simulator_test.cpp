// Training simulator: determinism, distribution laws, AdamW behaviour and
// change rates, and exact stress-update counts.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "dcr/core/detect.hpp"
#include "dcr/core/rounding.hpp"
#include "examples/common/simulator.hpp"

using namespace dcr;

namespace {

template <class W>
std::size_t count_changed(const std::vector<W>& a, std::span<const W> b) {
  std::size_t c = 0;
  for (std::size_t i = 0; i < a.size(); ++i) c += a[i] != b[i];
  return c;
}

errc code_of(auto&& f) {
  try {
    f();
  } catch (const error& e) {
    return e.code();
  }
  return errc::ok;
}

} // namespace

TEST_CASE("generators: xoshiro256** reference values, bounded draws stay in range") {
  // First outputs of xoshiro256** from the state {1, 2, 3, 4} (published test vector).
  auto x = sim::xoshiro256ss::from_state({1, 2, 3, 4});
  const std::uint64_t want[] = {11520, 0, 1509978240, 1215971899390074240ull};
  for (auto w : want) CHECK(x.next() == w);
  sim::splitmix64 sm{0};
  // splitmix64 with state 0: published first output 0xE220A8397B1DCDAF.
  CHECK(sm.next() == 0xE220A8397B1DCDAFull);
  sim::xoshiro256ss g(42);
  for (std::uint64_t bound : {1ull, 2ull, 3ull, 10ull, 1000003ull, (1ull << 63) + 5})
    for (int i = 0; i < 2000; ++i) CHECK(g.below(bound) < bound);
  // below() is uniform: each of 6 buckets gets 1/6 of 60000 draws within 5 sigma.
  std::vector<int> hist(6, 0);
  for (int i = 0; i < 60000; ++i) ++hist[g.below(6)];
  for (int h : hist) CHECK(std::abs(h - 10000) < 5 * 91);
}

TEST_CASE("normal_bf16 is deterministic and has the requested moments") {
  const std::size_t n = 1'000'000;
  const auto a = sim::normal_bf16(n, 0.02f, 7), b = sim::normal_bf16(n, 0.02f, 7),
             c = sim::normal_bf16(n, 0.02f, 8);
  CHECK(a == b);
  CHECK(count_changed(a, std::span<const std::uint16_t>(c)) > n * 9 / 10);
  double sum = 0, sq = 0;
  std::size_t within = 0;
  for (auto w : a) {
    const double x = bf16_to_f32(w);
    sum += x;
    sq += x * x;
    within += std::fabs(x) <= 0.02;
  }
  const double mean = sum / n, sd = std::sqrt(sq / n - mean * mean);
  CHECK(std::fabs(mean) < 5 * 0.02 / std::sqrt(double(n)));
  CHECK(std::fabs(sd / 0.02 - 1.0) < 0.005); // BF16 rounding adds ~0.1% noise at most
  CHECK(std::fabs(double(within) / n - 0.682689) < 0.003);
  // Words are the RNE of float values: converting back and forth is the identity.
  for (std::size_t i = 0; i < 1000; ++i) CHECK(f32_to_bf16_rne(bf16_to_f32(a[i])) == a[i]);
}

TEST_CASE("normal_words works for f16 and f32 too") {
  const auto h = sim::normal_words<dcr::f16>(100'000, 1.0f, 3);
  const auto f = sim::normal_words<dcr::f32>(100'000, 1.0f, 3);
  // Same normal stream: the f16 word is the RNE of the f32 value.
  for (std::size_t i = 0; i < h.size(); ++i) CHECK(h[i] == f32_to_f16_rne(f32_from_bits(f[i])));
}

TEST_CASE("AdamW: first step moves every master weight by about lr; stored = RNE(master)") {
  const std::size_t n = 200'000;
  const auto init = sim::normal_bf16(n, 0.02f, 11);
  sim::adamw_trainer t(init, 12);
  t.step();
  CHECK(t.steps() == 1);
  // At t = 1, m̂ = g and sqrt(v̂) = |g|, so the update is lr·g/(|g| + eps) ≈ ±lr.
  std::size_t near_lr = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double d = std::fabs(double(t.master()[i]) - double(bf16_to_f32(init[i])));
    near_lr += std::fabs(d - 1e-6) < 1e-8;
    CHECK(t.bf16()[i] == f32_to_bf16_rne(t.master()[i]));
  }
  CHECK(near_lr > n * 999 / 1000);
}

TEST_CASE("AdamW: per-step change rate of std-0.02 BF16 weights is 0.5-2%; deterministic") {
  const std::size_t n = 400'000;
  const auto init = sim::normal_bf16(n, 0.02f, 21);
  sim::adamw_trainer t(init, 22), same(init, 22);
  std::vector<std::uint16_t> prev = init;
  for (int s = 0; s < 5; ++s) {
    t.step();
    same.step();
    const double rate = double(count_changed(prev, t.bf16())) / double(n);
    CAPTURE(s);
    CAPTURE(rate);
    CHECK(rate > 0.005);
    CHECK(rate < 0.02);
    // detect_changes agrees with a naive count on simulator output
    std::vector<std::uint64_t> idx;
    detect_changes(std::span<const std::uint16_t>(prev), t.bf16(), 0, idx);
    CHECK(idx.size() == count_changed(prev, t.bf16()));
    prev.assign(t.bf16().begin(), t.bf16().end());
  }
  CHECK(std::equal(t.bf16().begin(), t.bf16().end(), same.bf16().begin()));
  CHECK(std::equal(t.master().begin(), t.master().end(), same.master().begin()));
  // A different seed gives different gradients from the first step on.
  sim::adamw_trainer x(init, 22), y(init, 23);
  x.step();
  y.step();
  CHECK_FALSE(std::equal(x.master().begin(), x.master().end(), y.master().begin()));
}

TEST_CASE("AdamW: weight decay shrinks, f16 trainer stores RNE(master)") {
  const auto init = sim::normal_words<dcr::f16>(50'000, 0.5f, 31);
  sim::adamw_options opt;
  opt.lr = 1e-3f;
  opt.weight_decay = 0.1f;
  sim::basic_adamw_trainer<dcr::f16> t(init, 32, opt),
      no_decay(init, 32, {1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f});
  for (int s = 0; s < 3; ++s) {
    t.step();
    no_decay.step();
  }
  double l2 = 0, l2_nd = 0;
  for (std::size_t i = 0; i < init.size(); ++i) {
    CHECK(t.words()[i] == f32_to_f16_rne(t.master()[i]));
    l2 += double(t.master()[i]) * t.master()[i];
    l2_nd += double(no_decay.master()[i]) * no_decay.master()[i];
  }
  CHECK(l2 < l2_nd);
}

TEST_CASE("stress_update changes exactly round(fraction·n) uniformly chosen elements") {
  const std::size_t n = 400'000;
  const auto base = sim::normal_bf16(n, 0.02f, 41);
  for (double fraction : {0.0, 0.012, 0.03, 0.05, 0.5, 1.0}) {
    auto w = base;
    const std::size_t k = sim::stress_update(w, fraction, 1e-2, 42);
    CAPTURE(fraction);
    CHECK(k == static_cast<std::size_t>(std::llround(fraction * n)));
    CHECK(count_changed(base, std::span<const std::uint16_t>(w)) == k);
    // Uniform: 8 equal slices each hold k/8 changes within 6 sigma.
    for (std::size_t s = 0; s < 8 && fraction > 0 && fraction < 1; ++s) {
      std::size_t c = 0;
      for (std::size_t i = s * n / 8; i < (s + 1) * n / 8; ++i) c += base[i] != w[i];
      const double expect = double(k) / 8, sigma = std::sqrt(expect * (1 - fraction));
      CHECK(std::fabs(double(c) - expect) < 6 * sigma + 1);
    }
    // Scaled, not replaced: relative change stays within a few amplitudes + an ulp.
    for (std::size_t i = 0; i < n; ++i)
      if (base[i] != w[i]) {
        const double x = bf16_to_f32(base[i]), y = bf16_to_f32(w[i]);
        CHECK(std::fabs(y / x - 1.0) < 0.08);
      }
    auto again = base;
    sim::stress_update(again, fraction, 1e-2, 42);
    CHECK(again == w);
  }
}

TEST_CASE(
    "stress_update: elements scaling cannot change still change; bad arguments are rejected") {
  std::vector<std::uint16_t> w{0x0000, 0x8000, 0x7F80, 0x7FC0, 0x3F80};
  const auto before = w;
  CHECK(sim::stress_update(w, 1.0, 1e-2, 5) == 5);
  for (std::size_t i = 0; i < w.size(); ++i) CHECK(w[i] != before[i]);
  auto z = before;
  CHECK(sim::stress_update(z, 1.0, 0.0, 5) == 5); // zero amplitude: lowest bit flipped
  for (std::size_t i = 0; i < z.size(); ++i) CHECK(z[i] == (before[i] ^ 1u));
  CHECK(code_of([&] { sim::stress_update(w, -0.1, 1e-2, 1); }) == errc::invalid_argument);
  CHECK(code_of([&] { sim::stress_update(w, 1.5, 1e-2, 1); }) == errc::invalid_argument);
  CHECK(code_of([&] { sim::stress_update(w, NAN, 1e-2, 1); }) == errc::invalid_argument);
  CHECK(code_of([&] { sim::stress_update(w, 0.5, -1.0, 1); }) == errc::invalid_argument);
  CHECK(code_of([&] { sim::stress_update(w, 0.5, INFINITY, 1); }) == errc::invalid_argument);
  std::vector<std::uint16_t> empty;
  CHECK(sim::stress_update(empty, 0.5, 1e-2, 1) == 0);
}
