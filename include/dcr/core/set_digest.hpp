#pragma once
/// \file
/// Set digests of stored words: a set-homomorphic hash of the (region,
/// position, word) triples of a state whose word is not zero, so that a write
/// of one word updates the digest in O(1) from the word before and after it,
/// and a refit updates it in O(changes) instead of hashing the whole state.
///
/// Construction (an LtHash-style sum, Bellare–Micciancio's AdHash over
/// 64-bit lanes): every triple hashes to `set_digest_lanes` 64-bit words;
/// the digest state is their lane-wise sum modulo 2^64 over all triples.
/// Adding a triple adds its hash, removing one subtracts it, so the state
/// depends only on the set, not on the order of writes, and two partial
/// states combine by addition (owners, threads, tensors).
///
/// The element hash (digest version 2; `seal` names it): region key
/// s_0..s_3 (64 bits each, `region_key`), position p, word w zero-extended
/// to 64 bits; lane i is
///     u_i = G(p ^ s_i),   h_i = F(u_i ^ w),
/// G the splitmix64 finaliser and F MurmurHash3's fmix64: both are
/// xorshift-multiply bijections of 64-bit words with full avalanche (every
/// input bit flips every output bit with probability ~1/2). Why this choice:
///  - the fault model is accidental divergence (lost, repeated or misplaced
///    writes, another attempt's payload, a wrong restore), not an adversary.
///    Properties that hold exactly, not just with high probability: at a
///    fixed position, h_i is a bijection of the word (F is one), and for a
///    fixed word, h_i is a bijection of the position (G, ^ and F are), so a
///    triple replaced by one that differs in its word alone or in its
///    position alone (a wrong value, a misplaced write) changes every lane.
///    Position and word do not enter additively (no h = f(p) + g(w), under
///    which swapping two words between two positions cancels): they meet
///    under F, a nonlinear function, after G has spread the position over
///    all 64 bits. Lanes are independent in that each has its own key, so
///    G(p ^ s_i) are unrelated position hashes;
///  - collisions: modelling G(· ^ s_i) and F as random functions, lane i of
///    two different triples collides only if u_i(p) ^ w = u_i(p') ^ w'
///    (p ≠ p' and w ≠ w'), probability 2^-64, and the four lanes ask for
///    four unrelated equalities; the lanes of a fixed nonzero difference of
///    two sets are then uniform, so two different states collide with
///    probability about 2^-256 in the lanes (2^-252 when a bug counts one
///    triple twice, since 2·h is even), and 2^-128 after `seal` truncates to
///    128 bits. This is weaker evidence than version 1's XXH3-128 (a
///    published, widely tested hash); G and F are the standard finalisers of
///    splitmix64 and MurmurHash3, tested here by known answers and lane
///    checks (test/protocol/state_digest_test.cpp);
///  - cost: 4 multiplies per lane and word, and G is shared by the word
///    before and after a write (`replace`, `replace_batch`): 24 64-bit
///    multiplies per changed word. `replace_batch` folds a batch of writes
///    with AVX-512DQ 8 writes per step (`vpmullq`, masks instead of
///    branches for zero words) where the CPU has it, and with AVX2 4 writes per step where it
///    has only that (each 64-bit multiply made of three 32-bit `vpmuludq`). `dcr-bench-digest`
///    (docs/benchmarks.md): ~3 ns per write on the AVX-512 path, 7-10x less than version 1 (two
///    XXH3-128 calls per word, four per write, which was most of a sparse refit's apply); one
///    write at a time (SSE2, other CPUs) ~12 ns, about version 1's cost, up to 1.5x more under
///    load; the AVX2 path about a fifth less than that (thread CPU time, loaded AMD EPYC);
///  - more lanes would not buy collision resistance against someone who
///    chooses weights: G and F are public bijections, not a PRF, and
///    LtHash-grade resistance to generalised-birthday and lattice attacks
///    needs states of kilobytes and a cryptographic element hash (Lewi et
///    al., 2019). The digest makes no such claim (docs/protocol.md).
/// Zero words are "absent": the digest of zero-filled storage is the empty
/// set, so a fresh store costs nothing to digest and padding adds nothing.
/// The layout (regions, dtypes, shapes) is bound separately by `seal`.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>

