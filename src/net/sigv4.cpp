/// \file
/// AWS Signature Version 4: the compiled definitions of
/// dcr/transport/detail/sigv4.hpp over OpenSSL libcrypto.

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <ctime>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "dcr/core/error.hpp"
#include "dcr/core/hash.hpp"
#include "dcr/transport/detail/sigv4.hpp"

namespace dcr::transport::detail {

/// SHA-256 of `data`. Throws `dcr::error(io)` only if libcrypto fails
/// (allocation), which callers turn into a status.
sha256_digest sha256(std::span<const std::byte> data) {
  sha256_digest d{};
  unsigned len = 0;
  if (EVP_Digest(data.data(), data.size(), d.data(), &len, EVP_sha256(), nullptr) != 1 ||
      len != d.size())
    throw error(errc::io, "libcrypto SHA-256 failed");
  return d;
}
sha256_digest sha256(std::string_view s) {
  return sha256(std::as_bytes(std::span(s.data(), s.size())));
}

/// HMAC-SHA256(key, data).
sha256_digest hmac_sha256(std::span<const unsigned char> key, std::string_view data) {
  sha256_digest d{};
  unsigned len = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(data.data()), data.size(), d.data(),
           &len) == nullptr ||
      len != d.size())
    throw error(errc::io, "libcrypto HMAC-SHA256 failed");
  return d;
}

/// SigV4 URI encoding: every byte except the unreserved A-Z a-z 0-9 - . _ ~
/// becomes %XY with upper-case hex; '/' is kept when `keep_slash` (object key
/// paths: S3 encodes the path once, segment by segment) and encoded otherwise
/// (query names and values).
std::string uri_encode(std::string_view s, bool keep_slash) {
  static constexpr char digits[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    const bool unreserved = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
                            (c >= '0' && c <= '9') || c == '-' || c == '.' || c == '_' || c == '~';
    if (unreserved || (keep_slash && c == '/')) {
      out.push_back(ch);
    } else {
      out.push_back('%');
      out.push_back(digits[c >> 4]);
      out.push_back(digits[c & 15]);
    }
  }
  return out;
}

/// "YYYYMMDDTHHMMSSZ" (UTC) of `t`, the x-amz-date format.
std::string amz_date(std::chrono::system_clock::time_point t) {
  const std::time_t tt = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  ::gmtime_r(&tt, &tm);
  char buf[20];
  std::strftime(buf, sizeof buf, "%Y%m%dT%H%M%SZ", &tm);
  return buf;
}

/// Canonical query string: names and values URI-encoded ('/' too), sorted by
/// encoded name then value, each written "name=value" (also for empty values).
std::string canonical_query(const std::vector<std::pair<std::string, std::string>>& query) {
  std::vector<std::pair<std::string, std::string>> enc;
  enc.reserve(query.size());
  for (auto& [k, v] : query) enc.emplace_back(uri_encode(k, false), uri_encode(v, false));
  std::sort(enc.begin(), enc.end());
  std::string out;
  for (auto& [k, v] : enc) {
    if (!out.empty()) out.push_back('&');
    out += k;
    out.push_back('=');
    out += v;
  }
  return out;
}

/// Header value as canonicalised: outer whitespace trimmed, inner runs of
/// spaces collapsed to one.
std::string canonical_header_value(std::string_view v) {
  std::string out;
  bool space = false;
  for (char c : v) {
    if (c == ' ' || c == '\t') {
      space = !out.empty();
      continue;
    }
    if (space) out.push_back(' ');
    space = false;
    out.push_back(c);
  }
  return out;
}

/// The signing key: HMAC chain over "AWS4"+secret, date, region, service,
/// "aws4_request".
sha256_digest sigv4_signing_key(std::string_view secret, std::string_view day,
                                std::string_view region, std::string_view service) {
  const std::string k0 = "AWS4" + std::string(secret);
  auto k =
      hmac_sha256(std::span(reinterpret_cast<const unsigned char*>(k0.data()), k0.size()), day);
  k = hmac_sha256(k, region);
  k = hmac_sha256(k, service);
  return hmac_sha256(k, "aws4_request");
}

/// Sign `rq` with `cred` (see the file comment).
sigv4_signature sigv4_sign(const sigv4_request& rq, const sigv4_credentials& cred) {
  sigv4_signature s;
  // Lower-case names; values of repeated names join with ',' in order.
  std::vector<std::pair<std::string, std::string>> hs;
  for (auto& [n, v] : rq.headers) {
    std::string name(n);
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) {
      return static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
    });
    auto it = std::find_if(hs.begin(), hs.end(), [&](auto& h) { return h.first == name; });
    if (it == hs.end())
      hs.emplace_back(std::move(name), canonical_header_value(v));
    else
      it->second += "," + canonical_header_value(v);
  }
  std::stable_sort(hs.begin(), hs.end(), [](auto& a, auto& b) { return a.first < b.first; });
  std::string canon_headers;
  for (auto& [n, v] : hs) {
    canon_headers += n + ":" + v + "\n";
    if (!s.signed_headers.empty()) s.signed_headers.push_back(';');
    s.signed_headers += n;
  }
  s.canonical_request = rq.method + "\n" + rq.canonical_uri + "\n" + canonical_query(rq.query) +
                        "\n" + canon_headers + "\n" + s.signed_headers + "\n" + rq.payload_hash;
  const std::string day = rq.date.substr(0, 8);
  s.scope = day + "/" + rq.region + "/" + rq.service + "/aws4_request";
  s.string_to_sign =
      "AWS4-HMAC-SHA256\n" + rq.date + "\n" + s.scope + "\n" + to_hex(sha256(s.canonical_request));
  const auto key = sigv4_signing_key(cred.secret_key, day, rq.region, rq.service);
  s.signature = to_hex(hmac_sha256(key, s.string_to_sign));
  s.authorization = "AWS4-HMAC-SHA256 Credential=" + cred.access_key + "/" + s.scope +
                    ", SignedHeaders=" + s.signed_headers + ", Signature=" + s.signature;
  return s;
}

} // namespace dcr::transport::detail
