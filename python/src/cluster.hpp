#pragma once
/// \file
/// The deployment choices of the C++ cluster programs (examples/cluster),
/// chosen by URL for the Python module, in plain types: the object store
/// (`memory:`, `fs:<dir>`, `s3://host:port/bucket` through dcr-net's
/// `s3_object_store`) and the commit store (`file:<dir>`, or
/// `etcd://host:port[,host:port...][/prefix]` through dcr-net's
/// `etcd_commit_store`). Each is one type-erased object that models the
/// library's concept (`transport::object_store`, `protocol::commit_store`),
/// so the library's coordinator runs over it unchanged. A build without
/// dcr-net (`-Dnet=disabled`, no libcrypto; DCR_PY_NET unset) refuses the
/// S3 and etcd URLs with `invalid_argument`, as the cluster programs do.

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "dcr/core/error.hpp"
#include "dcr/protocol/commit_store.hpp"
#include "dcr/transport/object_store.hpp"
#if DCR_PY_NET
#include "dcr/protocol/etcd_commit_store.hpp"
#include "dcr/transport/s3_object_store.hpp"
#endif

namespace dcr_py {

/// Credentials and region of an S3 endpoint (the Python side reads them
/// from a credentials file or the environment, as the C++ programs do).
struct s3_args {
  std::string access_key, secret_key, region = "us-east-1";
};

/// TLS files of an etcd endpoint (`etcd+https://`): CA bundle, client
/// certificate and key (the C++ programs' `--etcd-credentials`).
struct etcd_args {
  std::string ca_file, cert_file, key_file;
};

/// "host:port" → checked; `invalid_argument` naming `url` otherwise.
inline std::string host_port(const std::string& url, std::string_view hp) {
  const auto colon = hp.rfind(':');
  bool ok = colon != std::string_view::npos && colon > 0 && colon + 1 < hp.size();
  if (ok)
    for (char c : hp.substr(colon + 1)) ok = ok && c >= '0' && c <= '9';
  if (!ok)
    throw dcr::error(dcr::errc::invalid_argument,
                     "'" + url + "': expected HOST:PORT, got '" + std::string(hp) + "'");
  return std::string(hp);
}

/// Splits "<scheme>://A[/B]" after the scheme into (A, B).
inline std::pair<std::string, std::string> authority_and_path(const std::string& url,
                                                              std::size_t scheme_len) {
  const auto rest = url.substr(scheme_len);
  const auto slash = rest.find('/');
  if (slash == std::string::npos) return {rest, ""};
  return {rest.substr(0, slash), rest.substr(slash + 1)};
}

/// An object store chosen by URL (see file comment).
class any_store {
public:
  /// `key`: the job key manifests are sealed with (empty: unkeyed), the
  /// store's `seal_key()` (transport/attempt_objects.hpp reads it there).
  any_store(const std::string& url, const s3_args& s3, dcr::seal_key key = {}) : key_(key) {
    if (url == "memory:" || url == "memory") {
      impl_ = std::make_unique<holder<dcr::transport::memory_object_store>>();
    } else if (url.rfind("fs:", 0) == 0 && url.size() > 3) {
      impl_ = std::make_unique<holder<dcr::transport::fs_object_store>>(
          std::filesystem::path(url.substr(3)));
    } else if (url.rfind("s3://", 0) == 0 || url.rfind("s3+https://", 0) == 0) {
#if DCR_PY_NET
      const bool https = url.rfind("s3+https://", 0) == 0;
      auto [authority, bucket] = authority_and_path(url, https ? 11 : 5);
      if (!bucket.empty() && bucket.back() == '/') bucket.pop_back();
      if (bucket.empty() || bucket.find('/') != std::string::npos)
        throw dcr::error(dcr::errc::invalid_argument,
                         "object store '" + url + "': expected s3://HOST:PORT/BUCKET");
      dcr::transport::s3_options o;
      o.endpoint = (https ? "https://" : "http://") + host_port(url, authority);
      o.bucket = bucket;
      o.region = s3.region;
      if (s3.access_key.empty() || s3.secret_key.empty())
        throw dcr::error(dcr::errc::invalid_argument,
                         "object store '" + url +
                             "': no S3 credentials (give a credentials "
                             "file, or set DCR_S3_ACCESS_KEY and DCR_S3_SECRET_KEY)");
      o.credentials.access_key = s3.access_key;
      o.credentials.secret_key = s3.secret_key;
      auto h = std::make_unique<holder<dcr::transport::s3_object_store>>(std::move(o));
      s3_ = &h->store;
      impl_ = std::move(h);
#else
      (void)s3;
      throw dcr::error(dcr::errc::invalid_argument,
                       "object store '" + url +
                           "': this build has no dcr-net (configure -Dnet=enabled)");
#endif
    } else {
      throw dcr::error(dcr::errc::invalid_argument,
                       "object store '" + url +
                           "': expected memory:, fs:<directory> or s3://HOST:PORT/BUCKET");
    }
  }

