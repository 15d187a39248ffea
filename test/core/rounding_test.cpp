// Rounding laws for dcr/core/rounding.hpp, checked against references that
// share no code with the implementation: magnitudes decoded with std::ldexp,
// the nearest representable value picked by exact distance (differences of
// these values are exact in double), ties to the even code.
//
// Suite 'unit' runs 10^5 random inputs per format; building with
// -DDCR_ROUNDING_SLOW (the 'slow' suite) adds 10^7 random inputs and an
// exhaustive sweep over all 2^32 FP32 patterns.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "dcr/core/rounding.hpp"
#include "examples/common/simulator.hpp"

using namespace dcr;

namespace {

/// One 16-bit format described by its field widths only.
struct format16 {
  int mantissa_bits;      // 7 for bf16, 10 for f16
  int exponent_bias;      // 127 for bf16, 15 for f16
  std::uint16_t inf_code; // 0x7F80, 0x7C00
  std::uint16_t (*narrow)(float);
  float (*widen)(std::uint16_t);
};

std::uint16_t narrow_bf16(float f) { return f32_to_bf16_rne(f); }
std::uint16_t narrow_f16(float f) { return f32_to_f16_rne(f); }
float widen_bf16(std::uint16_t w) { return bf16_to_f32(w); }
float widen_f16(std::uint16_t w) { return f16_to_f32(w); }

const format16 bf16_fmt{7, 127, 0x7F80, narrow_bf16, widen_bf16};
const format16 f16_fmt{10, 15, 0x7C00, narrow_f16, widen_f16};

/// Magnitude of a finite non-negative code, from the IEEE definition.
double ref_magnitude(const format16& f, std::uint32_t code) {
  const std::uint32_t m = code & ((1u << f.mantissa_bits) - 1u);
  const int e = static_cast<int>(code >> f.mantissa_bits);
  if (e == 0) return std::ldexp(static_cast<double>(m), 1 - f.exponent_bias - f.mantissa_bits);
  return std::ldexp(static_cast<double>(m + (1u << f.mantissa_bits)),
                    e - f.exponent_bias - f.mantissa_bits);
}

/// Table of magnitudes of codes 0..inf_code, the last being the value the
/// next code would have with an unbounded exponent (2^128 resp. 2^16): IEEE
/// overflow rounds to infinity exactly when that virtual value is nearer.
std::vector<double> magnitudes(const format16& f) {
  std::vector<double> t(f.inf_code + 1u);
  for (std::uint32_t c = 0; c <= f.inf_code; ++c) t[c] = ref_magnitude(f, c);
  return t;
}

/// Choose between code lo (value vlo ≤ x) and lo + 1 (value vhi > x).
std::uint16_t pick(double ax, std::uint32_t lo, double vlo, double vhi) {
  const double dlo = ax - vlo, dhi = vhi - ax; // exact: both values share most bits with x
  if (dlo < dhi) return static_cast<std::uint16_t>(lo);
  if (dhi < dlo) return static_cast<std::uint16_t>(lo + 1);
  return static_cast<std::uint16_t>((lo & 1u) ? lo + 1 : lo);
}

/// Expected NaN result: the policy written in rounding.hpp.
std::uint16_t ref_nan(const format16& f, std::uint32_t u) {
  const std::uint32_t keep =
      static_cast<std::uint32_t>(f.mantissa_bits) - 1u; // below the quiet bit
  const std::uint32_t payload = (u >> (22 - keep)) & ((1u << keep) - 1u);
  const std::uint32_t quiet = 1u << keep;
  return static_cast<std::uint16_t>(((u >> 16) & 0x8000u) | f.inf_code | quiet | payload);
}

/// Reference narrowing by binary search over the magnitude table.
std::uint16_t ref_narrow(const format16& f, const std::vector<double>& mag, float x) {
  const std::uint32_t u = f32_bits(x);
  if (std::isnan(x)) return ref_nan(f, u);
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  if (std::isinf(x)) return static_cast<std::uint16_t>(sign | f.inf_code);
  const double ax = std::fabs(static_cast<double>(x));
  if (ax >= mag.back())
    return static_cast<std::uint16_t>(sign | f.inf_code); // nearer to 2^128 / 2^16
  auto it = std::upper_bound(mag.begin(), mag.end(), ax); // first magnitude > ax
  const auto lo = static_cast<std::uint32_t>(it - mag.begin() - 1);
  if (mag[lo] == ax) return static_cast<std::uint16_t>(sign | lo);
  return static_cast<std::uint16_t>(sign | pick(ax, lo, mag[lo], mag[lo + 1]));
}

std::string hex(std::uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%08x", static_cast<unsigned>(v));
  return b;
}

using splitmix = dcr::sim::splitmix64;

/// Random inputs from four classes: any pattern; exponents near the 16-bit
/// formats' ranges; exact ties of each format; values one FP32 ulp off a tie.
float random_input(splitmix& g) {
  const std::uint64_t r = g.next();
  std::uint32_t u = static_cast<std::uint32_t>(r);
  const std::uint32_t sign = u & 0x80000000u;
  switch ((r >> 32) & 7u) {
  case 0:
  case 1:
    return f32_from_bits(u);
  case 2: { // exponent 2^-30 .. 2^17 covers f16 subnormal, normal and overflow
    const std::uint32_t e = 97u + static_cast<std::uint32_t>((r >> 40) % 48u);
    return f32_from_bits(sign | (e << 23) | (u & 0x007FFFFFu));
  }
  case 3: // bf16 tie: dropped half exactly 1/2 ulp
    return f32_from_bits((u & 0xFFFF0000u) | 0x8000u);
  case 4: { // f16 tie in the normal range
    const std::uint32_t e = 113u + static_cast<std::uint32_t>((r >> 40) % 31u);
    return f32_from_bits(sign | (e << 23) | (u & 0x007FE000u) | 0x1000u);
  }
  case 5: { // f16 tie in the subnormal range: (2k+1)·2^-25
    const std::uint32_t k = static_cast<std::uint32_t>((r >> 40) % 1024u);
    return std::ldexp(static_cast<float>(2 * k + 1), -25) * (sign ? -1.0f : 1.0f);
  }
  case 6: // one ulp either side of a bf16 tie
    return f32_from_bits((u & 0xFFFF0000u) | ((r >> 40) & 1u ? 0x8001u : 0x7FFFu));
  default: { // f16 subnormal/normal boundary region and f32 subnormals
    const std::uint32_t e = static_cast<std::uint32_t>((r >> 40) % 4u) == 0
                                ? 0u
                                : 110u + static_cast<std::uint32_t>((r >> 42) % 4u);
    return f32_from_bits(sign | (e << 23) | (u & 0x007FFFFFu));
  }
  }
}

void random_sweep(const format16& f, std::size_t n, std::uint64_t seed) {
  const auto mag = magnitudes(f);
  splitmix g{seed};
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float x = random_input(g);
    const std::uint16_t want = ref_narrow(f, mag, x), got = f.narrow(x);
    if (want != got && ++bad <= 10) {
      INFO("input " << hex(f32_bits(x)) << " want " << hex(want) << " got " << hex(got));
      CHECK(want == got);
    }
  }
  CHECK(bad == 0);
}

