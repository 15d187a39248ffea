#include <doctest/doctest.h>

#include <random>
#include <set>

#include "dcr/core/dtype.hpp"
#include "dcr/core/error.hpp"
#include "dcr/core/hash.hpp"
#include "dcr/core/set_digest.hpp"
#include "dcr/core/tensor.hpp"

using namespace dcr;

TEST_CASE("dtype info round-trips through safetensors names") {
  for (auto id :
       {dtype_id::bf16, dtype_id::f16, dtype_id::f32, dtype_id::f8e4m3fn, dtype_id::f8e5m2}) {
    auto i = info(id);
    REQUIRE(i);
    CHECK(from_safetensors_name(i->safetensors_name) == id);
  }
  CHECK_FALSE(info(static_cast<dtype_id>(0)));
  CHECK_FALSE(is_known_dtype(200));
}

TEST_CASE("placeholders are NaN patterns of their dtype") {
  CHECK(is_nan_word<bf16>(dtype_traits<bf16>::placeholder));
  CHECK(is_nan_word<f16>(dtype_traits<f16>::placeholder));
  CHECK(is_nan_word<f32>(dtype_traits<f32>::placeholder));
  CHECK(is_nan_word<f8e4m3fn>(dtype_traits<f8e4m3fn>::placeholder));
  CHECK(is_nan_word<f8e5m2>(dtype_traits<f8e5m2>::placeholder));
  CHECK_FALSE(is_nan_word<bf16>(0x7F80));   // +inf
  CHECK_FALSE(is_nan_word<f8e4m3fn>(0x7E)); // 448, the largest finite e4m3fn
}

TEST_CASE("row-major layout law: offsets enumerate 0..n-1 exactly once") {
  auto l = strided_layout::row_major({3, 4, 5});
  CHECK(l.size() == 60);
  CHECK(l.required_span_size() == 60);
  CHECK(l.is_unique());
  CHECK(l.is_contiguous());
  for (std::int64_t k = 0; k < l.size(); ++k) CHECK(l.offset_of_linear(k) == k);
}

TEST_CASE("slices and transposes stay unique and inside the parent span") {
  auto l = strided_layout::row_major({6, 8});
  std::int64_t base = 0;
  auto s = l.slice(1, 2, 3, base);
  CHECK(base == 2);
  CHECK_FALSE(s.is_contiguous());
  CHECK(s.is_unique());
  std::set<std::int64_t> seen;
  for (std::int64_t k = 0; k < s.size(); ++k) {
    auto o = base + s.offset_of_linear(k);
    CHECK(o < l.required_span_size());
    seen.insert(o);
  }
  CHECK(seen.size() == 18);
  auto t = l.transposed(0, 1);
  CHECK(t.is_unique());
  CHECK(t.offset_of_linear(1) == 8);
  CHECK_THROWS_AS(l.slice(0, 5, 2, base), error);
}

TEST_CASE("broadcast strides are not unique") {
  strided_layout l = strided_layout::row_major({4, 3});
  l.strides[0] = 0;
  CHECK_FALSE(l.is_unique());
}

TEST_CASE("blake2b-128 matches the RFC 7693 style known answer for empty input") {
  // b2sum -l 128 /dev/null
  CHECK(to_hex(digest({})) == "cae66941d9efbd404e4d88758ea67670");
}

TEST_CASE("name hash is XXH3-64 and stable") {
  CHECK(name_hash("") == 0x2D06800538D394C2ull);
  CHECK(name_hash("model.embed_tokens.weight") == name_hash("model.embed_tokens.weight"));
}

TEST_CASE("errors carry their code and say what went wrong") {
  try {
    throw_if_failed(fail(errc::digest_mismatch, "payload 3: body digest differs"));
    FAIL("no throw");
  } catch (const error& e) {
    CHECK(e.code() == errc::digest_mismatch);
    CHECK(std::string(e.what()) == "digest_mismatch: payload 3: body digest differs");
  }
}

TEST_CASE("set digest: add_words (zeros not hashed) equals one add per word and the portable sum") {
  std::mt19937_64 rng(31);
  const auto k = region_key("w", dtype_id::bf16, std::vector<std::uint64_t>{8192});
  for (std::size_t n = 0; n < 700; n += 1 + n / 8) {
    std::vector<std::uint64_t> words(n);
    for (auto& w : words) w = rng() % 5 == 0 ? 0 : rng();
    const std::uint64_t first = rng() % 1000;
    set_digest one;
    set_digest::lanes portable{};
    for (std::size_t j = 0; j < n; ++j) {
      one.add(k, first + j, words[j]);
      if (words[j] == 0) continue;
      const auto h = set_digest::element_portable(k, first + j, words[j]);
      for (std::size_t i = 0; i < set_digest_lanes; ++i) portable[i] += h[i];
    }
    set_digest batched;
    batched.add_words(k, std::span<const std::uint64_t>(words), first);
    CHECK(batched == one);
    CHECK(batched.value() == portable);
  }
}
