#pragma once
/// \file
/// FP8 E4M3 ("fn": no infinities, max finite 448) conversions used by block
/// quantisation rules: round-to-nearest-even with saturation, and decoding;
/// and the per-tile scaling policies of block quantisation.

#include <algorithm>
#include <bit>
#include <cmath>
#include <concepts>
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
    return static_cast<std::uint8_t>(sign |
                                     static_cast<std::uint8_t>(q)); // q == 8 is the smallest normal
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

/// A per-tile FP8 block-quantisation policy. Given the tile's amax (the
/// largest |x| of the tile, in FP32), `scale_inv(amax)` is the stored
/// inverse scale and `scaled(x, amax)` the FP32 value that is cast to E4M3
/// (round to nearest even, saturating). Laws: both are pure functions of
/// their arguments (the receiver's dequantisation is `e4m3 * scale_inv`).
template <class Q>
concept fp8_block_quantizer = requires(const Q& q, float amax, float x) {
  { q.scale_inv(amax) } -> std::same_as<float>;
  { q.scaled(x, amax) } -> std::same_as<float>;
};

/// The reference behaviour, as `per_block_cast_to_fp8` used with DeepGEMM
/// and vLLM computes it: amax clamped below at 1e-4, values multiplied by
/// `448 / amax`, `amax / 448` stored (all in FP32). The default.
struct per_block_cast_to_fp8 {
  static constexpr float amax_floor = 1e-4f;
  float scale_inv(float amax) const noexcept { return std::max(amax, amax_floor) / e4m3_max; }
  float scaled(float x, float amax) const noexcept {
    return x * (e4m3_max / std::max(amax, amax_floor));
  }
};
static_assert(fp8_block_quantizer<per_block_cast_to_fp8>);

/// Values divided by `scale_inv = amax / 448`, and scale_inv 1 for an
/// all-zero tile. Codes differ from the reference for some tiles (division
/// by the rounded scale_inv is not multiplication by 448/amax); kept for
/// checkpoints produced this way.
struct divide_by_scale_inv {
  float scale_inv(float amax) const noexcept { return amax > 0 ? amax / e4m3_max : 1.0f; }
  float scaled(float x, float amax) const noexcept { return x / scale_inv(amax); }
};
static_assert(fp8_block_quantizer<divide_by_scale_inv>);

} // namespace dcr
