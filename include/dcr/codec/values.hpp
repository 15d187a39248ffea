#pragma once
/// \file
/// Value coding: what an item's words mean (XOR mask or overwrite value) and
/// how they are laid out before compression (optionally byte planes).
///
/// XOR masks of small updates have an almost-always-zero high byte (sign and
/// upper exponent bits rarely change), so splitting words into byte planes
/// lets zstd see one long near-constant stream and one noisy stream instead
/// of interleaved bytes. This header avoids Boost (host twins include it).

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

#include "dcr/codec/item.hpp"
#include "dcr/core/config.hpp"
#include "dcr/core/error.hpp"

namespace dcr::codec {

/// A delta encoding policy: how a value is made from (old, new) words and
/// applied to resident words. Law: `apply(old, make(old, new)) == new`.
template <class E>
concept delta_encoding = requires(std::uint16_t w) {
  { E::id } -> std::convertible_to<value_encoding>;
  { E::make(w, w) } -> std::same_as<std::uint16_t>;
  { E::apply(w, w) } -> std::same_as<std::uint16_t>;
};

/// value = old ^ new; applying XORs it in (needs the resident word to be `old`).
struct xor_mask {
  static constexpr value_encoding id = value_encoding::xor_mask;
  template <class W>
  static constexpr DCR_HOST_DEVICE W make(W old_w, W new_w) noexcept {
    return old_w ^ new_w;
  }
  template <class W>
  static constexpr DCR_HOST_DEVICE W apply(W resident, W v) noexcept {
    return resident ^ v;
  }
};
static_assert(delta_encoding<xor_mask>);

/// value = new; applying writes it, whatever was resident.
struct overwrite {
  static constexpr value_encoding id = value_encoding::overwrite;
  template <class W>
  static constexpr DCR_HOST_DEVICE W make(W, W new_w) noexcept {
    return new_w;
  }
  template <class W>
  static constexpr DCR_HOST_DEVICE W apply(W, W v) noexcept {
    return v;
  }
};
static_assert(delta_encoding<overwrite>);

/// True when `raw` is a value encoding id this build knows.
constexpr bool is_known_encoding(std::uint8_t raw) noexcept { return raw == 1 || raw == 2; }

/// Wire id of the layout of an item's values in the value buffer.
enum class value_filter : std::uint8_t {
  none = 0,        ///< little-endian words in index order
  byte_planes = 1, ///< most significant byte of every word, then the next, ..., least significant
};

constexpr std::string_view to_string(value_filter f) noexcept {
  switch (f) {
  case value_filter::none:
    return "none";
  case value_filter::byte_planes:
    return "byte_planes";
  }
  return "unknown";
}

/// True when `raw` is a value filter id this build knows.
constexpr bool is_known_filter(std::uint8_t raw) noexcept { return raw <= 1; }

/// Write `words` (n little-endian words of `width` bytes) filtered into `out`
/// (same size). Precondition: sizes agree, `width` in {1, 2, 4, 8}.
inline void apply_filter(value_filter f, std::span<const std::byte> words, std::size_t width,
                         std::span<std::byte> out) noexcept {
  const std::size_t n = width ? words.size() / width : 0;
  if (f == value_filter::none || width == 1) {
    if (!words.empty()) std::memcpy(out.data(), words.data(), words.size());
    return;
  }
  const std::byte* DCR_RESTRICT in = words.data();
  std::byte* DCR_RESTRICT o = out.data();
  if (width == 2) {
    for (std::size_t i = 0; i < n; ++i) {
      o[i] = in[2 * i + 1];
      o[n + i] = in[2 * i];
    }
    return;
  }
  for (std::size_t p = 0; p < width; ++p) {
    const std::size_t byte = width - 1 - p;
    for (std::size_t i = 0; i < n; ++i) o[p * n + i] = in[i * width + byte];
  }
}

/// Inverse of `apply_filter`: restore little-endian words from filtered bytes.
inline void remove_filter(value_filter f, std::span<const std::byte> filtered, std::size_t width,
                          std::span<std::byte> out) noexcept {
  const std::size_t n = width ? filtered.size() / width : 0;
  if (f == value_filter::none || width == 1) {
    if (!filtered.empty()) std::memcpy(out.data(), filtered.data(), filtered.size());
    return;
  }
  const std::byte* DCR_RESTRICT in = filtered.data();
  std::byte* DCR_RESTRICT o = out.data();
  if (width == 2) {
    for (std::size_t i = 0; i < n; ++i) {
      o[2 * i + 1] = in[i];
      o[2 * i] = in[n + i];
    }
    return;
  }
  for (std::size_t p = 0; p < width; ++p) {
    const std::size_t byte = width - 1 - p;
    for (std::size_t i = 0; i < n; ++i) o[i * width + byte] = in[p * n + i];
  }
}

} // namespace dcr::codec