#if defined(DCR_ROUNDING_SLOW)
/// All 2^32 inputs in pattern order. For non-negative patterns, magnitude
/// grows with the pattern, so the bracketing code advances monotonically and
/// the reference costs O(1) per input; negative inputs must mirror.
void exhaustive_sweep(const format16& f) {
  const auto mag = magnitudes(f);
  std::uint32_t lo = 0;
  std::uint64_t bad = 0;
  for (std::uint64_t v = 0; v <= 0x7FFFFFFFu; ++v) {
    const auto u = static_cast<std::uint32_t>(v);
    const float x = f32_from_bits(u);
    std::uint16_t want;
    if (u > 0x7F800000u) {
      want = ref_nan(f, u);
    } else if (u == 0x7F800000u) {
      want = f.inf_code;
    } else if (static_cast<double>(x) >= mag.back()) {
      want = f.inf_code;
    } else {
      const double ax = static_cast<double>(x);
      while (mag[lo + 1] <= ax) ++lo;
      want = mag[lo] == ax ? static_cast<std::uint16_t>(lo) : pick(ax, lo, mag[lo], mag[lo + 1]);
    }
    const std::uint16_t got = f.narrow(x);
    const std::uint16_t got_neg = f.narrow(f32_from_bits(u | 0x80000000u));
    if ((got != want || got_neg != (want | 0x8000u)) && ++bad <= 10) {
      INFO("input " << hex(u) << " want " << hex(want) << " got " << hex(got) << " / "
                    << hex(got_neg));
      CHECK(false);
    }
  }
  CHECK(bad == 0);
}
#endif

std::uint16_t bf(float x) { return f32_to_bf16_rne(x); }
std::uint16_t hf(float x) { return f32_to_f16_rne(x); }
float bits(std::uint32_t u) { return f32_from_bits(u); }

} // namespace

// Compile-time use: the conversions are constant expressions.
static_assert(f32_to_bf16_rne(1.0f) == 0x3F80 && f32_to_f16_rne(1.0f) == 0x3C00);
static_assert(bf16_to_f32(0xC000) == -2.0f && f16_to_f32(0x0001) == 0x1p-24f);