#include "dcr/core/dtype.hpp"
#include "dcr/core/endian.hpp"
#include "dcr/core/hash.hpp"

// The host pass of nvcc sees the same class as a plain C++ translation
// unit (so that a program linking both has one definition of `set_digest`);
// only nvcc's device pass, which never emits these host functions, goes
// without the AVX-512 path.
#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__)) &&       \
    !defined(__CUDA_ARCH__)
#define DCR_SET_DIGEST_AVX512 1
#include <immintrin.h>
#endif

namespace dcr {

/// 64-bit lanes of a set digest (see the file comment for the choice).
inline constexpr std::size_t set_digest_lanes = 4;

/// Per-region keys of the element hash (a region: one parameter, one shard):
/// one 64-bit key per lane.
struct set_digest_key {
  std::uint64_t seed[set_digest_lanes]{};
};

namespace detail {
/// G: the splitmix64 finaliser (Stafford's Mix13).
constexpr std::uint64_t digest_mix_position(std::uint64_t x) noexcept {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return x;
}
/// F: MurmurHash3's fmix64.
constexpr std::uint64_t digest_mix_word(std::uint64_t x) noexcept {
  x ^= x >> 33;
  x *= 0xFF51AFD7ED558CCDull;
  x ^= x >> 33;
  x *= 0xC4CEB9FE1A85EC53ull;
  x ^= x >> 33;
  return x;
}
#ifdef DCR_SET_DIGEST_AVX512
#define DCR_SET_DIGEST_TARGET __attribute__((target("avx512f,avx512dq")))
/// G and F on 8 words at once (only where the CPU has AVX-512DQ).
DCR_SET_DIGEST_TARGET inline __m512i digest_xorshift_x8(__m512i x, unsigned shift) noexcept {
  // maskz: the unmasked form reads an undefined register (GCC warns).
  return _mm512_xor_si512(x, _mm512_maskz_srli_epi64(0xFF, x, shift));
}
DCR_SET_DIGEST_TARGET inline __m512i digest_mul_x8(__m512i x, std::uint64_t m) noexcept {
  return _mm512_mullo_epi64(x, _mm512_set1_epi64(static_cast<long long>(m)));
}
DCR_SET_DIGEST_TARGET inline __m512i digest_mix_position_x8(__m512i x) noexcept {
  x = digest_mul_x8(digest_xorshift_x8(x, 30), 0xBF58476D1CE4E5B9ull);
  x = digest_mul_x8(digest_xorshift_x8(x, 27), 0x94D049BB133111EBull);
  return digest_xorshift_x8(x, 31);
}
DCR_SET_DIGEST_TARGET inline __m512i digest_mix_word_x8(__m512i x) noexcept {
  x = digest_mul_x8(digest_xorshift_x8(x, 33), 0xFF51AFD7ED558CCDull);
  x = digest_mul_x8(digest_xorshift_x8(x, 33), 0xC4CEB9FE1A85EC53ull);
  return digest_xorshift_x8(x, 33);
}
#define DCR_SET_DIGEST_TARGET_AVX2 __attribute__((target("avx2")))
/// x * m modulo 2^64 on 4 words without a 64-bit vector multiply (AVX2 has
/// none): three 32 x 32 -> 64-bit multiplies, (xl*ml) + ((xh*ml + xl*mh) << 32).
/// `m_lo`, `m_hi`: the low and high 32 bits of m in every 64-bit element.
DCR_SET_DIGEST_TARGET_AVX2 inline __m256i digest_mul_x4(__m256i x, __m256i m_lo,
                                                        __m256i m_hi) noexcept {
  const __m256i lo = _mm256_mul_epu32(x, m_lo);
  const __m256i cross =
      _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(x, 32), m_lo), _mm256_mul_epu32(x, m_hi));
  return _mm256_add_epi64(lo, _mm256_slli_epi64(cross, 32));
}
/// The four multipliers of G and F split for `digest_mul_x4`.
struct digest_mul_consts_x4 {
  __m256i lo[4], hi[4];
  DCR_SET_DIGEST_TARGET_AVX2 digest_mul_consts_x4() noexcept {
    constexpr std::uint64_t m[4] = {0xBF58476D1CE4E5B9ull, 0x94D049BB133111EBull,
                                    0xFF51AFD7ED558CCDull, 0xC4CEB9FE1A85EC53ull};
    for (int i = 0; i < 4; ++i) {
      lo[i] = _mm256_set1_epi64x(static_cast<long long>(m[i] & 0xFFFFFFFFu));
      hi[i] = _mm256_set1_epi64x(static_cast<long long>(m[i] >> 32));
    }
  }
};
DCR_SET_DIGEST_TARGET_AVX2 inline __m256i digest_xorshift_x4(__m256i x, int shift) noexcept {
  return _mm256_xor_si256(x, _mm256_srl_epi64(x, _mm_cvtsi32_si128(shift)));
}
DCR_SET_DIGEST_TARGET_AVX2 inline __m256i digest_mix_position_x4(__m256i x,
                                                                 const digest_mul_consts_x4& c) {
  x = digest_mul_x4(digest_xorshift_x4(x, 30), c.lo[0], c.hi[0]);
  x = digest_mul_x4(digest_xorshift_x4(x, 27), c.lo[1], c.hi[1]);
  return digest_xorshift_x4(x, 31);
}
DCR_SET_DIGEST_TARGET_AVX2 inline __m256i digest_mix_word_x4(__m256i x,
                                                             const digest_mul_consts_x4& c) {
  x = digest_mul_x4(digest_xorshift_x4(x, 33), c.lo[2], c.hi[2]);
  x = digest_mul_x4(digest_xorshift_x4(x, 33), c.lo[3], c.hi[3]);
  return digest_xorshift_x4(x, 33);
}
/// One step of the AVX2 `replace_batch` (4 writes, every lane of the digest).
// `Before`: whether the `before` words are hashed (false: all of them are
// zero, absent, as in a full recomputation, which then costs half).
template <bool Before>
DCR_SET_DIGEST_TARGET_AVX2 inline void digest_step_x4(__m256i* acc, const __m256i* seed,
                                                      const digest_mul_consts_x4& c, __m256i p,
                                                      __m256i b, __m256i a) noexcept {
  const __m256i zero = _mm256_setzero_si256();
  const __m256i a_zero = _mm256_cmpeq_epi64(a, zero);
  for (std::size_t i = 0; i < set_digest_lanes; ++i) {
    const __m256i u = digest_mix_position_x4(_mm256_xor_si256(p, seed[i]), c);
    const __m256i ha = digest_mix_word_x4(_mm256_xor_si256(u, a), c);
    acc[i] = _mm256_add_epi64(acc[i], _mm256_andnot_si256(a_zero, ha));
    if constexpr (Before) {
      const __m256i hb = digest_mix_word_x4(_mm256_xor_si256(u, b), c);
      acc[i] = _mm256_sub_epi64(acc[i], _mm256_andnot_si256(_mm256_cmpeq_epi64(b, zero), hb));
    }
  }
}
#endif
} // namespace detail

