// Change detection against a naive element-by-element reference, over all
// word widths, densities, lengths around the 64-word block size, unaligned
// starts, and chunked (streaming) calls.

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string_view>
#include <vector>

#include "dcr/core/detect.hpp"
#include "examples/common/simulator.hpp"

using namespace dcr;

namespace {

using splitmix = dcr::sim::splitmix64;

/// `n + pad` random words and a copy in which each word differs with
/// probability `p` (by XOR with a random non-zero word).
template <class W>
struct pair_of_buffers {
  std::vector<W> old_words, new_words;
};

template <class W>
pair_of_buffers<W> make_pair_of(std::size_t n, double p, std::uint64_t seed) {
  splitmix g{seed};
  pair_of_buffers<W> r;
  r.old_words.resize(n);
  for (auto& w : r.old_words) w = static_cast<W>(g.next());
  r.new_words = r.old_words;
  for (auto& w : r.new_words)
    if (g.uniform() < p) {
      W x;
      do x = static_cast<W>(g.next());
      while (x == 0);
      w = static_cast<W>(w ^ x);
    }
  return r;
}

template <class W>
std::vector<std::uint64_t> naive_changes(std::span<const W> a, std::span<const W> b,
                                         std::uint64_t base) {
  std::vector<std::uint64_t> r;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) r.push_back(base + i);
  return r;
}

std::vector<index_run> naive_runs(const std::vector<std::uint64_t>& idx) {
  std::vector<index_run> r;
  for (auto i : idx) {
    if (!r.empty() && r.back().start + r.back().count == i)
      ++r.back().count;
    else
      r.push_back({i, 1});
  }
  return r;
}

const double densities[] = {0.0, 1e-4, 0.01, 0.05, 0.5, 1.0};
const std::size_t lengths[] = {0,   1,   2,    7,    63,   64,   65,        127,
                               128, 129, 1000, 1023, 1024, 1025, 4096 + 77, 70'001};

} // namespace

TEST_CASE_TEMPLATE("detect_changes and detect_runs equal the naive reference", W, std::uint8_t,
                   std::uint16_t, std::uint32_t, std::uint64_t) {
  std::uint64_t seed = 1000 * sizeof(W);
  for (double p : densities)
    for (std::size_t n : lengths)
      for (std::size_t offset : {0, 1, 3}) { // unaligned starts inside a larger buffer
        auto buf = make_pair_of<W>(n + offset, p, ++seed);
        std::span<const W> a(buf.old_words.data() + offset, n), b(buf.new_words.data() + offset, n);
        const std::uint64_t base = seed * 977;
        const auto want = naive_changes(a, b, base);
        CAPTURE(p);
        CAPTURE(n);
        CAPTURE(offset);
        std::vector<std::uint64_t> got{42}; // appends, keeps what is there
        detect_changes(a, b, base, got);
        REQUIRE(got.size() == want.size() + 1);
        CHECK(got[0] == 42);
        CHECK(std::equal(want.begin(), want.end(), got.begin() + 1));

        std::vector<index_run> runs;
        detect_runs(a, b, base, runs);
        CHECK(runs == naive_runs(want));
        for (std::size_t r = 1; r < runs.size(); ++r) // maximal: a gap of at least one word
          CHECK(runs[r - 1].start + runs[r - 1].count < runs[r].start);
      }
}

TEST_CASE_TEMPLATE("chunked calls give the same result as one call", W, std::uint8_t, std::uint16_t,
                   std::uint32_t, std::uint64_t) {
  splitmix g{77 + sizeof(W)};
  for (double p : {0.01, 0.3, 0.9, 1.0}) {
    const std::size_t n = 20'000;
    auto buf = make_pair_of<W>(n, p, g.next());
    std::span<const W> a(buf.old_words), b(buf.new_words);
    std::vector<std::uint64_t> whole;
    std::vector<index_run> whole_runs;
    detect_changes(a, b, 5, whole);
    detect_runs(a, b, 5, whole_runs);
    std::vector<std::uint64_t> parts;
    std::vector<index_run> part_runs;
    for (std::size_t i = 0; i < n;) {
      const std::size_t len = std::min<std::size_t>(n - i, g.next() % 300);
      detect_changes(a.subspan(i, len), b.subspan(i, len), 5 + i, parts);
      detect_runs(a.subspan(i, len), b.subspan(i, len), 5 + i, part_runs);
      i += len;
    }
    CAPTURE(p);
    CHECK(parts == whole);
    CHECK(part_runs == whole_runs);
  }
}

