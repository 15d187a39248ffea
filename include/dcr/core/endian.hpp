#pragma once
/// \file
/// Little-endian loads and stores of unsigned words: the one helper behind
/// every fixed-layout field dcr reads or writes (payload header and item
/// table, location words, relay frames, the safetensors header length, the
/// device twins' gap words). `constexpr DCR_HOST_DEVICE`, so kernels and host
/// twins share it; no Boost (CUDA code includes it).
///
/// On a little-endian host the word is one `memcpy` (a single unaligned
/// load or store after optimisation); elsewhere, and on the device, bytes
/// are assembled explicitly, which is correct on any byte order.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "dcr/core/config.hpp"

namespace dcr {

/// Byte-like element types a buffer may be viewed as.
template <class B>
concept byte_like =
    std::is_same_v<std::remove_cv_t<B>, std::byte> || std::is_same_v < std::remove_cv_t<B>,
unsigned char > || std::is_same_v<std::remove_cv_t<B>, char>;

/// The `sizeof(W)` bytes at `p` read as a little-endian unsigned word.
template <class W, byte_like B>
requires std::is_unsigned_v<W>
constexpr DCR_HOST_DEVICE W load_le(const B* p) noexcept {
#if !defined(__CUDA_ARCH__)
  if (!std::is_constant_evaluated() && std::endian::native == std::endian::little) {
    W w;
    std::memcpy(&w, p, sizeof w);
    return w;
  }
#endif
  std::uint64_t v = 0;
  for (unsigned i = 0; i < sizeof(W); ++i)
    v |= static_cast<std::uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return static_cast<W>(v);
}

/// Writes `w` to the `sizeof(W)` bytes at `p`, little-endian.
template <class W, byte_like B>
requires std::is_unsigned_v<W>
constexpr DCR_HOST_DEVICE void store_le(B* p, W w) noexcept {
#if !defined(__CUDA_ARCH__)
  if (!std::is_constant_evaluated() && std::endian::native == std::endian::little) {
    std::memcpy(p, &w, sizeof w);
    return;
  }
#endif
  for (unsigned i = 0; i < sizeof(W); ++i)
    p[i] = static_cast<B>(
        static_cast<unsigned char>((static_cast<std::uint64_t>(w) >> (8 * i)) & 0xFF));
}

/// The `width` (1..8) bytes at `p` as a little-endian word, for widths known
/// only at run time (gap words of a location coding).
template <byte_like B>
constexpr DCR_HOST_DEVICE std::uint64_t load_le_width(const B* p, unsigned width) noexcept {
  std::uint64_t v = 0;
  for (unsigned i = 0; i < width; ++i)
    v |= static_cast<std::uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

} // namespace dcr
