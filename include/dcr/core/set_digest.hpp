#pragma once
/// \file
/// Set digests of stored words: a set-homomorphic hash of the (region,
/// position, word) triples of a state whose word is not zero, so that a write
/// of one word updates the digest in O(1) from the word before and after it,
/// and a refit updates it in O(changes) instead of hashing the whole state.
///
/// Construction (an LtHash-style sum, Bellare-Micciancio's AdHash over
/// 64-bit lanes): every triple hashes to `set_digest_lanes` 64-bit words;
/// the digest state is their lane-wise sum modulo 2^64 over all triples.
/// Adding a triple adds its hash, removing one subtracts it, so the state
/// depends only on the set, not on the order of writes, and two partial
/// states combine by addition (owners, threads, tensors).
///
/// The element hash (digest version 3; `seal` names it): the 128-bit block
/// (p, w), position p and word w zero-extended, each 64 bits little-endian
/// (p in bytes 0-7), goes through four AES rounds keyed by the region:
///     x = (p, w) ^ K_0;  x = AESENC(x, K_r) for r = 1..4;  (h_0, h_1) = x,
/// AESENC the AES round (ShiftRows, SubBytes, MixColumns, round-key XOR) as
/// x86's `aesenc` computes it, K_0..K_4 the region's round keys
/// (`region_key`). Why this choice:
///  - the fault model is accidental divergence (lost, repeated or misplaced
///    writes, another attempt's payload, a wrong restore), not an adversary.
///    What holds exactly, not just with high probability: for a fixed region
///    the map (p, w) -> h is a permutation of 128-bit blocks (every round and
///    key XOR is one), so two different triples of a region never have equal
///    element hashes, whether they differ in the word, the position or both.
///    Position and word do not enter additively (no h = f(p) + g(w), under
///    which swapping two words between two positions cancels): they meet in
///    the S-boxes. Two rounds already make every output bit depend on every
///    input bit; four rounds admit no differential or linear characteristic
///    of probability above 2^-150 (25 active S-boxes, the wide-trail bound),
///    so structured differences (neighbouring positions, swapped or shifted
///    words, flipped bits) behave like random ones;
///  - collisions: modelling the keyed rounds as a random function, the lanes
///    of a fixed nonzero difference of two sets are uniform, so two
///    different states collide with probability about 2^-128 (2^-126 when a
///    bug counts one triple twice, since 2h is even in each lane), which the
///    128-bit `seal` keeps. This rests on AES's round function, the most
///    studied one there is, with fewer rounds than the cipher;
///  - cost: four AES rounds per word, eight per write (the word before and
///    after), one instruction each on every x86-64 CPU since 2010 (AES-NI;
///    `replace_batch` runs two writes, four independent blocks, per step).
///    `dcr-bench-digest` (docs/benchmarks.md) measures it against version
///    2's element hash (splitmix64 and fmix64 finalisers over four lanes: 24
///    64-bit multiplies per write, three 32-bit ones each on CPUs without
///    AVX-512), which was most of a sparse refit's apply and of a dense
///    refit. Other CPUs run table-driven rounds (`element_portable`, the
///    same values, tested equal), several times slower; ARMv8's AES
///    instructions (`AESE`, `AESMC`) would serve there, but have no path
///    here yet;
///  - more rounds or lanes would not buy collision resistance against
///    someone who chooses weights: the round keys derive from public names,
///    so the hash is a public permutation, not a PRF, and LtHash-grade
///    resistance to generalised-birthday and lattice attacks needs states of
///    kilobytes and a cryptographic element hash (Lewi et al., 2019). The
///    digest makes no such claim (docs/protocol.md).
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
// without the AES-NI path.
#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__)) &&       \
    !defined(__CUDA_ARCH__)
#define DCR_SET_DIGEST_AESNI 1
#include <immintrin.h>
#define DCR_SET_DIGEST_TARGET __attribute__((target("aes,sse4.1")))
#endif