/// Key of a region from everything that names it: its name, dtype and shape
/// (a different layout gives unrelated element hashes). The lane keys are
/// consecutive splitmix64 outputs from an XXH3-64 of the region's names.
inline set_digest_key region_key(std::string_view name, dtype_id dtype,
                                 std::span<const std::uint64_t> shape) noexcept {
  XXH3_state_t st;
  XXH3_INITSTATE(&st);
  XXH3_64bits_reset_withSeed(&st, 0x6463722d73657432ull); // "dcr-set2"
  XXH3_64bits_update(&st, name.data(), name.size());
  const std::uint8_t d = static_cast<std::uint8_t>(dtype);
  XXH3_64bits_update(&st, &d, 1);
  for (auto x : shape) {
    std::byte le[8];
    store_le(le, x);
    XXH3_64bits_update(&st, le, 8);
  }
  std::uint64_t state = XXH3_64bits_digest(&st);
  set_digest_key k;
  for (std::size_t i = 0; i < set_digest_lanes; ++i) {
    state += 0x9E3779B97F4A7C15ull;
    k.seed[i] = detail::digest_mix_position(state);
  }
  return k;
}

/// Lane-wise sums of element hashes (see the file comment).
class set_digest {
public:
  using lanes = std::array<std::uint64_t, set_digest_lanes>;