  /// CreateBucket (S3; success when this account owns it already); nothing
  /// for the other stores.
  void create_bucket() {
#if DCR_PY_NET
    if (s3_) dcr::throw_if_failed(s3_->create_bucket());
#endif
  }
  bool is_s3() const noexcept { return s3_ != nullptr; }
  const dcr::seal_key& seal_key() const noexcept { return key_; }

  dcr::status put(std::string_view n, std::span<const std::byte> b) { return impl_->put(n, b); }
  dcr::status get(std::string_view n, std::vector<std::byte>& out) { return impl_->get(n, out); }
  dcr::status list(std::string_view p, std::vector<std::string>& names) {
    return impl_->list(p, names);
  }
  dcr::status remove(std::string_view n) { return impl_->remove(n); }
  /// How long a waiting attempt reader sleeps between listings (S3: its
  /// billed, rate-limited LISTs; else 5 ms as the cluster programs).
  std::chrono::microseconds list_poll_max() const {
#if DCR_PY_NET
    if (s3_) return s3_->list_poll_max();
#endif
    return std::chrono::microseconds(5000);
  }

private:
  struct base {
    virtual ~base() = default;
    virtual dcr::status put(std::string_view, std::span<const std::byte>) = 0;
    virtual dcr::status get(std::string_view, std::vector<std::byte>&) = 0;
    virtual dcr::status list(std::string_view, std::vector<std::string>&) = 0;
    virtual dcr::status remove(std::string_view) = 0;
  };
  template <class S>
  struct holder : base {
    S store;
    template <class... A>
    explicit holder(A&&... a) : store(std::forward<A>(a)...) {}
    dcr::status put(std::string_view n, std::span<const std::byte> b) override {
      return store.put(n, b);
    }
    dcr::status get(std::string_view n, std::vector<std::byte>& out) override {
      return store.get(n, out);
    }
    dcr::status list(std::string_view p, std::vector<std::string>& names) override {
      return store.list(p, names);
    }
    dcr::status remove(std::string_view n) override { return store.remove(n); }
  };
  std::unique_ptr<base> impl_;
  dcr::seal_key key_;
#if DCR_PY_NET
  dcr::transport::s3_object_store* s3_ = nullptr;
#else
  void* s3_ = nullptr; // never set: no S3 in this build
#endif
};
static_assert(dcr::transport::object_store<any_store>);

/// A commit store chosen by URL (see file comment).
class any_commits {
public:
  /// `key`: the job key the record is sealed with (empty: unkeyed).
  any_commits(const std::string& url, const etcd_args& tls, dcr::seal_key key = {}) {
    if (url.rfind("file:", 0) == 0 && url.size() > 5) {
      file_ = std::make_unique<dcr::protocol::file_commit_store>(url.substr(5), key);
      return;
    }
    const bool https = url.rfind("etcd+https://", 0) == 0;
    if (!https && url.rfind("etcd://", 0) != 0)
      throw dcr::error(
          dcr::errc::invalid_argument,
          "commit store '" + url +
              "': expected file:<directory> or etcd://HOST:PORT[,HOST:PORT...][/prefix]");
#if DCR_PY_NET
    auto [authority, prefix] = authority_and_path(url, https ? 13 : 7);
    dcr::protocol::etcd_options o;
    o.endpoints.clear();
    std::size_t at = 0;
    while (at <= authority.size()) {
      const auto c = std::min(authority.find(',', at), authority.size());
      if (c > at)
        o.endpoints.push_back((https ? "https://" : "http://") +
                              host_port(url, std::string_view(authority).substr(at, c - at)));
      at = c + 1;
    }
    if (o.endpoints.empty())
      throw dcr::error(dcr::errc::invalid_argument, "commit store '" + url + "': no endpoint");
    if (!prefix.empty()) o.prefix = prefix.back() == '/' ? prefix : prefix + "/";
    o.http.tls.ca_file = tls.ca_file;
    o.http.tls.cert_file = tls.cert_file;
    o.http.tls.key_file = tls.key_file;
    o.key = key;
    etcd_opt_ = o;
    etcd_ = std::make_unique<dcr::protocol::etcd_commit_store>(std::move(o));
#else
    (void)tls;
    (void)key;
    throw dcr::error(dcr::errc::invalid_argument,
                     "commit store '" + url +
                         "': this build has no dcr-net (configure -Dnet=enabled)");
#endif
  }

