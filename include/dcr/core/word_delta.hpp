#pragma once
/// \file
/// Integer difference of two stored words, zigzag coded: the value word of
/// the `add` encoding (docs/wire-format.md, value encoding 3).
///
/// `zigzag_delta(old, new)` is `d = new - old` modulo 2^w (w = the word's
/// bits) read as a two's-complement w-bit number and mapped to an unsigned
/// word by zigzag (0, -1, 1, -2, ... -> 0, 1, 2, 3, ...), so that a value
/// that moved a few units in the last place becomes a small word whatever
/// the carry chain of its old bits. `apply_zigzag_delta(old, v)` adds the
/// decoded difference back modulo 2^w. Both are pure unsigned arithmetic on
/// stored bits (no float reconstruction), so the round trip is exact for
/// every pair of words. Everything here is `constexpr DCR_HOST_DEVICE`:
/// the codec, the receiver sinks, the host twins and the CUDA kernels share
/// these two functions.

#include <cstdint>
#include <type_traits>

#include "dcr/core/config.hpp"

namespace dcr {

/// Zigzag code of `new_w - old_w` modulo 2^w.
template <class W>
requires std::is_unsigned_v<W>
constexpr DCR_HOST_DEVICE W zigzag_delta(W old_w, W new_w) noexcept {
  constexpr unsigned top = 8 * sizeof(W) - 1;
  const W d = static_cast<W>(new_w - old_w);
  // (d << 1) ^ (d >> top, sign-extended): all in W, so wrap is modular.
  const W sign = static_cast<W>(W{0} - static_cast<W>(d >> top));
  return static_cast<W>(static_cast<W>(d << 1) ^ sign);
}

/// `resident + unzigzag(v)` modulo 2^w: inverse of `zigzag_delta` in its
/// second argument (`apply_zigzag_delta(o, zigzag_delta(o, n)) == n`).
template <class W>
requires std::is_unsigned_v<W>
constexpr DCR_HOST_DEVICE W apply_zigzag_delta(W resident, W v) noexcept {
  const W d =
      static_cast<W>(static_cast<W>(v >> 1) ^ static_cast<W>(W{0} - static_cast<W>(v & 1u)));
  return static_cast<W>(resident + d);
}

static_assert(zigzag_delta<std::uint16_t>(0x3f80, 0x3f81) == 2);
static_assert(zigzag_delta<std::uint16_t>(0x3f81, 0x3f80) == 1);
static_assert(zigzag_delta<std::uint8_t>(0xFF, 0x00) == 2);
static_assert(apply_zigzag_delta<std::uint32_t>(5, zigzag_delta<std::uint32_t>(5, 0xFFFFFFFFu)) ==
              0xFFFFFFFFu);

} // namespace dcr
