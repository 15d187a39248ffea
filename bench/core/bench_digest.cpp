// dcr-bench-digest: cost of the state digest's element hash per changed word,
// the update a receiver's sink makes for every write (h(before) out,
// h(after) in; core/set_digest.hpp).
//
// Input: 2^20 writes (--quick: 2^14) at uniform random positions of a
// 2^28-word region, random nonzero BF16 words before and after (zero-extended,
// as sinks pass them), folded in batches of 256 as `checked_sink` does.
// References, kept here for the comparison only: digest version 1's element
// hash (two XXH3-128 calls per word, four per write) and version 2's
// (splitmix64 and fmix64 finalisers over four 64-bit lanes, 24 64-bit
// multiplies per write; one write at a time, and 4 per step with AVX2 where
// the CPU has it, as version 2 ran there). Rows of version 3 (four AES
// rounds per word, core/set_digest.hpp): `replace` one write at a time,
// `replace_batch` portable (table-driven rounds), `replace_batch` with
// AES instructions (AES-NI or ARMv8's, where the CPU has them), and `add_words` (a full
// recomputation, one word hashed per position, ns per word). Best of 7 runs; ns per write and
// ratios to the references.

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "dcr/core/hash.hpp"
#include "dcr/core/set_digest.hpp"
#include "examples/common/simulator.hpp"

namespace {

using namespace dcr;

/// Digest version 1's element hash: lanes 2i, 2i+1 = XXH3-128 of the 16
/// bytes (position, word) seeded by seed i.
void v1_replace(std::array<std::uint64_t, 4>& s, const std::uint64_t seed[2], std::uint64_t pos,
                std::uint64_t before, std::uint64_t after) {
  auto elem = [&](std::uint64_t w, bool add) {
    if (w == 0) return;
    std::byte in[16];
    store_le(in, pos);
    store_le(in + 8, w);
    for (int i = 0; i < 2; ++i) {
      const XXH128_hash_t x = XXH3_128bits_withSeed(in, sizeof in, seed[i]);
      s[2 * i] += add ? x.low64 : 0 - x.low64;
      s[2 * i + 1] += add ? x.high64 : 0 - x.high64;
    }
  };
  if (before == after) return;
  elem(before, false);
  elem(after, true);
}

/// Digest version 2's element hash (kept for the comparison): lane i of
/// (p, w) is F(G(p ^ s_i) ^ w), G the splitmix64 finaliser, F MurmurHash3's
/// fmix64, four lanes.
namespace v2 {
constexpr std::uint64_t mix_g(std::uint64_t x) { return detail::splitmix64_mix(x); }
constexpr std::uint64_t mix_f(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xFF51AFD7ED558CCDull;
  x ^= x >> 33;
  x *= 0xC4CEB9FE1A85EC53ull;
  x ^= x >> 33;
  return x;
}
void replace(std::array<std::uint64_t, 4>& s, const std::uint64_t seed[4], std::uint64_t p,
             std::uint64_t before, std::uint64_t after) {
  if (before == after) return;
  for (std::size_t i = 0; i < 4; ++i) {
    const auto u = mix_g(p ^ seed[i]);
    if (after != 0) s[i] += mix_f(u ^ after);
    if (before != 0) s[i] -= mix_f(u ^ before);
  }
}
#ifdef DCR_SET_DIGEST_AESNI
#define DCR_BENCH_AVX2 __attribute__((target("avx2")))
/// x * m modulo 2^64 on 4 words from three 32 x 32 -> 64-bit multiplies.
DCR_BENCH_AVX2 inline __m256i mul_x4(__m256i x, __m256i m_lo, __m256i m_hi) {
  const __m256i lo = _mm256_mul_epu32(x, m_lo);
  const __m256i cross =
      _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(x, 32), m_lo), _mm256_mul_epu32(x, m_hi));
  return _mm256_add_epi64(lo, _mm256_slli_epi64(cross, 32));
}
DCR_BENCH_AVX2 inline __m256i xorshift_x4(__m256i x, int shift) {
  return _mm256_xor_si256(x, _mm256_srl_epi64(x, _mm_cvtsi32_si128(shift)));
}
/// F on 4 words.
DCR_BENCH_AVX2 inline __m256i mix_f_x4(__m256i x, const __m256i* lo, const __m256i* hi) {
  x = mul_x4(xorshift_x4(x, 33), lo[2], hi[2]);
  x = mul_x4(xorshift_x4(x, 33), lo[3], hi[3]);
  return xorshift_x4(x, 33);
}
/// Version 2's AVX2 batch: 4 writes per step, every lane.
DCR_BENCH_AVX2 void replace_batch_avx2(std::array<std::uint64_t, 4>& s, const std::uint64_t seed[4],
                                       const std::uint64_t* position, const std::uint64_t* before,
                                       const std::uint64_t* after, std::size_t n) {
  constexpr std::uint64_t m[4] = {0xBF58476D1CE4E5B9ull, 0x94D049BB133111EBull,
                                  0xFF51AFD7ED558CCDull, 0xC4CEB9FE1A85EC53ull};
  __m256i lo[4], hi[4], acc[4], sd[4];
  for (int i = 0; i < 4; ++i) {
    lo[i] = _mm256_set1_epi64x(static_cast<long long>(m[i] & 0xFFFFFFFFu));
    hi[i] = _mm256_set1_epi64x(static_cast<long long>(m[i] >> 32));
    acc[i] = _mm256_setzero_si256();
    sd[i] = _mm256_set1_epi64x(static_cast<long long>(seed[i]));
  }
  const __m256i zero = _mm256_setzero_si256();
  for (std::size_t j = 0; j + 4 <= n; j += 4) { // n is a multiple of 4 here
    const __m256i p = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(position + j));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(before + j));
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(after + j));
    for (int i = 0; i < 4; ++i) {
      __m256i u = mul_x4(xorshift_x4(_mm256_xor_si256(p, sd[i]), 30), lo[0], hi[0]);
      u = xorshift_x4(mul_x4(xorshift_x4(u, 27), lo[1], hi[1]), 31);
      acc[i] =
          _mm256_add_epi64(acc[i], _mm256_andnot_si256(_mm256_cmpeq_epi64(a, zero),
                                                       mix_f_x4(_mm256_xor_si256(u, a), lo, hi)));
      acc[i] =
          _mm256_sub_epi64(acc[i], _mm256_andnot_si256(_mm256_cmpeq_epi64(b, zero),
                                                       mix_f_x4(_mm256_xor_si256(u, b), lo, hi)));
    }
  }
  for (int i = 0; i < 4; ++i) {
    alignas(32) std::uint64_t part[4];
    _mm256_store_si256(reinterpret_cast<__m256i*>(part), acc[i]);
    for (auto x : part) s[i] += x;
  }
}
#endif
} // namespace v2

