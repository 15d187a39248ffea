#pragma once
/// \file
/// Shared bench plumbing: command-line flags (--json, --markdown), the machine
/// description every bench prints, a best-of-N timer, a memcpy reference
/// measured in the same process, the hardware floors the benches compare
/// against (streaming reads, touched-line read-modify-writes), aligned
/// tables, and the byte-for-byte check of a refit against a dense refit.

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "support/report.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDA_ARCH__)
#include <immintrin.h>
#endif

namespace dcr::bench {

/// Output mode chosen on the command line.
struct options {
  bool json = false;     ///< machine-readable JSON on stdout
  bool markdown = false; ///< a Markdown section for docs/benchmarks.md
  bool quick = false;    ///< smaller inputs (smoke runs in tests)
  std::vector<std::string> rest;

  static options parse(int argc, char** argv) {
    options o;
    for (int i = 1; i < argc; ++i) {
      std::string_view a = argv[i];
      if (a == "--json")
        o.json = true;
      else if (a == "--markdown")
        o.markdown = true;
      else if (a == "--quick")
        o.quick = true;
      else
        o.rest.emplace_back(a);
    }
    return o;
  }
};

/// Where the storage of two receivers differs, or "" when it is equal byte for
/// byte (same parameters in the same order, same bytes). A bench compares
/// every refit it timed with a dense refit of the same candidate through the
/// same loader, outside the timed region: a figure is only published for a
/// refit that was right. `Store` is a `parameter_store` (`receiver::storage()`).
template <class Store>
std::string storage_difference(const Store& got, const Store& want) {
  if (got.size() != want.size())
    return std::to_string(got.size()) + " parameters, the dense refit has " +
           std::to_string(want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    const auto& a = got[i];
    const auto& b = want[i];
    if (a.meta.name != b.meta.name)
      return "parameter " + std::to_string(i) + " is " + a.meta.name + ", the dense refit's " +
             b.meta.name;
    if (a.bytes == b.bytes) continue;
    if (a.bytes.size() != b.bytes.size())
      return a.meta.name + ": " + std::to_string(a.bytes.size()) + " bytes, the dense refit's " +
             std::to_string(b.bytes.size());
    const auto m = std::mismatch(a.bytes.begin(), a.bytes.end(), b.bytes.begin());
    return a.meta.name + " differs from the dense refit at byte " +
           std::to_string(m.first - a.bytes.begin()) + " of " + std::to_string(a.bytes.size());
  }
  return {};
}

/// Best wall time in seconds of `reps` runs of `f` (after one warm-up run).
inline double best_seconds(int reps, const std::function<void()>& f) {
  f();
  double best = 1e300;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
  }
  return best;
}

/// Seconds for memcpy of `bytes` bytes between two distinct buffers (best of reps).
inline double memcpy_seconds(std::size_t bytes, int reps = 5) {
  std::vector<unsigned char> a(bytes, 1), b(bytes, 2);
  return best_seconds(reps, [&] {
    std::memcpy(b.data(), a.data(), bytes);
    asm volatile("" ::"r"(b.data()) : "memory");
  });
}

/// Prevent the optimiser from discarding a computed value.
template <class T>
inline void do_not_optimize(const T& v) {
  asm volatile("" ::"g"(&v) : "memory");
}

// ---- Floors: the memory traffic an operation cannot avoid, measured -------
//
// Each floor does only the loads (and stores) the operation must do, with the
// widest vectors this CPU has, and folds what it read into a value the caller
// passes to do_not_optimize, so the compiler cannot drop the reads.

namespace detail {
inline std::uint64_t or_xor_scalar(const std::byte* a, const std::byte* b, std::size_t bytes) {
  std::uint64_t acc[4] = {0, 0, 0, 0};
  std::size_t i = 0;
  for (; i + 32 <= bytes; i += 32)
    for (int k = 0; k < 4; ++k) {
      std::uint64_t x, y;
      std::memcpy(&x, a + i + 8 * k, 8);
      std::memcpy(&y, b + i + 8 * k, 8);
      acc[k] |= x ^ y;
    }
  for (; i < bytes; ++i) acc[0] |= std::to_integer<std::uint64_t>(a[i] ^ b[i]);
  return acc[0] | acc[1] | acc[2] | acc[3];
}
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDA_ARCH__)
#define DCR_BENCH_X86 1
/// Software prefetch distance of the prefetching variant (as detect.hpp's scan).
inline constexpr std::size_t floor_prefetch_bytes = 8192;
inline void prefetch_ahead(const std::byte* p) {
  const auto at =
      reinterpret_cast<std::uintptr_t>(p) + floor_prefetch_bytes; // may lie past the end
  __builtin_prefetch(reinterpret_cast<const void*>(at), 0, 2);
  __builtin_prefetch(reinterpret_cast<const void*>(at + 64), 0, 2);
}
template <bool Prefetch>
__attribute__((target("avx512f"))) inline std::uint64_t
or_xor_avx512(const std::byte* a, const std::byte* b, std::size_t bytes) {
  __m512i acc0 = _mm512_setzero_si512(), acc1 = acc0;
  std::size_t i = 0;
  for (; i + 128 <= bytes; i += 128) {
    if constexpr (Prefetch) {
      prefetch_ahead(a + i);
      prefetch_ahead(b + i);
    }
    acc0 = _mm512_or_si512(acc0,
                           _mm512_xor_si512(_mm512_loadu_si512(a + i), _mm512_loadu_si512(b + i)));
    acc1 = _mm512_or_si512(
        acc1, _mm512_xor_si512(_mm512_loadu_si512(a + i + 64), _mm512_loadu_si512(b + i + 64)));
  }
  alignas(64) std::uint64_t lanes[8];
  _mm512_store_si512(lanes, _mm512_or_si512(acc0, acc1));
  std::uint64_t r = or_xor_scalar(a + i, b + i, bytes - i);
  for (auto l : lanes) r |= l;
  return r;
}
template <bool Prefetch>
__attribute__((target("avx2"))) inline std::uint64_t
or_xor_avx2(const std::byte* a, const std::byte* b, std::size_t bytes) {
  __m256i acc0 = _mm256_setzero_si256(), acc1 = acc0;
  std::size_t i = 0;
  for (; i + 64 <= bytes; i += 64) {
    if constexpr (Prefetch)
      if (i % 128 == 0) {
        prefetch_ahead(a + i);
        prefetch_ahead(b + i);
      }
    const auto* pa = reinterpret_cast<const __m256i*>(a + i);
    const auto* pb = reinterpret_cast<const __m256i*>(b + i);
    acc0 = _mm256_or_si256(acc0, _mm256_xor_si256(_mm256_loadu_si256(pa), _mm256_loadu_si256(pb)));
    acc1 = _mm256_or_si256(
        acc1, _mm256_xor_si256(_mm256_loadu_si256(pa + 1), _mm256_loadu_si256(pb + 1)));
  }
  alignas(32) std::uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), _mm256_or_si256(acc0, acc1));
  std::uint64_t r = or_xor_scalar(a + i, b + i, bytes - i);
  for (auto l : lanes) r |= l;
  return r;
}
#endif
} // namespace detail