TEST_CASE_TEMPLATE("change_mask: bit i says whether word i differs, bits past n are zero", W,
                   std::uint8_t, std::uint16_t, std::uint32_t, std::uint64_t) {
  splitmix g{9 + sizeof(W)};
  for (int rep = 0; rep < 200; ++rep) {
    auto buf = make_pair_of<W>(64, g.uniform(), g.next());
    for (std::size_t n = 0; n <= 64; ++n) {
      const std::uint64_t m = change_mask(buf.old_words.data(), buf.new_words.data(), n);
      for (std::size_t i = 0; i < 64; ++i)
        CHECK(((m >> i) & 1u) == (i < n && buf.old_words[i] != buf.new_words[i] ? 1u : 0u));
    }
  }
}

TEST_CASE_TEMPLATE("every single-bit flip at every block position is a change", W, std::uint8_t,
                   std::uint16_t, std::uint32_t, std::uint64_t) {
  std::vector<W> a(130);
  splitmix g{3};
  for (auto& w : a) w = static_cast<W>(g.next());
  for (std::size_t pos :
       {std::size_t{0}, std::size_t{31}, std::size_t{63}, std::size_t{64}, std::size_t{129}})
    for (unsigned bit = 0; bit < 8 * sizeof(W); ++bit) {
      auto b = a;
      b[pos] = static_cast<W>(b[pos] ^ (W{1} << bit));
      std::vector<std::uint64_t> got;
      detect_changes(a, b, 0, got);
      CHECK(got == std::vector<std::uint64_t>{pos});
    }
}

TEST_CASE("stored bits decide, not float equality: signed zeros and NaN payloads") {
  auto bits = [](float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
  };
  // +0 == -0 and NaN != NaN as floats; as stored words it is the other way round.
  const std::vector<std::uint32_t> a{bits(0.0f), 0x7FC00000u, 0x7FC00000u, 0xFFC00001u, bits(1.5f)};
  const std::vector<std::uint32_t> b{bits(-0.0f), 0x7FC00001u, 0x7FC00000u, 0xFFC00001u,
                                     bits(1.5f)};
  std::vector<std::uint64_t> got;
  detect_changes(a, b, 0, got);
  CHECK(got == std::vector<std::uint64_t>{0, 1});
  const std::vector<std::uint16_t> ha{0x0000, 0x7FC0, 0x7FC1}, hb{0x8000, 0x7FC0, 0x7FC2};
  got.clear();
  detect_changes(ha, hb, 10, got);
  CHECK(got == std::vector<std::uint64_t>{10, 12});
}

TEST_CASE("detect_runs merges with the run already at the end of out only when adjacent") {
  const std::vector<std::uint16_t> a(8, 0), b{1, 1, 0, 0, 0, 0, 1, 1};
  std::vector<index_run> runs{{90, 10}}; // ends at 100
  detect_runs(a, b, 100, runs);
  CHECK(runs == std::vector<index_run>{{90, 12}, {106, 2}});
  runs = {{90, 9}}; // ends at 99: not adjacent
  detect_runs(a, b, 100, runs);
  CHECK(runs == std::vector<index_run>{{90, 9}, {100, 2}, {106, 2}});
  runs = {{90, 9}};
  detect_runs(a, a, 100, runs); // no change: out untouched
  CHECK(runs == std::vector<index_run>{{90, 9}});
}

