#pragma once
// Test-only workloads for receiver tests: canonical BF16 models, version
// transitions (AdamW steps and stress updates via dcr::sim, NaN injection) and items
// built from the bitwise canonical diff of two versions.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "dcr/codec/item.hpp"
#include "dcr/core/hash.hpp"
#include "dcr/core/rounding.hpp"
#include "dcr/core/word_delta.hpp"
#include "dcr/receiver/tensor_set.hpp"
#include "examples/common/simulator.hpp"

namespace dcr::test {

inline std::uint16_t* bf16_words(host_tensor& t) {
  return reinterpret_cast<std::uint16_t*>(t.bytes.data());
}
inline const std::uint16_t* bf16_words(const host_tensor& t) {
  return reinterpret_cast<const std::uint16_t*>(t.bytes.data());
}

/// Random BF16 model: N(0, 0.02) weights, norms near 1.
inline tensor_set random_model(const std::vector<tensor_meta>& metas, std::uint64_t seed) {
  tensor_set s(metas);
  std::mt19937_64 rng(seed);
  for (auto& t : s.tensors()) {
    const bool norm = t.meta.name.find("norm") != std::string::npos;
    std::normal_distribution<float> nd(norm ? 1.0f : 0.0f, norm ? 0.05f : 0.02f);
    auto* w = bf16_words(t);
    for (std::uint64_t i = 0; i < t.meta.numel(); ++i) w[i] = f32_to_bf16_rne(nd(rng));
  }
  return s;
}

/// Deep copy of a tensor set.
inline tensor_set clone(const tensor_set& s) {
  tensor_set c;
  for (auto& t : s.tensors()) c.add(t);
  return c;
}

/// AdamW steps (dcr::sim trainer: FP32 master, lr 1e-6, N(0,1) gradients,
/// BF16 RNE stored words), one trainer per tensor seeded from `seed`.
inline void adamw_steps(tensor_set& s, int steps, std::uint64_t seed) {
  std::uint64_t k = 0;
  for (auto& t : s.tensors()) {
    auto w = t.words<bf16>();
    sim::adamw_trainer tr(std::span<const std::uint16_t>(w.data(), w.size()), seed + 1000 * ++k);
    for (int i = 0; i < steps; ++i) tr.step();
    std::copy(tr.bf16().begin(), tr.bf16().end(), w.begin());
  }
}

/// Stress update of every tensor (dcr::sim::stress_update: a uniform
/// `fraction` of elements scaled by (1 + amp·N(0,1)) in FP32, RNE to BF16).
inline void stress(tensor_set& s, double fraction, double amp, std::uint64_t seed) {
  std::uint64_t k = 0;
  for (auto& t : s.tensors()) sim::stress_update(t.words<bf16>(), fraction, amp, seed + 1000 * ++k);
}

/// Put NaN patterns (the default placeholder 0x7FC0 among them) at `per_tensor`
/// random positions of every tensor, and turn earlier NaNs back into numbers.
inline void inject_nans(tensor_set& s, int per_tensor, std::uint64_t seed) {
  static constexpr std::uint16_t pats[] = {0x7FC0, 0xFFC0, 0x7F81, 0x7FFF, 0xFF80 | 0x11};
  std::mt19937_64 rng(seed);
  for (auto& t : s.tensors()) {
    auto* w = bf16_words(t);
    const auto n = t.meta.numel();
    for (std::uint64_t i = 0; i < n; ++i)
      if (is_nan_word<bf16>(w[i]) && rng() % 2) w[i] = 0x3F80;
    for (int k = 0; k < per_tensor; ++k) w[rng() % n] = pats[rng() % std::size(pats)];
  }
}

/// Which items a test emits.
enum class delta_mode { mixed, xor_only, overwrite_only, add_only };

/// Value word of `enc` for one changed element (`w` bytes at `x` -> `y`).
inline void delta_word(value_encoding enc, const std::byte* x, const std::byte* y, std::size_t w,
                       std::vector<std::byte>& out) {
  if (enc == value_encoding::add) {
    std::uint64_t o = 0, n = 0;
    std::memcpy(&o, x, w);
    std::memcpy(&n, y, w);
    std::uint64_t v = 0;
    if (w == 1)
      v = zigzag_delta<std::uint8_t>(static_cast<std::uint8_t>(o), static_cast<std::uint8_t>(n));
    if (w == 2)
      v = zigzag_delta<std::uint16_t>(static_cast<std::uint16_t>(o), static_cast<std::uint16_t>(n));
    if (w == 4)
      v = zigzag_delta<std::uint32_t>(static_cast<std::uint32_t>(o), static_cast<std::uint32_t>(n));
    for (std::size_t b = 0; b < w; ++b) out.push_back(static_cast<std::byte>(v >> (8 * b)));
    return;
  }
  for (std::size_t b = 0; b < w; ++b)
    out.push_back(enc == value_encoding::xor_mask ? (x[b] ^ y[b]) : y[b]);
}

/// Items from the bitwise diff of two versions: each tensor's changed indices
/// are split among `owners` contiguous index ranges (one item per owner with
/// entries). XOR (or add) where `xor_ok(name)` allows it (in mixed mode XOR
/// for about a third of those tensors, add for another third), overwrite
/// elsewhere.
inline std::vector<item> diff_items(const tensor_set& from, const tensor_set& to, delta_mode mode,
                                    const std::function<bool(const std::string&)>& xor_ok,
                                    int owners = 2) {
  std::vector<item> out;
  for (auto& a : from.tensors()) {
    auto bt = to.find(a.meta.name);
    const auto* B = reinterpret_cast<const std::byte*>(bt->data);
    const auto w = width_of(a.meta.dtype);
    const auto n = a.meta.numel();
    const bool relative_ok = mode != delta_mode::overwrite_only && xor_ok(a.meta.name);
    value_encoding enc = !relative_ok                   ? value_encoding::overwrite
                         : mode == delta_mode::add_only ? value_encoding::add
                                                        : value_encoding::xor_mask;
    if (mode == delta_mode::mixed && relative_ok)
      enc = std::array{value_encoding::xor_mask, value_encoding::add,
                       value_encoding::overwrite}[name_hash(a.meta.name) % 3];
    for (int o = 0; o < owners; ++o) {
      const std::uint64_t lo =
          n * static_cast<std::uint64_t>(o) / static_cast<std::uint64_t>(owners);
      const std::uint64_t hi =
          n * static_cast<std::uint64_t>(o + 1) / static_cast<std::uint64_t>(owners);
      item it;
      it.tensor = a.meta;
      it.encoding = enc;
      for (std::uint64_t i = lo; i < hi; ++i) {
        const std::byte* x = a.bytes.data() + i * w;
        const std::byte* y = B + i * w;
        if (std::memcmp(x, y, w) == 0) continue;
        it.indices.push_back(i);
        delta_word(enc, x, y, w, it.values);
      }
      if (!it.indices.empty()) out.push_back(std::move(it));
    }
  }
  return out;
}

/// Number of changed elements over all tensors.
inline std::uint64_t changed_count(const std::vector<item>& items) {
  std::uint64_t n = 0;
  for (auto& it : items) n += it.indices.size();
  return n;
}

} // namespace dcr::test
