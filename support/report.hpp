#pragma once
/// \file
/// Reporting and small concurrency helpers shared by the benches and the
/// example programs (the demo, the tools). Not installed and not part of the
/// library: `include/dcr/` never includes it.

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "dcr/core/json.hpp"

namespace dcr::support {

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
      for (std::size_t c = 0; c < w.size(); ++c)
        os << (c == 0 ? ":" : "") << std::string(w[c] + 1, '-') << (c == 0 ? "" : ":") << "|";
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

/// A JSON string literal of `s` (for --json output), as dcr's JSON writer
/// quotes strings.
inline std::string json_string(std::string_view s) {
  std::string out;
  json_escape(s, out);
  return out;
}

/// Run `f(0) ... f(n-1)` on every hardware thread, each index once.
inline void parallel_for(std::size_t n, const std::function<void(std::size_t)>& f) {
  const std::size_t t = std::max(1u, std::thread::hardware_concurrency());
  std::atomic<std::size_t> next{0};
  std::vector<std::thread> ts;
  for (std::size_t k = 0; k < t; ++k)
    ts.emplace_back([&] {
      for (std::size_t i; (i = next++) < n;) f(i);
    });
  for (auto& x : ts) x.join();
}

} // namespace dcr::support