TEST_CASE("for_each_change_mask visits every block once, in order, the tail short") {
  const std::size_t n = 200;
  auto buf = make_pair_of<std::uint16_t>(n, 0.2, 11);
  std::vector<std::uint64_t> firsts, from_masks;
  for_each_change_mask<std::uint16_t>(buf.old_words, buf.new_words, 1000,
                                      [&](std::uint64_t first, std::uint64_t m) {
                                        firsts.push_back(first);
                                        for (; m; m &= m - 1)
                                          from_masks.push_back(first + std::countr_zero(m));
                                      });
  CHECK(firsts == std::vector<std::uint64_t>{1000, 1064, 1128, 1192});
  CHECK(from_masks == naive_changes<std::uint16_t>(buf.old_words, buf.new_words, 1000));
}

TEST_CASE("spans of different lengths are rejected with invalid_argument") {
  const std::vector<std::uint16_t> a(10), b(11);
  std::vector<std::uint64_t> idx;
  std::vector<index_run> runs;
  auto code_of = [](auto&& f) {
    try {
      f();
    } catch (const error& e) {
      return e.code();
    }
    return errc::ok;
  };
  CHECK(code_of([&] { detect_changes(a, b, 0, idx); }) == errc::invalid_argument);
  CHECK(code_of([&] { detect_runs(a, b, 0, runs); }) == errc::invalid_argument);
  CHECK(code_of([&] { for_each_change_mask<std::uint16_t>(a, b, 0, [](auto, auto) {}); }) ==
        errc::invalid_argument);
  CHECK(idx.empty());
  CHECK(runs.empty());
}

TEST_CASE_TEMPLATE("change_masks: every available instruction set equals the scalar definition", W,
                   std::uint8_t, std::uint16_t, std::uint32_t, std::uint64_t) {
  splitmix g{101 + sizeof(W)};
  for (detect_isa isa : {detect_isa::portable, detect_isa::avx2, detect_isa::avx512}) {
    if (!detect_isa_available(isa)) {
      MESSAGE("instruction set " << to_string(isa) << " not on this CPU; its kernel is not run");
      continue;
    }
    for (double p : densities) {
      const std::size_t blocks = 37;
      auto buf = make_pair_of<W>(blocks * 64 + 5, p, g.next());
      for (std::size_t offset : {0, 1, 5}) { // unaligned block starts
        std::vector<std::uint64_t> masks(blocks, 0xDEAD);
        change_masks(buf.old_words.data() + offset, buf.new_words.data() + offset, blocks,
                     masks.data(), isa);
        for (std::size_t k = 0; k < blocks; ++k) {
          std::uint64_t want = 0;
          for (std::size_t i = 0; i < 64; ++i)
            want |= std::uint64_t{buf.old_words[offset + 64 * k + i] !=
                                  buf.new_words[offset + 64 * k + i]}
                    << i;
          CHECK(masks[k] == want);
        }
      }
    }
  }
}

TEST_CASE("DCR_DETECT_ISA selects an available scan, otherwise the best one") {
  const char* env = std::getenv("DCR_DETECT_ISA");
  MESSAGE("scan instruction set: " << to_string(active_detect_isa()));
  detect_isa want = detect_isa_available(detect_isa::avx512) ? detect_isa::avx512
                    : detect_isa_available(detect_isa::avx2) ? detect_isa::avx2
                                                             : detect_isa::portable;
  for (detect_isa i : {detect_isa::portable, detect_isa::avx2, detect_isa::avx512})
    if (env != nullptr && std::string_view(env) == to_string(i) && detect_isa_available(i))
      want = i;
  CHECK(active_detect_isa() == want);
}