TEST_CASE("bf16: every one of the 65536 patterns widens exactly and narrows back") {
  for (std::uint32_t w = 0; w < 65536; ++w) {
    const auto c = static_cast<std::uint16_t>(w);
    const float x = bf16_to_f32(c);
    CHECK(f32_bits(x) == (w << 16)); // widening is the upper half, NaN bits untouched
    const bool signalling = (w & 0x7F80u) == 0x7F80u && (w & 0x7Fu) != 0 && (w & 0x40u) == 0;
    CHECK(f32_to_bf16_rne(x) == (signalling ? (c | 0x0040u) : c));
    if ((w & 0x7F80u) != 0x7F80u) {
      const double v = ref_magnitude(bf16_fmt, w & 0x7FFFu);
      CHECK(static_cast<double>(x) == ((w & 0x8000u) ? -v : v));
    }
  }
}

TEST_CASE("f16: every one of the 65536 patterns widens exactly and narrows back") {
  for (std::uint32_t w = 0; w < 65536; ++w) {
    const auto c = static_cast<std::uint16_t>(w);
    const float x = f16_to_f32(c);
    const bool special = (w & 0x7C00u) == 0x7C00u;
    if (!special) {
      const double v = ref_magnitude(f16_fmt, w & 0x7FFFu);
      CHECK(static_cast<double>(x) == ((w & 0x8000u) ? -v : v));
      CHECK(std::signbit(x) == ((w & 0x8000u) != 0));
    } else {
      // Infinity and NaN: sign, all-ones exponent, mantissa moved up unchanged.
      CHECK(f32_bits(x) == (((w & 0x8000u) << 16) | 0x7F800000u | ((w & 0x3FFu) << 13)));
    }
    const bool signalling = special && (w & 0x3FFu) != 0 && (w & 0x200u) == 0;
    CHECK(f32_to_f16_rne(x) == (signalling ? (c | 0x0200u) : c));
  }
}

TEST_CASE("bf16 edge classes") {
  SUBCASE("zeros and infinities keep their sign") {
    CHECK(bf(0.0f) == 0x0000);
    CHECK(bf(-0.0f) == 0x8000);
    CHECK(bf(INFINITY) == 0x7F80);
    CHECK(bf(-INFINITY) == 0xFF80);
  }
  SUBCASE("ties go to the even code, near-ties to the nearer") {
    CHECK(bf(1.0f + 0x1p-8f) == 0x3F80);     // 0x3F80 | 0x3F81: even below
    CHECK(bf(1.0f + 3 * 0x1p-8f) == 0x3F82); // 0x3F81 | 0x3F82: even above
    CHECK(bf(1.0f + 0x1p-8f + 0x1p-23f) == 0x3F81);
    CHECK(bf(-(1.0f + 3 * 0x1p-8f)) == 0xBF82);
    CHECK(bf(bits(0x3F817FFFu)) == 0x3F81);
  }
  SUBCASE("overflow: the largest finite stays, half an ulp above it is infinity") {
    CHECK(bf(bits(0x7F7F0000u)) == 0x7F7F);
    CHECK(bf(bits(0x7F7F7FFFu)) == 0x7F7F);
    CHECK(bf(bits(0x7F7F8000u)) == 0x7F80); // tie, 0x7F7F is odd
    CHECK(bf(bits(0x7F7FFFFFu)) == 0x7F80); // FLT_MAX
    CHECK(bf(-bits(0x7F7FFFFFu)) == 0xFF80);
  }
  SUBCASE("subnormal inputs and results round at subnormal precision") {
    CHECK(bf(bits(0x00000001u)) == 0x0000); // smallest FP32 subnormal
    CHECK(bf(bits(0x00008000u)) == 0x0000); // tie 0 | 1: even
    CHECK(bf(bits(0x00008001u)) == 0x0001);
    CHECK(bf(bits(0x00018000u)) == 0x0002); // tie 1 | 2: even
    CHECK(bf(bits(0x007FFFFFu)) == 0x0080); // largest FP32 subnormal → smallest normal
    CHECK(bf(bits(0x80008001u)) == 0x8001);
  }
  SUBCASE("NaNs become quiet, keep sign and the top payload bits") {
    CHECK(bf(bits(0x7FC00000u)) == 0x7FC0);
    CHECK(bf(bits(0xFFC00001u)) == 0xFFC0);
    CHECK(bf(bits(0x7F800001u)) == 0x7FC0); // signalling, payload only in dropped bits
    CHECK(bf(bits(0x7FA00000u)) == 0x7FE0); // signalling, payload bit kept
    CHECK(bf(bits(0xFFFFFFFFu)) == 0xFFFF);
  }
}