  bool is_etcd() const noexcept {
#if DCR_PY_NET
    return etcd_ != nullptr;
#else
    return false;
#endif
  }
  dcr::status load(dcr::protocol::stored_record& out) {
    return visit([&](auto& s) { return s.load(out); });
  }
  dcr::status take_over(std::uint64_t& e) {
    return visit([&](auto& s) { return s.take_over(e); });
  }
  dcr::status prepare(std::uint64_t e, std::uint64_t& a) {
    return visit([&](auto& s) { return s.prepare(e, a); });
  }
  dcr::status compare_and_set(std::uint64_t e, std::uint64_t a, std::uint64_t r,
                              const dcr::protocol::commit_record& k) {
    return visit([&](auto& s) { return s.compare_and_set(e, a, r, k); });
  }

  /// Claims owner id `owner` for as long as this object lives (the owner
  /// lease, "Owner leases" in protocol/commit_store.hpp), as the C++ owner
  /// program does: `errc::conflict` when another process still holds it
  /// after `wait`. `ttl`: the etcd lease's TTL (the file store's flock,
  /// released by the kernel when its holder dies, needs none).
  dcr::status claim_owner(std::uint32_t owner, std::chrono::seconds ttl,
                          std::chrono::milliseconds wait) {
#if DCR_PY_NET
    if (etcd_)
      return dcr::protocol::etcd_owner_lease::acquire(etcd_opt_, owner, {ttl, wait}, etcd_lease_);
#endif
    (void)ttl;
    const auto until = std::chrono::steady_clock::now() + wait;
    for (;;) {
      auto s = dcr::protocol::file_owner_lease::acquire(file_->directory(), owner, file_lease_);
      if (s || s.code != dcr::errc::conflict || std::chrono::steady_clock::now() >= until) return s;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  /// Success iff this process still holds the owner lease it claimed
  /// (`conflict` otherwise: a stale owner writes nothing).
  dcr::status check_owner() {
#if DCR_PY_NET
    if (etcd_lease_) return etcd_lease_->check();
#endif
    DCR_RETURN_ERROR_IF(!file_lease_, conflict, "no owner lease held");
    return file_lease_->check();
  }
  /// `check_owner`, claiming the id again if the etcd lease lapsed while
  /// this process was cut off and nobody claimed it since
  /// (`etcd_owner_lease::hold`). Before a write only.
  dcr::status hold_owner() {
#if DCR_PY_NET
    if (etcd_lease_) return etcd_lease_->hold();
#endif
    return check_owner();
  }
  /// The fence token of the lease held (empty: none).
  std::string owner_token() const {
#if DCR_PY_NET
    if (etcd_lease_) return etcd_lease_->token();
#endif
    return file_lease_ ? file_lease_->token() : std::string();
  }

private:
  template <class F>
  dcr::status visit(F&& f) {
#if DCR_PY_NET
    if (etcd_) return f(*etcd_);
#endif
    return f(*file_);
  }
  std::unique_ptr<dcr::protocol::file_commit_store> file_;
  std::unique_ptr<dcr::protocol::file_owner_lease> file_lease_;
#if DCR_PY_NET
  dcr::protocol::etcd_options etcd_opt_;
  std::unique_ptr<dcr::protocol::etcd_commit_store> etcd_;
  std::unique_ptr<dcr::protocol::etcd_owner_lease> etcd_lease_;
#endif
};
static_assert(dcr::protocol::commit_store<any_commits>);

} // namespace dcr_py
