#pragma once
/// \file
/// Shared bench plumbing: command-line flags (--json, --markdown), the machine
/// description every bench prints, a best-of-N timer, a memcpy reference
/// measured in the same process, and aligned tables.

#include <algorithm>
#include <chrono>
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
      if (a == "--json") o.json = true;
      else if (a == "--markdown") o.markdown = true;
      else if (a == "--quick") o.quick = true;
      else o.rest.emplace_back(a);
    }
    return o;
  }
};

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
template <class T> inline void do_not_optimize(const T& v) { asm volatile("" ::"g"(&v) : "memory"); }

using support::fmt;
using support::json_string;
using support::machine_description;
using support::table;

} // namespace dcr::bench
