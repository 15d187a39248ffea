/// \file
/// The compiled implementation of `s3_object_store` (contract in
/// dcr/transport/s3_object_store.hpp).

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
#include "dcr/core/hash.hpp"
#include "dcr/net/http_client.hpp"
#include "dcr/transport/detail/s3_xml.hpp"
#include "dcr/transport/detail/sigv4.hpp"
#include "dcr/transport/object_store.hpp"

#include "dcr/transport/s3_object_store.hpp"

namespace dcr::transport {

struct s3_object_store::impl {
  /// Throws `dcr::error(invalid_argument)` for a malformed endpoint (or an
  /// https one without TLS support), bucket name, empty access key, or
  /// `max_keys`/`max_attempts` out of range.
  explicit impl(s3_options opt) : opt_(std::move(opt)) {
    throw_if_failed(net::parse_endpoint(opt_.endpoint, endpoint_));
    throw_if_failed(validate_bucket_name(opt_.bucket));
    if (opt_.credentials.access_key.empty())
      throw error(errc::invalid_argument, "S3: empty access key");
    if (opt_.max_keys < 1 || opt_.max_keys > 1000)
      throw error(errc::invalid_argument, "S3: max_keys must be 1..1000");
    if (opt_.max_attempts < 1)
      throw error(errc::invalid_argument, "S3: max_attempts must be at least 1");
    if (opt_.region.empty()) throw error(errc::invalid_argument, "S3: empty region");
    if (opt_.list_poll_max.count() <= 0)
      throw error(errc::invalid_argument, "S3: list_poll_max must be positive");
  }

  const s3_options& options() const noexcept { return opt_; }
  /// Upper bound of `attempt_reader`'s poll interval on this store.
  std::chrono::microseconds list_poll_max() const noexcept { return opt_.list_poll_max; }
  s3_stats stats() const noexcept {
    return {requests_.load(), retries_.load(), list_pages_.load()};
  }

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

  /// Every valid object name starting with `prefix` and sorting after
  /// `after` (none when empty), sorted (ListObjectsV2, `start-after`).
  status list(std::string_view prefix, std::string_view after, std::vector<std::string>& names) {
    DCR_TRY(validate_object_prefix(prefix));
    names.clear();
    std::string token, last(after);
    bool first_key = after.empty();
    for (;;) {
      std::vector<std::pair<std::string, std::string>> q{
          {"list-type", "2"}, {"max-keys", std::to_string(opt_.max_keys)}};
      if (!prefix.empty()) q.emplace_back("prefix", std::string(prefix));
      // start-after applies to the first page; continuation tokens carry on from there.
      if (!after.empty() && token.empty()) q.emplace_back("start-after", std::string(after));
      if (!token.empty()) q.emplace_back("continuation-token", token);
      net::http_response res;
      DCR_TRY(execute("GET", {}, q, {}, res));
      if (res.status != 200) return http_error("GET", bucket_path({}) + "?list-type=2", res);
      ++list_pages_;
      detail::s3_list_page page;
      DCR_TRY(detail::parse_s3_list_page(res.body, page));
      for (auto& k : page.keys) {
        DCR_RETURN_ERROR_IF(k.compare(0, prefix.size(), prefix) != 0, bad_format,
                            "ListObjectsV2: key '" + k + "' does not start with '" +
                                std::string(prefix) + "'");
        DCR_RETURN_ERROR_IF(!first_key && k <= last, bad_format,
                            "ListObjectsV2: key '" + k + "' does not follow '" + last + "'");
        first_key = false;
        last = k;
        if (validate_object_name(k).ok()) names.push_back(std::move(k));
      }
      if (!page.truncated) return status::success();
      // A server that hands back the token it was given would loop forever.
      DCR_RETURN_ERROR_IF(page.next_token == token, bad_format,
                          "ListObjectsV2: continuation token repeats");
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

  status http_error(std::string_view method, const std::string& path,
                    const net::http_response& res) const {
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
                 const std::vector<std::pair<std::string, std::string>>& query,
                 std::span<const std::byte> body, net::http_response& res) {
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
          body.empty() ? std::string(detail::empty_payload_sha256) : to_hex(detail::sha256(body));

      auto client = acquire();
      std::chrono::milliseconds wait = opt_.backoff;
      status last;
      for (unsigned attempt = 1;; ++attempt) {
        sign(rq, path, query, payload_hash, body.empty() ? nullptr : "application/octet-stream");
        ++requests_;
        last = client->request(rq, res);
        if (last.ok() && !retryable(res.status)) break;
        if (!last.ok() && last.code != errc::unavailable)
          break; // the server spoke, but not HTTP: no retry
        if (attempt >= opt_.max_attempts) {
          if (last.ok()) { // a 5xx answer to the end
            last = http_error(method, rq.target, res);
            last.message += " (after " + std::to_string(attempt) + " attempts)";
          } else {
            last.message =
                "S3: " + last.message + " (after " + std::to_string(attempt) + " attempts)";
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
            const std::vector<std::pair<std::string, std::string>>& query,
            const std::string& payload_hash, const char* content_type) const {
    detail::sigv4_request s;
    s.method = rq.method;
    s.canonical_uri = path;
    s.query = query;
    s.payload_hash = payload_hash;
    s.date = detail::amz_date(std::chrono::system_clock::now());
    s.region = opt_.region;
    s.headers = {{"host", endpoint_.host_header()},
                 {"x-amz-content-sha256", payload_hash},
                 {"x-amz-date", s.date}};
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
    return std::chrono::milliseconds(
        half + static_cast<std::int64_t>(rng() % static_cast<unsigned>(half + 1)));
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

s3_object_store::s3_object_store(s3_options opt) : impl_(std::make_unique<impl>(std::move(opt))) {}
s3_object_store::~s3_object_store() = default;

const s3_options& s3_object_store::options() const noexcept { return impl_->options(); }
std::chrono::microseconds s3_object_store::list_poll_max() const noexcept {
  return impl_->list_poll_max();
}
s3_stats s3_object_store::stats() const noexcept { return impl_->stats(); }
status s3_object_store::create_bucket() { return impl_->create_bucket(); }
status s3_object_store::put(std::string_view name, std::span<const std::byte> bytes) {
  return impl_->put(name, bytes);
}
status s3_object_store::get(std::string_view name, std::vector<std::byte>& out) {
  return impl_->get(name, out);
}
status s3_object_store::list(std::string_view prefix, std::vector<std::string>& names) {
  return impl_->list(prefix, {}, names);
}
status s3_object_store::list_after(std::string_view prefix, std::string_view after,
                                   std::vector<std::string>& names) {
  return impl_->list(prefix, after, names);
}
status s3_object_store::remove(std::string_view name) { return impl_->remove(name); }

} // namespace dcr::transport
