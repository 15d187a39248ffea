// dcr-bench-cuda: achieved bandwidth of the device kernels (XOR scatter and
// masked overwrite at 1% and 5% density, change detection) on >= 4 GiB of
// BF16 words, as % of the device's peak (memory clock x bus width) and of a
// device-to-device memcpy measured in the same run; host twins beside.
//
// Bytes touched count DRAM traffic at 32-byte sector granularity: streamed
// buffers in full, scattered words as the distinct sectors they touch (read
// and written for XOR, written for overwrite). The table also gives the
// logical bytes (words read and written).
//
// Without a CUDA device it prints why and exits 77 (reported as a skip by
// meson and as "not measured" by scripts/bench-docs.sh).

#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "dcr/gpu/copy.cuh"
#include "dcr/gpu/detect.cuh"
#include "dcr/gpu/scatter.cuh"
#include "dcr/twin/copy.hpp"
#include "dcr/twin/detect.hpp"
#include "dcr/twin/scatter.hpp"
#include "test_common.cuh"

using namespace dcr;
using dcr::gpu::test::dbuf;
using dcr::gpu::test::random_locations;
using dcr::gpu::test::random_words;
using W = std::uint16_t; // BF16 words

namespace {

struct row {
  std::string kernel;
  double density_pct;
  std::uint64_t elements;
  double sector_bytes, logical_bytes, seconds, host_seconds;
};

void must(const status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "dcr-bench-cuda: %s failed: %s\n", what, s.message.c_str());
    std::exit(1);
  }
}

/// Best device time in seconds of `reps` runs of `f` (after one warm-up), by CUDA events.
template <class F>
double device_seconds(int reps, F&& f) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  f();
  must(dcr::gpu::synchronize(), "warm-up");
  float best = 1e30f;
  for (int r = 0; r < reps; ++r) {
    cudaEventRecord(a);
    f();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    best = std::min(best, ms);
  }
  must(dcr::gpu::synchronize(), "timed runs");
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return best / 1e3;
}

/// Distinct 32-byte sectors holding the words at sorted `loc`.
std::uint64_t sectors(const std::vector<std::uint64_t>& loc) {
  std::uint64_t n = 0, last = ~0ull;
  for (auto l : loc)
    if (const auto s = l * sizeof(W) / 32; s != last) ++n, last = s;
  return n;
}

} // namespace

