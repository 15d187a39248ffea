#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <random>
#include <span>
#include <vector>

#include "codec/fixtures.hpp"
#include "dcr/codec/values.hpp"
#include "dcr/twin/element.hpp"

using namespace dcr;
using namespace dcr::codec;

TEST_CASE("byte-plane filter is a bijection for every width and length") {
  std::mt19937_64 rng(31);
  for (std::size_t width : {1, 2, 4, 8})
    for (std::size_t n : {0, 1, 2, 3, 31, 1000}) {
      std::vector<std::byte> words(width * n), filtered(width * n), back(width * n);
      for (auto& b : words) b = static_cast<std::byte>(rng());
      for (auto f : {value_filter::none, value_filter::byte_planes}) {
        apply_filter(f, words, width, filtered);
        remove_filter(f, filtered, width, back);
        CHECK(back == words);
        if (f == value_filter::none) CHECK(filtered == words);
      }
      // Plane p holds byte (width - 1 - p) of every word: most significant first.
      apply_filter(value_filter::byte_planes, words, width, filtered);
      for (std::size_t i = 0; i < n; ++i)
        for (std::size_t p = 0; p < width; ++p)
          CHECK(filtered[p * n + i] == words[i * width + width - 1 - p]);
    }
}

TEST_CASE(
    "delta encodings satisfy apply(old, make(old, new)) == new over all 16-bit pairs sampled") {
  std::mt19937_64 rng(77);
  for (int r = 0; r < 100000; ++r) {
    const auto o = static_cast<std::uint16_t>(rng()), n = static_cast<std::uint16_t>(rng());
    CHECK_EQ(xor_mask::apply(o, xor_mask::make(o, n)), n);
    CHECK_EQ(overwrite::apply(o, overwrite::make(o, n)), n);
    CHECK_EQ(overwrite::apply(static_cast<std::uint16_t>(~o), overwrite::make(o, n)), n);
  }
  CHECK(is_known_encoding(1));
  CHECK(is_known_encoding(2));
  CHECK(is_known_encoding(3));
  CHECK_FALSE(is_known_encoding(0));
  CHECK_FALSE(is_known_encoding(4));
  // add (3) is new in format v2.
  CHECK(is_encoding_of_version(1, 1));
  CHECK(is_encoding_of_version(2, 1));
  CHECK_FALSE(is_encoding_of_version(3, 1));
  CHECK(is_encoding_of_version(3, 2));
  CHECK_FALSE(is_encoding_of_version(0, 2));
  CHECK(is_relative(value_encoding::xor_mask));
  CHECK(is_relative(value_encoding::add));
  CHECK_FALSE(is_relative(value_encoding::overwrite));
  CHECK(is_known_filter(0));
  CHECK(is_known_filter(1));
  CHECK_FALSE(is_known_filter(2));
}

namespace {

/// Pairs (old, new) of 16-bit words with old in `olds` and every new word
/// for which `apply(old, make(old, new)) != new`, for the add encoding, its
/// twin scatter op and the sink's `apply`. A plain loop over arrays (the
/// compiler vectorises it), so 2^16 new words per old word cost microseconds.
std::uint64_t add_failures_16(std::span<const std::uint16_t> olds) {
  std::uint64_t bad = 0;
  for (const std::uint16_t o : olds)
    for (std::uint32_t n = 0; n < 0x10000u; ++n) {
      const auto nw = static_cast<std::uint16_t>(n);
      const std::uint16_t v = add_delta::make(o, nw);
      bad += add_delta::apply(o, v) != nw;
      bad += twin::scatter_word<std::uint16_t>(o, v, twin::scatter_op::add) != nw;
    }
  return bad;
}

} // namespace

TEST_CASE("add: apply(old, make(old, new)) == new for every 8-bit pair") {
  std::uint64_t bad = 0;
  for (std::uint32_t o = 0; o < 256; ++o)
    for (std::uint32_t n = 0; n < 256; ++n) {
      const auto ow = static_cast<std::uint8_t>(o), nw = static_cast<std::uint8_t>(n);
      const std::uint8_t v = add_delta::make(ow, nw);
      bad += add_delta::apply(ow, v) != nw;
      bad += twin::scatter_word<std::uint8_t>(ow, v, twin::scatter_op::add) != nw;
    }
  CHECK(bad == 0);
}