/// OR over `bytes` of `a[i] ^ b[i]` (64-bit lanes): reads both buffers once,
/// streaming, and writes nothing. The detection floor. `prefetch`: also
/// prefetch 8 KiB ahead into L2 (which of the two is faster depends on the
/// machine and its load; the detection bench takes the better).
inline std::uint64_t read_both(const void* a, const void* b, std::size_t bytes,
                               bool prefetch = false) {
  const auto* pa = static_cast<const std::byte*>(a);
  const auto* pb = static_cast<const std::byte*>(b);
#if defined(DCR_BENCH_X86)
  static const int isa = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") ? 2 : __builtin_cpu_supports("avx2") ? 1 : 0;
  }();
  if (isa == 2)
    return prefetch ? detail::or_xor_avx512<true>(pa, pb, bytes)
                    : detail::or_xor_avx512<false>(pa, pb, bytes);
  if (isa == 1)
    return prefetch ? detail::or_xor_avx2<true>(pa, pb, bytes)
                    : detail::or_xor_avx2<false>(pa, pb, bytes);
#else
  (void)prefetch;
#endif
  return detail::or_xor_scalar(pa, pb, bytes);
}

/// OR over one buffer (read once, streaming).
inline std::uint64_t read_one(const void* a, std::size_t bytes) {
  // x ^ 0 keeps one code path; the zero side is a small buffer reread from L1.
  static const std::vector<std::byte> zeros(4096);
  const auto* p = static_cast<const std::byte*>(a);
  std::uint64_t r = 0;
  for (std::size_t off = 0; off < bytes; off += zeros.size())
    r |= read_both(p + off, zeros.data(), std::min(zeros.size(), bytes - off));
  return r;
}

/// The 64-byte lines of a buffer that hold a change: bit k of `bits` is set
/// when the bytes of `before` and `after` that fall in line k differ. Lines
/// are those of the address space: `head` is the buffer's address modulo 64,
/// so line 0 holds the buffer's first `64 - head` bytes.
struct line_set {
  std::vector<std::uint64_t> bits;
  std::size_t lines = 0; ///< lines the buffer spans
  std::size_t count = 0; ///< set bits

  static line_set diff(const std::byte* before, const std::byte* after, std::size_t bytes,
                       std::size_t head) {
    line_set s;
    s.lines = (head + bytes + 63) / 64;
    s.bits.assign((s.lines + 63) / 64, 0);
    for (std::size_t k = 0; k < s.lines; ++k) {
      const std::size_t lo = k == 0 ? 0 : 64 * k - head;
      const std::size_t hi = std::min(bytes, 64 * (k + 1) - head);
      if (lo < hi && std::memcmp(before + lo, after + lo, hi - lo) != 0) {
        s.bits[k / 64] |= std::uint64_t{1} << (k % 64);
        ++s.count;
      }
    }
    return s;
  }
};

/// One 64-bit word in every line of `lines` in `buf` (64-byte aligned,
/// holding `lines.lines` lines), in address order: read-modify-written
/// (`Store` false) or only stored (`Store` true; the CPU still reads each line
/// for ownership and writes it back, but no load waits on memory, so more
/// lines are in flight). Either is the line traffic of an apply that touches
/// exactly those lines. `delta` comes from the caller at run time so the
/// stores cannot be folded away.
template <bool Store = false>
inline void touch_lines(std::byte* buf, const line_set& lines, std::uint64_t delta) {
  const std::uint64_t* bits = lines.bits.data();
  const std::size_t words = lines.bits.size();
  for (std::size_t w = 0; w < words; ++w)
    for (std::uint64_t m = bits[w]; m != 0; m &= m - 1) {
      auto* p = reinterpret_cast<std::uint64_t*>(
          buf + 64 * (64 * w + static_cast<std::size_t>(std::countr_zero(m))));
      if constexpr (Store)
        *p = delta;
      else
        *p += delta;
    }
}

using support::fmt;
using support::json_string;
using support::machine_description;
using support::table;

} // namespace dcr::bench
