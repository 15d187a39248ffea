#pragma once
/// \file
/// Name hashing (XXH3-64, used for ownership) and content digests (BLAKE2b-128,
/// used for payload bodies and receiver target-state digests).

#include <array>
#include <blake2.h>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
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

/// A job's shared secret for keyed seals (BLAKE2b's key parameter, at most
/// 64 bytes). Empty means unkeyed: the seals are then checksums anyone can
/// recompute, which detects damage but not forgery (the embedded demo and
/// loopback use). Compared in constant time; never printed.
class seal_key {
public:
  seal_key() = default;
  /// At most 64 bytes (`invalid_argument` beyond: BLAKE2b keys are 1..64 bytes).
  static status make(std::span<const std::byte> bytes, seal_key& out) {
    DCR_RETURN_ERROR_IF(bytes.size() > 64, invalid_argument,
                        "seal key: " + std::to_string(bytes.size()) + " bytes, at most 64");
    seal_key k;
    std::memcpy(k.bytes_.data(), bytes.data(), bytes.size());
    k.size_ = bytes.size();
    out = k;
    return status::success();
  }
  static status make(std::string_view text, seal_key& out) {
    return make(std::as_bytes(std::span(text.data(), text.size())), out);
  }
  /// The job key of a shared secret (a key file's bytes): at least 16
  /// bytes; a secret longer than BLAKE2b's 64-byte key is reduced to its
  /// BLAKE2b-512, so any length of random text or bytes works. Every
  /// process of one job derives the same key from the same secret.
  static status from_secret(std::string_view secret, seal_key& out) {
    DCR_RETURN_ERROR_IF(secret.size() < 16, invalid_argument,
                        "job key: " + std::to_string(secret.size()) +
                            " bytes, a job key needs at least 16");
    if (secret.size() <= 64) return make(secret, out);
    std::array<std::uint8_t, 64> h{};
    DCR_RETURN_ERROR_IF(blake2b(h.data(), secret.data(), nullptr, h.size(), secret.size(), 0) != 0,
                        invalid_argument, "job key: blake2b failed");
    return make(std::as_bytes(std::span(h)), out);
  }
  bool empty() const noexcept { return size_ == 0; }
  std::size_t size() const noexcept { return size_; }
  const std::uint8_t* data() const noexcept { return bytes_.data(); }
  friend bool operator==(const seal_key& a, const seal_key& b) noexcept {
    if (a.size_ != b.size_) return false;
    std::uint8_t diff = 0;
    for (std::size_t i = 0; i < a.size_; ++i)
      diff |= static_cast<std::uint8_t>(a.bytes_[i] ^ b.bytes_[i]);
    return diff == 0;
  }

private:
  std::array<std::uint8_t, 64> bytes_{};
  std::size_t size_ = 0;
};

/// Incremental BLAKE2b-128 (digest length parameter 16): unkeyed it equals
/// `b2sum -l 128` of the same bytes; with a `seal_key` it is BLAKE2b's keyed
/// mode (a MAC: only a holder of the key can make or check it).
class blake2b_128 {
public:
  blake2b_128() {
    if (blake2b_init(&state_, 16) != 0) throw error(errc::invalid_argument, "blake2b_init failed");
  }
  explicit blake2b_128(const seal_key& key) {
    const int r = key.empty() ? blake2b_init(&state_, 16)
                              : blake2b_init_key(&state_, 16, key.data(), key.size());
    if (r != 0) throw error(errc::invalid_argument, "blake2b_init failed");
  }
  blake2b_128& update(std::span<const std::byte> bytes) {
    if (!bytes.empty() &&
        blake2b_update(&state_, reinterpret_cast<const std::uint8_t*>(bytes.data()),
                       bytes.size()) != 0)
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
inline digest128 digest(std::span<const std::byte> bytes) {
  return blake2b_128{}.update(bytes).final();
}
/// BLAKE2b-128 of a byte span keyed by `key` (unkeyed when it is empty).
inline digest128 digest(std::span<const std::byte> bytes, const seal_key& key) {
  return blake2b_128{key}.update(bytes).final();
}

/// Equal digests, compared in constant time (a MAC check must not tell an
/// attacker how many leading bytes of a forged tag were right).
inline bool same_digest(const digest128& a, const digest128& b) noexcept {
  std::uint8_t diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) diff |= static_cast<std::uint8_t>(a[i] ^ b[i]);
  return diff == 0;
}

/// Lower-case hex of any bytes (digests here, SHA-256 hashes and signatures
/// in SigV4): two characters per byte.
inline std::string to_hex(std::span<const unsigned char> bytes) {
  static constexpr char hex[] = "0123456789abcdef";
  std::string s(2 * bytes.size(), '0');
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    s[2 * i] = hex[bytes[i] >> 4];
    s[2 * i + 1] = hex[bytes[i] & 15];
  }
  return s;
}
/// Lower-case hex of a digest (32 characters).
inline std::string to_hex(const digest128& d) {
  return to_hex(std::span<const unsigned char>(d.data(), d.size()));
}