double best_seconds(int reps, const std::function<void()>& f) {
  double best = 1e300;
  for (int r = 0; r <= reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    const auto t1 = std::chrono::steady_clock::now();
    if (r > 0) best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
  }
  return best;
}

} // namespace

int main(int argc, char** argv) {
  const auto opt = bench::options::parse(argc, argv);
  const std::size_t n = opt.quick ? (1u << 14) : (1u << 20);
  const int reps = 7;
  constexpr std::size_t batch = 256;
  dcr::sim::splitmix64 g{0xD16E57};
  std::vector<std::uint64_t> pos(n), before(n), after(n);
  for (std::size_t j = 0; j < n; ++j) {
    pos[j] = g.next() & ((1ull << 28) - 1);
    before[j] = 1 + g.next() % 0xFFFF;
    after[j] = before[j] ^ (1u << (g.next() & 7));
  }
  const auto key = region_key("model.layers.0.mlp.down_proj.weight", dtype_id::bf16,
                              std::vector<std::uint64_t>{1024, 2816});
  const std::uint64_t v1_seed[2] = {key.round_key[0], key.round_key[1]};
  const std::uint64_t v2_seed[4] = {key.round_key[0], key.round_key[1], key.round_key[2],
                                    key.round_key[3]};

  struct result {
    std::string name;
    double s;
  };
  std::vector<result> rows;
  rows.push_back({"v1: XXH3-128 x2 per word (reference)", best_seconds(reps, [&] {
                    std::array<std::uint64_t, 4> s{};
                    for (std::size_t j = 0; j < n; ++j)
                      v1_replace(s, v1_seed, pos[j], before[j], after[j]);
                    bench::do_not_optimize(s);
                  })});
  rows.push_back({"v2: G/F finalisers, one write at a time (reference)", best_seconds(reps, [&] {
                    std::array<std::uint64_t, 4> s{};
                    for (std::size_t j = 0; j < n; ++j)
                      v2::replace(s, v2_seed, pos[j], before[j], after[j]);
                    bench::do_not_optimize(s);
                  })});
  std::size_t v2_row = 1; // the path version 2 ran on this CPU
#ifdef DCR_SET_DIGEST_AESNI
  if (__builtin_cpu_supports("avx2")) {
    rows.push_back({"v2: AVX2, 4 writes per step (reference)", best_seconds(reps, [&] {
                      std::array<std::uint64_t, 4> s{};
                      for (std::size_t j = 0; j < n; j += batch)
                        v2::replace_batch_avx2(s, v2_seed, &pos[j], &before[j], &after[j],
                                               std::min(batch, n - j));
                      bench::do_not_optimize(s);
                    })});
    v2_row = 2;
  }
#endif
  rows.push_back({"v3: replace, one write at a time", best_seconds(reps, [&] {
                    set_digest d;
                    for (std::size_t j = 0; j < n; ++j) d.replace(key, pos[j], before[j], after[j]);
                    bench::do_not_optimize(d.value());
                  })});
  rows.push_back({"v3: replace_batch, portable rounds", best_seconds(reps, [&] {
                    set_digest d;
                    for (std::size_t j = 0; j < n; j += batch)
                      d.replace_batch_portable(key, &pos[j], &before[j], &after[j],
                                               std::min(batch, n - j));
                    bench::do_not_optimize(d.value());
                  })});
#ifdef DCR_SET_DIGEST_AESNI
  const char* hardware_row = "v3: replace_batch, AES-NI";
#else
  const char* hardware_row = "v3: replace_batch, ARMv8 AES";
#endif
  if (set_digest::have_hardware_aes())
    rows.push_back({hardware_row, best_seconds(reps, [&] {
                      set_digest d;
                      for (std::size_t j = 0; j < n; j += batch)
                        d.replace_batch(key, &pos[j], &before[j], &after[j],
                                        std::min(batch, n - j));
                      bench::do_not_optimize(d.value());
                    })});
  rows.push_back({"v3: add_words (full recomputation, per word)", best_seconds(reps, [&] {
                    set_digest d;
                    d.add_words(key, std::span<const std::uint64_t>(after));
                    bench::do_not_optimize(d.value());
                  })});
  const double ref = rows[0].s;
  if (opt.json) {
    std::cout << "{\"machine\":" << bench::json_string(bench::machine_description())
              << ",\"writes\":" << n << ",\"rows\":[";
    for (std::size_t i = 0; i < rows.size(); ++i)
      std::cout << (i ? "," : "") << "{\"name\":" << bench::json_string(rows[i].name)
                << ",\"ns_per_write\":" << rows[i].s / static_cast<double>(n) * 1e9
                << ",\"ratio_to_v1\":" << rows[i].s / ref
                << ",\"ratio_to_v2\":" << rows[i].s / rows[v2_row].s << "}";
    std::cout << "]}\n";
    return 0;
  }
  std::cout << "State-digest update per changed word (h(before) out, h(after) in): " << n
            << " writes at random positions of a 2^28-word region, nonzero BF16 words, batches of "
            << batch << "; ratio to v2: to the " << rows[v2_row].name
            << ".\nMachine: " << bench::machine_description() << ". Best of " << reps
            << " runs.\n\n";
  bench::table t({"element hash / path", "ns per write", "ratio to v1", "ratio to v2"});
  for (auto& r : rows)
    t.add({r.name, bench::fmt(r.s / static_cast<double>(n) * 1e9, 2), bench::fmt(r.s / ref, 3),
           bench::fmt(r.s / rows[v2_row].s, 3)});
  t.print(std::cout, opt.markdown);
  return 0;
}