TEST_CASE("add: every new 16-bit word from 1,032 old words (BF16/F16 patterns)") {
  // Every 64th old word plus the edges of the BF16 and F16 encodings: zeros,
  // the largest finite, infinities, NaNs, the smallest normal and subnormal,
  // and their neighbours, so that every carry and wrap case is reached. The
  // slow suite runs all 2^32 pairs.
  std::vector<std::uint16_t> olds;
  for (std::uint32_t o = 0; o < 0x10000u; o += 64) olds.push_back(static_cast<std::uint16_t>(o));
  for (std::uint16_t e : {0x0000, 0x0001, 0x007F, 0x0080, 0x03FF, 0x0400, 0x3F80, 0x3C00,
                          0x7BFF, 0x7C00, 0x7C01, 0x7E00, 0x7F7F, 0x7F80, 0x7F81, 0x7FC0,
                          0x7FFF, 0x8000, 0x8001, 0xFC00, 0xFF80, 0xFFC0, 0xFFFE, 0xFFFF})
    olds.push_back(e);
  CHECK(olds.size() == 1024 + 24);
  CHECK(add_failures_16(olds) == 0);
}

TEST_CASE("add: every 16-bit old -> new pair (2^32)" * doctest::test_suite("slow")) {
  std::vector<std::uint16_t> all(0x10000);
  for (std::uint32_t o = 0; o < 0x10000u; ++o) all[o] = static_cast<std::uint16_t>(o);
  CHECK(add_failures_16(all) == 0);
}

TEST_CASE("add: random and edge 32-bit pairs round-trip") {
  std::mt19937_64 rng(78);
  std::uint64_t bad = 0;
  const std::uint32_t edges[] = {0u,          1u,          0x7F7FFFFFu, 0x7F800000u, 0x7FC00000u,
                                 0x80000000u, 0xFFFFFFFFu, 0x3F800000u, 0x00800000u};
  for (auto o : edges)
    for (auto n : edges) {
      bad += add_delta::apply(o, add_delta::make(o, n)) != n;
      bad +=
          twin::scatter_word<std::uint32_t>(o, add_delta::make(o, n), twin::scatter_op::add) != n;
    }
  for (int r = 0; r < 2000000; ++r) {
    const auto o = static_cast<std::uint32_t>(rng()), n = static_cast<std::uint32_t>(rng());
    bad += add_delta::apply(o, add_delta::make(o, n)) != n;
    // Small moves, the case add is for.
    const auto near = static_cast<std::uint32_t>(o + static_cast<std::uint32_t>(rng() % 64) - 32u);
    bad += add_delta::apply(o, add_delta::make(o, near)) != near;
  }
  CHECK(bad == 0);
  // 64-bit words (gap words share the element code) obey the same law.
  for (int r = 0; r < 1000; ++r) {
    const std::uint64_t o = rng(), n = rng();
    CHECK(apply_zigzag_delta(o, zigzag_delta(o, n)) == n);
  }
}

TEST_CASE("add: the word is the zigzag of the signed difference (small moves, small words)") {
  // d = new - old (mod 2^w, read as w-bit two's complement) -> 2|d| - (d < 0).
  for (int d = -300; d <= 300; ++d) {
    const std::uint16_t o = 0x3F80; // bf16 1.0
    const auto n = static_cast<std::uint16_t>(o + d);
    const auto want = static_cast<std::uint16_t>(d >= 0 ? 2 * d : -2 * d - 1);
    CHECK(add_delta::make(o, n) == want);
  }
  // One unit in the last place is word 2 up and 1 down, whatever the carry
  // chain of the old bits; the XOR mask of the same move depends on it.
  for (std::uint16_t o : {0x3F80, 0x3F81, 0x3F83, 0x3F87, 0x3FFF}) {
    CHECK(add_delta::make(o, static_cast<std::uint16_t>(o + 1)) == 2);
    CHECK(add_delta::make(o, static_cast<std::uint16_t>(o - 1)) == 1);
  }
  CHECK(xor_mask::make<std::uint16_t>(0x3F87, 0x3F88) == 0x000F);
  // Modular wrap: the largest word plus one is zero, a difference of +1.
  CHECK(add_delta::make<std::uint8_t>(0xFF, 0x00) == 2);
  CHECK(add_delta::make<std::uint8_t>(0x00, 0xFF) == 1);
  CHECK(add_delta::make<std::uint8_t>(0x00, 0x80) == 0xFF); // -128: the most negative
  CHECK(add_delta::make<std::uint8_t>(0x00, 0x7F) == 0xFE); // +127: the most positive
  // Applying 0 changes nothing (inactive positions of a scratch hold 0).
  CHECK(add_delta::apply<std::uint16_t>(0x1234, 0) == 0x1234);
}