namespace dcr {

/// 64-bit lanes of a set digest: the element hash's 128-bit block.
inline constexpr std::size_t set_digest_lanes = 2;
/// AES rounds of the element hash (see the file comment for the choice).
inline constexpr std::size_t set_digest_rounds = 4;

/// Per-region keys of the element hash (a region: one parameter, one shard):
/// the whitening key K_0 and one key per round, each two 64-bit words (bytes
/// 0-7, then 8-15, little-endian).
struct set_digest_key {
  std::uint64_t round_key[2 * (set_digest_rounds + 1)]{};
};

namespace detail {
/// The splitmix64 finaliser (Stafford's Mix13): expands a region's name
/// hash into round keys.
constexpr std::uint64_t splitmix64_mix(std::uint64_t x) noexcept {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return x;
}

/// The AES S-box (FIPS-197, 5.1.1), computed: walking the multiplicative
/// group of GF(2^8) by powers of 3 (p) and of its inverse (q) gives every
/// nonzero byte with its inverse, then the affine map.
constexpr std::array<std::uint8_t, 256> make_aes_sbox() noexcept {
  std::array<std::uint8_t, 256> box{};
  const auto rotl8 = [](std::uint8_t x, int n) {
    return static_cast<std::uint8_t>((x << n) | (x >> (8 - n)));
  };
  std::uint8_t p = 1, q = 1;
  do {
    p = static_cast<std::uint8_t>(p ^ (p << 1) ^ ((p & 0x80) ? 0x1B : 0)); // p * 3
    q = static_cast<std::uint8_t>(q ^ (q << 1));                           // q / 3
    q = static_cast<std::uint8_t>(q ^ (q << 2));
    q = static_cast<std::uint8_t>(q ^ (q << 4));
    if (q & 0x80) q ^= 0x09;
    box[p] =
        static_cast<std::uint8_t>(q ^ rotl8(q, 1) ^ rotl8(q, 2) ^ rotl8(q, 3) ^ rotl8(q, 4) ^ 0x63);
  } while (p != 1);
  box[0] = 0x63;
  return box;
}
inline constexpr std::array<std::uint8_t, 256> aes_sbox = make_aes_sbox();

/// One AES round as x86's `aesenc` computes it, on a state of 16 bytes
/// (column-major: byte r + 4c is row r of column c): ShiftRows, SubBytes,
/// MixColumns, then XOR with the round key. The portable element hash.
constexpr void aes_round(std::uint8_t (&s)[16], const std::uint8_t (&rk)[16]) noexcept {
  std::uint8_t t[16]{};
  for (int c = 0; c < 4; ++c)
    for (int r = 0; r < 4; ++r) t[r + 4 * c] = aes_sbox[s[r + 4 * ((c + r) % 4)]];
  const auto x2 = [](std::uint8_t a) {
    return static_cast<std::uint8_t>((a << 1) ^ ((a & 0x80) ? 0x1B : 0));
  };
  for (int c = 0; c < 4; ++c) {
    const std::uint8_t a0 = t[4 * c], a1 = t[4 * c + 1], a2 = t[4 * c + 2], a3 = t[4 * c + 3];
    const std::uint8_t all = a0 ^ a1 ^ a2 ^ a3;
    // b_r = a_r ^ all ^ 2 (a_r ^ a_{r+1}): 2a_r ^ 3a_{r+1} ^ a_{r+2} ^ a_{r+3}.
    s[4 * c] = static_cast<std::uint8_t>(a0 ^ all ^ x2(a0 ^ a1) ^ rk[4 * c]);
    s[4 * c + 1] = static_cast<std::uint8_t>(a1 ^ all ^ x2(a1 ^ a2) ^ rk[4 * c + 1]);
    s[4 * c + 2] = static_cast<std::uint8_t>(a2 ^ all ^ x2(a2 ^ a3) ^ rk[4 * c + 2]);
    s[4 * c + 3] = static_cast<std::uint8_t>(a3 ^ all ^ x2(a3 ^ a0) ^ rk[4 * c + 3]);
  }
}
/// The round as four 32-bit table lookups per column (the usual software
/// AES): `aes_te[r][x]` is the column that byte x of row r contributes
/// after SubBytes and MixColumns (bytes of a column little-endian in a
/// word). The same round as `aes_round`, tested equal; 4 KiB of tables.
constexpr std::array<std::array<std::uint32_t, 256>, 4> make_aes_te() noexcept {
  std::array<std::array<std::uint32_t, 256>, 4> te{};
  for (int x = 0; x < 256; ++x) {
    const std::uint32_t s1 = aes_sbox[static_cast<std::size_t>(x)];
    const std::uint32_t s2 = ((s1 << 1) ^ ((s1 & 0x80) ? 0x1B : 0)) & 0xFF, s3 = s2 ^ s1;
    // Row r's byte enters output rows r, r+1, r+2, r+3 times 2, 1, 1, 3.
    const std::uint32_t col = s2 | (s1 << 8) | (s1 << 16) | (s3 << 24);
    for (int r = 0; r < 4; ++r)
      te[static_cast<std::size_t>(r)][static_cast<std::size_t>(x)] =
          r == 0 ? col : (col << (8 * r)) | (col >> (32 - 8 * r));
  }
  return te;
}
inline constexpr std::array<std::array<std::uint32_t, 256>, 4> aes_te = make_aes_te();
/// One round on the state's four columns `w` (little-endian words of the
/// 16 bytes), key columns `k`.
constexpr void aes_round_te(std::uint32_t (&w)[4], const std::uint32_t (&k)[4]) noexcept {
  // Written out per column so that the state stays in registers.
  const auto col = [](std::uint32_t a, std::uint32_t b, std::uint32_t c, std::uint32_t d,
                      std::uint32_t key) {
    return aes_te[0][a & 0xFF] ^ aes_te[1][(b >> 8) & 0xFF] ^ aes_te[2][(c >> 16) & 0xFF] ^
           aes_te[3][d >> 24] ^ key;
  };
  const std::uint32_t w0 = w[0], w1 = w[1], w2 = w[2], w3 = w[3];
  w[0] = col(w0, w1, w2, w3, k[0]);
  w[1] = col(w1, w2, w3, w0, k[1]);
  w[2] = col(w2, w3, w0, w1, k[2]);
  w[3] = col(w3, w0, w1, w2, k[3]);
}

/// 16 bytes of two little-endian 64-bit words and back.
constexpr void digest_block_bytes(std::uint64_t lo, std::uint64_t hi, std::uint8_t (&b)[16]) {
  for (int i = 0; i < 8; ++i) {
    b[i] = static_cast<std::uint8_t>(lo >> (8 * i));
    b[8 + i] = static_cast<std::uint8_t>(hi >> (8 * i));
  }
}
constexpr std::uint64_t digest_block_word(const std::uint8_t (&b)[16], int half) {
  std::uint64_t x = 0;
  for (int i = 7; i >= 0; --i) x = (x << 8) | b[8 * half + i];
  return x;
}

#ifdef DCR_SET_DIGEST_AESNI
/// The element hash of one block (p, w) with AES-NI; `rk`: K_0..K_4.
DCR_SET_DIGEST_TARGET inline __m128i digest_block_x1(const __m128i* rk, __m128i x) noexcept {
  x = _mm_xor_si128(x, rk[0]);
  for (std::size_t r = 1; r <= set_digest_rounds; ++r) x = _mm_aesenc_si128(x, rk[r]);
  return x;
}
/// A region's round keys in registers.
DCR_SET_DIGEST_TARGET inline void digest_load_keys(const std::uint64_t* round_key,
                                                   __m128i* rk) noexcept {
  for (std::size_t r = 0; r <= set_digest_rounds; ++r)
    rk[r] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(round_key + 2 * r));
}
#endif
} // namespace detail

