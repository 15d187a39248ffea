#pragma once
/// \file
/// Bitwise change detection between two word spans (old and new stored bits
/// of the same elements). Words are compared as integers, never as floats:
/// +0 vs -0 is a change, and two NaNs are equal only when their bits are.
///
/// Layering: `change_mask` turns up to 64 words into a 64-bit mask (bit i set
/// when word i differs; SSE2 on x86-64, a plain loop elsewhere);
/// `for_each_change_mask` walks a span block by block; `detect_changes` and
/// `detect_runs` extract indices or runs from the masks. All of them work on
/// any sub-span, so a caller streams over a large tensor chunk by chunk by
/// passing consecutive sub-spans with the matching `base`.

#include <algorithm>
#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <ranges>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "dcr/core/config.hpp"
#include "dcr/core/error.hpp"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace dcr {

/// A stored-word type change detection compares: u8, u16, u32 or u64.
template <class W>
concept detect_word = std::same_as<W, std::uint8_t> || std::same_as<W, std::uint16_t> ||
                      std::same_as<W, std::uint32_t> || std::same_as<W, std::uint64_t>;

/// A maximal run of changed indices: `start`, `start + 1`, ..., `start + count - 1`.
struct index_run {
  std::uint64_t start = 0;
  std::uint64_t count = 0;
  friend bool operator==(const index_run&, const index_run&) = default;
};

/// Words per mask: one bit per word of a 64-bit mask.
inline constexpr std::size_t change_block_words = 64;

namespace detail {

template <class W> inline std::uint64_t change_mask_scalar(const W* a, const W* b, std::size_t n) noexcept {
  std::uint64_t m = 0;
  for (std::size_t i = 0; i < n; ++i) m |= static_cast<std::uint64_t>(a[i] != b[i]) << i;
  return m;
}

#if defined(__SSE2__)
inline __m128i load16(const void* p) noexcept { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }

/// 16-bit mask of equal lanes for 16 bytes of W-words, widened to one bit per word.
template <class W> inline std::uint64_t equal_mask_64(const W* a, const W* b) noexcept {
  std::uint64_t eq = 0;
  if constexpr (sizeof(W) == 1) {
    for (int g = 0; g < 4; ++g) {
      const __m128i e = _mm_cmpeq_epi8(load16(a + 16 * g), load16(b + 16 * g));
      eq |= static_cast<std::uint64_t>(static_cast<std::uint32_t>(_mm_movemask_epi8(e))) << (16 * g);
    }
  } else if constexpr (sizeof(W) == 2) {
    for (int g = 0; g < 4; ++g) {
      const __m128i e0 = _mm_cmpeq_epi16(load16(a + 16 * g), load16(b + 16 * g));
      const __m128i e1 = _mm_cmpeq_epi16(load16(a + 16 * g + 8), load16(b + 16 * g + 8));
      eq |= static_cast<std::uint64_t>(static_cast<std::uint32_t>(_mm_movemask_epi8(_mm_packs_epi16(e0, e1))))
            << (16 * g);
    }
  } else if constexpr (sizeof(W) == 4) {
    for (int g = 0; g < 4; ++g) {
      const W* pa = a + 16 * g;
      const W* pb = b + 16 * g;
      const __m128i e0 = _mm_cmpeq_epi32(load16(pa), load16(pb));
      const __m128i e1 = _mm_cmpeq_epi32(load16(pa + 4), load16(pb + 4));
      const __m128i e2 = _mm_cmpeq_epi32(load16(pa + 8), load16(pb + 8));
      const __m128i e3 = _mm_cmpeq_epi32(load16(pa + 12), load16(pb + 12));
      const __m128i p = _mm_packs_epi16(_mm_packs_epi32(e0, e1), _mm_packs_epi32(e2, e3));
      eq |= static_cast<std::uint64_t>(static_cast<std::uint32_t>(_mm_movemask_epi8(p))) << (16 * g);
    }
  } else {
    // No 64-bit compare in SSE2: a word is equal when both 32-bit halves are.
    for (int g = 0; g < 32; ++g) {
      const __m128i e = _mm_cmpeq_epi32(load16(a + 2 * g), load16(b + 2 * g));
      const __m128i both = _mm_and_si128(e, _mm_shuffle_epi32(e, 0xB1));
      eq |= static_cast<std::uint64_t>(_mm_movemask_pd(_mm_castsi128_pd(both))) << (2 * g);
    }
  }
  return eq;
}
#endif

} // namespace detail

/// Bit i set when `old_words[i] != new_words[i]` bitwise, for i < n ≤ 64.
template <detect_word W>
inline std::uint64_t change_mask(const W* old_words, const W* new_words, std::size_t n) noexcept {
#if defined(__SSE2__)
  if (n == change_block_words) return ~detail::equal_mask_64(old_words, new_words);
#endif
  return detail::change_mask_scalar(old_words, new_words, n);
}

namespace detail {
inline void check_same_size(std::size_t a, std::size_t b, const char* what) {
  if (a != b)
    throw error(errc::invalid_argument, std::string(what) + ": old span has " + std::to_string(a) +
                                            " words, new span has " + std::to_string(b));
}
} // namespace detail

