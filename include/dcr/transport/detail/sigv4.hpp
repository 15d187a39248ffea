#pragma once
/// \file
/// AWS Signature Version 4 (header form) for the S3 object store: SHA-256 and
/// HMAC-SHA256, the S3 URI-encoding rules, canonical request, string to sign,
/// signing-key derivation and the Authorization header. Pure functions of
/// their inputs (the clock is an argument), so the published AWS examples
/// check them exactly. Compiled into the dcr-net library (src/net/sigv4.cpp,
/// over OpenSSL libcrypto, whose headers this one does not include); exposed
/// in a header of its own for those tests.

#include <array>
#include <chrono>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dcr::transport::detail {

using sha256_digest = std::array<unsigned char, 32>;

/// Hex SHA-256 of the empty string (the payload hash of bodiless requests).
inline constexpr std::string_view empty_payload_sha256 =
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// Access key, secret and (for temporary credentials) session token.
struct sigv4_credentials {
  std::string access_key;
  std::string secret_key;
  std::string session_token; ///< sent and signed as x-amz-security-token when not empty
};

/// What is signed. `headers` are the request headers to sign, exactly as
/// sent (names in any case; `host` must be among them); `query` holds raw
/// (unencoded) name/value pairs; `canonical_uri` is the already encoded path.
struct sigv4_request {
  std::string method;
  std::string canonical_uri = "/";
  std::vector<std::pair<std::string, std::string>> query;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string payload_hash; ///< hex SHA-256 of the body, or "UNSIGNED-PAYLOAD"
  std::string date;         ///< x-amz-date value, "YYYYMMDDTHHMMSSZ"
  std::string region;
  std::string service = "s3";
};

/// Every intermediate of a signature (tests compare each with AWS's examples).
struct sigv4_signature {
  std::string canonical_request;
  std::string string_to_sign;
  std::string scope;          ///< date/region/service/aws4_request
  std::string signed_headers; ///< sorted lower-case names joined by ';'
  std::string signature;      ///< hex
  std::string authorization;  ///< the Authorization header value
};

/// SHA-256 of `data`. Throws `dcr::error(io)` only if libcrypto fails
/// (allocation), which callers turn into a status.
sha256_digest sha256(std::span<const std::byte> data);

sha256_digest sha256(std::string_view s);

/// HMAC-SHA256(key, data).
sha256_digest hmac_sha256(std::span<const unsigned char> key, std::string_view data);

/// SigV4 URI encoding: every byte except the unreserved A-Z a-z 0-9 - . _ ~
/// becomes %XY with upper-case hex; '/' is kept when `keep_slash` (object key
/// paths: S3 encodes the path once, segment by segment) and encoded otherwise
/// (query names and values).
std::string uri_encode(std::string_view s, bool keep_slash);

/// "YYYYMMDDTHHMMSSZ" (UTC) of `t`, the x-amz-date format.
std::string amz_date(std::chrono::system_clock::time_point t);

/// Canonical query string: names and values URI-encoded ('/' too), sorted by
/// encoded name then value, each written "name=value" (also for empty values).
std::string canonical_query(const std::vector<std::pair<std::string, std::string>>& query);

/// Header value as canonicalised: outer whitespace trimmed, inner runs of
/// spaces collapsed to one.
std::string canonical_header_value(std::string_view v);

/// The signing key: HMAC chain over "AWS4"+secret, date, region, service,
/// "aws4_request".
sha256_digest sigv4_signing_key(std::string_view secret, std::string_view day,
                                std::string_view region, std::string_view service);

/// Sign `rq` with `cred` (see the file comment).
sigv4_signature sigv4_sign(const sigv4_request& rq, const sigv4_credentials& cred);

} // namespace dcr::transport::detail
