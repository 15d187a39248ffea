#pragma once
/// \file
/// Bitwise change detection between two word spans (old and new stored bits
/// of the same elements). Words are compared as integers, never as floats:
/// +0 vs -0 is a change, and two NaNs are equal only when their bits are.
///
/// Layering: `change_mask` turns up to 64 words into a 64-bit mask (bit i set
/// when word i differs; SSE2 on x86-64, a plain loop elsewhere). The scan
/// behind `change_masks`, `for_each_change_mask`, `detect_changes` and
/// `detect_runs` walks a span in 64-word blocks with L2 prefetching, on
/// AVX-512BW or AVX2 when the CPU has them (chosen once at run time), and
/// hands each mask to an inlined visitor that extracts indices or runs with
/// bit tricks; on AVX-512 VBMI2, `detect_changes` can extract indices with
/// `vpcompressb` instead, branch-free up to 16 changes per block (opt-in:
/// see `default_detect_extract`). All of them work on any sub-span, so a caller streams over a
/// large tensor chunk by chunk by passing consecutive sub-spans with the
/// matching `base`.

#include <algorithm>
#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <ranges>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "dcr/core/config.hpp"
#include "dcr/core/error.hpp"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
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

template <class W>
inline std::uint64_t change_mask_scalar(const W* a, const W* b, std::size_t n) noexcept {
  std::uint64_t m = 0;
  for (std::size_t i = 0; i < n; ++i) m |= static_cast<std::uint64_t>(a[i] != b[i]) << i;
  return m;
}

#if defined(__SSE2__)
inline __m128i load16(const void* p) noexcept {
  return _mm_loadu_si128(static_cast<const __m128i*>(p));
}