/// Calls `f(first, mask)` for every 64-word block of the spans, in order,
/// including clean blocks (mask 0): `first` is `base` plus the block's offset
/// and bit i of `mask` says whether word `first - base + i` changed. The last
/// block may be shorter (its high bits are 0). Throws `errc::invalid_argument`
/// when the spans differ in length.
template <detect_word W, class F>
void for_each_change_mask(std::span<const W> old_words, std::span<const W> new_words,
                          std::uint64_t base, F&& f) {
  detail::check_same_size(old_words.size(), new_words.size(), "for_each_change_mask");
  const std::size_t n = old_words.size();
  const W* a = old_words.data();
  const W* b = new_words.data();
  std::size_t i = 0;
  for (; i + change_block_words <= n; i += change_block_words)
    f(base + i, change_mask(a + i, b + i, change_block_words));
  if (i < n) f(base + i, change_mask(a + i, b + i, n - i));
}

/// Appends `base + i` to `out` for every i where the words' bits differ, in
/// increasing order. Throws `errc::invalid_argument` when the spans differ in
/// length. Streaming: call it on consecutive sub-spans with `base` advanced by
/// the words already seen; the result is the same as one call.
template <detect_word W>
void detect_changes(std::span<const W> old_words, std::span<const W> new_words, std::uint64_t base,
                    std::vector<std::uint64_t>& out) {
  detail::check_same_size(old_words.size(), new_words.size(), "detect_changes");
  // Indices go to a small buffer that stays in L1 and is appended in bulk:
  // growing `out` per element would test capacity per element, and resizing
  // ahead would zero-fill memory that mostly goes unused.
  constexpr std::size_t chunk_blocks = 16;
  constexpr std::size_t slack = 8; // unconditional writes past the last index
  std::uint64_t buf[chunk_blocks * change_block_words + slack];
  const std::size_t n = old_words.size();
  const W* a = old_words.data();
  const W* b = new_words.data();
  std::size_t i = 0;
  while (i < n) {
    std::size_t k = 0;
    for (std::size_t blk = 0; blk < chunk_blocks && i < n; ++blk, i += change_block_words) {
      const std::size_t len = std::min(change_block_words, n - i);
      std::uint64_t m = change_mask(a + i, b + i, len);
      const std::uint64_t first = base + i;
      const auto cnt = static_cast<std::size_t>(std::popcount(m));
      // Write eight candidates whatever the count: at sparse densities this
      // keeps the loop free of data-dependent branches; countr_zero(0) is 64,
      // and entries past `cnt` are overwritten or never appended.
      std::uint64_t* p = buf + k;
      for (std::size_t j = 0; j < slack; ++j) {
        p[j] = first + static_cast<std::uint64_t>(std::countr_zero(m));
        m &= m - 1;
      }
      for (std::size_t j = slack; j < cnt; ++j) {
        p[j] = first + static_cast<std::uint64_t>(std::countr_zero(m));
        m &= m - 1;
      }
      k += cnt;
    }
    out.insert(out.end(), buf, buf + k);
  }
}

/// Appends the maximal runs of changed words (bitwise) to `out`, as
/// (base + start, count), in increasing order. A run that starts where
/// `out.back()` ends is merged into it, so consecutive sub-spans (with `base`
/// advanced) give the same runs as one call over the whole span. Throws
/// `errc::invalid_argument` when the spans differ in length.
template <detect_word W>
void detect_runs(std::span<const W> old_words, std::span<const W> new_words, std::uint64_t base,
                 std::vector<index_run>& out) {
  detail::check_same_size(old_words.size(), new_words.size(), "detect_runs");
  index_run cur{};
  if (!out.empty()) {
    cur = out.back();
    out.pop_back();
  }
  for_each_change_mask(old_words, new_words, base, [&](std::uint64_t first, std::uint64_t m) {
    std::uint64_t shift = 0; // bits of m below `shift` are consumed
    while (m != 0) {
      const auto s = static_cast<std::uint64_t>(std::countr_zero(m));
      const auto len = static_cast<std::uint64_t>(std::countr_one(m >> s));
      const std::uint64_t start = first + shift + s;
      if (cur.count != 0 && cur.start + cur.count == start) {
        cur.count += len;
      } else {
        if (cur.count != 0) out.push_back(cur);
        cur = {start, len};
      }
      const std::uint64_t used = s + len; // ≤ 64
      m = used == 64 ? 0 : m >> used;
      shift += used;
    }
  });
  if (cur.count != 0) out.push_back(cur);
}

/// Convenience overloads for contiguous ranges (vectors, arrays, mutable spans).
template <std::ranges::contiguous_range R>
  requires detect_word<std::remove_cv_t<std::ranges::range_value_t<R>>>
void detect_changes(const R& old_words, const R& new_words, std::uint64_t base,
                    std::vector<std::uint64_t>& out) {
  using W = std::remove_cv_t<std::ranges::range_value_t<R>>;
  detect_changes<W>(std::span<const W>(std::ranges::data(old_words), std::ranges::size(old_words)),
                    std::span<const W>(std::ranges::data(new_words), std::ranges::size(new_words)), base,
                    out);
}

/// \copydoc detect_runs
template <std::ranges::contiguous_range R>
  requires detect_word<std::remove_cv_t<std::ranges::range_value_t<R>>>
void detect_runs(const R& old_words, const R& new_words, std::uint64_t base, std::vector<index_run>& out) {
  using W = std::remove_cv_t<std::ranges::range_value_t<R>>;
  detect_runs<W>(std::span<const W>(std::ranges::data(old_words), std::ranges::size(old_words)),
                 std::span<const W>(std::ranges::data(new_words), std::ranges::size(new_words)), base, out);
}

} // namespace dcr
