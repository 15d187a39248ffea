// The set digest (core/set_digest.hpp) by itself: its algebra (order-free,
// add and remove invert, zero words absent), the element hash's AES round
// checked against FIPS-197 and frozen known answers, and every path (the
// byte-wise reference, the table lookups, AES-NI or ARMv8's AES
// instructions, one write at a time or in batches) giving the same values.
// Built for the host as a unit suite, and by scripts/cross-aarch64-test.sh
// for ARMv8 (run under qemu-user), with DCR_TEST_NO_SEAL there: the seal is
// libb2's BLAKE2b, which that build does not link.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dcr/core/set_digest.hpp"

using namespace dcr;
TEST_CASE("set digest: order-free, add and remove invert, zero words absent, layout bound") {
  std::mt19937_64 rng(1);
  const auto k1 = region_key("a", dtype_id::bf16, std::vector<std::uint64_t>{8, 4});
  const auto k2 = region_key("b", dtype_id::bf16, std::vector<std::uint64_t>{8, 4});
  const auto k3 = region_key("a", dtype_id::f16, std::vector<std::uint64_t>{8, 4});
  const auto k4 = region_key("a", dtype_id::bf16, std::vector<std::uint64_t>{4, 8});
  CHECK(k1.round_key[0] != k2.round_key[0]);
  CHECK(k1.round_key[0] != k3.round_key[0]);
  CHECK(k1.round_key[0] != k4.round_key[0]);
  struct triple {
    int region;
    std::uint64_t pos, word;
  };
  const set_digest_key* keys[] = {&k1, &k2};
  std::vector<triple> ts;
  for (int i = 0; i < 500; ++i)
    ts.push_back({static_cast<int>(rng() % 2), rng() % 32, 1 + rng() % 0xFFFF});
  set_digest a, b;
  for (auto& t : ts) a.add(*keys[t.region], t.pos, t.word);
  std::shuffle(ts.begin(), ts.end(), rng);
  for (auto& t : ts) b.add(*keys[t.region], t.pos, t.word);
  CHECK(a == b);
  CHECK_FALSE(a.empty());
  for (auto& t : ts) b.remove(*keys[t.region], t.pos, t.word);
  CHECK(b.empty());
  set_digest z;
  z.add(k1, 3, 0);
  CHECK(z.empty());
  // replace == remove + add, and is a no-op for an unchanged word.
  set_digest r1, r2;
  r1.replace(k1, 5, 0x1234, 0x4321);
  r2.remove(k1, 5, 0x1234);
  r2.add(k1, 5, 0x4321);
  CHECK(r1 == r2);
  set_digest r3;
  r3.replace(k1, 5, 7, 7);
  CHECK(r3.empty());
  // Position, word and region all matter.
  set_digest p, q, w, g;
  p.add(k1, 1, 9);
  q.add(k1, 2, 9);
  w.add(k1, 1, 10);
  g.add(k2, 1, 9);
  CHECK(p != q);
  CHECK(p != w);
  CHECK(p != g);
  // Contiguous words equal single adds; the seal binds the layout.
  std::vector<std::uint16_t> words(100);
  for (auto& x : words) x = static_cast<std::uint16_t>(rng() % 4); // zeros included
  set_digest bulk, one;
  bulk.add_words(k1, std::span<const std::uint16_t>(words), 10);
  for (std::size_t j = 0; j < words.size(); ++j) one.add(k1, 10 + j, words[j]);
  CHECK(bulk == one);
#ifndef DCR_TEST_NO_SEAL
  const std::byte l1[] = {std::byte{1}}, l2[] = {std::byte{2}};
  CHECK(bulk.seal(l1) != bulk.seal(l2));
  CHECK(bulk.seal(l1) == one.seal(l1));
#endif
}

namespace {

/// AES-128 (FIPS-197) from `detail::aes_round`: the key schedule, nine
/// rounds and the last round without MixColumns, written here from the
/// standard so that the element hash's round is checked against the
/// standard's own test vector.
std::array<std::uint8_t, 16> aes128_encrypt(const std::uint8_t (&key)[16],
                                            const std::uint8_t (&plain)[16]) {
  const auto& sbox = detail::aes_sbox;
  std::uint8_t w[176];
  std::memcpy(w, key, 16);
  std::uint8_t rcon = 1;
  for (int i = 16; i < 176; i += 4) {
    std::uint8_t t[4] = {w[i - 4], w[i - 3], w[i - 2], w[i - 1]};
    if (i % 16 == 0) { // RotWord, SubWord, Rcon
      const std::uint8_t t0 = t[0];
      t[0] = static_cast<std::uint8_t>(sbox[t[1]] ^ rcon);
      t[1] = sbox[t[2]];
      t[2] = sbox[t[3]];
      t[3] = sbox[t0];
      rcon = static_cast<std::uint8_t>((rcon << 1) ^ ((rcon & 0x80) ? 0x1B : 0));
    }
    for (int k = 0; k < 4; ++k) w[i + k] = static_cast<std::uint8_t>(w[i - 16 + k] ^ t[k]);
  }
  std::uint8_t s[16], rk[16];
  for (int i = 0; i < 16; ++i) s[i] = static_cast<std::uint8_t>(plain[i] ^ w[i]);
  for (int r = 1; r < 10; ++r) {
    std::memcpy(rk, w + 16 * r, 16);
    detail::aes_round(s, rk);
  }
  std::array<std::uint8_t, 16> out{};
  for (int c = 0; c < 4; ++c)
    for (int r = 0; r < 4; ++r)
      out[r + 4 * c] =
          static_cast<std::uint8_t>(sbox[s[r + 4 * ((c + r) % 4)]] ^ w[160 + r + 4 * c]);
  return out;
}

} // namespace