  /// The element hash of (position, word) in region `k`.
  static constexpr lanes element(const set_digest_key& k, std::uint64_t position,
                                 std::uint64_t word) noexcept {
    lanes h{};
    for (std::size_t i = 0; i < set_digest_lanes; ++i)
      h[i] = detail::digest_mix_word(detail::digest_mix_position(position ^ k.seed[i]) ^ word);
    return h;
  }

  /// Add the triple (k, position, word); a zero word is absent.
  void add(const set_digest_key& k, std::uint64_t position, std::uint64_t word) noexcept {
    if (word == 0) return;
    const auto h = element(k, position, word);
    for (std::size_t i = 0; i < set_digest_lanes; ++i) s_[i] += h[i];
  }
  /// Remove the triple (k, position, word).
  void remove(const set_digest_key& k, std::uint64_t position, std::uint64_t word) noexcept {
    if (word == 0) return;
    const auto h = element(k, position, word);
    for (std::size_t i = 0; i < set_digest_lanes; ++i) s_[i] -= h[i];
  }
  /// The word at `position` changed from `before` to `after`: the one hook
  /// every write goes through (one at a time; `replace_batch` for many).
  void replace(const set_digest_key& k, std::uint64_t position, std::uint64_t before,
               std::uint64_t after) noexcept {
    if (before == after) return;
    for (std::size_t i = 0; i < set_digest_lanes; ++i) {
      const auto u = detail::digest_mix_position(position ^ k.seed[i]);
      if (after != 0) s_[i] += detail::digest_mix_word(u ^ after);
      if (before != 0) s_[i] -= detail::digest_mix_word(u ^ before);
    }
  }
  /// `replace(k, position[j], before[j], after[j])` for j < n, in one pass
  /// (AVX-512 where the CPU has it; the same sums either way).
  void replace_batch(const set_digest_key& k, const std::uint64_t* position,
                     const std::uint64_t* before, const std::uint64_t* after,
                     std::size_t n) noexcept {
#ifdef DCR_SET_DIGEST_AVX512
    if (have_avx512()) {
      replace_batch_avx512(k, position, before, after, n);
      return;
    }
    if (have_avx2()) {
      replace_batch_avx2(k, position, before, after, n);
      return;
    }
#endif
    replace_batch_portable(k, position, before, after, n);
  }
  /// The portable path of `replace_batch` (public so that tests compare it
  /// with the vector path).
  void replace_batch_portable(const set_digest_key& k, const std::uint64_t* position,
                              const std::uint64_t* before, const std::uint64_t* after,
                              std::size_t n) noexcept {
    // One write at a time (what the compiler makes of a vector loop without
    // 64-bit vector multiplies is slower: AVX2 has its own path below).
    for (std::size_t j = 0; j < n; ++j) replace(k, position[j], before[j], after[j]);
  }
#ifdef DCR_SET_DIGEST_AVX512
  /// Whether this CPU runs the AVX-512 path of `replace_batch`.
  static bool have_avx512() noexcept {
    static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
    return yes;
  }
  /// The AVX-512 path (only where `have_avx512()`): 8 writes per step.
  DCR_SET_DIGEST_TARGET void replace_batch_avx512(const set_digest_key& k,
                                                  const std::uint64_t* position,
                                                  const std::uint64_t* before,
                                                  const std::uint64_t* after,
                                                  std::size_t n) noexcept {
    __m512i acc[set_digest_lanes];
    __m512i seed[set_digest_lanes];
    for (std::size_t i = 0; i < set_digest_lanes; ++i) {
      acc[i] = _mm512_setzero_si512();
      seed[i] = _mm512_set1_epi64(static_cast<long long>(k.seed[i]));
    }
    for (std::size_t j = 0; j < n; j += 8) {
      const __mmask8 live =
          n - j >= 8 ? __mmask8(0xFF) : static_cast<__mmask8>((1u << (n - j)) - 1);
      const __m512i p = _mm512_maskz_loadu_epi64(live, position + j);
      const __m512i b = _mm512_maskz_loadu_epi64(live, before + j);
      const __m512i a = _mm512_maskz_loadu_epi64(live, after + j);
      // Zero words are absent (also the masked-off tail, loaded as zero).
      const __mmask8 a_in = _mm512_test_epi64_mask(a, a);
      const __mmask8 b_in = _mm512_test_epi64_mask(b, b);
      for (std::size_t i = 0; i < set_digest_lanes; ++i) {
        const __m512i u = detail::digest_mix_position_x8(_mm512_xor_si512(p, seed[i]));
        acc[i] = _mm512_mask_add_epi64(acc[i], a_in, acc[i],
                                       detail::digest_mix_word_x8(_mm512_xor_si512(u, a)));
        acc[i] = _mm512_mask_sub_epi64(acc[i], b_in, acc[i],
                                       detail::digest_mix_word_x8(_mm512_xor_si512(u, b)));
      }
    }
    for (std::size_t i = 0; i < set_digest_lanes; ++i) {
      alignas(64) std::uint64_t part[8];
      _mm512_store_si512(part, acc[i]);
      for (auto x : part) s_[i] += x;
    }
  }
  /// Whether this CPU runs the AVX2 path of `replace_batch` (used where it
  /// has no AVX-512DQ).
  static bool have_avx2() noexcept {
    static const bool yes = __builtin_cpu_supports("avx2");
    return yes;
  }
  /// The AVX2 path (only where `have_avx2()`): 4 writes per step, each
  /// 64-bit multiply made of three 32-bit ones (`detail::digest_mul_x4`);
  /// the four lanes' chains are independent, which keeps the multipliers
  /// busy. The same sums as the portable path.
  DCR_SET_DIGEST_TARGET_AVX2 void replace_batch_avx2(const set_digest_key& k,
                                                     const std::uint64_t* position,
                                                     const std::uint64_t* before,
                                                     const std::uint64_t* after,
                                                     std::size_t n) noexcept {
    batch_avx2<true>(k, position, before, after, n);
  }
  /// `replace_batch_avx2` with every `before` word zero (`add_words`): the
  /// zeros are not hashed.
  DCR_SET_DIGEST_TARGET_AVX2 void
  add_batch_avx2(const set_digest_key& k, const std::uint64_t* position, const std::uint64_t* zero,
                 const std::uint64_t* word, std::size_t n) noexcept {
    batch_avx2<false>(k, position, zero, word, n);
  }
  template <bool Before>
  DCR_SET_DIGEST_TARGET_AVX2 void batch_avx2(const set_digest_key& k, const std::uint64_t* position,
                                             const std::uint64_t* before,
                                             const std::uint64_t* after, std::size_t n) noexcept {
    const detail::digest_mul_consts_x4 c;
    __m256i acc[set_digest_lanes];
    __m256i seed[set_digest_lanes];
    for (std::size_t i = 0; i < set_digest_lanes; ++i) {
      acc[i] = _mm256_setzero_si256();
      seed[i] = _mm256_set1_epi64x(static_cast<long long>(k.seed[i]));
    }
    std::size_t j = 0;
    for (; j + 4 <= n; j += 4)
      detail::digest_step_x4<Before>(
          acc, seed, c, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(position + j)),
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(before + j)),
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(after + j)));
    if (j < n) {
      alignas(32) std::uint64_t p[4] = {}, b[4] = {}, a[4] = {};
      for (std::size_t t = 0; j + t < n; ++t) {
        p[t] = position[j + t];
        b[t] = before[j + t];
        a[t] = after[j + t];
      }
      detail::digest_step_x4<Before>(acc, seed, c,
                                     _mm256_load_si256(reinterpret_cast<const __m256i*>(p)),
                                     _mm256_load_si256(reinterpret_cast<const __m256i*>(b)),
                                     _mm256_load_si256(reinterpret_cast<const __m256i*>(a)));
    }
    for (std::size_t i = 0; i < set_digest_lanes; ++i) {
      alignas(32) std::uint64_t part[4];
      _mm256_store_si256(reinterpret_cast<__m256i*>(part), acc[i]);
      for (auto x : part) s_[i] += x;
    }
  }
