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
/// Needs OpenSSL libcrypto (`dcr_s3_dep` in Meson). HTTPS endpoints (what AWS
/// and most deployments require) also need the `dcr-tls` dependency
/// (`DCR_NET_TLS`, see net/http_client.hpp); without it they are refused at
/// construction. `s3_options::http.tls` sets the trusted CAs (default: the
/// system store). A certificate that fails verification is `errc::io` and is
/// not retried.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "dcr/core/error.hpp"
#include "dcr/net/http_client.hpp"
#include "dcr/transport/detail/s3_xml.hpp"
#include "dcr/transport/detail/sigv4.hpp"
#include "dcr/transport/object_store.hpp"

namespace dcr::transport {

/// Where the store is and how it behaves.
struct s3_options {
  std::string endpoint = "http://127.0.0.1:9000"; ///< "http[s]://host[:port]" (no path)
  std::string region = "us-east-1";               ///< signed into every request's scope
  std::string bucket;                             ///< S3 bucket name rules (3-63 of [a-z0-9.-])
  detail::sigv4_credentials credentials;
  std::uint32_t max_keys = 1000;  ///< ListObjectsV2 page size, 1..1000
  unsigned max_attempts = 5;      ///< tries per request when the failure is retryable
  std::chrono::milliseconds backoff{50};      ///< wait before the first retry; doubles each time
  std::chrono::milliseconds max_backoff{2000};
  std::size_t max_pool = 16;      ///< idle connections kept for reuse
  /// Longest wait between listings of a waiting attempt reader: every
  /// LIST is a billed request, rate-limited per prefix, and each receiver
  /// polls, so the default trades up to 50 ms of latency for 20 LIST/s per
  /// waiting receiver instead of 200.
  std::chrono::milliseconds list_poll_max{50};
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
                      "bucket name '" + std::string(b) + "' must start and end with a letter or digit");
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
  explicit s3_object_store(s3_options opt) : opt_(std::move(opt)) {
    throw_if_failed(net::parse_endpoint(opt_.endpoint, endpoint_));
    throw_if_failed(validate_bucket_name(opt_.bucket));
    if (opt_.credentials.access_key.empty()) throw error(errc::invalid_argument, "S3: empty access key");
    if (opt_.max_keys < 1 || opt_.max_keys > 1000)
      throw error(errc::invalid_argument, "S3: max_keys must be 1..1000");
    if (opt_.max_attempts < 1) throw error(errc::invalid_argument, "S3: max_attempts must be at least 1");
    if (opt_.region.empty()) throw error(errc::invalid_argument, "S3: empty region");
    if (opt_.list_poll_max.count() <= 0) throw error(errc::invalid_argument, "S3: list_poll_max must be positive");
  }
  s3_object_store(const s3_object_store&) = delete;
  s3_object_store& operator=(const s3_object_store&) = delete;

  const s3_options& options() const noexcept { return opt_; }
  /// Upper bound of `attempt_reader`'s poll interval on this store.
  std::chrono::microseconds list_poll_max() const noexcept { return opt_.list_poll_max; }
  s3_stats stats() const noexcept { return {requests_.load(), retries_.load(), list_pages_.load()}; }

  /// CreateBucket; success also when this account already owns it.
  status create_bucket() {
    net::http_response res;
    DCR_TRY(execute("PUT", {}, {}, {}, res));
    if (res.status == 200) return status::success();
    auto e = detail::parse_s3_error(res.body);
    if (res.status == 409 && e.code == "BucketAlreadyOwnedByYou") return status::success();
    return http_error("PUT", bucket_path({}), res);
  }

  /// PutObject (atomic publish).
  status put(std::string_view name, std::span<const std::byte> bytes) {
    DCR_TRY(validate_object_name(name));
    net::http_response res;
    DCR_TRY(execute("PUT", name, {}, bytes, res));
    if (res.status == 200) return status::success();
    return http_error("PUT", bucket_path(name), res);
  }

