#pragma once
/// \file
/// Training-side simulator: synthetic checkpoints and weight updates with the
/// statistics of RL fine-tuning, for tests and benches.
///
/// Determinism: every result is a function of the seed alone. Random bits come
/// from xoshiro256** seeded through splitmix64; normals from the Marsaglia
/// polar method (a Box–Muller variant) on 53-bit uniforms; uniform integers
/// from Lemire's unbiased multiply-and-reject. None of the standard library's
/// engines or distributions is used, so results do not depend on its
/// implementation. The only library math is `std::sqrt` (exact by IEEE 754)
/// and `std::log` in the polar transform, so results are bit-identical
/// wherever the C library's `log` agrees (e.g. any glibc on x86-64).

#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "dcr/core/dtype.hpp"
#include "dcr/core/error.hpp"
#include "dcr/core/rounding.hpp"

namespace dcr::sim {

/// splitmix64 (Steele, Lea, Flood): a 64-bit state stepped by a Weyl
/// sequence and mixed; used to expand one seed into generator states.
struct splitmix64 {
  std::uint64_t state = 0;
  constexpr std::uint64_t next() noexcept {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  /// A double in [0, 1) from the top 53 bits of `next()`.
  constexpr double uniform() noexcept { return static_cast<double>(next() >> 11) * 0x1p-53; }
};

/// xoshiro256** 1.0 (Blackman, Vigna) with its state filled by splitmix64(seed).
class xoshiro256ss {
public:
  explicit constexpr xoshiro256ss(std::uint64_t seed) noexcept {
    splitmix64 sm{seed};
    for (auto& x : s_) x = sm.next();
  }

  /// A generator with exactly this state (test vectors); not all zero.
  static constexpr xoshiro256ss from_state(const std::uint64_t (&state)[4]) noexcept {
    xoshiro256ss g(0);
    for (int i = 0; i < 4; ++i) g.s_[i] = state[i];
    return g;
  }

  /// Next 64 random bits.
  constexpr std::uint64_t next() noexcept {
    const std::uint64_t r = rotl(s_[1] * 5, 7) * 9;
    const std::uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return r;
  }

  /// Uniform double in [0, 1) with 53 random bits.
  constexpr double uniform() noexcept { return static_cast<double>(next() >> 11) * 0x1p-53; }

  /// Uniform integer in [0, bound), bound > 0, without modulo bias (Lemire 2019).
  constexpr std::uint64_t below(std::uint64_t bound) noexcept {
    unsigned __int128 p = static_cast<unsigned __int128>(next()) * bound;
    auto low = static_cast<std::uint64_t>(p);
    if (low < bound) {
      const std::uint64_t reject = (0 - bound) % bound; // 2^64 mod bound
      while (low < reject) {
        p = static_cast<unsigned __int128>(next()) * bound;
        low = static_cast<std::uint64_t>(p);
      }
    }
    return static_cast<std::uint64_t>(p >> 64);
  }

private:
  static constexpr std::uint64_t rotl(std::uint64_t x, int k) noexcept {
    return (x << k) | (x >> (64 - k));
  }
  std::uint64_t s_[4]{};
};

/// Standard normal deviates, N(0, 1), by the Marsaglia polar method: draw
/// (u, v) uniform in the unit disc, emit u·f and v·f with f = sqrt(-2 ln s / s).
class normal_source {
public:
  explicit normal_source(std::uint64_t seed) noexcept : gen_(seed) {}

  double next() noexcept {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u, v, s;
    do {
      u = 2.0 * gen_.uniform() - 1.0;
      v = 2.0 * gen_.uniform() - 1.0;
      s = u * u + v * v;
    } while (s >= 1.0 || s == 0.0);
    const double f = std::sqrt(-2.0 * std::log(s) / s);
    spare_ = v * f;
    has_spare_ = true;
    return u * f;
  }

