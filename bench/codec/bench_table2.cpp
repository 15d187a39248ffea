// The paper's Table 2 experiment: XOR masks vs overwrite values after zstd-1,
// and the add encoding (zigzag integer differences of the stored words).
//
// 20M standard-normal values generated directly in BF16 (seed 42); one FP32
// standard-normal noise vector (seed 44) scaled by a and added in FP32 as two
// separate operations; RNE back to BF16. Changed words (bitwise) in input
// order form three streams of little-endian 16-bit words, without locations or
// metadata: overwrite (new words), XOR (old ^ new) and add (zigzag of
// new - old mod 2^16). Then the same with the byte-plane filter (high bytes
// of all words, then low bytes).
#include <algorithm>
#include <cstdint>
#include <iostream>
#include <random>
#include <vector>

#include "bench_common.hpp"
#include "dcr/codec/values.hpp"
#include "dcr/codec/zstd.hpp"
#include "dcr/core/rounding.hpp"

namespace {

std::span<const std::byte> bytes_of(const std::vector<std::uint16_t>& v) {
  return std::as_bytes(std::span(v));
}

std::size_t filtered_zstd(const std::vector<std::uint16_t>& words) {
  std::vector<std::byte> f(words.size() * 2);
  dcr::codec::apply_filter(dcr::codec::value_filter::byte_planes, bytes_of(words), 2, f);
  return dcr::codec::zstd_size(f, 1);
}

struct row {
  double a, changed_pct;
  std::size_t changed, overwrite, xr, overwrite_f, xor_f, add, add_f;
};

} // namespace

int main(int argc, char** argv) {
  using namespace dcr;
  const auto opt = bench::options::parse(argc, argv);
  const std::size_t n = opt.quick ? 1'000'000 : 20'000'000;

  std::vector<std::uint16_t> x(n);
  std::vector<float> noise(n);
  {
    std::mt19937_64 g(42);
    std::normal_distribution<float> d;
    for (auto& w : x) w = f32_to_bf16_rne(d(g));
    std::mt19937_64 h(44);
    for (auto& e : noise) e = d(h);
  }
  std::vector<row> rows;
  for (double a : {1e-4, 1e-3, 1e-2}) {
    const float af = static_cast<float>(a);
    std::vector<std::uint16_t> ow, xr, ad;
    for (std::size_t i = 0; i < n; ++i) {
      const float scaled = noise[i] * af; // separate FP32 operations
      const float sum = bf16_to_f32(x[i]) + scaled;
      const std::uint16_t y = f32_to_bf16_rne(sum);
      if (y != x[i]) {
        ow.push_back(y);
        xr.push_back(static_cast<std::uint16_t>(x[i] ^ y));
        ad.push_back(codec::add_delta::make(x[i], y));
      }
    }
    row r{a,
          100.0 * static_cast<double>(ow.size()) / static_cast<double>(n),
          ow.size(),
          codec::zstd_size(bytes_of(ow), 1),
          codec::zstd_size(bytes_of(xr), 1),
          filtered_zstd(ow),
          filtered_zstd(xr),
          codec::zstd_size(bytes_of(ad), 1),
          filtered_zstd(ad)};
    rows.push_back(r);
  }

  auto ratio = [](std::size_t num, std::size_t den) {
    return static_cast<double>(num) / static_cast<double>(den);
  };
  if (opt.json) {
    std::cout << "{\"values\":" << n
              << ",\"machine\":" << bench::json_string(bench::machine_description())
              << ",\"rows\":[";
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const auto& r = rows[i];
      std::cout << (i ? "," : "") << "{\"a\":" << r.a << ",\"changed_pct\":" << r.changed_pct
                << ",\"changed\":" << r.changed << ",\"overwrite_bytes\":" << r.overwrite
                << ",\"xor_bytes\":" << r.xr << ",\"ratio\":" << ratio(r.overwrite, r.xr)
                << ",\"xor_filtered_bytes\":" << r.xor_f
                << ",\"ratio_filtered\":" << ratio(r.overwrite, r.xor_f)
                << ",\"overwrite_filtered_bytes\":" << r.overwrite_f
                << ",\"ratio_both_filtered\":" << ratio(r.overwrite_f, r.xor_f)
                << ",\"add_bytes\":" << r.add << ",\"ratio_add\":" << ratio(r.overwrite, r.add)
                << ",\"add_filtered_bytes\":" << r.add_f
                << ",\"ratio_add_planes\":" << ratio(r.overwrite, r.add_f)
                << ",\"add_planes_to_xor_planes\":" << ratio(r.add_f, r.xor_f) << "}";
    }
    std::cout << "]}\n";
    return 0;
  }
  bench::table t({"a", "changed %", "overwrite B", "XOR B", "ratio", "XOR+planes B",
                  "ratio (planes)", "overwrite+planes B", "ratio (both planes)", "add B",
                  "ratio (add)", "add+planes B", "ratio (add planes)", "add+planes / XOR+planes"});
  for (const auto& r : rows)
    t.add({bench::fmt(r.a, 4), bench::fmt(r.changed_pct, 2), std::to_string(r.overwrite),
           std::to_string(r.xr), bench::fmt(ratio(r.overwrite, r.xr)), std::to_string(r.xor_f),
           bench::fmt(ratio(r.overwrite, r.xor_f)), std::to_string(r.overwrite_f),
           bench::fmt(ratio(r.overwrite_f, r.xor_f)), std::to_string(r.add),
           bench::fmt(ratio(r.overwrite, r.add)), std::to_string(r.add_f),
           bench::fmt(ratio(r.overwrite, r.add_f)), bench::fmt(ratio(r.add_f, r.xor_f), 3)});
  if (opt.markdown)
    std::cout << "\n## Table 2: XOR masks and add differences vs overwrite values "
                 "(dcr-bench-table2)\n\n";
  const char* li = opt.markdown ? "- " : "";
  std::cout << li << "inputs: " << n
            << " BF16 values N(0,1) (seed 42), FP32 noise N(0,1) (seed 44) scaled by a, "
            << "RNE to BF16; changed words in input order, no locations; zstd level 1\n";
  std::cout << li
            << "ratio = overwrite bytes / XOR bytes; ratio (add) = overwrite bytes / add bytes "
               "(add = zigzag of new - old mod 2^16); planes = byte-plane filter (high bytes, then "
               "low bytes)\n";
  std::cout << li << "machine: " << bench::machine_description() << "\n\n";
  t.print(std::cout, opt.markdown);
  bool goal = true;
  for (const auto& r : rows) goal = goal && ratio(r.overwrite, r.xor_f) >= 2.1;
  bool add_wins = true;
  double worst_add = 0;
  for (const auto& r : rows) {
    add_wins = add_wins && r.add_f < r.xor_f;
    worst_add = std::max(worst_add, ratio(r.add_f, r.xor_f));
  }
  std::cout << "\n"
            << li
            << "goal: overwrite / (XOR + planes) >= 2.1 at every a: " << (goal ? "met" : "NOT met")
            << "\n"
            << li << "goal: add + planes smaller than XOR + planes at every a: "
            << (add_wins ? "met" : "NOT met") << " (largest add / XOR " << bench::fmt(worst_add, 3)
            << ")\n";
  return 0;
}
