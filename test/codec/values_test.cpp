#include <doctest/doctest.h>

#include <random>

#include "codec/fixtures.hpp"
#include "dcr/codec/values.hpp"

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
  CHECK_FALSE(is_known_encoding(0));
  CHECK_FALSE(is_known_encoding(3));
  CHECK(is_known_filter(0));
  CHECK(is_known_filter(1));
  CHECK_FALSE(is_known_filter(2));
}
