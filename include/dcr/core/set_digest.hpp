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
///    after), one instruction each on every x86-64 CPU since 2010 (AES-NI)
///    and two on ARMv8 CPUs with the cryptography extension (`AESE`,
///    `AESMC`: Neoverse, Grace, Graviton, Apple); `replace_batch` runs two
///    writes, four independent blocks, per step. `dcr-bench-digest`
///    (docs/benchmarks.md) measures it against version 2's element hash
///    (splitmix64 and fmix64 finalisers over four lanes: 24 64-bit
///    multiplies per write, three 32-bit ones each on CPUs without
///    AVX-512), which was most of a sparse refit's apply and of a dense
///    refit. Other CPUs run table-driven rounds (`element_portable`, the
///    same values, tested equal), several times slower;
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

// The hardware AES rounds (`detail::aes_hw`): x86's AES-NI, or ARMv8's AES
// instructions. The host pass of nvcc sees the same class as a plain C++
// translation unit (so that a program linking both has one definition of
// `set_digest`); only nvcc's device pass, which never emits these host
// functions, goes without them.
#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__)) &&       \
    !defined(__CUDA_ARCH__)
#define DCR_SET_DIGEST_AESNI 1
#define DCR_SET_DIGEST_HARDWARE_AES 1
#include <immintrin.h>
#define DCR_SET_DIGEST_TARGET __attribute__((target("aes,sse4.1")))
#elif defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDA_ARCH__)
// ARMv8: built for a CPU with AES (-march=...+crypto or +aes, as Apple's
// arm64 targets are), the instructions are always used; otherwise GCC
// compiles these functions alone for +crypto and they run where the kernel
// reports AES (HWCAP_AES). Clang (14 here) declares the AES intrinsics only
// for translation units built with +aes, so without it it takes the
// table-driven rounds. scripts/cross-aarch64-test.sh builds all three.
#if defined(__ARM_FEATURE_AES) || defined(__ARM_FEATURE_CRYPTO)
#define DCR_SET_DIGEST_ARMV8_AES 1
#define DCR_SET_DIGEST_TARGET
#elif defined(__linux__) && !defined(__clang__)
#define DCR_SET_DIGEST_ARMV8_AES 1
#define DCR_SET_DIGEST_ARMV8_AES_HWCAP 1
#define DCR_SET_DIGEST_TARGET __attribute__((target("+crypto")))
#include <sys/auxv.h>
#endif
#ifdef DCR_SET_DIGEST_ARMV8_AES
#define DCR_SET_DIGEST_HARDWARE_AES 1
#include <arm_neon.h>
#endif
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

