// dcr-bench-digest: cost of the state digest's element hash per changed word,
// the update a receiver's sink makes for every write (h(before) out,
// h(after) in; core/set_digest.hpp).
//
// Input: 2^20 writes (--quick: 2^14) at uniform random positions of a
// 2^28-word region, random nonzero BF16 words before and after (zero-extended,
// as sinks pass them), folded in batches of 256 as `checked_sink` does.
// Reference: digest version 1's element hash, two XXH3-128 calls per word,
// four per write, kept here for the comparison only. Rows: `replace` one
// write at a time, `replace_batch` portable path, `replace_batch` AVX-512
// path (where the CPU has it). Best of 7 runs; ns per write and ratio to
// the reference.

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
void v1_replace(set_digest::lanes& s, const std::uint64_t seed[2], std::uint64_t pos,
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
  const std::uint64_t v1_seed[2] = {key.seed[0], key.seed[1]};

  struct result {
    std::string name;
    double s;
  };
  std::vector<result> rows;
  rows.push_back({"v1: XXH3-128 x2 per word (reference)", best_seconds(reps, [&] {
                    set_digest::lanes s{};
                    for (std::size_t j = 0; j < n; ++j)
                      v1_replace(s, v1_seed, pos[j], before[j], after[j]);
                    bench::do_not_optimize(s);
                  })});
  rows.push_back({"v2: replace, one write at a time", best_seconds(reps, [&] {
                    set_digest d;
                    for (std::size_t j = 0; j < n; ++j) d.replace(key, pos[j], before[j], after[j]);
                    bench::do_not_optimize(d.value());
                  })});
  rows.push_back({"v2: replace_batch, portable", best_seconds(reps, [&] {
                    set_digest d;
                    for (std::size_t j = 0; j < n; j += batch)
                      d.replace_batch_portable(key, &pos[j], &before[j], &after[j],
                                               std::min(batch, n - j));
                    bench::do_not_optimize(d.value());
                  })});
#ifdef DCR_SET_DIGEST_AVX512
  if (set_digest::have_avx2())
    rows.push_back({"v2: replace_batch, AVX2", best_seconds(reps, [&] {
                      set_digest d;
                      for (std::size_t j = 0; j < n; j += batch)
                        d.replace_batch_avx2(key, &pos[j], &before[j], &after[j],
                                             std::min(batch, n - j));
                      bench::do_not_optimize(d.value());
                    })});
  if (set_digest::have_avx512())
    rows.push_back({"v2: replace_batch, AVX-512", best_seconds(reps, [&] {
                      set_digest d;
                      for (std::size_t j = 0; j < n; j += batch)
                        d.replace_batch_avx512(key, &pos[j], &before[j], &after[j],
                                               std::min(batch, n - j));
                      bench::do_not_optimize(d.value());
                    })});
#endif
  const double ref = rows[0].s;
  if (opt.json) {
    std::cout << "{\"machine\":" << bench::json_string(bench::machine_description())
              << ",\"writes\":" << n << ",\"rows\":[";
    for (std::size_t i = 0; i < rows.size(); ++i)
      std::cout << (i ? "," : "") << "{\"name\":" << bench::json_string(rows[i].name)
                << ",\"ns_per_write\":" << rows[i].s / static_cast<double>(n) * 1e9
                << ",\"ratio_to_v1\":" << rows[i].s / ref << "}";
    std::cout << "]}\n";
    return 0;
  }
  std::cout << "State-digest update per changed word (h(before) out, h(after) in): " << n
            << " writes at random positions of a 2^28-word region, nonzero BF16 words, batches of "
            << batch << ".\nMachine: " << bench::machine_description() << ". Best of " << reps
            << " runs.\n\n";
  bench::table t({"element hash / path", "ns per write", "ratio to v1"});
  for (auto& r : rows)
    t.add({r.name, bench::fmt(r.s / static_cast<double>(n) * 1e9, 2), bench::fmt(r.s / ref, 3)});
  t.print(std::cout, opt.markdown);
  return 0;
}
