#pragma once
/// \file
/// Base64 (RFC 4648 §4, standard alphabet, with padding): the encoding of
/// bytes in etcd's JSON gateway and in HTTP headers such as Content-MD5.

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "dcr/core/error.hpp"

namespace dcr::net {

/// Encode bytes (a `std::string` used as a byte buffer) to padded base64.
inline std::string base64_encode(std::string_view bytes) {
  static constexpr char alphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  std::size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const std::uint32_t v = static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[i])) << 16 |
                            static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[i + 1]))
                                << 8 |
                            static_cast<unsigned char>(bytes[i + 2]);
    out += alphabet[v >> 18];
    out += alphabet[(v >> 12) & 63];
    out += alphabet[(v >> 6) & 63];
    out += alphabet[v & 63];
  }
  if (const auto rest = bytes.size() - i; rest > 0) {
    std::uint32_t v = static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[i])) << 16;
    if (rest == 2) v |= static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[i + 1])) << 8;
    out += alphabet[v >> 18];
    out += alphabet[(v >> 12) & 63];
    out += rest == 2 ? alphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

/// Decode padded base64. Strict: length a multiple of 4, padding only at the
/// end, unused bits zero (so every byte string has exactly one encoding);
/// `errc::bad_format` naming `what` and the offset otherwise.
inline status base64_decode(std::string_view text, std::string& out,
                            std::string_view what = "base64") {
  auto bad = [&](std::size_t at, const char* why) {
    return fail(errc::bad_format,
                std::string(what) + ": " + why + " at character " + std::to_string(at));
  };
  auto sextet = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  if (text.size() % 4 != 0) return bad(text.size(), "length is not a multiple of 4");
  std::string r;
  r.reserve(text.size() / 4 * 3);
  for (std::size_t i = 0; i < text.size(); i += 4) {
    const bool last = i + 4 == text.size();
    const int pad = last ? (text[i + 3] == '=') + (text[i + 2] == '=') : 0;
    if (pad == 1 && text[i + 2] == '=') return bad(i + 2, "misplaced padding");
    std::uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = text[i + static_cast<std::size_t>(k)];
      int s = 0;
      if (k >= 4 - pad) {
        if (c != '=') return bad(i + static_cast<std::size_t>(k), "misplaced padding");
      } else if ((s = sextet(c)) < 0) {
        return bad(i + static_cast<std::size_t>(k), "not a base64 character");
      }
      v = v << 6 | static_cast<std::uint32_t>(s);
    }
    if ((pad == 1 && (v & 0xFF)) || (pad == 2 && (v & 0xFFFF)))
      return bad(i, "nonzero unused bits");
    r += static_cast<char>(v >> 16);
    if (pad < 2) r += static_cast<char>((v >> 8) & 0xFF);
    if (pad < 1) r += static_cast<char>(v & 0xFF);
  }
  out = std::move(r);
  return status::success();
}

} // namespace dcr::net
