#pragma once
/// \file
/// FP8 E4M3 ("fn": no infinities, max finite 448) conversions used by block
/// quantisation rules: round-to-nearest-even with saturation, and decoding.

#include <bit>
#include <cmath>
#include <cstdint>

namespace dcr {

/// Largest finite E4M3fn magnitude.
inline constexpr float e4m3_max = 448.0f;

/// f32 -> E4M3fn, saturating to +-448, round to nearest even; NaN -> 0x7F.
inline std::uint8_t f32_to_e4m3_rne(float x) noexcept {
  if (std::isnan(x)) return 0x7F;
  const std::uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  float a = std::fabs(x);
  if (a > e4m3_max) a = e4m3_max;
  if (a < 0.015625f) { // below 2^-6: subnormal steps of 2^-9 (scaling by 512 is exact)
    const float q = std::nearbyint(a * 512.0f);
    return static_cast<std::uint8_t>(sign | static_cast<std::uint8_t>(q)); // q == 8 is the smallest normal
  }
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(a);
  int e = static_cast<int>((bits >> 23) & 0xFF) - 127;
  std::uint32_t m = bits & 0x7FFFFF;
  std::uint32_t keep = m >> 20, rem = m & 0xFFFFF;
  if (rem > 0x80000u || (rem == 0x80000u && (keep & 1))) ++keep;
  if (keep == 8) {
    keep = 0;
    ++e;
  }
  return static_cast<std::uint8_t>(sign | static_cast<std::uint8_t>(((e + 7) << 3) | keep));
}

/// E4M3fn -> f32 (exact).
inline float e4m3_to_f32(std::uint8_t w) noexcept {
  const float s = (w & 0x80) ? -1.0f : 1.0f;
  const int e = (w >> 3) & 0xF, m = w & 7;
  if (e == 15 && m == 7) return std::nanf("");
  if (e == 0) return s * std::ldexp(static_cast<float>(m), -9);
  return s * std::ldexp(1.0f + static_cast<float>(m) / 8.0f, e - 7);
}

} // namespace dcr
