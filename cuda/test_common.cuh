#pragma once
// Test support for the CUDA kernel tests: a failure counter, the device
// skip (exit 77, which meson reports as SKIP), device buffers, and input
// generators with fixed seeds shared by every test.

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "dcr/core/error.hpp"
#include "dcr/gpu/runtime.cuh"

namespace dcr::gpu::test {

inline int failures = 0;
inline int checks = 0;

inline void expect(bool ok, const std::string& what, const char* file, int line) {
  ++checks;
  if (!ok) {
    ++failures;
    if (failures <= 20) std::fprintf(stderr, "%s:%d: FAILED: %s\n", file, line, what.c_str());
  }
}
#define DCR_EXPECT(cond, what) ::dcr::gpu::test::expect((cond), (what), __FILE__, __LINE__)

/// Expect status `s` to carry `code`.
inline void expect_code(const status& s, errc code, const std::string& what, const char* file,
                        int line) {
  expect(s.code == code,
         what + ": expected " + std::string(to_string(code)) + ", got " +
             std::string(to_string(s.code)) + " (" + s.message + ")",
         file, line);
}
#define DCR_EXPECT_CODE(s, code, what)                                                             \
  ::dcr::gpu::test::expect_code((s), ::dcr::errc::code, (what), __FILE__, __LINE__)

/// Print a summary and return the process exit code (0 or 1).
inline int finish(const char* name) {
  std::printf("%s: %d checks, %d failures\n", name, checks, failures);
  return failures == 0 ? 0 : 1;
}

/// Exit 77 (skip) when no device is present, after the host-side part ran.
inline void skip_without_device(const char* name) {
  if (device_count() > 0) return;
  if (failures != 0) std::exit(finish(name));
  std::printf("%s: host-side checks passed (%d); no CUDA device: skipping %s device part\n", name,
              checks, name);
  std::exit(77);
}

/// Free device memory in bytes (0 when unknown).
inline std::size_t free_device_bytes() {
  std::size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
    clear_last_error();
    return 0;
  }
  return free;
}

/// Owning device buffer of `n` elements; aborts the test on CUDA errors
/// (a broken device makes every later check meaningless).
template <class T>
class dbuf {
public:
  explicit dbuf(std::size_t n = 0) : n_(n) {
    if (n > 0) must(cudaMalloc(&p_, n * sizeof(T)), "cudaMalloc");
  }
  explicit dbuf(const std::vector<T>& h) : dbuf(h.size()) { upload(h); }
  dbuf(const dbuf&) = delete;
  dbuf& operator=(const dbuf&) = delete;
  ~dbuf() {
    if (p_ != nullptr) cudaFree(p_);
  }
  void upload(const std::vector<T>& h) {
    if (!h.empty())
      must(cudaMemcpy(p_, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
  }
  std::vector<T> download() const {
    std::vector<T> h(n_);
    if (n_ > 0) must(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return h;
  }
  /// The first `count` elements (count <= size()).
  std::vector<T> download_prefix(std::size_t count) const {
    std::vector<T> h(count < n_ ? count : n_);
    if (!h.empty())
      must(cudaMemcpy(h.data(), p_, h.size() * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return h;
  }
  T* get() const noexcept { return p_; }
  std::size_t size() const noexcept { return n_; }

  static void must(cudaError_t e, const char* what) {
    if (e != cudaSuccess) {
      std::fprintf(stderr, "CUDA failure in test (%s): %s\n", what, cudaGetErrorString(e));
      std::exit(1);
    }
  }

private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

/// Random words filling `n` elements (fast for multi-GiB buffers).
template <class W>
std::vector<W> random_words(std::size_t n, std::uint64_t seed) {
  std::vector<W> v(n);
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& w : v) {
    x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
    w = static_cast<W>((x * 0x2545F4914F6CDD1Dull) >> 32);
  }
  return v;
}

/// Sorted distinct locations in [0, n) with per-element probability
/// `density` (geometric skips, so sparse lists over huge n are cheap).
inline std::vector<std::uint64_t> random_locations(std::uint64_t n, double density,
                                                   std::uint64_t seed) {
  std::vector<std::uint64_t> out;
  if (density <= 0 || n == 0) return out;
  if (density >= 1) {
    out.resize(n);
    for (std::uint64_t i = 0; i < n; ++i) out[i] = i;
    return out;
  }
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const double l = std::log1p(-density);
  out.reserve(static_cast<std::size_t>(static_cast<double>(n) * density * 1.1) + 16);
  std::uint64_t i = 0;
  for (;;) {
    const double skip = std::floor(std::log1p(-u(rng)) / l);
    if (skip >= static_cast<double>(n - i)) break;
    i += static_cast<std::uint64_t>(skip);
    out.push_back(i);
    if (++i >= n) break;
  }
  return out;
}

/// Densities every test sweeps: 0, 0.1%, 1%, 5%, 50%, 100%.
inline const double densities[] = {0.0, 0.001, 0.01, 0.05, 0.5, 1.0};

/// Bytes of two buffers equal.
template <class W>
bool same_bytes(const std::vector<W>& a, const std::vector<W>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(W)) == 0);
}

} // namespace dcr::gpu::test
