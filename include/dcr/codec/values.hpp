#pragma once
/// \file
/// Value coding: what an item's words mean (XOR mask, zigzag integer
/// difference or overwrite value) and
/// how they are laid out before compression (optionally byte planes).
///
/// XOR masks of small updates have an almost-always-zero high byte (sign and
/// upper exponent bits rarely change), so splitting words into byte planes
/// lets zstd see one long near-constant stream and one noisy stream instead
/// of interleaved bytes. This header avoids Boost (host twins include it).

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

#include "dcr/codec/item.hpp"
#include "dcr/core/config.hpp"
#include "dcr/core/error.hpp"
#include "dcr/core/word_delta.hpp"

namespace dcr::codec {

/// A delta encoding policy: how a value is made from (old, new) words and
/// applied to resident words. Law: `apply(old, make(old, new)) == new`.
/// `relative` is true when `apply` reads the resident word (the value is
/// exact only where the resident word is `old`: version-aligned storage,
/// representation-preserving copies, no duplicate application).
template <class E>
concept delta_encoding = requires(std::uint16_t w) {
  { E::id } -> std::convertible_to<value_encoding>;
  { E::relative } -> std::convertible_to<bool>;
  { E::make(w, w) } -> std::same_as<std::uint16_t>;
  { E::apply(w, w) } -> std::same_as<std::uint16_t>;
};

/// value = old ^ new; applying XORs it in (needs the resident word to be `old`).
struct xor_mask {
  static constexpr value_encoding id = value_encoding::xor_mask;
  static constexpr bool relative = true;
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
  static constexpr bool relative = false;
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

/// value = zigzag(new - old mod 2^w) (`dcr::zigzag_delta`); applying adds the
/// difference back modulo 2^w (needs the resident word to be `old`, like XOR).
/// Integer arithmetic on stored words, not on the floats they encode, so it
/// is exact for every pair of words, NaN and infinity included. For a value
/// that moved a few units in the last place the word is small and centred on
/// zero, where the XOR mask carries the old bits' carry chain (0x0001,
/// 0x0003, 0x0007, ...).
struct add {
  static constexpr value_encoding id = value_encoding::add;
  static constexpr bool relative = true;
  template <class W>
  static constexpr DCR_HOST_DEVICE W make(W old_w, W new_w) noexcept {
    return zigzag_delta(old_w, new_w);
  }
  template <class W>
  static constexpr DCR_HOST_DEVICE W apply(W resident, W v) noexcept {
    return apply_zigzag_delta(resident, v);
  }
};
static_assert(delta_encoding<add>);

/// Deprecated: the former name of `add`, kept while callers move to `add`.
using add_delta = add;

/// The encoding type of a wire id: `f(E{})` for `xor_mask`, `overwrite` or
/// `add`; returns what `f` returns. Precondition: `is_known_encoding(e)`
/// (anything else is treated as `xor_mask`). For the few places that turn a
/// runtime id into the type once, at an entry point (the receiver picks its
/// pipeline from a compile-time table instead).
template <class F>
constexpr decltype(auto) visit_encoding(value_encoding e, F&& f) {
  switch (e) {
  case value_encoding::overwrite:
    return f(overwrite{});
  case value_encoding::add:
    return f(add{});
  default:
    return f(xor_mask{});
  }
}

/// True when `raw` is a value encoding id this build knows (any format version).
constexpr bool is_known_encoding(std::uint8_t raw) noexcept { return raw >= 1 && raw <= 3; }

/// True when value encoding `raw` may appear in a payload of format `version`:
/// `add` (3) is new in v2.
constexpr bool is_encoding_of_version(std::uint8_t raw, std::uint16_t version) noexcept {
  return raw == 1 || raw == 2 || (raw == 3 && version >= 2);
}

/// True when applying encoding `e` reads the resident word (XOR, add).
constexpr bool is_relative(value_encoding e) noexcept { return e != value_encoding::overwrite; }

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

/// Estimated compressed size in bytes of `words` (little-endian words of
/// `width` bytes) under filter `f`: the zeroth-order entropy of each byte
/// plane (`byte_planes`, width > 1) or of the whole byte stream (`none`),
/// summed. What zstd's literal coder approaches on these streams; used to
/// pick between two exact encodings of an item without compressing both.
/// With `stride` > 1 only every `stride`-th word is counted and the result
/// scaled to all words (a sample, so that the estimate of a large item costs
/// a bounded number of histogram updates).
///
/// The counts go to four interleaved histograms per plane, summed before the
/// entropy: one histogram serialises on its own counters when a byte repeats
/// (store-to-load forwarding of one counter, the common case in an exponent
/// plane); four let consecutive samples' increments overlap. The counts, and
/// so the result, are those of one histogram.
inline double estimate_value_bytes(std::span<const std::byte> words, std::size_t width,
                                   value_filter f, std::size_t stride = 1) {
  if (words.empty() || width == 0) return 0.0;
  if (stride == 0) stride = 1;
  const std::size_t planes = (f == value_filter::byte_planes && width > 1) ? width : 1;
  const std::size_t n_words = words.size() / width;
  constexpr std::size_t lanes = 4;
  std::array<std::array<std::array<std::uint64_t, 256>, lanes>, 8> part; // planes in use zeroed:
  std::memset(part.data(), 0, planes * sizeof(part[0]));                 // 8 KiB per plane
  const auto* p = reinterpret_cast<const std::uint8_t*>(words.data());
  const std::size_t counted = n_words == 0 ? 0 : (n_words - 1) / stride + 1;
  auto count = [&](std::size_t lane, std::size_t i) {
    const std::uint8_t* w = p + i * stride * width;
    for (std::size_t b = 0; b < width; ++b) ++part[planes == 1 ? 0 : b][lane][w[b]];
  };
  std::size_t i = 0;
  if (width == 2 && planes == 2) {
    // The BF16 / F16 case, the constants folded.
    const std::size_t step = 2 * stride;
    for (; i + lanes <= counted; i += lanes) {
      const std::uint8_t* w = p + i * step;
      ++part[0][0][w[0]];
      ++part[1][0][w[1]];
      ++part[0][1][w[step]];
      ++part[1][1][w[step + 1]];
      ++part[0][2][w[2 * step]];
      ++part[1][2][w[2 * step + 1]];
      ++part[0][3][w[3 * step]];
      ++part[1][3][w[3 * step + 1]];
    }
  } else {
    for (; i + lanes <= counted; i += lanes)
      for (std::size_t l = 0; l < lanes; ++l) count(l, i + l);
  }
  for (; i < counted; ++i) count(0, i);
  const double symbols = static_cast<double>(counted * (planes == 1 ? width : 1));
  double bits = 0.0;
  for (std::size_t b = 0; b < planes; ++b)
    for (std::size_t v = 0; v < 256; ++v) {
      const std::uint64_t c = part[b][0][v] + part[b][1][v] + part[b][2][v] + part[b][3][v];
      if (c) bits += static_cast<double>(c) * std::log2(symbols / static_cast<double>(c));
    }
  return bits / 8.0 * static_cast<double>(n_words) / static_cast<double>(counted);
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