// The estimate counts into interleaved histograms (values.hpp); its result must
// be exactly that of one histogram per plane, summed in the same order: the
// payload's XOR-vs-add choice depends on it, so any drift would change bytes.
TEST_CASE("estimate_value_bytes equals a one-histogram reference exactly") {
  auto reference = [](std::span<const std::byte> words, std::size_t width, value_filter f,
                      std::size_t stride) {
    if (words.empty() || width == 0) return 0.0;
    if (stride == 0) stride = 1;
    const std::size_t planes = (f == value_filter::byte_planes && width > 1) ? width : 1;
    const std::size_t n = words.size() / width;
    std::vector<std::array<std::uint64_t, 256>> hist(planes);
    std::uint64_t counted = 0;
    for (std::size_t i = 0; i < n; i += stride, ++counted)
      for (std::size_t b = 0; b < width; ++b)
        ++hist[planes == 1 ? 0 : b][std::to_integer<std::uint8_t>(words[i * width + b])];
    const double symbols = static_cast<double>(counted * (planes == 1 ? width : 1));
    double bits = 0.0;
    for (auto& h : hist)
      for (auto c : h)
        if (c) bits += static_cast<double>(c) * std::log2(symbols / static_cast<double>(c));
    return bits / 8.0 * static_cast<double>(n) / static_cast<double>(counted);
  };
  std::mt19937_64 rng(77);
  for (std::size_t width : {1, 2, 4, 8})
    for (std::size_t n : {1, 2, 3, 4, 5, 7, 8, 9, 63, 1000, 4099})
      for (int skew : {0, 1, 2}) {
        std::vector<std::byte> words(width * n);
        for (auto& b : words) {
          const auto r = rng();
          // skew 1: few distinct bytes (repeats, as in an exponent plane); 2: constant runs.
          b = static_cast<std::byte>(skew == 0 ? r : skew == 1 ? r % 3 : (r % 16 == 0 ? r : 0x3F));
        }
        for (auto f : {value_filter::none, value_filter::byte_planes})
          for (std::size_t stride : {1, 2, 3, 5, 17}) {
            INFO("width " << width << " n " << n << " skew " << skew << " stride " << stride);
            CHECK(estimate_value_bytes(words, width, f, stride) ==
                  reference(words, width, f, stride));
          }
      }
}

TEST_CASE("estimate_value_bytes: zeroth-order entropy of the byte planes") {
  std::vector<std::byte> zeros(2000, std::byte{0});
  CHECK(estimate_value_bytes(zeros, 2, value_filter::byte_planes) == 0.0);
  CHECK(estimate_value_bytes({}, 2, value_filter::byte_planes) == 0.0);
  // Two equiprobable bytes in each plane: 1 bit per byte.
  std::vector<std::byte> two(4000);
  for (std::size_t i = 0; i < two.size(); ++i) two[i] = static_cast<std::byte>((i / 2) % 2);
  CHECK(estimate_value_bytes(two, 2, value_filter::byte_planes) == doctest::Approx(500.0));
  // Unfiltered: one histogram over all bytes (values 0 and 1, equiprobable).
  CHECK(estimate_value_bytes(two, 2, value_filter::none) == doctest::Approx(500.0));
  // High plane constant, low plane uniform over 256 values: 8 bits per low byte only.
  std::vector<std::byte> low(2 * 2560);
  for (std::size_t i = 0; i < 2560; ++i) {
    low[2 * i] = static_cast<std::byte>(i % 256);
    low[2 * i + 1] = std::byte{0x3F};
  }
  CHECK(estimate_value_bytes(low, 2, value_filter::byte_planes) == doctest::Approx(2560.0));
  CHECK(estimate_value_bytes(low, 2, value_filter::none) > 2560.0);
  // A strided sample (every 3rd word) is scaled back to all words.
  CHECK(estimate_value_bytes(low, 2, value_filter::byte_planes, 3) ==
        doctest::Approx(2560.0).epsilon(0.01));
  CHECK(estimate_value_bytes(zeros, 2, value_filter::byte_planes, 7) == 0.0);
  CHECK(estimate_value_bytes(two, 2, value_filter::none, 1) ==
        estimate_value_bytes(two, 2, value_filter::none));
}