  /// GetObject; `errc::not_found` for a missing key.
  status get(std::string_view name, std::vector<std::byte>& out) {
    DCR_TRY(validate_object_name(name));
    net::http_response res;
    DCR_TRY(execute("GET", name, {}, {}, res));
    if (res.status == 200) {
      auto b = std::as_bytes(std::span(res.body.data(), res.body.size()));
      out.assign(b.begin(), b.end());
      return status::success();
    }
    if (res.status == 404) {
      auto e = detail::parse_s3_error(res.body);
      DCR_RETURN_ERROR_IF(e.code != "NoSuchBucket", not_found,
                          "no object '" + std::string(name) + "' in bucket '" + opt_.bucket + "'");
    }
    return http_error("GET", bucket_path(name), res);
  }

  /// Every valid object name starting with `prefix`, sorted (ListObjectsV2).
  status list(std::string_view prefix, std::vector<std::string>& names) {
    DCR_TRY(validate_object_prefix(prefix));
    names.clear();
    std::string token, last;
    bool first_key = true;
    for (;;) {
      std::vector<std::pair<std::string, std::string>> q{{"list-type", "2"},
                                                         {"max-keys", std::to_string(opt_.max_keys)}};
      if (!prefix.empty()) q.emplace_back("prefix", std::string(prefix));
      if (!token.empty()) q.emplace_back("continuation-token", token);
      net::http_response res;
      DCR_TRY(execute("GET", {}, q, {}, res));
      if (res.status != 200) return http_error("GET", bucket_path({}) + "?list-type=2", res);
      ++list_pages_;
      detail::s3_list_page page;
      DCR_TRY(detail::parse_s3_list_page(res.body, page));
      for (auto& k : page.keys) {
        DCR_RETURN_ERROR_IF(k.compare(0, prefix.size(), prefix) != 0, bad_format,
                            "ListObjectsV2: key '" + k + "' does not start with '" + std::string(prefix) + "'");
        DCR_RETURN_ERROR_IF(!first_key && k <= last, bad_format,
                            "ListObjectsV2: key '" + k + "' does not follow '" + last + "'");
        first_key = false;
        last = k;
        if (validate_object_name(k).ok()) names.push_back(std::move(k));
      }
      if (!page.truncated) return status::success();
      // A server that hands back the token it was given would loop forever.
      DCR_RETURN_ERROR_IF(page.next_token == token, bad_format, "ListObjectsV2: continuation token repeats");
      token = std::move(page.next_token);
    }
  }

  /// DeleteObject; `errc::not_found` for a missing key (see file comment).
  status remove(std::string_view name) {
    DCR_TRY(validate_object_name(name));
    net::http_response res;
    DCR_TRY(execute("HEAD", name, {}, {}, res));
    DCR_RETURN_ERROR_IF(res.status == 404, not_found,
                        "no object '" + std::string(name) + "' in bucket '" + opt_.bucket + "'");
    if (res.status != 200) return http_error("HEAD", bucket_path(name), res);
    DCR_TRY(execute("DELETE", name, {}, {}, res));
    if (res.status == 204 || res.status == 200) return status::success();
    return http_error("DELETE", bucket_path(name), res);
  }

private:
  /// "/bucket" or "/bucket/key", URI-encoded (the key is a valid object name,
  /// but encoding keeps the path right whatever the validation admits).
  std::string bucket_path(std::string_view key) const {
    std::string p = "/" + opt_.bucket;
    if (!key.empty()) p += "/" + detail::uri_encode(key, true);
    return p;
  }

  static bool retryable(unsigned http_status) {
    return http_status == 500 || http_status == 502 || http_status == 503 || http_status == 504;
  }

  status http_error(std::string_view method, const std::string& path, const net::http_response& res) const {
    auto e = detail::parse_s3_error(res.body);
    std::string m = "S3 " + std::string(method) + " " + endpoint_.url() + path + ": HTTP " +
                    std::to_string(res.status);
    if (!e.code.empty()) m += " " + e.code;
    if (!e.message.empty()) m += ": " + e.message;
    if (e.code.empty() && e.message.empty() && !res.reason.empty()) m += " " + res.reason;
    if (!e.request_id.empty()) m += " (request id " + e.request_id + ")";
    return fail(retryable(res.status) ? errc::unavailable : errc::io, std::move(m));
  }