  /// The underlying uniform generator (shares the stream).
  xoshiro256ss& uniform_bits() noexcept { return gen_; }

private:
  xoshiro256ss gen_;
  double spare_ = 0.0;
  bool has_spare_ = false;
};

/// A floating dtype the simulator can round to: bf16, f16 or f32.
template <class D>
concept simulated_dtype =
    std::same_as<D, dcr::bf16> || std::same_as<D, dcr::f16> || std::same_as<D, dcr::f32>;

/// FP32 → stored word of D, round to nearest even (identity for f32).
template <simulated_dtype D>
constexpr word_t<D> to_word(float x) noexcept {
  if constexpr (std::is_same_v<D, dcr::bf16>)
    return f32_to_bf16_rne(x);
  else if constexpr (std::is_same_v<D, dcr::f16>)
    return f32_to_f16_rne(x);
  else
    return f32_bits(x);
}

/// Stored word of D → FP32, exact.
template <simulated_dtype D>
constexpr float to_f32(word_t<D> w) noexcept {
  if constexpr (std::is_same_v<D, dcr::bf16>)
    return bf16_to_f32(w);
  else if constexpr (std::is_same_v<D, dcr::f16>)
    return f16_to_f32(w);
  else
    return f32_from_bits(w);
}

/// `n` words of dtype D holding RNE(float(stddev · z)), z ~ N(0, 1) from `seed`.
template <simulated_dtype D>
std::vector<word_t<D>> normal_words(std::size_t n, float stddev, std::uint64_t seed) {
  normal_source g(seed);
  std::vector<word_t<D>> out(n);
  const double sd = stddev;
  for (auto& w : out) w = to_word<D>(static_cast<float>(sd * g.next()));
  return out;
}

/// `n` BF16 words drawn from N(0, stddev²): RNE(float(stddev · z)).
inline std::vector<std::uint16_t> normal_bf16(std::size_t n, float stddev, std::uint64_t seed) {
  return normal_words<dcr::bf16>(n, stddev, seed);
}

/// AdamW hyper-parameters (defaults: RL fine-tuning as in the paper's runs).
struct adamw_options {
  float lr = 1e-6f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f; ///< decoupled, applied as w *= 1 - lr·wd
};

/// FP32 master weights trained by AdamW on random N(0, 1) gradients, stored
/// as words of dtype D (RNE of the master after every step).
///
/// Per step t (1-based) and element, in FP32, in this order (PyTorch's AdamW):
/// g ~ N(0,1) (next value of one normal stream seeded once by `seed`);
/// w *= 1 - lr·wd; m = β1·m + (1-β1)·g; v = β2·v + (1-β2)·g²;
/// w -= (lr / (1-β1^t)) · m / (sqrt(v) / sqrt(1-β2^t) + eps); stored = RNE(w).
/// β^t is a running product in double, rounded once to FP32 per step.
template <simulated_dtype D>
class basic_adamw_trainer {
public:
  using word = word_t<D>;

  /// Master weights start as the exact FP32 values of `initial`.
  basic_adamw_trainer(std::span<const word> initial, std::uint64_t seed, adamw_options opt = {})
      : opt_(opt), grads_(seed), master_(initial.size()), m_(initial.size(), 0.0f),
        v_(initial.size(), 0.0f), stored_(initial.begin(), initial.end()) {
    for (std::size_t i = 0; i < initial.size(); ++i) master_[i] = to_f32<D>(initial[i]);
  }

  /// One optimiser step over every element.
  void step() {
    ++t_;
    const float b1 = opt_.beta1, b2 = opt_.beta2;
    b1_pow_ *= b1; // β^t as a running product: exact enough, and no pow()
    b2_pow_ *= b2;
    const auto bc1 = static_cast<float>(1.0 - b1_pow_);
    const auto bc2 = static_cast<float>(1.0 - b2_pow_);
    const float step_size = opt_.lr / bc1;
    const float sqrt_bc2 = std::sqrt(bc2);
    const float decay = 1.0f - opt_.lr * opt_.weight_decay;
    for (std::size_t i = 0; i < master_.size(); ++i) {
      const auto g = static_cast<float>(grads_.next());
      float w = master_[i] * decay;
      const float m = b1 * m_[i] + (1.0f - b1) * g;
      const float v = b2 * v_[i] + (1.0f - b2) * (g * g);
      w -= step_size * (m / (std::sqrt(v) / sqrt_bc2 + opt_.eps));
      m_[i] = m;
      v_[i] = v;
      master_[i] = w;
      stored_[i] = to_word<D>(w);
    }
  }