/// 16-bit mask of equal lanes for 16 bytes of W-words, widened to one bit per word.
template <class W>
inline std::uint64_t equal_mask_64(const W* a, const W* b) noexcept {
  std::uint64_t eq = 0;
  if constexpr (sizeof(W) == 1) {
    for (int g = 0; g < 4; ++g) {
      const __m128i e = _mm_cmpeq_epi8(load16(a + 16 * g), load16(b + 16 * g));
      eq |= static_cast<std::uint64_t>(static_cast<std::uint32_t>(_mm_movemask_epi8(e)))
            << (16 * g);
    }
  } else if constexpr (sizeof(W) == 2) {
    for (int g = 0; g < 4; ++g) {
      const __m128i e0 = _mm_cmpeq_epi16(load16(a + 16 * g), load16(b + 16 * g));
      const __m128i e1 = _mm_cmpeq_epi16(load16(a + 16 * g + 8), load16(b + 16 * g + 8));
      eq |= static_cast<std::uint64_t>(
                static_cast<std::uint32_t>(_mm_movemask_epi8(_mm_packs_epi16(e0, e1))))
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
      eq |= static_cast<std::uint64_t>(static_cast<std::uint32_t>(_mm_movemask_epi8(p)))
            << (16 * g);
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

/// Bytes ahead of the compare position that the scan prefetches (into L2):
/// far enough to cover DRAM latency at streaming rate, small enough to stay
/// within the L2 miss queue.
inline constexpr std::size_t detect_prefetch_bytes = 8192;

/// Instruction sets the scans can use.
enum class detect_isa : std::uint8_t {
  portable = 0, ///< SSE2 on x86-64, a plain loop elsewhere
  avx512 = 1,   ///< AVX-512BW compare-to-mask, chosen at run time when the CPU has it
  avx2 = 2,     ///< AVX2 compares + movemask, for x86-64 CPUs without AVX-512BW
};

/// Short name of an instruction set ("portable", "avx2", "avx512").
constexpr std::string_view to_string(detect_isa isa) noexcept {
  switch (isa) {
  case detect_isa::portable:
    return "portable";
  case detect_isa::avx512:
    return "avx512";
  case detect_isa::avx2:
    return "avx2";
  }
  return "unknown";
}

namespace detail {

inline void prefetch_block(const void* p, std::size_t bytes) noexcept {
#if defined(__GNUC__) || defined(__clang__)
  // Integer arithmetic: the address may lie past the end of the span, which
  // prefetch tolerates but pointer arithmetic would not.
  const auto at = reinterpret_cast<std::uintptr_t>(p) + detect_prefetch_bytes;
  for (std::size_t off = 0; off < bytes; off += 64)
    __builtin_prefetch(reinterpret_cast<const void*>(at + off), 0, 2);
#else
  (void)p;
  (void)bytes;
#endif
}

/// The block scan: `f(first, mask)` for `blocks` whole 64-word blocks. The
/// visitor is inlined into each instruction-set variant, so the extraction
/// code it carries is compiled for that instruction set too.
template <class W, class F>
void scan_blocks_portable(const W* a, const W* b, std::size_t blocks, std::uint64_t first, F& f) {
  for (std::size_t k = 0; k < blocks; ++k, a += change_block_words, b += change_block_words) {
    prefetch_block(a, sizeof(W) * change_block_words);
    prefetch_block(b, sizeof(W) * change_block_words);
    f(first + k * change_block_words, change_mask(a, b, change_block_words));
  }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDA_ARCH__)
#define DCR_DETECT_HAVE_X86_DISPATCH 1
/// Change mask of one 64-word block with AVX-512BW compare-to-mask.
template <class W>
__attribute__((target("avx512f,avx512bw"))) inline std::uint64_t
change_mask_avx512(const W* a, const W* b) noexcept {
  constexpr int per_vec = 64 / static_cast<int>(sizeof(W)); // words per 512-bit vector
  std::uint64_t m = 0;
  for (int v = 0; v < static_cast<int>(change_block_words) / per_vec; ++v) {
    const __m512i x = _mm512_loadu_si512(a + v * per_vec);
    const __m512i y = _mm512_loadu_si512(b + v * per_vec);
    std::uint64_t part;
    if constexpr (sizeof(W) == 1)
      part = _mm512_cmpneq_epi8_mask(x, y);
    else if constexpr (sizeof(W) == 2)
      part = _mm512_cmpneq_epi16_mask(x, y);
    else if constexpr (sizeof(W) == 4)
      part = _mm512_cmpneq_epi32_mask(x, y);
    else
      part = _mm512_cmpneq_epi64_mask(x, y);
    m |= part << (v * per_vec);
  }
  return m;
}

/// AVX-512BW variant; popcnt/bmi for the visitor's bit extraction (every
/// AVX-512 CPU has them).
template <class W, class F>
__attribute__((target("avx512f,avx512bw,popcnt,bmi,bmi2,lzcnt"))) void
scan_blocks_avx512(const W* a, const W* b, std::size_t blocks, std::uint64_t first, F& f) {
  for (std::size_t k = 0; k < blocks; ++k, a += change_block_words, b += change_block_words) {
    prefetch_block(a, sizeof(W) * change_block_words);
    prefetch_block(b, sizeof(W) * change_block_words);
    f(first + k * change_block_words, change_mask_avx512(a, b));
  }
}

/// AVX2 variant; movemask gives one bit per byte (u8), per word after a
/// saturating pack (u16), per float/double lane (u32/u64).
template <class W, class F>
__attribute__((target("avx2,popcnt,bmi,bmi2,lzcnt"))) void
scan_blocks_avx2(const W* a, const W* b, std::size_t blocks, std::uint64_t first, F& f) {
  for (std::size_t k = 0; k < blocks; ++k, a += change_block_words, b += change_block_words) {
    prefetch_block(a, sizeof(W) * change_block_words);
    prefetch_block(b, sizeof(W) * change_block_words);
    const auto* va = reinterpret_cast<const __m256i*>(a); // 2, 4, 8 or 16 vectors per block
    const auto* vb = reinterpret_cast<const __m256i*>(b);
    std::uint64_t eq = 0;
    if constexpr (sizeof(W) == 1) {
      for (int v = 0; v < 2; ++v) {
        const __m256i e = _mm256_cmpeq_epi8(_mm256_loadu_si256(va + v), _mm256_loadu_si256(vb + v));
        eq |= std::uint64_t{static_cast<std::uint32_t>(_mm256_movemask_epi8(e))} << (32 * v);
      }
    } else if constexpr (sizeof(W) == 2) {
      for (int v = 0; v < 2; ++v) {
        const __m256i e0 =
            _mm256_cmpeq_epi16(_mm256_loadu_si256(va + 2 * v), _mm256_loadu_si256(vb + 2 * v));
        const __m256i e1 = _mm256_cmpeq_epi16(_mm256_loadu_si256(va + 2 * v + 1),
                                              _mm256_loadu_si256(vb + 2 * v + 1));
        // packs works per 128-bit lane; the permute restores word order.
        const __m256i p = _mm256_permute4x64_epi64(_mm256_packs_epi16(e0, e1), 0xD8);
        eq |= std::uint64_t{static_cast<std::uint32_t>(_mm256_movemask_epi8(p))} << (32 * v);
      }
    } else if constexpr (sizeof(W) == 4) {
      for (int v = 0; v < 8; ++v) {
        const __m256i e =
            _mm256_cmpeq_epi32(_mm256_loadu_si256(va + v), _mm256_loadu_si256(vb + v));
        eq |= std::uint64_t{static_cast<std::uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(e)))}
              << (8 * v);
      }
    } else {
      for (int v = 0; v < 16; ++v) {
        const __m256i e =
            _mm256_cmpeq_epi64(_mm256_loadu_si256(va + v), _mm256_loadu_si256(vb + v));
        eq |= std::uint64_t{static_cast<std::uint32_t>(_mm256_movemask_pd(_mm256_castsi256_pd(e)))}
              << (4 * v);
      }
    }
    f(first + k * change_block_words, ~eq);
  }
}

inline bool cpu_has_bit_ops() noexcept {
  return __builtin_cpu_supports("popcnt") && __builtin_cpu_supports("bmi") &&
         __builtin_cpu_supports("bmi2");
}
inline bool cpu_has_avx512bw() noexcept {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         cpu_has_bit_ops();
}
inline bool cpu_has_avx512vbmi2() noexcept {
  __builtin_cpu_init();
  return cpu_has_avx512bw() && __builtin_cpu_supports("avx512vbmi2");
}
inline bool cpu_has_avx2() noexcept {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && cpu_has_bit_ops();
}
#endif

} // namespace detail

/// True when `isa` can run on this CPU.
inline bool detect_isa_available(detect_isa isa) noexcept {
#if defined(DCR_DETECT_HAVE_X86_DISPATCH)
  static const bool avx512 = detail::cpu_has_avx512bw();
  static const bool avx2 = detail::cpu_has_avx2();
  return isa == detect_isa::portable || (isa == detect_isa::avx512 && avx512) ||
         (isa == detect_isa::avx2 && avx2);
#else
  return isa == detect_isa::portable;
#endif
}

/// The instruction set the scans use, decided once: the best one this CPU
/// has (AVX-512BW, then AVX2, then portable), unless the environment variable
/// `DCR_DETECT_ISA` names another available one ("portable", "avx2",
/// "avx512") to test or measure it.
inline detect_isa active_detect_isa() noexcept {
  static const detect_isa isa = [] {
    if (const char* env = std::getenv("DCR_DETECT_ISA"))
      for (detect_isa i : {detect_isa::portable, detect_isa::avx2, detect_isa::avx512})
        if (std::string_view(env) == to_string(i) && detect_isa_available(i)) return i;
    for (detect_isa i : {detect_isa::avx512, detect_isa::avx2})
      if (detect_isa_available(i)) return i;
    return detect_isa::portable;
  }();
  return isa;
}

/// How `detect_changes` turns a block's mask into indices.
enum class detect_extract : std::uint8_t {
  scalar = 0,   ///< count-trailing-zeros per set bit, the first four unconditionally (any CPU)
  compress = 1, ///< AVX-512 VBMI2 `vpcompressb` of the 64 lane numbers, widened and stored
                ///< without a data-dependent branch up to 16 indices per block
};

/// Short name of an extraction ("scalar", "compress").
constexpr std::string_view to_string(detect_extract e) noexcept {
  return e == detect_extract::compress ? "compress" : "scalar";
}

/// True when extraction `e` can run with scan `isa` on this CPU: `compress`
/// needs the AVX-512 scan and VBMI2.
inline bool detect_extract_available(detect_extract e, detect_isa isa) noexcept {
  if (e == detect_extract::scalar) return detect_isa_available(isa);
#if defined(DCR_DETECT_HAVE_X86_DISPATCH)
  static const bool vbmi2 = detail::cpu_has_avx512vbmi2();
  return isa == detect_isa::avx512 && vbmi2;
#else
  return false;
#endif
}

/// The extraction used with scan `isa`: `scalar`, unless the environment
/// variable `DCR_DETECT_EXTRACT` is "compress" and that is available. Scalar
/// is the default because, measured on an AMD EPYC with AVX-512 VBMI2
/// (256 MiB BF16 buffers, 0.1-5% changes, interleaved runs in one process),
/// `compress` was 0-6% slower: at these densities the scalar path's few
/// mispredictions cost less than the compress path's two full-width stores
/// per block. Both stay, tested against each other, for CPUs where this
/// differs.
inline detect_extract default_detect_extract(detect_isa isa) noexcept {
  static const bool want_compress = [] {
    const char* env = std::getenv("DCR_DETECT_EXTRACT");
    return env != nullptr && std::string_view(env) == "compress";
  }();
  return want_compress && detect_extract_available(detect_extract::compress, isa)
             ? detect_extract::compress
             : detect_extract::scalar;
}

namespace detail {
inline void check_same_size(std::size_t a, std::size_t b, const char* what) {
  if (a != b)
    throw error(errc::invalid_argument, std::string(what) + ": old span has " + std::to_string(a) +
                                            " words, new span has " + std::to_string(b));
}

/// Whole blocks with the chosen instruction set, then the short tail.
template <class W, class F>
void scan(const W* a, const W* b, std::size_t n, std::uint64_t base, F& f, detect_isa isa) {
  const std::size_t blocks = n / change_block_words;
#if defined(DCR_DETECT_HAVE_X86_DISPATCH)
  if (isa == detect_isa::avx512)
    scan_blocks_avx512(a, b, blocks, base, f);
  else if (isa == detect_isa::avx2)
    scan_blocks_avx2(a, b, blocks, base, f);
  else
    scan_blocks_portable(a, b, blocks, base, f);
#else
  (void)isa;
  scan_blocks_portable(a, b, blocks, base, f);
#endif
  const std::size_t i = blocks * change_block_words;
  if (i < n) f(base + i, change_mask(a + i, b + i, n - i));
}
} // namespace detail

/// Masks of `blocks` consecutive 64-word blocks: `masks[k]` is
/// `change_mask(old_words + 64k, new_words + 64k, 64)`, computed with `isa`,
/// which must be available (`detect_isa_available`).
template <detect_word W>
void change_masks(const W* old_words, const W* new_words, std::size_t blocks, std::uint64_t* masks,
                  detect_isa isa = active_detect_isa()) {
  auto store = [masks](std::uint64_t first, std::uint64_t m) {
    masks[first / change_block_words] = m;
  };
  detail::scan(old_words, new_words, blocks * change_block_words, 0, store, isa);
}

/// Calls `f(first, mask)` for every 64-word block of the spans, in order,
/// including clean blocks (mask 0): `first` is `base` plus the block's offset
/// and bit i of `mask` says whether word `first - base + i` changed. The last
/// block may be shorter (its high bits are 0). Throws `errc::invalid_argument`
/// when the spans differ in length.
template <detect_word W, class F>
void for_each_change_mask(std::span<const W> old_words, std::span<const W> new_words,
                          std::uint64_t base, F&& f) {
  detail::check_same_size(old_words.size(), new_words.size(), "for_each_change_mask");
  detail::scan(old_words.data(), new_words.data(), old_words.size(), base, f, active_detect_isa());
}

namespace detail {
/// Indices collect in a small buffer that stays in L1 and is appended to
/// `out` in bulk: growing `out` per element would test capacity per element,
/// and resizing ahead would zero-fill memory that mostly goes unused. Every
/// extraction may write up to 64 entries past `k` before counting them.
struct index_buffer {
  static constexpr std::size_t cap = 1024;
  std::vector<std::uint64_t>& out;
  std::size_t k = 0;
  alignas(64) std::uint64_t buf[cap];

  explicit index_buffer(std::vector<std::uint64_t>& o) : out(o) {}
  /// Room for one more block's indices.
  void reserve_block() {
    if (k > cap - change_block_words) flush();
  }
  void flush() {
    out.insert(out.end(), buf, buf + k);
    k = 0;
  }
};

/// Scalar extraction of one block's indices.
inline void extract_scalar(index_buffer& ib, std::uint64_t first, std::uint64_t m) noexcept {
  // No early exit for m == 0: at 1% density half the blocks are clean, in no
  // predictable pattern, and a mispredicted branch costs more than the four
  // stores below. Four candidates are written whatever the count
  // (countr_zero(0) is 64; entries past `cnt` are overwritten or never
  // appended), so blocks with up to four changes take no data-dependent branch.
  const auto cnt = static_cast<std::size_t>(std::popcount(m));
  std::uint64_t* p = ib.buf + ib.k;
  for (std::size_t j = 0; j < 4; ++j) {
    p[j] = first + static_cast<std::uint64_t>(std::countr_zero(m));
    m &= m - 1;
  }
  for (std::size_t j = 4; j < cnt; ++j) {
    p[j] = first + static_cast<std::uint64_t>(std::countr_zero(m));
    m &= m - 1;
  }
  ib.k += cnt;
}

#if defined(DCR_DETECT_HAVE_X86_DISPATCH)
/// Lane numbers 0..63, the bytes `vpcompressb` selects from.
alignas(64) inline constexpr std::uint8_t lane_numbers[64] = {
    0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21,
    22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43,
    44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63};

/// Whole blocks with the AVX-512 compare and `vpcompressb` extraction: the
/// mask selects the numbers of the changed lanes into the low bytes of one
/// register, the first 16 are widened to u64, offset by `first` and stored
/// unconditionally (entries past the count are overwritten or never
/// appended); only blocks with more than 16 changes (none in practice below
/// 10% density) take a loop. The register form of the compress is used: the
/// form that stores to memory is microcoded and slow on some CPUs.
template <class W>
__attribute__((target("avx512f,avx512bw,avx512vbmi2,popcnt,bmi,bmi2,lzcnt"))) void
scan_extract_compress(const W* a, const W* b, std::size_t blocks, std::uint64_t first,
                      index_buffer& ib) {
  const __m512i lanes = _mm512_load_si512(lane_numbers);
  for (std::size_t blk = 0; blk < blocks;
       ++blk, a += change_block_words, b += change_block_words, first += change_block_words) {
    prefetch_block(a, sizeof(W) * change_block_words);
    prefetch_block(b, sizeof(W) * change_block_words);
    const std::uint64_t m = change_mask_avx512(a, b);
    ib.reserve_block();
    const __m512i pos = _mm512_maskz_compress_epi8(m, lanes);
    const __m512i at = _mm512_set1_epi64(static_cast<long long>(first));
    const __m128i lo = _mm512_maskz_extracti32x4_epi32(0xF, pos, 0); // (the cast warns in GCC 12)
    std::uint64_t* p = ib.buf + ib.k;
    _mm512_storeu_si512(p, _mm512_add_epi64(at, _mm512_maskz_cvtepu8_epi64(0xFF, lo)));
    _mm512_storeu_si512(
        p + 8, _mm512_add_epi64(at, _mm512_maskz_cvtepu8_epi64(0xFF, _mm_srli_si128(lo, 8))));
    const auto cnt = static_cast<std::size_t>(std::popcount(m));
    if (cnt > 16) {
      alignas(64) std::uint8_t sel[64];
      _mm512_store_si512(sel, pos);
      for (std::size_t j = 16; j < cnt; ++j) p[j] = first + sel[j];
    }
    ib.k += cnt;
  }
}
#endif
} // namespace detail

/// Appends `base + i` to `out` for every i where the words' bits differ, in
/// increasing order, with scan `isa` and extraction `extract`. Throws
/// `errc::invalid_argument` when the spans differ in length or the pair is
/// not available on this CPU (`detect_extract_available`). Streaming: call it on consecutive
/// sub-spans with `base` advanced by the words already seen; the result is
/// the same as one call.
template <detect_word W>
void detect_changes(std::span<const W> old_words, std::span<const W> new_words, std::uint64_t base,
                    std::vector<std::uint64_t>& out, detect_isa isa, detect_extract extract) {
  detail::check_same_size(old_words.size(), new_words.size(), "detect_changes");
  if (!detect_extract_available(extract, isa))
    throw error(errc::invalid_argument, "detect_changes: scan " + std::string(to_string(isa)) +
                                            " with " + std::string(to_string(extract)) +
                                            " extraction is not available on this CPU");
  detail::index_buffer ib(out);
  auto visit = [&ib](std::uint64_t first, std::uint64_t m) {
    ib.reserve_block();
    detail::extract_scalar(ib, first, m);
  };
#if defined(DCR_DETECT_HAVE_X86_DISPATCH)
  if (extract == detect_extract::compress) {
    const std::size_t n = old_words.size(), blocks = n / change_block_words,
                      i = blocks * change_block_words;
    detail::scan_extract_compress(old_words.data(), new_words.data(), blocks, base, ib);
    if (i < n) visit(base + i, change_mask(old_words.data() + i, new_words.data() + i, n - i));
    ib.flush();
    return;
  }
#else
  (void)extract;
#endif
  detail::scan(old_words.data(), new_words.data(), old_words.size(), base, visit, isa);
  ib.flush();
}

/// `detect_changes` with the active scan and its default extraction.
template <detect_word W>
void detect_changes(std::span<const W> old_words, std::span<const W> new_words, std::uint64_t base,
                    std::vector<std::uint64_t>& out) {
  const detect_isa isa = active_detect_isa();
  detect_changes(old_words, new_words, base, out, isa, default_detect_extract(isa));
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
  // Runs collect in an L1 buffer whose last entry is the run that may still
  // grow; it starts as out.back() so that a chunked caller's runs merge.
  constexpr std::size_t cap = 512;
  index_run buf[cap];
  std::size_t k = 0;
  if (!out.empty()) {
    buf[k++] = out.back();
    out.pop_back();
  }
  auto visit = [&](std::uint64_t first, std::uint64_t m) {
    if (k > cap - change_block_words / 2) { // a block holds at most 32 runs
      out.insert(out.end(), buf, buf + k - 1);
      buf[0] = buf[k - 1];
      k = 1;
    }
    // Bit i of `starts` (`ends`) is set when a run starts (ends) at word i of
    // the block; runs pair up in order.
    std::uint64_t starts = m & ~(m << 1);
    std::uint64_t ends = m & ~(m >> 1);
    if ((m & 1u) && k != 0 &&
        buf[k - 1].start + buf[k - 1].count == first) { // continues across blocks
      buf[k - 1].count += static_cast<std::uint64_t>(std::countr_zero(ends)) + 1;
      starts &= starts - 1;
      ends &= ends - 1;
    }
    const auto cnt = static_cast<std::size_t>(std::popcount(starts));
    index_run* p = buf + k;
    // As in detect_changes: four runs written unconditionally (garbage past
    // `cnt` is overwritten or never appended).
    for (std::size_t j = 0; j < 4; ++j) {
      const auto s = static_cast<std::uint64_t>(std::countr_zero(starts));
      const auto e = static_cast<std::uint64_t>(std::countr_zero(ends));
      p[j] = {first + s, e - s + 1};
      starts &= starts - 1;
      ends &= ends - 1;
    }
    for (std::size_t j = 4; j < cnt; ++j) {
      const auto s = static_cast<std::uint64_t>(std::countr_zero(starts));
      const auto e = static_cast<std::uint64_t>(std::countr_zero(ends));
      p[j] = {first + s, e - s + 1};
      starts &= starts - 1;
      ends &= ends - 1;
    }
    k += cnt;
  };
  detail::scan(old_words.data(), new_words.data(), old_words.size(), base, visit,
               active_detect_isa());
  out.insert(out.end(), buf, buf + k);
}

/// Convenience overloads for contiguous ranges (vectors, arrays, mutable spans).
template <std::ranges::contiguous_range R>
requires detect_word<std::remove_cv_t<std::ranges::range_value_t<R>>>
void detect_changes(const R& old_words, const R& new_words, std::uint64_t base,
                    std::vector<std::uint64_t>& out) {
  using W = std::remove_cv_t<std::ranges::range_value_t<R>>;
  detect_changes<W>(std::span<const W>(std::ranges::data(old_words), std::ranges::size(old_words)),
                    std::span<const W>(std::ranges::data(new_words), std::ranges::size(new_words)),
                    base, out);
}

/// \copydoc detect_runs
template <std::ranges::contiguous_range R>
requires detect_word<std::remove_cv_t<std::ranges::range_value_t<R>>>
void detect_runs(const R& old_words, const R& new_words, std::uint64_t base,
                 std::vector<index_run>& out) {
  using W = std::remove_cv_t<std::ranges::range_value_t<R>>;
  detect_runs<W>(std::span<const W>(std::ranges::data(old_words), std::ranges::size(old_words)),
                 std::span<const W>(std::ranges::data(new_words), std::ranges::size(new_words)),
                 base, out);
}

} // namespace dcr
