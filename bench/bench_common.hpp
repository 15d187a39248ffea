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

/// "CPU model, N cores, compiler" of the machine the bench runs on.
inline std::string machine_description() {
  std::string model = "unknown CPU";
  std::ifstream cpu("/proc/cpuinfo");
  for (std::string line; std::getline(cpu, line);)
    if (line.rfind("model name", 0) == 0) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  std::ostringstream s;
  s << model << ", " << std::thread::hardware_concurrency() << " hardware threads, ";
#if defined(__clang__)
  s << "clang " << __clang_major__ << "." << __clang_minor__;
#elif defined(__GNUC__)
  s << "g++ " << __GNUC__ << "." << __GNUC_MINOR__;
#endif
  return s.str();
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
template <class T> inline void do_not_optimize(const T& v) { asm volatile("" ::"g"(&v) : "memory"); }

/// A table of strings printed with aligned columns (right-aligned numbers).
class table {
public:
  explicit table(std::vector<std::string> header) : header_(std::move(header)) {}
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }

  void print(std::ostream& os, bool markdown) const {
    std::vector<std::size_t> w(header_.size());
    for (std::size_t c = 0; c < header_.size(); ++c) {
      w[c] = header_[c].size();
      for (auto& r : rows_) w[c] = std::max(w[c], r[c].size());
    }
    auto line = [&](const std::vector<std::string>& r) {
      if (markdown) os << "| ";
      for (std::size_t c = 0; c < r.size(); ++c) {
        os << (c == 0 ? std::left : std::right) << std::setw(static_cast<int>(w[c])) << r[c];
        os << (markdown ? " | " : "  ");
      }
      os << "\n";
    };
    line(header_);
    if (markdown) {
      os << "|";
      for (std::size_t c = 0; c < w.size(); ++c) os << (c == 0 ? ":" : "") << std::string(w[c] + 1, '-') << (c == 0 ? "" : ":") << "|";
      os << "\n";
    } else {
      std::size_t total = 0;
      for (auto x : w) total += x + 2;
      os << std::string(total, '-') << "\n";
    }
    for (auto& r : rows_) line(r);
  }

private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

/// Fixed-point formatting for table cells.
inline std::string fmt(double v, int digits = 2) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(digits) << v;
  return s.str();
}

/// Minimal JSON string escaping for bench output.
inline std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    if (static_cast<unsigned char>(ch) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", ch);
      out += buf;
      continue;
    }
    out += ch;
  }
  return out + "\"";
}

} // namespace dcr::bench