TEST_CASE("f16 edge classes") {
  SUBCASE("zeros and infinities keep their sign") {
    CHECK(hf(0.0f) == 0x0000);
    CHECK(hf(-0.0f) == 0x8000);
    CHECK(hf(INFINITY) == 0x7C00);
    CHECK(hf(-INFINITY) == 0xFC00);
  }
  SUBCASE("ties go to the even code") {
    CHECK(hf(1.0f + 0x1p-11f) == 0x3C00);
    CHECK(hf(1.0f + 3 * 0x1p-11f) == 0x3C02);
    CHECK(hf(1.0f + 0x1p-11f + 0x1p-23f) == 0x3C01);
    CHECK(hf(-(1.0f + 3 * 0x1p-11f)) == 0xBC02);
  }
  SUBCASE("overflow: 65504 is the largest finite, 65520 rounds to infinity") {
    CHECK(hf(65504.0f) == 0x7BFF);
    CHECK(hf(std::nextafter(65520.0f, 0.0f)) == 0x7BFF);
    CHECK(hf(65520.0f) == 0x7C00); // tie, 0x7BFF is odd
    CHECK(hf(1e10f) == 0x7C00);
    CHECK(hf(-65520.0f) == 0xFC00);
    CHECK(hf(bits(0x7F7FFFFFu)) == 0x7C00);
  }
  SUBCASE("subnormal results are rounded once, at their own precision") {
    CHECK(hf(0x1p-24f) == 0x0001);
    CHECK(hf(0x1p-25f) == 0x0000); // tie 0 | 1: even
    CHECK(hf(std::nextafter(0x1p-25f, 1.0f)) == 0x0001);
    CHECK(hf(std::nextafter(0x1p-25f, 0.0f)) == 0x0000);
    CHECK(hf(3 * 0x1p-25f) == 0x0002);        // tie 1 | 2
    CHECK(hf(5 * 0x1p-25f) == 0x0002);        // tie 2 | 3
    CHECK(hf(0x1p-14f - 0x1p-25f) == 0x0400); // tie 0x3FF | 0x400: even, a normal
    CHECK(hf(0x1p-14f - 0x1p-24f) == 0x03FF);
    CHECK(hf(0x1p-14f) == 0x0400);
    CHECK(hf(-0x1p-24f) == 0x8001);
  }
  SUBCASE("FP32 subnormal inputs flush to a signed zero by rounding, not by FTZ") {
    CHECK(hf(bits(0x00000001u)) == 0x0000);
    CHECK(hf(bits(0x807FFFFFu)) == 0x8000);
  }
  SUBCASE("NaNs become quiet, keep sign and the top payload bits") {
    CHECK(hf(bits(0x7FC00000u)) == 0x7E00);
    CHECK(hf(bits(0x7F800001u)) == 0x7E00);
    CHECK(hf(bits(0x7F802000u)) == 0x7E01);
    CHECK(hf(bits(0xFFFFFFFFu)) == 0xFFFF);
  }
}

TEST_CASE("random inputs match the exact-distance reference (10^5 per format)") {
  random_sweep(bf16_fmt, 100'000, 0x5EED0001);
  random_sweep(f16_fmt, 100'000, 0x5EED0002);
}

#if defined(__FLT16_MAX__)
TEST_CASE("f16 narrowing agrees with the compiler's _Float16 conversion") {
  // A third implementation (libgcc soft-fp or F16C), NaN payloads included.
  splitmix g{0x5EED0003};
  std::size_t bad = 0;
  for (int i = 0; i < 100'000; ++i) {
    const float x = random_input(g);
    volatile float vx = x; // keep the conversion at run time
    const _Float16 h = static_cast<_Float16>(vx);
    std::uint16_t hb;
    std::memcpy(&hb, &h, 2);
    if (hb != f32_to_f16_rne(x) && ++bad <= 10) {
      INFO("input " << hex(f32_bits(x)));
      CHECK(hb == f32_to_f16_rne(x));
    }
  }
  CHECK(bad == 0);
}
#endif

#if defined(DCR_ROUNDING_SLOW)
TEST_CASE("random inputs match the exact-distance reference (10^7 per format)") {
  random_sweep(bf16_fmt, 10'000'000, 0x5EED0011);
  random_sweep(f16_fmt, 10'000'000, 0x5EED0012);
}
TEST_CASE("bf16: all 2^32 FP32 inputs match the reference") { exhaustive_sweep(bf16_fmt); }
TEST_CASE("f16: all 2^32 FP32 inputs match the reference") { exhaustive_sweep(f16_fmt); }
#endif