TEST_CASE("set digest v3 element hash: the AES round checked by FIPS-197, frozen known answers") {
  // The S-box's published entries and FIPS-197 Appendix C.1 (AES-128).
  CHECK(detail::aes_sbox[0x00] == 0x63);
  CHECK(detail::aes_sbox[0x01] == 0x7C);
  CHECK(detail::aes_sbox[0x53] == 0xED);
  CHECK(detail::aes_sbox[0xFF] == 0x16);
  std::uint8_t key[16], plain[16];
  for (int i = 0; i < 16; ++i) {
    key[i] = static_cast<std::uint8_t>(i);
    plain[i] = static_cast<std::uint8_t>(i * 0x11);
  }
  const auto cipher = aes128_encrypt(key, plain);
  CHECK(to_hex(cipher) == "69c4e0d86a7b0430d8cdb78070b4c55a");
  // The key derivation's splitmix64 finaliser: splitmix64 from seed 0 yields
  // these published first outputs (Steele, Lea, Flood; Vigna's reference code).
  CHECK(detail::splitmix64_mix(0x9E3779B97F4A7C15ull) == 0xE220A8397B1DCDAFull);
  CHECK(detail::splitmix64_mix(2 * 0x9E3779B97F4A7C15ull) == 0x6E789E6AA1B965F4ull);
  CHECK(detail::splitmix64_mix(3 * 0x9E3779B97F4A7C15ull) == 0x06C45D188009454Full);
  // Frozen answers of digest version 3: a change here changes every state
  // digest, so it must come with a new version tag in `seal` and a new
  // commit-record version (docs/protocol.md, "State digests").
  const auto k = region_key("model.layers.0.mlp.down_proj.weight", dtype_id::bf16,
                            std::vector<std::uint64_t>{1024, 2816});
  const std::uint64_t key_want[10] = {
      0xAF7FE935CD39A54Eull, 0x8E8D012B19F5AB29ull, 0x579371393741B2A2ull, 0x33981E114563A397ull,
      0xF428C45C14A61F6Cull, 0x869EB73C736211E0ull, 0xA945EBD2CDC9963Eull, 0x60B5E5E9128BD9DEull,
      0x48288184658C2571ull, 0x2C9F594A0A187F8Aull};
  for (std::size_t i = 0; i < 10; ++i) CHECK(k.round_key[i] == key_want[i]);
  struct kat {
    std::uint64_t pos, word;
    set_digest::lanes want;
  };
  const kat kats[] = {
      {0ull, 0x1ull, {0x552EB4294A7C2DF3ull, 0x40F41FE5DF1F6714ull}},
      {1ull, 0x1ull, {0x50DFF59CE87F7597ull, 0x963EBE1FE6167D0Aull}},
      {0ull, 0x2ull, {0x7C6F1E0345B30019ull, 0x183814BEDC43FF90ull}},
      {12345ull, 0x3C01ull, {0xEC0C79F18B9391A7ull, 0x721CBDF60D70459Eull}},
      {2883583ull, 0xFFFFull, {0xE27A2850A54C88F0ull, 0x1D72858D631D95E5ull}},
      {1099511627776ull, 0x7FF8000000000000ull, {0x23D23166CC3D3AA9ull, 0x83BF1D045844F9B6ull}},
  };
  for (const auto& t : kats) {
    CHECK(set_digest::element_portable(k, t.pos, t.word) == t.want);
    CHECK(set_digest::element(k, t.pos, t.word) == t.want);
  }
  set_digest d;
  for (const auto& t : kats) d.add(k, t.pos, t.word);
  // The lanes: the sums of the answers above modulo 2^64.
  CHECK(d.value() == set_digest::lanes{0x14D69B7275CBF8E3ull, 0x02B9534C6A4CB8E7ull});
#ifndef DCR_TEST_NO_SEAL
  const std::byte layout[] = {std::byte{0x64}, std::byte{0x63}, std::byte{0x72}};
  CHECK(to_hex(d.seal(layout)) == "e62f50e5cb18038c83b6c9fea393c75c");
#endif
}

