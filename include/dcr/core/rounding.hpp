#pragma once
/// \file
/// Exact conversions between FP32 and the 16-bit storage formats, done on bit
/// patterns so that host, device and compile time agree bit for bit,
/// independent of the floating-point environment (rounding mode, FTZ/DAZ).
///
/// Narrowing (`f32_to_bf16_rne`, `f32_to_f16_rne`) is IEEE 754
/// round-to-nearest, ties-to-even, with gradual underflow and overflow to
/// infinity. Widening (`bf16_to_f32`, `f16_to_f32`) is exact for every one of
/// the 65536 patterns, so narrow(widen(w)) == w for all w, NaNs included.
///
/// NaN policy (both narrowings): the result is a quiet NaN with the input's
/// sign; the quiet bit is set and the mantissa bits just below it are the
/// input's mantissa bits just below its quiet bit, truncated (bf16 keeps f32
/// mantissa bits 21..16, f16 keeps bits 21..13); lower payload bits are
/// dropped. A signalling NaN therefore becomes quiet and never turns into an
/// infinity. This is what x86 F16C `vcvtps2ph` does for f16. Widening keeps
/// NaN bits as they are (no quieting), so stored patterns survive a round trip.

#include <cstdint>

#include "dcr/core/config.hpp"

namespace dcr {

/// Bit pattern of an FP32 value.
constexpr DCR_HOST_DEVICE std::uint32_t f32_bits(float f) noexcept {
  return __builtin_bit_cast(std::uint32_t, f);
}

/// FP32 value of a bit pattern.
constexpr DCR_HOST_DEVICE float f32_from_bits(std::uint32_t u) noexcept {
  return __builtin_bit_cast(float, u);
}

/// FP32 → BF16, round to nearest, ties to even; NaN policy in the file comment.
constexpr DCR_HOST_DEVICE std::uint16_t f32_to_bf16_rne(float f) noexcept {
  std::uint32_t u = f32_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  // Adding 0x7FFF (+1 when the kept LSB is odd) carries into the kept bits
  // exactly when the dropped half is above (or at, for odd) one half ulp; a
  // carry out of the mantissa bumps the exponent, up to infinity.
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

/// BF16 → FP32, exact (the BF16 pattern is the upper half of the FP32 pattern).
constexpr DCR_HOST_DEVICE float bf16_to_f32(std::uint16_t w) noexcept {
  return f32_from_bits(static_cast<std::uint32_t>(w) << 16);
}

/// FP32 → F16 (IEEE binary16), round to nearest, ties to even; subnormal
/// results are rounded once at their own precision; |x| ≥ 65520 gives ±inf.
constexpr DCR_HOST_DEVICE std::uint16_t f32_to_f16_rne(float f) noexcept {
  const std::uint32_t u = f32_bits(f);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<std::uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x01FFu));
  if (a >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u); // ≥ 65504 + ulp/2
  if (a >= 0x38800000u) { // normal result: rebias exponent by 127 - 15, round 13 bits away
    const std::uint32_t r = a - (112u << 23);
    return static_cast<std::uint16_t>(sign | ((r + 0x0FFFu + ((r >> 13) & 1u)) >> 13));
  }
  // Subnormal (or zero) result in units of 2^-24: m·2^(e-150) / 2^-24 = m >> (126 - e).
  const std::uint32_t e = a >> 23;
  if (e < 102) return static_cast<std::uint16_t>(sign); // below 2^-25: rounds to zero
  const std::uint32_t m = (a & 0x007FFFFFu) | 0x00800000u;
  const std::uint32_t s = 126u - e; // 14..24
  const std::uint32_t q = m >> s;
  const std::uint32_t rest = m & ((1u << s) - 1u);
  const std::uint32_t half = 1u << (s - 1u);
  const std::uint32_t up = (rest > half) | ((rest == half) & (q & 1u));
  return static_cast<std::uint16_t>(sign | (q + up)); // q + up = 0x400 is the smallest normal
}

/// F16 → FP32, exact for every pattern (subnormals are normalised in FP32).
constexpr DCR_HOST_DEVICE float f16_to_f32(std::uint16_t w) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(w & 0x8000u) << 16;
  std::uint32_t e = (w >> 10) & 0x1Fu;
  std::uint32_t m = w & 0x03FFu;
  if (e == 0x1Fu) return f32_from_bits(sign | 0x7F800000u | (m << 13));
  if (e != 0) return f32_from_bits(sign | ((e + 112u) << 23) | (m << 13));
  if (m == 0) return f32_from_bits(sign);
  // Subnormal m·2^-24: shift the leading one up to the implicit-bit position.
  e = 113;
  while ((m & 0x0400u) == 0) {
    m <<= 1;
    --e;
  }
  return f32_from_bits(sign | (e << 23) | ((m & 0x03FFu) << 13));
}

} // namespace dcr