int main(int argc, char** argv) {
  const auto opt = bench::options::parse(argc, argv);
  std::string json_file; // --json-file=PATH: also write the JSON there (one run, both outputs)
  for (const auto& a : opt.rest)
    if (a.rfind("--json-file=", 0) == 0) json_file = a.substr(12);
  if (dcr::gpu::device_count() == 0) {
    const char* none = "{\"device\":null,\"unmeasured\":\"no CUDA device\",\"rows\":[]}\n";
    if (opt.json) std::cout << none;
    if (!json_file.empty()) std::ofstream(json_file) << none;
    std::cerr << "dcr-bench-cuda: no CUDA device on this machine: unmeasured (run "
                 "scripts/gpu-check.sh on a GPU machine)\n";
    return 77;
  }
  int dev = 0, clock_khz = 0, bus_bits = 0, sms = 0;
  cudaDeviceProp prop{};
  cudaGetDevice(&dev);
  cudaGetDeviceProperties(&prop, dev);
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, dev);
  cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  const double peak = 2.0 * clock_khz * 1e3 * bus_bits / 8.0; // bytes/s, double data rate
  const std::string device_name = std::string(prop.name) + ", " + std::to_string(sms) + " SMs, " +
                                  std::to_string(prop.totalGlobalMem >> 30) + " GiB";

  const int reps = opt.quick ? 2 : 5;
  std::uint64_t n = opt.quick ? (1ull << 24) : (1ull << 31); // 32 MiB or 4 GiB of BF16 words
  const std::size_t free_bytes = dcr::gpu::test::free_device_bytes();
  // Detection needs old + new + a worst-case index buffer of 8 bytes per word.
  while (n > (1ull << 20) && (2 * sizeof(W) + 8) * n + (1ull << 30) > free_bytes) n /= 2;
  const double gib = static_cast<double>(n * sizeof(W)) / (1ull << 30);

  // Reference: device-to-device memcpy of the weights (read + write).
  double memcpy_bw = 0;
  {
    dbuf<W> a(n), b(n);
    const double s = device_seconds(
        reps, [&] { cudaMemcpyAsync(b.get(), a.get(), n * sizeof(W), cudaMemcpyDeviceToDevice); });
    memcpy_bw = 2.0 * n * sizeof(W) / s;
  }

  std::vector<row> rows;
  dcr::gpu::workspace ws;
  const auto init = random_words<W>(n, 1);
  const auto lin = twin::linear(static_cast<std::int64_t>(n));

  for (double d : {0.01, 0.05}) {
    const auto loc = random_locations(n, d, 2);
    const auto masks = random_words<W>(loc.size(), 3);
    const double k = static_cast<double>(loc.size());
    const double sec = static_cast<double>(sectors(loc)) * 32;
    dbuf<W> dst(init);
    dbuf<W> d_masks(masks);
    {
      dbuf<std::uint64_t> d_loc(loc);
      const double s = device_seconds(reps, [&] {
        must(dcr::gpu::xor_scatter<W>({dst.get(), lin}, d_loc.get(), d_masks.get(), loc.size(), ws),
             "xor_scatter");
      });
      auto host = init;
      const double hs = bench::best_seconds(2, [&] {
        must(twin::xor_scatter<W>({host.data(), lin}, loc, masks), "twin");
      });
      // Locations read twice (check, scatter), masks once, dst sectors read and written.
      rows.push_back({"xor_scatter", d * 100, n, k * (16 + sizeof(W)) + 2 * sec,
                      k * (16 + 3 * sizeof(W)), s, hs});
    }
    {
      std::vector<std::uint8_t> gaps;
      std::uint64_t maxgap = 0;
      for (std::size_t i = 1; i < loc.size(); ++i)
        maxgap = std::max(maxgap, loc[i] - loc[i - 1] - 1);
      const unsigned w = twin::gap_width_for(maxgap);
      for (std::size_t i = 1; i < loc.size(); ++i)
        for (unsigned b = 0; b < w; ++b)
          gaps.push_back(static_cast<std::uint8_t>((loc[i] - loc[i - 1] - 1) >> (8 * b)));
      dbuf<std::uint8_t> d_gaps(gaps);
      const double s = device_seconds(reps, [&] {
        must(dcr::gpu::scatter_gaps<W>({dst.get(), lin}, loc[0], w, d_gaps.get(), gaps.size(),
                                       d_masks.get(), loc.size(), twin::scatter_op::xor_mask, ws),
             "scatter_gaps");
      });
      auto host = init;
      const double hs = bench::best_seconds(2, [&] {
        must(twin::scatter_gaps<W>({host.data(), lin}, loc[0], w, gaps, masks,
                                   twin::scatter_op::xor_mask),
             "twin");
      });
      // Gaps read by the scan; locations written by the scan, read by the check and the scatter.
      const double gb = static_cast<double>(gaps.size());
      rows.push_back({"xor_scatter_gaps", d * 100, n, gb + k * (24 + sizeof(W)) + 2 * sec,
                      gb + k * (24 + 3 * sizeof(W)), s, hs});
    }
  }

  for (double d : {0.01, 0.05}) {
    const W ph = dtype_traits<bf16>::placeholder;
    const auto act = random_locations(n, d, 4);
    auto src = std::vector<W>(n, ph);
    const auto v = random_words<W>(act.size(), 5);
    for (std::size_t i = 0; i < act.size(); ++i)
      src[act[i]] = v[i] == ph ? static_cast<W>(ph ^ 1) : v[i];
    dbuf<W> d_src(src);
    dbuf<W> dst(init);
    const double s = device_seconds(reps, [&] {
      must(dcr::gpu::masked_overwrite<W>({dst.get(), lin}, {d_src.get(), lin}, ph),
           "masked_overwrite");
    });
    auto host = init;
    const double hs = bench::best_seconds(2, [&] {
      must(twin::masked_overwrite<W>({host.data(), lin}, {src.data(), lin}, ph), "twin");
    });
    const double k = static_cast<double>(act.size());
    rows.push_back({"masked_overwrite", d * 100, n,
                    static_cast<double>(n * sizeof(W)) + static_cast<double>(sectors(act)) * 32,
                    static_cast<double>(n * sizeof(W)) + k * sizeof(W), s, hs});
  }

  for (double d : {0.01, 0.05}) {
    auto neu = init;
    const auto ch = random_locations(n, d, 6);
    for (auto i : ch) neu[i] = static_cast<W>(neu[i] ^ 1);
    dbuf<W> d_old(init), d_new(neu);
    dbuf<std::uint64_t> d_out(n);
    std::uint64_t changed = 0;
    const double s = device_seconds(reps, [&] {
      must(dcr::gpu::detect_changes<W>(d_old.get(), d_new.get(), n, 0, d_out.get(), changed, ws),
           "detect_changes");
    });
    if (changed != ch.size()) {
      std::fprintf(stderr, "dcr-bench-cuda: detect found %llu changes, %zu expected\n",
                   static_cast<unsigned long long>(changed), ch.size());
      return 1;
    }
    std::vector<std::uint64_t> out;
    out.reserve(ch.size());
    const double hs = bench::best_seconds(2, [&] {
      out.clear();
      must(twin::detect_changes<W>(init, neu, 0, out), "twin");
    });
    const double bytes = 2.0 * n * sizeof(W) + 8.0 * static_cast<double>(ch.size());
    rows.push_back({"detect_changes", d * 100, n, bytes, bytes, s, hs});
  }

  std::ostringstream js;
  {
    std::ostream& out = js;
    out << "{\"device\":" << bench::json_string(device_name) << ",\"peak_GBps\":" << peak / 1e9
        << ",\"memcpy_GBps\":" << memcpy_bw / 1e9 << ",\"weights_GiB\":" << gib << ",\"rows\":[";
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const auto& r = rows[i];
      out << (i ? "," : "") << "{\"kernel\":" << bench::json_string(r.kernel)
          << ",\"density_pct\":" << r.density_pct
          << ",\"pct_of_peak\":" << 100.0 * r.sector_bytes / r.seconds / peak
          << ",\"pct_of_memcpy\":" << 100.0 * r.sector_bytes / r.seconds / memcpy_bw
          << ",\"GBps\":" << r.sector_bytes / r.seconds / 1e9
          << ",\"host_twin_GBps\":" << r.sector_bytes / r.host_seconds / 1e9 << "}";
    }
    out << "]}\n";
  }
  if (!json_file.empty()) std::ofstream(json_file) << js.str();
  if (opt.json) {
    std::cout << js.str();
    return 0;
  }
  bench::table t({"kernel", "density %", "weights GiB", "touched GiB", "logical GiB", "ms", "GB/s",
                  "% of peak", "% of memcpy", "host twin GB/s", "device / host"});
  for (const auto& r : rows)
    t.add({r.kernel, bench::fmt(r.density_pct, 0), bench::fmt(gib, 2),
           bench::fmt(r.sector_bytes / (1ull << 30), 3),
           bench::fmt(r.logical_bytes / (1ull << 30), 3), bench::fmt(r.seconds * 1e3, 3),
           bench::fmt(r.sector_bytes / r.seconds / 1e9, 1),
           bench::fmt(100.0 * r.sector_bytes / r.seconds / peak, 1),
           bench::fmt(100.0 * r.sector_bytes / r.seconds / memcpy_bw, 1),
           bench::fmt(r.sector_bytes / r.host_seconds / 1e9, 2),
           bench::fmt(r.host_seconds / r.seconds, 1)});
  if (opt.markdown) std::cout << "\n## CUDA kernels (`dcr-bench-cuda`)\n\n";
  std::cout << "device: " << device_name << "; peak " << bench::fmt(peak / 1e9, 0)
            << " GB/s (memory clock x bus width), "
            << "device-to-device memcpy " << bench::fmt(memcpy_bw / 1e9, 0) << " GB/s\n"
            << (opt.markdown ? "\n" : "") << "host: " << bench::machine_description() << "\n"
            << (opt.markdown ? "\n" : "") << "weights: " << n << " BF16 words ("
            << bench::fmt(gib, 2) << " GiB); best of " << reps
            << "; touched = DRAM bytes at 32-byte sectors\n\n";
  t.print(std::cout, opt.markdown);
  return 0;
}
