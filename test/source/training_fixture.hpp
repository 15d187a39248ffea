#pragma once
// Shared helpers of the training-side tests: random canonical checkpoints, a
// stress update, the brute-force changed set of two canonical versions, and
// a checker that applies items to canonical tensors the way a receiver with
// the identity loader would.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "dcr/codec/item.hpp"
#include "dcr/core/rounding.hpp"
#include "dcr/core/tensor.hpp"
#include "dcr/map/fp8.hpp"
#include "examples/common/simulator.hpp"

namespace dcr::test {

/// Normal(0, stddev) values of `meta`'s dtype (bf16/f16/f32/f8e4m3fn), fixed seed.
inline host_tensor random_tensor(const tensor_meta& meta, std::uint64_t seed,
                                 float stddev = 0.02f) {
  host_tensor t(meta);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, stddev);
  const auto n = meta.numel();
  for (std::uint64_t k = 0; k < n; ++k) {
    const float x = nd(rng);
    switch (meta.dtype) {
    case dtype_id::bf16: {
      auto w = f32_to_bf16_rne(x);
      std::memcpy(t.bytes.data() + 2 * k, &w, 2);
      break;
    }
    case dtype_id::f16: {
      auto w = f32_to_f16_rne(x);
      std::memcpy(t.bytes.data() + 2 * k, &w, 2);
      break;
    }
    case dtype_id::f32:
      std::memcpy(t.bytes.data() + 4 * k, &x, 4);
      break;
    case dtype_id::f8e4m3fn:
      t.bytes[k] = static_cast<std::byte>(f32_to_e4m3_rne(x * 100));
      break;
    default:
      break;
    }
  }
  return t;
}

inline std::vector<host_tensor> random_checkpoint(std::span<const tensor_meta> metas,
                                                  std::uint64_t seed) {
  std::vector<host_tensor> v;
  for (std::size_t i = 0; i < metas.size(); ++i)
    v.push_back(random_tensor(metas[i], seed * 1000003 + i));
  return v;
}

/// Stress update (the simulator's): in each bf16 tensor, round(fraction n)
/// uniformly chosen elements get new bits, x -> RNE(x (1 + amp N(0,1))).
inline void stress(std::vector<host_tensor>& ts, double fraction, double amp, std::uint64_t seed) {
  for (std::size_t i = 0; i < ts.size(); ++i)
    if (ts[i].meta.dtype == dtype_id::bf16)
      sim::stress_update(ts[i].words<bf16>(), fraction, amp, seed * 7777 + i);
}

/// Changes about `fraction` of the words of every tensor, whatever its dtype:
/// bf16 tensors by the stress update, others by random bit flips (the golden
/// payload expectations are the bytes of these exact changes: keep it as is).
inline void mutate(std::vector<host_tensor>& ts, double fraction, std::uint64_t seed) {
  stress(ts, fraction, 1e-2, seed);
  std::mt19937_64 rng(seed ^ 0x9E3779B97F4A7C15ull);
  for (auto& t : ts) {
    if (t.meta.dtype == dtype_id::bf16) continue;
    const auto w = width_of(t.meta.dtype);
    const auto n = t.meta.numel();
    const auto k = static_cast<std::uint64_t>(fraction * static_cast<double>(n));
    for (std::uint64_t i = 0; i < k; ++i) {
      const auto at = rng() % n;
      const auto bit = rng() % (8 * w);
      t.bytes[at * w + bit / 8] ^= static_cast<std::byte>(1u << (bit % 8));
    }
  }
}

/// Destination = (canonical tensor name, flat index).
using dest = std::pair<std::string, std::uint64_t>;

/// Brute force: every element whose stored bits differ between `a` and `b`.
inline std::set<dest> changed_set(std::span<const host_tensor> a, std::span<const host_tensor> b) {
  std::set<dest> s;
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    REQUIRE(a[i].meta == b[i].meta);
    const auto w = width_of(a[i].meta.dtype);
    for (std::uint64_t k = 0; k < a[i].meta.numel(); ++k)
      if (std::memcmp(a[i].bytes.data() + k * w, b[i].bytes.data() + k * w, w) != 0)
        s.insert({a[i].meta.name, k});
  }
  return s;
}

/// Checks item invariants, that no destination is emitted twice, and applies
/// every item to `canon` (XOR or overwrite). Returns the emitted destinations.
inline std::set<dest> apply_items(std::span<const item> items, std::vector<host_tensor>& canon) {
  std::map<std::string, std::size_t> by_name;
  for (std::size_t i = 0; i < canon.size(); ++i) by_name[canon[i].meta.name] = i;
  std::set<dest> emitted;
  for (auto& it : items) {
    REQUIRE(by_name.count(it.tensor.name));
    auto& t = canon[by_name[it.tensor.name]];
    CHECK(it.tensor == t.meta);
    const auto w = width_of(t.meta.dtype);
    REQUIRE(it.values.size() == it.indices.size() * w);
    for (std::size_t k = 0; k < it.indices.size(); ++k) {
      if (k) CHECK(it.indices[k] > it.indices[k - 1]);
      REQUIRE(it.indices[k] < t.meta.numel());
      if (!emitted.insert({it.tensor.name, it.indices[k]}).second)
        FAIL_CHECK("destination emitted twice: " << it.tensor.name << "[" << it.indices[k] << "]");
      std::byte* dst = t.bytes.data() + it.indices[k] * w;
      const std::byte* src = it.values.data() + k * w;
      if (it.encoding == value_encoding::add) {
        // Whole little-endian words, added modulo 2^w (written out here, not
        // through codec::add_delta, so the test does not trust the codec).
        std::uint64_t o = 0, v = 0;
        for (std::size_t b = 0; b < w; ++b) {
          o |= std::uint64_t(std::to_integer<unsigned>(dst[b])) << (8 * b);
          v |= std::uint64_t(std::to_integer<unsigned>(src[b])) << (8 * b);
        }
        const std::uint64_t d = (v & 1) ? ~(v >> 1) : (v >> 1); // unzigzag, 64-bit
        const std::uint64_t n = o + d;
        for (std::size_t b = 0; b < w; ++b) dst[b] = static_cast<std::byte>(n >> (8 * b));
        continue;
      }
      for (std::size_t b = 0; b < w; ++b)
        dst[b] = it.encoding == value_encoding::xor_mask ? dst[b] ^ src[b] : src[b];
    }
  }
  return emitted;
}

inline bool same_bytes(std::span<const host_tensor> a, std::span<const host_tensor> b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].meta != b[i].meta || a[i].bytes != b[i].bytes) return false;
  return true;
}

} // namespace dcr::test
