#pragma once
/// \file
/// Name hashing (XXH3-64, used for ownership) and content digests (BLAKE2b-128,
/// used for payload bodies and receiver target-state digests).

#include <array>
#include <blake2.h>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "dcr/core/error.hpp"

namespace dcr {

/// Stable 64-bit hash of a tensor name (XXH3-64, seed 0). Stable across
/// processes, builds and attempts: ownership depends on it.
inline std::uint64_t name_hash(std::string_view name) noexcept {
  return XXH3_64bits(name.data(), name.size());
}

/// A 128-bit BLAKE2b digest.
using digest128 = std::array<std::uint8_t, 16>;

/// Incremental BLAKE2b-128 (digest length parameter 16, unkeyed): equals
/// `b2sum -l 128` of the same bytes.
class blake2b_128 {
public:
  blake2b_128() {
    if (blake2b_init(&state_, 16) != 0) throw error(errc::invalid_argument, "blake2b_init failed");
  }
  blake2b_128& update(std::span<const std::byte> bytes) {
    if (!bytes.empty() && blake2b_update(&state_, reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size()) != 0)
      throw error(errc::invalid_argument, "blake2b_update failed");
    return *this;
  }
  digest128 final() {
    digest128 out{};
    if (blake2b_final(&state_, out.data(), out.size()) != 0)
      throw error(errc::invalid_argument, "blake2b_final failed");
    return out;
  }

private:
  blake2b_state state_{};
};

/// BLAKE2b-128 of a byte span.
inline digest128 digest(std::span<const std::byte> bytes) { return blake2b_128{}.update(bytes).final(); }

/// Lower-case hex of a digest (32 characters).
inline std::string to_hex(const digest128& d) {
  static constexpr char hex[] = "0123456789abcdef";
  std::string s(32, '0');
  for (std::size_t i = 0; i < d.size(); ++i) {
    s[2 * i] = hex[d[i] >> 4];
    s[2 * i + 1] = hex[d[i] & 15];
  }
  return s;
}

} // namespace dcr