#ifdef DCR_SET_DIGEST_HARDWARE_AES
/// The few vector operations the hardware batch needs, on a block of two
/// 64-bit lanes (bytes 0-7 lane 0, little-endian, as in the portable
/// rounds), for each instruction set: one batch loop serves both.
namespace aes_hw {
#ifdef DCR_SET_DIGEST_AESNI
using block = __m128i;
DCR_SET_DIGEST_TARGET inline block load(const std::uint64_t* p) noexcept {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}
DCR_SET_DIGEST_TARGET inline block splat(std::uint64_t x) noexcept {
  return _mm_set1_epi64x(static_cast<long long>(x));
}
DCR_SET_DIGEST_TARGET inline block zero() noexcept { return _mm_setzero_si128(); }
/// (a_0, b_0) and (a_1, b_1).
DCR_SET_DIGEST_TARGET inline block pair_lo(block a, block b) noexcept {
  return _mm_unpacklo_epi64(a, b);
}
DCR_SET_DIGEST_TARGET inline block pair_hi(block a, block b) noexcept {
  return _mm_unpackhi_epi64(a, b);
}
/// All ones in each lane that is zero.
DCR_SET_DIGEST_TARGET inline block zero_lanes(block a) noexcept {
  return _mm_cmpeq_epi64(a, _mm_setzero_si128());
}
/// `x` with the lanes of `mask` cleared.
DCR_SET_DIGEST_TARGET inline block clear(block mask, block x) noexcept {
  return _mm_andnot_si128(mask, x);
}
DCR_SET_DIGEST_TARGET inline block add(block a, block b) noexcept { return _mm_add_epi64(a, b); }
DCR_SET_DIGEST_TARGET inline block sub(block a, block b) noexcept { return _mm_sub_epi64(a, b); }
DCR_SET_DIGEST_TARGET inline std::uint64_t lane0(block a) noexcept {
  return static_cast<std::uint64_t>(_mm_cvtsi128_si64(a));
}
DCR_SET_DIGEST_TARGET inline std::uint64_t lane1(block a) noexcept {
  return static_cast<std::uint64_t>(_mm_extract_epi64(a, 1));
}
/// The element hash of one block (p, w); `rk`: K_0..K_4.
DCR_SET_DIGEST_TARGET inline block rounds(const block* rk, block x) noexcept {
  x = _mm_xor_si128(x, rk[0]);
  for (std::size_t r = 1; r <= set_digest_rounds; ++r) x = _mm_aesenc_si128(x, rk[r]);
  return x;
}
#else // ARMv8
using block = uint64x2_t;
DCR_SET_DIGEST_TARGET inline block load(const std::uint64_t* p) noexcept { return vld1q_u64(p); }
DCR_SET_DIGEST_TARGET inline block splat(std::uint64_t x) noexcept { return vdupq_n_u64(x); }
DCR_SET_DIGEST_TARGET inline block zero() noexcept { return vdupq_n_u64(0); }
DCR_SET_DIGEST_TARGET inline block pair_lo(block a, block b) noexcept { return vzip1q_u64(a, b); }
DCR_SET_DIGEST_TARGET inline block pair_hi(block a, block b) noexcept { return vzip2q_u64(a, b); }
DCR_SET_DIGEST_TARGET inline block zero_lanes(block a) noexcept { return vceqzq_u64(a); }
DCR_SET_DIGEST_TARGET inline block clear(block mask, block x) noexcept {
  return vbicq_u64(x, mask);
}
DCR_SET_DIGEST_TARGET inline block add(block a, block b) noexcept { return vaddq_u64(a, b); }
DCR_SET_DIGEST_TARGET inline block sub(block a, block b) noexcept { return vsubq_u64(a, b); }
DCR_SET_DIGEST_TARGET inline std::uint64_t lane0(block a) noexcept { return vgetq_lane_u64(a, 0); }
DCR_SET_DIGEST_TARGET inline std::uint64_t lane1(block a) noexcept { return vgetq_lane_u64(a, 1); }
/// The same rounds as AES-NI's: AESE is (key XOR, ShiftRows, SubBytes) and
/// AESMC MixColumns, so x86's key-XOR-last round r is AESMC(AESE(x, K_{r-1}))
/// followed by K_r, which the next AESE (or the final XOR) applies.
DCR_SET_DIGEST_TARGET inline block rounds(const block* rk, block x) noexcept {
  uint8x16_t s = vreinterpretq_u8_u64(x);
  for (std::size_t r = 0; r < set_digest_rounds; ++r)
    s = vaesmcq_u8(vaeseq_u8(s, vreinterpretq_u8_u64(rk[r])));
  return vreinterpretq_u64_u8(veorq_u8(s, vreinterpretq_u8_u64(rk[set_digest_rounds])));
}
#endif
/// A region's round keys in registers.
DCR_SET_DIGEST_TARGET inline void load_keys(const std::uint64_t* round_key, block* rk) noexcept {
  for (std::size_t r = 0; r <= set_digest_rounds; ++r) rk[r] = load(round_key + 2 * r);
}
/// Whether this CPU runs these instructions.
inline bool available() noexcept {
#if defined(DCR_SET_DIGEST_AESNI)
  static const bool yes = __builtin_cpu_supports("aes") && __builtin_cpu_supports("sse4.1");
  return yes;
#elif defined(DCR_SET_DIGEST_ARMV8_AES_HWCAP)
  static const bool yes = (getauxval(AT_HWCAP) & HWCAP_AES) != 0;
  return yes;
#else
  return true; // built for a CPU with AES
#endif
}
} // namespace aes_hw
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
  /// (any CPU; `element` takes AES instructions where the CPU has them).
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
#ifdef DCR_SET_DIGEST_HARDWARE_AES
    if (have_hardware_aes()) return element_hardware(k, position, word);
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
  /// (AES instructions where the CPU has them; the same sums either way).
  void replace_batch(const set_digest_key& k, const std::uint64_t* position,
                     const std::uint64_t* before, const std::uint64_t* after,
                     std::size_t n) noexcept {
#ifdef DCR_SET_DIGEST_HARDWARE_AES
    if (have_hardware_aes()) {
      batch_hardware<true>(k, position, before, after, n);
      return;
    }
#endif
    replace_batch_portable(k, position, before, after, n);
  }
  /// `add(k, position[j], word[j])` for j < n, in one pass (a full
  /// recomputation: no word before to hash).
  void add_batch(const set_digest_key& k, const std::uint64_t* position, const std::uint64_t* word,
                 std::size_t n) noexcept {
#ifdef DCR_SET_DIGEST_HARDWARE_AES
    if (have_hardware_aes()) {
      batch_hardware<false>(k, position, nullptr, word, n);
      return;
    }
#endif
    for (std::size_t j = 0; j < n; ++j) add(k, position[j], word[j]);
  }
  /// The portable path of `replace_batch` (public so that tests compare it
  /// with the hardware path).
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
#ifdef DCR_SET_DIGEST_HARDWARE_AES
  /// Whether this CPU runs the AES rounds as instructions (AES-NI or ARMv8's
  /// AES) in `element`, `replace_batch` and `add_batch`.
  static bool have_hardware_aes() noexcept { return detail::aes_hw::available(); }
  /// The element hash by AES instructions (only where `have_hardware_aes()`).
  DCR_SET_DIGEST_TARGET static lanes
  element_hardware(const set_digest_key& k, std::uint64_t position, std::uint64_t word) noexcept {
    namespace hw = detail::aes_hw;
    hw::block rk[set_digest_rounds + 1];
    hw::load_keys(k.round_key, rk);
    const hw::block h = hw::rounds(rk, hw::pair_lo(hw::splat(position), hw::splat(word)));
    return {hw::lane0(h), hw::lane1(h)};
  }
  /// The batch by AES instructions (only where `have_hardware_aes()`): two
  /// writes per step, the blocks of their words after (and, with `Before`,
  /// before) as independent round chains; zero words are masked out instead
  /// of branched around.
  template <bool Before>
  DCR_SET_DIGEST_TARGET void batch_hardware(const set_digest_key& k, const std::uint64_t* position,
                                            const std::uint64_t* before, const std::uint64_t* after,
                                            std::size_t n) noexcept {
    namespace hw = detail::aes_hw;
    hw::block rk[set_digest_rounds + 1];
    hw::load_keys(k.round_key, rk);
    hw::block acc = hw::zero();
    std::size_t j = 0;
    for (; j + 2 <= n; j += 2) {
      const hw::block p = hw::load(position + j);
      const hw::block a = hw::load(after + j);
      const hw::block a_zero = hw::zero_lanes(a); // all ones where absent
      const hw::block ha0 = hw::rounds(rk, hw::pair_lo(p, a));
      const hw::block ha1 = hw::rounds(rk, hw::pair_hi(p, a));
      acc = hw::add(acc, hw::clear(hw::pair_lo(a_zero, a_zero), ha0));
      acc = hw::add(acc, hw::clear(hw::pair_hi(a_zero, a_zero), ha1));
      if constexpr (Before) {
        const hw::block b = hw::load(before + j);
        const hw::block b_zero = hw::zero_lanes(b);
        const hw::block hb0 = hw::rounds(rk, hw::pair_lo(p, b));
        const hw::block hb1 = hw::rounds(rk, hw::pair_hi(p, b));
        acc = hw::sub(acc, hw::clear(hw::pair_lo(b_zero, b_zero), hb0));
        acc = hw::sub(acc, hw::clear(hw::pair_hi(b_zero, b_zero), hb1));
      }
    }
    if (j < n) { // a last odd write
      const hw::block p = hw::splat(position[j]);
      const hw::block a = hw::splat(after[j]);
      acc = hw::add(acc, hw::clear(hw::zero_lanes(a), hw::rounds(rk, hw::pair_lo(p, a))));
      if constexpr (Before) {
        const hw::block b = hw::splat(before[j]);
        acc = hw::sub(acc, hw::clear(hw::zero_lanes(b), hw::rounds(rk, hw::pair_lo(p, b))));
      }
    }
    s_[0] += hw::lane0(acc);
    s_[1] += hw::lane1(acc);
  }
#else
  static constexpr bool have_hardware_aes() noexcept { return false; }
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