#else
  static constexpr bool have_avx512() noexcept { return false; }
  static constexpr bool have_avx2() noexcept { return false; }
#endif
  /// Add every word of a contiguous region (`words[j]` at position `first + j`).
  template <class W>
  void add_words(const set_digest_key& k, std::span<const W> words,
                 std::uint64_t first = 0) noexcept {
    constexpr std::size_t chunk = 256;
    std::uint64_t pos[chunk], zero[chunk] = {}, word[chunk];
    for (std::size_t j0 = 0; j0 < words.size(); j0 += chunk) {
      const std::size_t n = std::min(chunk, words.size() - j0);
      for (std::size_t j = 0; j < n; ++j) {
        pos[j] = first + j0 + j;
        word[j] = words[j0 + j];
      }
      add_batch(k, pos, zero, word, n);
    }
  }
  /// `replace_batch(k, position, zero, word, n)` with `zero` all zeros: the
  /// AVX2 path then hashes only the words (a full recomputation's case).
  void add_batch(const set_digest_key& k, const std::uint64_t* position, const std::uint64_t* zero,
                 const std::uint64_t* word, std::size_t n) noexcept {
#ifdef DCR_SET_DIGEST_AVX512
    if (!have_avx512() && have_avx2()) {
      add_batch_avx2(k, position, zero, word, n);
      return;
    }
#endif
    replace_batch(k, position, zero, word, n);
  }
  /// `replace(k, p, before[p], after[p])` for every position `p` in
  /// `positions` (an owner's changed words: the words are gathered into
  /// batches of `replace_batch`).
  template <class W>
  void replace_at(const set_digest_key& k, std::span<const std::uint64_t> positions,
                  std::span<const W> before, std::span<const W> after) noexcept {
    constexpr std::size_t chunk = 256;
    std::uint64_t b[chunk], a[chunk];
    for (std::size_t j0 = 0; j0 < positions.size(); j0 += chunk) {
      const std::size_t n = std::min(chunk, positions.size() - j0);
      for (std::size_t j = 0; j < n; ++j) {
        b[j] = before[positions[j0 + j]];
        a[j] = after[positions[j0 + j]];
      }
      replace_batch(k, positions.data() + j0, b, a, n);
    }
  }
  /// As above over bytes holding little-endian words of `width` bytes.
  void add_bytes(const set_digest_key& k, std::span<const std::byte> bytes, std::size_t width,
                 std::uint64_t first = 0) noexcept {
    visit_word(width, [&](auto word) { add_words(k, as_words<decltype(word)>(bytes), first); });
  }

  set_digest& operator+=(const set_digest& o) noexcept {
    for (std::size_t i = 0; i < set_digest_lanes; ++i) s_[i] += o.s_[i];
    return *this;
  }
  set_digest& operator-=(const set_digest& o) noexcept {
    for (std::size_t i = 0; i < set_digest_lanes; ++i) s_[i] -= o.s_[i];
    return *this;
  }
  friend bool operator==(const set_digest&, const set_digest&) = default;

  const lanes& value() const noexcept { return s_; }
  bool empty() const noexcept { return s_ == lanes{}; }

  /// The 128-bit digest of this set within `layout` (bytes that name the
  /// regions, e.g. a digest of their metadata): BLAKE2b-128 of a version
  /// tag, the layout and the lanes (little-endian).
  digest128 seal(std::span<const std::byte> layout) const {
    static constexpr char tag[] = "dcr-state-digest 2";
    blake2b_128 h;
    h.update(std::as_bytes(std::span(tag, sizeof tag - 1)));
    h.update(layout);
    std::array<std::byte, 8 * set_digest_lanes> le{};
    for (std::size_t i = 0; i < set_digest_lanes; ++i) store_le(le.data() + 8 * i, s_[i]);
    h.update(le);
    return h.final();
  }

private:
  template <class W>
  static std::span<const W> as_words(std::span<const std::byte> b) noexcept {
    return {reinterpret_cast<const W*>(b.data()), b.size() / sizeof(W)};
  }
  lanes s_{};
};

} // namespace dcr