/// Key of a region from everything that names it: its name, dtype and shape
/// (a different layout gives unrelated element hashes). The round keys are
/// consecutive splitmix64 outputs from an XXH3-64 of the region's names.
inline set_digest_key region_key(std::string_view name, dtype_id dtype,
                                 std::span<const std::uint64_t> shape) noexcept {
  XXH3_state_t st;
  XXH3_INITSTATE(&st);
  XXH3_64bits_reset_withSeed(&st, 0x6463722d73657433ull); // "dcr-set3"
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
  for (auto& w : k.round_key) {
    state += 0x9E3779B97F4A7C15ull;
    w = detail::splitmix64_mix(state);
  }
  return k;
}

/// Lane-wise sums of element hashes (see the file comment).
class set_digest {
public:
  using lanes = std::array<std::uint64_t, set_digest_lanes>;

  /// The element hash of (position, word) in region `k`, by table lookups
  /// (any CPU; `element` takes AES-NI where the CPU has it).
  static constexpr lanes element_portable(const set_digest_key& k, std::uint64_t position,
                                          std::uint64_t word) noexcept {
    const auto lo = [](std::uint64_t x) { return static_cast<std::uint32_t>(x); };
    const auto hi = [](std::uint64_t x) { return static_cast<std::uint32_t>(x >> 32); };
    const std::uint64_t p = position ^ k.round_key[0], v = word ^ k.round_key[1];
    std::uint32_t w[4] = {lo(p), hi(p), lo(v), hi(v)};
    for (std::size_t r = 1; r <= set_digest_rounds; ++r) {
      const std::uint64_t a = k.round_key[2 * r], b = k.round_key[2 * r + 1];
      const std::uint32_t rk[4] = {lo(a), hi(a), lo(b), hi(b)};
      detail::aes_round_te(w, rk);
    }
    return {w[0] | (std::uint64_t{w[1]} << 32), w[2] | (std::uint64_t{w[3]} << 32)};
  }
  /// The element hash by `detail::aes_round`, the round written byte by byte
  /// as FIPS-197 states it (the reference the tests check the others with).
  static constexpr lanes element_reference(const set_digest_key& k, std::uint64_t position,
                                           std::uint64_t word) noexcept {
    std::uint8_t x[16]{}, rk[16]{};
    detail::digest_block_bytes(position ^ k.round_key[0], word ^ k.round_key[1], x);
    for (std::size_t r = 1; r <= set_digest_rounds; ++r) {
      detail::digest_block_bytes(k.round_key[2 * r], k.round_key[2 * r + 1], rk);
      detail::aes_round(x, rk);
    }
    return {detail::digest_block_word(x, 0), detail::digest_block_word(x, 1)};
  }
  /// The element hash of (position, word) in region `k`.
  static lanes element(const set_digest_key& k, std::uint64_t position,
                       std::uint64_t word) noexcept {
#ifdef DCR_SET_DIGEST_AESNI
    if (have_aesni()) return element_aesni(k, position, word);
#endif
    return element_portable(k, position, word);
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
    add(k, position, after);
    remove(k, position, before);
  }
  /// `replace(k, position[j], before[j], after[j])` for j < n, in one pass
  /// (AES-NI where the CPU has it; the same sums either way).
  void replace_batch(const set_digest_key& k, const std::uint64_t* position,
                     const std::uint64_t* before, const std::uint64_t* after,
                     std::size_t n) noexcept {
#ifdef DCR_SET_DIGEST_AESNI
    if (have_aesni()) {
      batch_aesni<true>(k, position, before, after, n);
      return;
    }
#endif
    replace_batch_portable(k, position, before, after, n);
  }
  /// `add(k, position[j], word[j])` for j < n, in one pass (a full
  /// recomputation: no word before to hash).
  void add_batch(const set_digest_key& k, const std::uint64_t* position, const std::uint64_t* word,
                 std::size_t n) noexcept {
#ifdef DCR_SET_DIGEST_AESNI
    if (have_aesni()) {
      batch_aesni<false>(k, position, nullptr, word, n);
      return;
    }
#endif
    for (std::size_t j = 0; j < n; ++j) add(k, position[j], word[j]);
  }
  /// The portable path of `replace_batch` (public so that tests compare it
  /// with the AES-NI path).
  void replace_batch_portable(const set_digest_key& k, const std::uint64_t* position,
                              const std::uint64_t* before, const std::uint64_t* after,
                              std::size_t n) noexcept {
    for (std::size_t j = 0; j < n; ++j) {
      if (before[j] == after[j]) continue;
      if (after[j] != 0) {
        const auto h = element_portable(k, position[j], after[j]);
        for (std::size_t i = 0; i < set_digest_lanes; ++i) s_[i] += h[i];
      }
      if (before[j] != 0) {
        const auto h = element_portable(k, position[j], before[j]);
        for (std::size_t i = 0; i < set_digest_lanes; ++i) s_[i] -= h[i];
      }
    }
  }
#ifdef DCR_SET_DIGEST_AESNI
  /// Whether this CPU runs the AES-NI path (`element`, `replace_batch`, `add_batch`).
  static bool have_aesni() noexcept {
    static const bool yes = __builtin_cpu_supports("aes") && __builtin_cpu_supports("sse4.1");
    return yes;
  }
  /// The element hash with AES-NI (only where `have_aesni()`).
  DCR_SET_DIGEST_TARGET static lanes element_aesni(const set_digest_key& k, std::uint64_t position,
                                                   std::uint64_t word) noexcept {
    __m128i rk[set_digest_rounds + 1];
    detail::digest_load_keys(k.round_key, rk);
    const __m128i h = detail::digest_block_x1(
        rk, _mm_set_epi64x(static_cast<long long>(word), static_cast<long long>(position)));
    return {static_cast<std::uint64_t>(_mm_cvtsi128_si64(h)),
            static_cast<std::uint64_t>(_mm_extract_epi64(h, 1))};
  }
  /// The AES-NI batch (only where `have_aesni()`): two writes per step, the
  /// blocks of their words after (and, with `Before`, before) as independent
  /// round chains; zero words are masked out instead of branched around.
  template <bool Before>
  DCR_SET_DIGEST_TARGET void batch_aesni(const set_digest_key& k, const std::uint64_t* position,
                                         const std::uint64_t* before, const std::uint64_t* after,
                                         std::size_t n) noexcept {
    __m128i rk[set_digest_rounds + 1];
    detail::digest_load_keys(k.round_key, rk);
    const __m128i zero = _mm_setzero_si128();
    __m128i acc = zero;
    std::size_t j = 0;
    for (; j + 2 <= n; j += 2) {
      const __m128i p = _mm_loadu_si128(reinterpret_cast<const __m128i*>(position + j));
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(after + j));
      const __m128i a_zero = _mm_cmpeq_epi64(a, zero); // all ones where absent
      const __m128i ha0 = detail::digest_block_x1(rk, _mm_unpacklo_epi64(p, a));
      const __m128i ha1 = detail::digest_block_x1(rk, _mm_unpackhi_epi64(p, a));
      acc = _mm_add_epi64(acc, _mm_andnot_si128(_mm_unpacklo_epi64(a_zero, a_zero), ha0));
      acc = _mm_add_epi64(acc, _mm_andnot_si128(_mm_unpackhi_epi64(a_zero, a_zero), ha1));
      if constexpr (Before) {
        const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(before + j));
        const __m128i b_zero = _mm_cmpeq_epi64(b, zero);
        const __m128i hb0 = detail::digest_block_x1(rk, _mm_unpacklo_epi64(p, b));
        const __m128i hb1 = detail::digest_block_x1(rk, _mm_unpackhi_epi64(p, b));
        acc = _mm_sub_epi64(acc, _mm_andnot_si128(_mm_unpacklo_epi64(b_zero, b_zero), hb0));
        acc = _mm_sub_epi64(acc, _mm_andnot_si128(_mm_unpackhi_epi64(b_zero, b_zero), hb1));
      }
    }
    if (j < n) { // a last odd write
      const __m128i p = _mm_set1_epi64x(static_cast<long long>(position[j]));
      const __m128i a = _mm_set1_epi64x(static_cast<long long>(after[j]));
      const __m128i a_zero = _mm_cmpeq_epi64(a, zero);
      acc = _mm_add_epi64(
          acc, _mm_andnot_si128(a_zero, detail::digest_block_x1(rk, _mm_unpacklo_epi64(p, a))));
      if constexpr (Before) {
        const __m128i b = _mm_set1_epi64x(static_cast<long long>(before[j]));
        const __m128i b_zero = _mm_cmpeq_epi64(b, zero);
        acc = _mm_sub_epi64(
            acc, _mm_andnot_si128(b_zero, detail::digest_block_x1(rk, _mm_unpacklo_epi64(p, b))));
      }
    }
    s_[0] += static_cast<std::uint64_t>(_mm_cvtsi128_si64(acc));
    s_[1] += static_cast<std::uint64_t>(_mm_extract_epi64(acc, 1));
  }
#else
  static constexpr bool have_aesni() noexcept { return false; }
#endif
  /// Add every word of a contiguous region (`words[j]` at position `first + j`).
  template <class W>
  void add_words(const set_digest_key& k, std::span<const W> words,
                 std::uint64_t first = 0) noexcept {
    constexpr std::size_t chunk = 256;
    std::uint64_t pos[chunk], word[chunk];
    for (std::size_t j0 = 0; j0 < words.size(); j0 += chunk) {
      const std::size_t n = std::min(chunk, words.size() - j0);
      for (std::size_t j = 0; j < n; ++j) {
        pos[j] = first + j0 + j;
        word[j] = words[j0 + j];
      }
      add_batch(k, pos, word, n);
    }
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
    static constexpr char tag[] = "dcr-state-digest 3";
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