TEST_CASE_TEMPLATE("every available scan and extraction equals the naive reference and each other",
                   W, std::uint8_t, std::uint16_t, std::uint32_t, std::uint64_t) {
  struct variant {
    detect_isa isa;
    detect_extract extract;
  };
  std::vector<variant> variants;
  for (detect_isa isa : {detect_isa::portable, detect_isa::avx2, detect_isa::avx512})
    for (detect_extract e : {detect_extract::scalar, detect_extract::compress}) {
      if (detect_extract_available(e, isa))
        variants.push_back({isa, e});
      else
        MESSAGE("scan " << to_string(isa) << " with " << to_string(e)
                        << " extraction not on this CPU; not run");
    }
  REQUIRE(!variants.empty());
  splitmix g{0xC0DE + sizeof(W)};
  // Densities around the branch-free limits (4 per block for scalar, 16 for
  // compress) and clustered changes (whole blocks dirty), over random
  // lengths and unaligned starts, many rounds.
  const double dens[] = {0.0, 1e-3, 0.01, 0.05, 0.1, 0.25, 0.5, 0.9, 1.0};
  for (int round = 0; round < 6; ++round)
    for (double p : dens) {
      const std::size_t n = static_cast<std::size_t>(g.next() % 20000);
      const std::size_t offset = static_cast<std::size_t>(g.next() % 9);
      auto buf = make_pair_of<W>(n + offset, p, g.next());
      if (round % 2 == 1) // a dirty stretch: every word of some blocks changed
        for (std::size_t i = offset + n / 3; i < offset + n / 3 + std::min<std::size_t>(n / 4, 300);
             ++i)
          buf.new_words[i] = static_cast<W>(~buf.old_words[i]);
      std::span<const W> a(buf.old_words.data() + offset, n), b(buf.new_words.data() + offset, n);
      const std::uint64_t base = g.next() >> 8;
      const auto want = naive_changes(a, b, base);
      CAPTURE(p);
      CAPTURE(n);
      CAPTURE(offset);
      std::vector<std::uint64_t> first_got;
      for (const auto& v : variants) {
        CAPTURE(to_string(v.isa));
        CAPTURE(to_string(v.extract));
        std::vector<std::uint64_t> got{7}; // appends, keeps what is there
        detect_changes(a, b, base, got, v.isa, v.extract);
        REQUIRE(got.size() == want.size() + 1);
        CHECK(got[0] == 7);
        CHECK(std::equal(want.begin(), want.end(), got.begin() + 1));
        // Chunked at a random block-unaligned split: the same indices.
        const std::size_t cut = n ? static_cast<std::size_t>(g.next() % n) : 0;
        std::vector<std::uint64_t> chunked;
        detect_changes(a.first(cut), b.first(cut), base, chunked, v.isa, v.extract);
        detect_changes(a.subspan(cut), b.subspan(cut), base + cut, chunked, v.isa, v.extract);
        CHECK(chunked == want);
        if (first_got.empty()) first_got = got;
        CHECK(got == first_got);
      }
    }
}

TEST_CASE("the default extraction is scalar unless compress is asked for and available") {
  const detect_isa isa = active_detect_isa();
  const char* env = std::getenv("DCR_DETECT_EXTRACT");
  const bool compress_asked = env != nullptr && std::string_view(env) == "compress";
  MESSAGE("extraction with scan " << to_string(isa) << ": "
                                  << to_string(default_detect_extract(isa)));
  CHECK(default_detect_extract(isa) ==
        (compress_asked && detect_extract_available(detect_extract::compress, isa)
             ? detect_extract::compress
             : detect_extract::scalar));
  CHECK(detect_extract_available(detect_extract::scalar, detect_isa::portable));
  CHECK(!detect_extract_available(detect_extract::compress, detect_isa::portable));
  CHECK(!detect_extract_available(detect_extract::compress, detect_isa::avx2));
  // An unavailable pair is refused with a typed error, not run.
  std::vector<std::uint16_t> a(100, 1), b(100, 2);
  std::vector<std::uint64_t> out;
  try {
    detect_changes<std::uint16_t>(a, b, 0, out, detect_isa::portable, detect_extract::compress);
    FAIL("an unavailable extraction ran");
  } catch (const error& e) {
    CHECK(e.code() == errc::invalid_argument);
  }
  CHECK(out.empty());
}