  /// Stored words after the last step (the bits a checkpoint would hold).
  std::span<const word> words() const noexcept { return stored_; }
  /// BF16 stored words (BF16 trainers only).
  std::span<const std::uint16_t> bf16() const noexcept requires std::same_as<D, dcr::bf16> {
    return stored_;
  }
  /// FP32 master weights.
  std::span<const float> master() const noexcept { return master_; }
  /// Steps taken so far.
  std::uint64_t steps() const noexcept { return t_; }
  const adamw_options& options() const noexcept { return opt_; }

private:
  adamw_options opt_;
  normal_source grads_;
  std::vector<float> master_, m_, v_;
  std::vector<word> stored_;
  std::uint64_t t_ = 0;
  double b1_pow_ = 1.0, b2_pow_ = 1.0;
};

/// The BF16 trainer of the shared contract.
using adamw_trainer = basic_adamw_trainer<dcr::bf16>;

/// Stress update of the paper's §8 experiments on words of dtype D: exactly
/// k = round(fraction · n) elements, chosen uniformly without replacement
/// (selection sampling), get new stored bits; all others keep theirs.
///
/// A chosen element x becomes RNE(x · (1 + a·z)) computed in FP32, z ~ N(0,1),
/// a = rel_amplitude; z is redrawn (up to 32 draws) while the result rounds to
/// the old word, so the change count is exact. An element scaling cannot
/// change (±0, ±inf, NaN, or 32 draws without a change) gets its lowest bit
/// flipped instead. Returns k. Throws `errc::invalid_argument` for a fraction
/// outside [0, 1] or a negative or non-finite amplitude.
template <simulated_dtype D>
std::size_t stress_update_words(std::span<word_t<D>> words, double fraction, double rel_amplitude,
                                std::uint64_t seed) {
  if (!(fraction >= 0.0 && fraction <= 1.0))
    throw error(errc::invalid_argument,
                "stress_update: fraction " + std::to_string(fraction) + " is outside [0, 1]");
  if (!(rel_amplitude >= 0.0 && std::isfinite(rel_amplitude)))
    throw error(errc::invalid_argument, "stress_update: rel_amplitude " +
                                            std::to_string(rel_amplitude) +
                                            " is not a finite value >= 0");
  const std::size_t n = words.size();
  const auto k = static_cast<std::size_t>(std::llround(fraction * static_cast<double>(n)));
  normal_source g(seed);
  const auto amp = static_cast<float>(rel_amplitude);
  std::size_t chosen = 0;
  for (std::size_t i = 0; i < n && chosen < k; ++i) {
    // Knuth's algorithm S: choose i with probability (k - chosen) / (n - i).
    if (g.uniform_bits().below(n - i) >= k - chosen) continue;
    ++chosen;
    const word_t<D> old = words[i];
    const float x = to_f32<D>(old);
    word_t<D> nw = old;
    if (std::isfinite(x) && x != 0.0f && amp > 0.0f)
      for (int draw = 0; draw < 32 && nw == old; ++draw) {
        const float factor = 1.0f + amp * static_cast<float>(g.next());
        nw = to_word<D>(x * factor);
      }
    if (nw == old) nw = static_cast<word_t<D>>(old ^ 1u);
    words[i] = nw;
  }
  return k;
}

/// BF16 stress update of the shared contract (see `stress_update_words`).
inline std::size_t stress_update(std::span<std::uint16_t> words, double fraction,
                                 double rel_amplitude, std::uint64_t seed) {
  return stress_update_words<dcr::bf16>(words, fraction, rel_amplitude, seed);
}

} // namespace dcr::sim
