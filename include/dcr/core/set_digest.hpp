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
/// The element hash: lanes 2i and 2i+1 are XXH3-128 (seeded by the region's
/// key and lane pair i) of the 16 bytes (position, word zero-extended to
/// 64 bits), little-endian. Why this choice:
///  - the fault model is accidental divergence (lost, repeated or misplaced
///    writes, a wrong restore), not an adversary: modelling XXH3 as a random
///    function, the lanes of any fixed nonzero difference of two sets are
///    uniform, so two different states collide with probability about
///    2^-256 in the lanes (2^-252 when a bug counts one triple twice, since
///    2·h is even), and 2^-128 after `seal` truncates to 128 bits;
///  - cost: one XXH3-128 call on 16 bytes takes ~3 ns here, and every write
///    hashes twice (old and new word). Two calls (4 lanes) keep the update
///    of a refit below the cost of its apply; 16 lanes would cost ~25 ns per
///    hash, several times the apply itself. BLAKE2b per element is ~150 ns;
///  - more lanes would not buy collision resistance against someone who
///    chooses weights: XXH3 is not a PRF, and LtHash-grade resistance to
///    generalised-birthday and lattice attacks needs states of kilobytes
///    (Lewi et al., 2019). The digest makes no such claim (docs/protocol.md).
/// Zero words are "absent": the digest of zero-filled storage is the empty
/// set, so a fresh store costs nothing to digest and padding adds nothing.
/// The layout (regions, dtypes, shapes) is bound separately by `seal`.

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>

#include "dcr/core/dtype.hpp"
#include "dcr/core/endian.hpp"
#include "dcr/core/hash.hpp"

namespace dcr {

/// 64-bit lanes of a set digest (see the file comment for the choice).
inline constexpr std::size_t set_digest_lanes = 4;

/// Per-region seeds of the element hash (a region: one parameter, one shard).
struct set_digest_key {
  std::uint64_t seed[set_digest_lanes / 2]{};
};

/// Key of a region from everything that names it: its name, dtype and shape
/// (a different layout gives unrelated element hashes).
inline set_digest_key region_key(std::string_view name, dtype_id dtype,
                                 std::span<const std::uint64_t> shape) noexcept {
  XXH3_state_t st;
  XXH3_INITSTATE(&st);
  XXH3_64bits_reset_withSeed(&st, 0x6463722d73657431ull); // "dcr-set1"
  XXH3_64bits_update(&st, name.data(), name.size());
  const std::uint8_t d = static_cast<std::uint8_t>(dtype);
  XXH3_64bits_update(&st, &d, 1);
  for (auto x : shape) {
    std::byte le[8];
    store_le(le, x);
    XXH3_64bits_update(&st, le, 8);
  }
  const std::uint64_t base = XXH3_64bits_digest(&st);
  set_digest_key k;
  for (std::size_t i = 0; i < set_digest_lanes / 2; ++i)
    k.seed[i] = base + 0x9E3779B97F4A7C15ull * (i + 1);
  return k;
}

/// Lane-wise sums of element hashes (see the file comment).
class set_digest {
public:
  using lanes = std::array<std::uint64_t, set_digest_lanes>;

  /// The element hash of (position, word) in region `k`.
  static lanes element(const set_digest_key& k, std::uint64_t position,
                       std::uint64_t word) noexcept {
    std::byte in[16];
    store_le(in, position);
    store_le(in + 8, word);
    lanes h;
    for (std::size_t i = 0; i < set_digest_lanes / 2; ++i) {
      const XXH128_hash_t x = XXH3_128bits_withSeed(in, sizeof in, k.seed[i]);
      h[2 * i] = x.low64;
      h[2 * i + 1] = x.high64;
    }
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
  /// every write goes through.
  void replace(const set_digest_key& k, std::uint64_t position, std::uint64_t before,
               std::uint64_t after) noexcept {
    if (before == after) return;
    remove(k, position, before);
    add(k, position, after);
  }
  /// Add every word of a contiguous region (`words[j]` at position `first + j`).
  template <class W>
  void add_words(const set_digest_key& k, std::span<const W> words,
                 std::uint64_t first = 0) noexcept {
    lanes acc{};
    for (std::size_t j = 0; j < words.size(); ++j) {
      if (words[j] == 0) continue;
      const auto h = element(k, first + j, words[j]);
      for (std::size_t i = 0; i < set_digest_lanes; ++i) acc[i] += h[i];
    }
    for (std::size_t i = 0; i < set_digest_lanes; ++i) s_[i] += acc[i];
  }
  /// As above over bytes holding little-endian words of `width` bytes.
  void add_bytes(const set_digest_key& k, std::span<const std::byte> bytes, std::size_t width,
                 std::uint64_t first = 0) noexcept {
    switch (width) {
    case 1:
      add_words(k, as_words<std::uint8_t>(bytes), first);
      break;
    case 2:
      add_words(k, as_words<std::uint16_t>(bytes), first);
      break;
    case 4:
      add_words(k, as_words<std::uint32_t>(bytes), first);
      break;
    default:
      add_words(k, as_words<std::uint64_t>(bytes), first);
      break;
    }
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
    static constexpr char tag[] = "dcr-state-digest 1";
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