TEST_CASE("set digest v3 element hash: every lane tells apart neighbouring positions, "
          "other words and swapped pairs; the AES instructions equal the portable round") {
  std::mt19937_64 rng(7);
  if (!set_digest::have_hardware_aes())
    MESSAGE("no AES instructions (this CPU or this build): only the portable round runs");
  // The cross-built runs (scripts/cross-aarch64-test.sh) name the path they
  // must take, so that a build that silently fell back cannot pass.
  if (const char* want = std::getenv("DCR_EXPECT_HARDWARE_AES"))
    CHECK(set_digest::have_hardware_aes() == (std::string_view(want) == "1"));
  for (int round = 0; round < 2000; ++round) {
    const auto k = region_key("t" + std::to_string(round % 17), dtype_id::bf16,
                              std::vector<std::uint64_t>{rng() % 4096 + 1});
    const std::uint64_t p1 = rng() % (1ull << (1 + rng() % 40)), p2 = p1 + 1 + rng() % 3;
    const std::uint64_t w1 = 1 + rng() % 0xFFFF;
    std::uint64_t w2 = 1 + rng() % 0xFFFF;
    if (w2 == w1) w2 = w1 ^ 1;
    const auto h11 = set_digest::element(k, p1, w1), h12 = set_digest::element(k, p1, w2);
    const auto h21 = set_digest::element(k, p2, w1), h22 = set_digest::element(k, p2, w2);
    for (std::size_t i = 0; i < set_digest_lanes; ++i) {
      CHECK(h11[i] != h21[i]);                   // a neighbouring position
      CHECK(h11[i] != h12[i]);                   // another word
      CHECK(h11[i] + h22[i] != h12[i] + h21[i]); // two words swapped between two positions
      CHECK(h11[i] - h21[i] != h11[i] - h22[i]); // a write shifted by p2 - p1 and rewritten
      CHECK(h11[i] - h21[i] != h12[i] - h22[i]); // a write shifted by p2 - p1
    }
    // Position and word are not interchangeable.
    if (p1 != w1) CHECK(set_digest::element(k, p1, w1) != set_digest::element(k, w1, p1));
    // The lanes are not copies or shifts of each other.
    CHECK(h11[0] != h11[1]);
    CHECK(h11[0] - h21[0] != h11[1] - h21[1]);
    // Any 64-bit position and word (not just small ones): the hardware path
    // and the table lookups give the values of the round as FIPS-197 states it.
    const std::uint64_t p = rng(), w = rng();
    CHECK(set_digest::element_portable(k, p, w) == set_digest::element_reference(k, p, w));
    CHECK(set_digest::element(k, p, w) == set_digest::element_reference(k, p, w));
  }
}

TEST_CASE("set digest: replace_batch and add_batch (portable and AES instructions) equal one "
          "replace per write") {
  // Batch sizes that leave every tail length, with zero words (absent) and
  // unchanged words (which cancel) mixed in.
  std::mt19937_64 rng(11);
  const auto k = region_key("w", dtype_id::f32, std::vector<std::uint64_t>{64, 64});
  for (std::size_t n = 0; n < 300; n += 1 + n / 8) {
    std::vector<std::uint64_t> pos(n), before(n), after(n);
    for (std::size_t j = 0; j < n; ++j) {
      pos[j] = rng() % 4096;
      const auto r = rng() % 8;
      before[j] = r == 0 ? 0 : rng();                     // zero words are absent
      after[j] = r == 1 ? 0 : r == 2 ? before[j] : rng(); // an unchanged word cancels
    }
    set_digest one, portable;
    for (std::size_t j = 0; j < n; ++j) one.replace(k, pos[j], before[j], after[j]);
    CHECK(!(n > 8 && one.empty()));
    portable.replace_batch_portable(k, pos.data(), before.data(), after.data(), n);
    CHECK(portable == one);
    set_digest dispatched;
    dispatched.replace_batch(k, pos.data(), before.data(), after.data(), n);
    CHECK(dispatched == one);
    set_digest added, one_added;
    added.add_batch(k, pos.data(), after.data(), n);
    for (std::size_t j = 0; j < n; ++j) one_added.add(k, pos[j], after[j]);
    CHECK(added == one_added);
  }
}

TEST_CASE("set digest: replace_at equals one replace per changed position") {
  std::mt19937_64 rng(12);
  const auto k = region_key("w", dtype_id::bf16, std::vector<std::uint64_t>{4096});
  for (std::size_t n : {0u, 1u, 255u, 256u, 257u, 700u}) {
    std::vector<std::uint16_t> before(4096), after(4096);
    for (auto& w : before) w = static_cast<std::uint16_t>(rng() % 3 == 0 ? 0 : rng());
    after = before;
    std::vector<std::uint64_t> pos;
    for (std::uint64_t p = 0; p < 4096 && pos.size() < n; p += 1 + rng() % 5) pos.push_back(p);
    for (auto p : pos) after[p] = static_cast<std::uint16_t>(rng() % 4 == 0 ? 0 : rng());
    set_digest one, gathered;
    for (auto p : pos) one.replace(k, p, before[p], after[p]);
    gathered.replace_at<std::uint16_t>(k, pos, before, after);
    CHECK(gathered == one);
  }
}
