// dcr-bench-detect: bitwise change detection over BF16 words versus memcpy
// of the same bytes, measured in the same run.
//
// Input: two buffers of N BF16 words (old and new, 256 MiB each; --quick:
// 8 MiB). `new` differs from `old` at a uniform random fraction of positions.
// Floor: a streaming read of old and new with no output (an OR of their
// XOR, widest vectors available; the better of a plain and an L2-prefetching
// read), measured in the same run: the traffic
// detection cannot avoid. "x floor" = detect time / floor time.
// Reference: memcpy of one N-word buffer (what a dense refit copies per
// tensor). Detection reads both buffers; memcpy reads one and writes one, so
// both move 2N words through memory.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <span>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "dcr/core/detect.hpp"
#include "examples/common/simulator.hpp"

namespace {

using splitmix = dcr::sim::splitmix64;

struct row {
  double change_pct;
  std::size_t changed;
  std::size_t runs;
  double detect_s, runs_s, memcpy_s, memcpy2_s; ///< memcpy of one buffer, of both
  double floor_s;                               ///< streaming read of old and new
};

} // namespace

int main(int argc, char** argv) {
  using namespace dcr;
  const auto opt = bench::options::parse(argc, argv);
  const std::size_t n = opt.quick ? (std::size_t{4} << 20) : (std::size_t{128} << 20);
  const std::size_t bytes = n * sizeof(std::uint16_t);
  const int reps = opt.quick ? 3 : 9;

  std::vector<std::uint16_t> old_words(n), new_words(n), copy_dst(2 * n, 1);
  splitmix g{0xDE7EC7};
  for (auto& w : old_words) w = static_cast<std::uint16_t>(g.next());

  std::vector<row> rows;
  std::vector<std::uint64_t> idx;
  std::vector<index_run> runs;
  for (double pct : {0.1, 1.0, 5.0, 50.0}) {
    // Exact Bernoulli(pct/100) per word from 53 random bits.
    const auto threshold = static_cast<std::uint64_t>(pct / 100.0 * 0x1p53);
    new_words = old_words;
    for (auto& w : new_words) {
      const std::uint64_t r = g.next();
      if ((r >> 11) < threshold) w = static_cast<std::uint16_t>(w ^ ((r & 0x7FFu) | 1u));
    }
    std::span<const std::uint16_t> a(old_words), b(new_words);
    row r{pct, 0, 0, 1e300, 1e300, 1e300, 1e300, 1e300};
    // Interleaved repetitions, best of each: on a shared machine this keeps
    // the reference and the measured code under the same conditions.
    auto timed = [](double& best, auto&& f) {
      const auto t0 = std::chrono::steady_clock::now();
      f();
      const auto t1 = std::chrono::steady_clock::now();
      best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
    };
    for (int rep = 0; rep <= reps; ++rep) { // rep 0 warms up and is timed too (min is robust)
      timed(r.memcpy_s, [&] {
        std::memcpy(copy_dst.data(), new_words.data(), bytes);
        bench::do_not_optimize(copy_dst.data());
      });
      // The floor is the better of a plain and a prefetching read.
      for (bool prefetch : {false, true})
        timed(r.floor_s, [&] {
          bench::do_not_optimize(
              bench::read_both(old_words.data(), new_words.data(), bytes, prefetch));
        });
      timed(r.detect_s, [&] {
        idx.clear(); // capacity kept, as a streaming caller reuses its buffer
        detect_changes(a, b, 0, idx);
        bench::do_not_optimize(idx.data());
      });
      timed(r.memcpy2_s, [&] {
        std::memcpy(copy_dst.data(), old_words.data(), bytes);
        std::memcpy(copy_dst.data() + n, new_words.data(), bytes);
        bench::do_not_optimize(copy_dst.data());
      });
      timed(r.runs_s, [&] {
        runs.clear();
        detect_runs(a, b, 0, runs);
        bench::do_not_optimize(runs.data());
      });
    }
    r.changed = idx.size();
    r.runs = runs.size();
    rows.push_back(r);
  }

  auto gbps = [&](double s) { return 2.0 * static_cast<double>(bytes) / s / 1e9; };
  if (opt.json) {
    std::cout << "{\"machine\":" << bench::json_string(bench::machine_description())
              << ",\"isa\":" << bench::json_string(to_string(active_detect_isa()))
              << ",\"extract\":"
              << bench::json_string(to_string(default_detect_extract(active_detect_isa())))
              << ",\"words\":" << n << ",\"bytes_per_buffer\":" << bytes << ",\"rows\":[";
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const auto& r = rows[i];
      std::cout << (i ? "," : "") << "{\"change_pct\":" << r.change_pct
                << ",\"changed\":" << r.changed << ",\"runs\":" << r.runs
                << ",\"detect_ms\":" << r.detect_s * 1e3 << ",\"runs_ms\":" << r.runs_s * 1e3
                << ",\"memcpy_ms\":" << r.memcpy_s * 1e3
                << ",\"ratio_to_memcpy\":" << r.detect_s / r.memcpy_s
                << ",\"runs_ratio_to_memcpy\":" << r.runs_s / r.memcpy_s
                << ",\"memcpy_both_ms\":" << r.memcpy2_s * 1e3
                << ",\"ratio_to_memcpy_both\":" << r.detect_s / r.memcpy2_s
                << ",\"floor_ms\":" << r.floor_s * 1e3
                << ",\"ratio_to_floor\":" << r.detect_s / r.floor_s
                << ",\"runs_ratio_to_floor\":" << r.runs_s / r.floor_s << "}";
    }
    std::cout << "]}\n";
    return 0;
  }

  bench::table t({"change %", "changed", "runs", "floor ms", "memcpy ms", "detect ms",
                  "detect × floor", "detect/memcpy", "runs ms", "runs × floor", "runs/memcpy",
                  "memcpy both ms", "detect/memcpy both", "detect GB/s"});
  for (const auto& r : rows)
    t.add({bench::fmt(r.change_pct, 1), std::to_string(r.changed), std::to_string(r.runs),
           bench::fmt(r.floor_s * 1e3, 1), bench::fmt(r.memcpy_s * 1e3, 1),
           bench::fmt(r.detect_s * 1e3, 1), bench::fmt(r.detect_s / r.floor_s, 3),
           bench::fmt(r.detect_s / r.memcpy_s, 3), bench::fmt(r.runs_s * 1e3, 1),
           bench::fmt(r.runs_s / r.floor_s, 3), bench::fmt(r.runs_s / r.memcpy_s, 3),
           bench::fmt(r.memcpy2_s * 1e3, 1), bench::fmt(r.detect_s / r.memcpy2_s, 3),
           bench::fmt(gbps(r.detect_s), 1)});
  if (opt.markdown) std::cout << "\n## Change detection (`dcr-bench-detect`)\n\n";
  std::cout
      << (opt.markdown ? "" : "dcr-bench-detect: ") << (opt.markdown ? "Bitwise" : "bitwise")
      << " change detection of " << n << " BF16 words (" << bytes / (1 << 20)
      << " MiB per buffer, old and new) versus memcpy of one " << bytes / (1 << 20)
      << " MiB buffer (and of both buffers) in the same run; best of " << reps + 1
      << " interleaved runs; scan instruction set: " << to_string(active_detect_isa())
      << ", index extraction: " << to_string(default_detect_extract(active_detect_isa())) << ".\n"
      << (opt.markdown ? "\n" : "")
      << "Floor = a streaming read of old and new with no output (OR of their XOR in the widest "
         "vectors this CPU has; the better of a plain and an L2-prefetching read), measured in the "
         "same run; × floor = time / floor.\n"
      << (opt.markdown ? "\n" : "") << "Machine: " << bench::machine_description() << ".\n\n";
  t.print(std::cout, opt.markdown);
  std::cout
      << (opt.markdown ? "\n" : "")
      << "detect = changed indices (u64) appended to a reused vector; runs = maximal (start, "
         "count) "
         "runs; memcpy = one buffer (N bytes read, N written: the traffic of reading old and new); "
         "memcpy both = old and new copied (the same bytes the scan reads); GB/s counts both input "
         "buffers. Goal: detect × floor <= 1.1 at 1% and <= 1.3 at 5%.\n";
  return 0;
}