/// Parse what `to_hex` writes (exactly 32 lower-case hex characters).
inline bool parse_hex_digest(std::string_view s, digest128& d) {
  if (s.size() != 32) return false;
  auto nib = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  for (std::size_t i = 0; i < 16; ++i) {
    int hi = nib(s[2 * i]), lo = nib(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    d[i] = static_cast<std::uint8_t>(hi * 16 + lo);
  }
  return true;
}

/// `body` sealed for the text formats of the control plane (manifests,
/// commit records): followed by the line `digest <hex>` of the BLAKE2b-128
/// of every byte before it, so a damaged text is detected, not misread.
/// With a non-empty `key` the digest is keyed (same line, same length): only
/// a holder of the key can write a text that opens, so a forged one is
/// refused.
inline std::string seal_text(std::string body, const seal_key& key = {}) {
  const auto d = digest(std::as_bytes(std::span(body)), key);
  return body + "digest " + to_hex(d) + "\n";
}

/// Check the seal of a `seal_text` text and set `body` to what it covers.
/// `what` names the format in messages ("manifest: missing digest line").
/// `key` must be the key it was sealed with: unkeyed text read with a key,
/// keyed text read without it or with another key are `digest_mismatch`
/// (the two cannot be told apart, by design: the line looks the same).
inline status open_sealed_text(std::string_view text, std::string_view what, std::string_view& body,
                               const seal_key& key = {}) {
  const auto dpos = text.rfind("digest ");
  DCR_RETURN_ERROR_IF(dpos == std::string_view::npos || (dpos > 0 && text[dpos - 1] != '\n'),
                      bad_format, std::string(what) + ": missing digest line");
  digest128 want{};
  const auto line = text.substr(dpos + 7);
  DCR_RETURN_ERROR_IF(line.size() != 33 || line.back() != '\n' ||
                          !parse_hex_digest(line.substr(0, 32), want),
                      bad_format, std::string(what) + ": malformed digest line");
  body = text.substr(0, dpos);
  DCR_RETURN_ERROR_IF(
      !same_digest(digest(std::as_bytes(std::span(body)), key), want), digest_mismatch,
      std::string(what) + (key.empty() ? ": digest does not match its contents"
                                       : ": keyed digest does not match its contents "
                                         "(damaged, forged, or sealed without the job key)"));
  return status::success();
}

/// A fresh incarnation id (the identity of one commit history, carried by
/// every attempt object of it): 128 random bits as 32 lower-case hex digits.
inline std::string new_incarnation() {
  std::random_device rd;
  digest128 d{};
  for (auto& b : d) b = static_cast<std::uint8_t>(rd());
  return to_hex(d);
}

/// An incarnation id is exactly 32 lower-case hex digits.
inline bool valid_incarnation(std::string_view s) {
  digest128 d{};
  return parse_hex_digest(s, d);
}

} // namespace dcr
