#pragma once
/// \file
/// `s3_object_store`: the `object_store` concept over the S3 REST API, for
/// AWS S3 and the servers that speak it (MinIO, Ceph RGW, Swift's s3api).
///
/// Contract, on top of the concept's (see object_store.hpp):
///  - Path-style addressing: object `a/b` of bucket `bk` is
///    `<endpoint>/bk/a/b`; every request is signed with AWS Signature
///    Version 4 (header form, `x-amz-content-sha256` = SHA-256 of the body, so
///    the server rejects a body damaged in transit).
///  - `put` is one PutObject: S3 publishes an object whole or not at all.
///  - `get` of a missing key: `errc::not_found`. A missing bucket is a
///    configuration error, not a missing object: `errc::io`.
///  - `list` pages through ListObjectsV2 (`max_keys` per page) following
///    continuation tokens; it checks that every key starts with the prefix
///    and that keys strictly increase across pages (`errc::bad_format`
///    otherwise). Keys that are not valid object names (written by other
///    tools into the same bucket) are outside the store's namespace and are
///    skipped, as the filesystem backend skips its temporaries.
///  - `remove` is HEAD then DELETE, because S3 answers DELETE of a missing
///    key with success and the concept wants `errc::not_found`; a concurrent
///    remover between the two may make both succeed.
///  - Retries: every request is idempotent (a PUT of the same bytes, a DELETE,
///    reads), so connection failures, timeouts and HTTP 500/502/503/504 are
///    retried up to `max_attempts` times with exponential, jittered backoff.
///    Still failing: `errc::unavailable`.
///  - Any other HTTP error: `errc::io` with the S3 error code, message and
///    request id from the XML body, e.g. "HTTP 403 SignatureDoesNotMatch:
///    ...". Malformed answers: `errc::bad_format`.
///  - Thread-safe: concurrent calls use separate kept-alive connections from
///    a small pool.
/// Compiled into the dcr-net library (`dependency('dcr-net')`, which links
/// OpenSSL libcrypto for the signatures); this header includes no networking
/// or OpenSSL header. HTTPS endpoints (what AWS and most deployments require)
/// need dcr-net built with TLS (`net::tls_supported()`); without it they are
/// refused at construction. `s3_options::http.tls` sets the trusted CAs (default: the
/// system store). A certificate that fails verification is `errc::io` and is
/// not retried.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dcr/core/error.hpp"
#include "dcr/net/http_client.hpp"
#include "dcr/transport/detail/sigv4.hpp"
#include "dcr/transport/object_store.hpp"

namespace dcr::transport {

/// Where the store is and how it behaves.
struct s3_options {
  std::string endpoint = "http://127.0.0.1:9000"; ///< "http[s]://host[:port]" (no path)
  std::string region = "us-east-1";               ///< signed into every request's scope
  std::string bucket;                             ///< S3 bucket name rules (3-63 of [a-z0-9.-])
  detail::sigv4_credentials credentials;
  std::uint32_t max_keys = 1000;         ///< ListObjectsV2 page size, 1..1000
  unsigned max_attempts = 5;             ///< tries per request when the failure is retryable
  std::chrono::milliseconds backoff{50}; ///< wait before the first retry; doubles each time
  std::chrono::milliseconds max_backoff{2000};
  std::size_t max_pool = 16; ///< idle connections kept for reuse
  /// Longest wait between listings of a waiting attempt reader: every
  /// LIST is a billed request, rate-limited per prefix, and each receiver
  /// polls, so the default trades up to 50 ms of latency for 20 LIST/s per
  /// waiting receiver instead of 200.
  std::chrono::milliseconds list_poll_max{50};
  /// Requests an attempt writer or reader keeps in flight on this store
  /// (`requests_in_flight_of`), each on its own kept-alive connection (at
  /// most `max_pool` are kept). Swift's per-object latency, not the link,
  /// bounds one request at a time (docs/benchmarks.md measures the choice).
  std::size_t requests_in_flight = 8;
  net::http_options http = default_http(); ///< timeouts, body limit, TLS trust

  /// Large objects: response bodies up to 4 GiB (the http client's own
  /// default suits control-plane answers, not payloads).
  static net::http_options default_http() {
    net::http_options o;
    o.max_body = std::size_t{4} << 30;
    o.request_timeout = std::chrono::milliseconds(60000);
    o.user_agent = "dcr-s3";
    return o;
  }
};

/// Counters (totals since construction), for tests and monitoring.
struct s3_stats {
  std::uint64_t requests = 0;   ///< HTTP exchanges attempted, retries included
  std::uint64_t retries = 0;    ///< of those, repeats after a retryable failure
  std::uint64_t list_pages = 0; ///< ListObjectsV2 pages read
};

/// S3 bucket naming rules that matter for path-style URLs: 3-63 bytes of
/// lower-case letters, digits, '.' and '-', starting and ending alphanumeric.
inline status validate_bucket_name(std::string_view b) {
  auto alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
  DCR_RETURN_ERROR_IF(b.size() < 3 || b.size() > 63, invalid_argument,
                      "bucket name '" + std::string(b) + "' must have 3 to 63 bytes");
  DCR_RETURN_ERROR_IF(!alnum(b.front()) || !alnum(b.back()), invalid_argument,
                      "bucket name '" + std::string(b) +
                          "' must start and end with a letter or digit");
  for (char c : b)
    DCR_RETURN_ERROR_IF(!alnum(c) && c != '.' && c != '-', invalid_argument,
                        "bucket name '" + std::string(b) + "' has a byte outside [a-z0-9.-]");
  return status::success();
}

/// Object store on an S3 bucket (see file comment).
class s3_object_store {
public:
  /// Throws `dcr::error(invalid_argument)` for a malformed endpoint (or an
  /// https one without TLS support), bucket name, empty access key, or
  /// `max_keys`/`max_attempts` out of range.
  explicit s3_object_store(s3_options opt);
  s3_object_store(const s3_object_store&) = delete;
  s3_object_store& operator=(const s3_object_store&) = delete;
  ~s3_object_store();

  const s3_options& options() const noexcept;
  /// Upper bound of `attempt_reader`'s poll interval on this store.
  std::chrono::microseconds list_poll_max() const noexcept;
  s3_stats stats() const noexcept;
  /// `s3_options::requests_in_flight`.
  std::size_t requests_in_flight() const noexcept { return options().requests_in_flight; }

  /// CreateBucket; success also when this account already owns it.
  status create_bucket();
  /// PutObject (atomic publish).
  status put(std::string_view name, std::span<const std::byte> bytes);
  /// GetObject; `errc::not_found` for a missing key.
  status get(std::string_view name, std::vector<std::byte>& out);
  /// Every valid object name starting with `prefix`, sorted (ListObjectsV2).
  status list(std::string_view prefix, std::vector<std::string>& names);
  /// The names `list` returns that sort after `after` (ListObjectsV2
  /// `start-after`): a waiting reader lists only what is new.
  status list_after(std::string_view prefix, std::string_view after,
                    std::vector<std::string>& names);
  /// DeleteObject; `errc::not_found` for a missing key (see file comment).
  status remove(std::string_view name);

private:
  struct impl;
  std::unique_ptr<impl> impl_;
};
static_assert(object_store<s3_object_store> && lists_after<s3_object_store>);

} // namespace dcr::transport