  /// Sign and send one request, retrying retryable failures. A response with
  /// any status is success here; callers interpret it.
  status execute(const char* method, std::string_view key,
                 const std::vector<std::pair<std::string, std::string>>& query, std::span<const std::byte> body,
                 net::http_response& res) {
    try {
      net::http_request rq;
      rq.method = method;
      rq.idempotent = true;
      const std::string path = bucket_path(key);
      const std::string canon_query = detail::canonical_query(query);
      rq.target = canon_query.empty() ? path : path + "?" + canon_query;
      // The one copy of the body: http_request owns it as a string, and the
      // client sends it from there.
      if (!body.empty()) rq.body.assign(reinterpret_cast<const char*>(body.data()), body.size());
      const std::string payload_hash =
          body.empty() ? std::string(detail::empty_payload_sha256) : detail::hex_lower(detail::sha256(body));

      auto client = acquire();
      std::chrono::milliseconds wait = opt_.backoff;
      status last;
      for (unsigned attempt = 1;; ++attempt) {
        sign(rq, path, query, payload_hash, body.empty() ? nullptr : "application/octet-stream");
        ++requests_;
        last = client->request(rq, res);
        if (last.ok() && !retryable(res.status)) break;
        if (!last.ok() && last.code != errc::unavailable) break; // the server spoke, but not HTTP: no retry
        if (attempt >= opt_.max_attempts) {
          if (last.ok()) { // a 5xx answer to the end
            last = http_error(method, rq.target, res);
            last.message += " (after " + std::to_string(attempt) + " attempts)";
          } else {
            last.message = "S3: " + last.message + " (after " + std::to_string(attempt) + " attempts)";
          }
          break;
        }
        ++retries_;
        std::this_thread::sleep_for(jittered(wait));
        wait = std::min(wait * 2, opt_.max_backoff);
      }
      release(std::move(client));
      return last;
    } catch (const error& e) { // libcrypto failure
      return fail(e.code(), e.what());
    }
  }

  /// Replace the signing headers of `rq` with fresh ones for now.
  void sign(net::http_request& rq, const std::string& path,
            const std::vector<std::pair<std::string, std::string>>& query, const std::string& payload_hash,
            const char* content_type) const {
    detail::sigv4_request s;
    s.method = rq.method;
    s.canonical_uri = path;
    s.query = query;
    s.payload_hash = payload_hash;
    s.date = detail::amz_date(std::chrono::system_clock::now());
    s.region = opt_.region;
    s.headers = {{"host", endpoint_.host_header()}, {"x-amz-content-sha256", payload_hash}, {"x-amz-date", s.date}};
    if (!opt_.credentials.session_token.empty())
      s.headers.emplace_back("x-amz-security-token", opt_.credentials.session_token);
    if (content_type) s.headers.emplace_back("content-type", content_type);
    const auto sig = detail::sigv4_sign(s, opt_.credentials);
    rq.headers.clear();
    for (auto& [n, v] : s.headers) rq.headers.push_back({n, v});
    rq.headers.push_back({"authorization", sig.authorization});
  }

  /// Between d/2 and d, so that clients failing together do not retry in step.
  static std::chrono::milliseconds jittered(std::chrono::milliseconds d) {
    thread_local std::minstd_rand rng(std::random_device{}());
    const auto half = d.count() / 2;
    return std::chrono::milliseconds(half + static_cast<std::int64_t>(rng() % static_cast<unsigned>(half + 1)));
  }

  std::unique_ptr<net::http_client> acquire() {
    {
      std::lock_guard g(pool_m_);
      if (!pool_.empty()) {
        auto c = std::move(pool_.back());
        pool_.pop_back();
        return c;
      }
    }
    return std::make_unique<net::http_client>(endpoint_, opt_.http);
  }
  void release(std::unique_ptr<net::http_client> c) {
    std::lock_guard g(pool_m_);
    if (pool_.size() < opt_.max_pool) pool_.push_back(std::move(c));
  }

  s3_options opt_;
  net::http_endpoint endpoint_;
  std::mutex pool_m_;
  std::vector<std::unique_ptr<net::http_client>> pool_;
  std::atomic<std::uint64_t> requests_{0}, retries_{0}, list_pages_{0};
};
static_assert(object_store<s3_object_store>);

} // namespace dcr::transport
