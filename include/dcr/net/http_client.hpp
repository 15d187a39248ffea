#pragma once
/// \file
/// A small synchronous HTTP/1.1 client for the control-plane and object-store
/// backends: plain HTTP, and HTTPS when the `dcr-net` library was built with
/// TLS. This header is the thin front: it includes no Boost, Asio or OpenSSL
/// header; the client itself (Boost.Beast over Asio, OpenSSL for TLS) is
/// compiled once into `dcr-net` (src/net/http_client.cpp), so a program that
/// talks to etcd or S3 does not instantiate Beast in every translation unit.
///
/// Contract:
///  - `request` sends one request and reads one complete response; it returns
///    only when the response is in, an error occurred, or the deadline passed.
///    Any HTTP status (404, 500, ...) is a successful exchange: the caller
///    decides what a status means for it.
///  - Connections are kept alive and reused; a connection the server closed
///    while idle is detected before reuse (poll for EOF) and replaced.
///  - Endpoints are tried in order; a connect failure moves on to the next one
///    (failover), and the client stays on the endpoint that answered.
///  - A request that may already have reached the server is sent again only
///    when `http_request::idempotent` is set; otherwise its failure is
///    reported with the note that the outcome is unknown.
///  - Errors: `errc::unavailable` (no endpoint accepts connections, timeout,
///    connection reset), `errc::bad_format` (not a valid HTTP response),
///    `errc::length_overflow` (response body above `max_body`),
///    `errc::invalid_argument` (malformed endpoint URL, unusable TLS
///    options), `errc::io` (TLS refused, see below). Messages name the
///    endpoint, method and target.
///
/// TLS (`https://` endpoints) is a build option of the `dcr-net` library
/// (Meson option `tls`, on when libssl is found); `tls_supported()` says
/// whether the linked library has it. The client's layout does not depend on
/// it, so there is nothing a program must define consistently. Without TLS an
/// https endpoint is `errc::invalid_argument` at parse and construction time,
/// never a silent downgrade to plain HTTP. With it:
///  - TLS 1.2 or later; the server's certificate chain is verified against
///    `tls_options` (default: the system trust store) and its leaf must name
///    the endpoint host (DNS name or IP address in the subjectAltName, as
///    OpenSSL's `X509_check_host` / `X509_check_ip_asc` decide); SNI carries
///    the host name (not an IP literal, RFC 6066).
///  - The TCP connect and the handshake share `connect_timeout`.
///  - `errc::io` when the server's certificate fails verification (the
///    message says why: unknown issuer, expired, wrong name) or the handshake
///    fails above the transport (no common protocol version, a peer that does
///    not speak TLS, a client certificate the server rejects). Such a failure
///    is never retried on the same endpoint; another endpoint is still tried
///    (each one is verified), and if none answers the first such failure is
///    reported rather than a later "connection refused". A handshake cut by
///    a reset, EOF or timeout is `errc::unavailable` like any transport failure.
///  - A TLS 1.3 server judges the client certificate after the client's side
///    of the handshake is done: its refusal comes with the first exchange, as
///    an alert (`errc::io`) or, when the server closed before the request was
///    written, as a reset (`errc::unavailable`).
///  - `close()` sends a TLS close_notify (without waiting for the server's,
///    RFC 8446 section 6.1); a connection the server closed is just dropped.
///
/// Not thread-safe: one client per thread, or callers serialise access.

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dcr/core/error.hpp"

namespace dcr::net {

/// Whether the linked `dcr-net` library was built with TLS support.
bool tls_supported() noexcept;

/// A server address: host name or IP literal, TCP port, and whether the
/// connection is TLS (https).
struct http_endpoint {
  std::string host;
  std::uint16_t port = 80;
  bool tls = false;
  /// "host:port" (IPv6 literals in brackets), as in messages and Host headers.
  std::string authority() const {
    const bool v6 = host.find(':') != std::string::npos;
    return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
  }
  /// The Host header: the authority without the scheme's default port (80,
  /// 443), as browsers and SDKs send it, so that proxies that normalise it do
  /// not change what a request signature covers.
  std::string host_header() const {
    const bool v6 = host.find(':') != std::string::npos;
    return port == (tls ? 443 : 80) ? (v6 ? "[" + host + "]" : host) : authority();
  }
  /// "http://host:port" or "https://host:port", as in messages.
  std::string url() const { return (tls ? "https://" : "http://") + authority(); }
  friend bool operator==(const http_endpoint&, const http_endpoint&) = default;
};

/// Parse "http://host[:port]", "https://host[:port]" or "host:port"; IPv6
/// literals in brackets ("http://[::1]:9000"); a trailing "/" is allowed, a
/// path is not. A URL with a scheme may omit the port (80 for http, 443 for
/// https); a bare "host:port" is plain HTTP and needs its port.
/// `errc::invalid_argument` otherwise, and for https when the library has no
/// TLS support (see file comment).
status parse_endpoint(std::string_view url, http_endpoint& out);

/// One header field.
struct http_field {
  std::string name, value;
};

/// A request. `Host`, `Content-Length` and `User-Agent` are filled in unless
/// given here (a signer that needs the exact Host value sets it itself).
struct http_request {
  std::string method = "GET"; ///< any token: GET, PUT, POST, DELETE, HEAD, ...
  std::string target = "/";   ///< origin-form: path and query, already percent-encoded
  std::vector<http_field> headers;
  std::string body;
  /// True when sending the request twice has the effect of sending it once
  /// (or the caller tolerates it): only then is a request that may have
  /// reached the server sent again after a connection failure.
  bool idempotent = false;
};

/// A complete response.
struct http_response {
  unsigned status = 0;
  std::string reason;
  std::vector<http_field> headers; ///< in arrival order
  std::string body;

  /// First header with this name (case-insensitive), if any.
  std::optional<std::string_view> header(std::string_view name) const;
};

/// How https endpoints are authenticated, and how the client authenticates
/// itself (used only when the library has TLS support; see file comment).
/// Files are PEM. A file that cannot be loaded is
/// `dcr::error(invalid_argument)` when the client is constructed.
struct tls_options {
  /// Trusted CA certificates (a bundle). With `ca_dir` also empty the system
  /// trust store is used (OpenSSL's default paths).
  std::string ca_file;
  /// A directory of trusted CA certificates named by subject hash
  /// (`openssl rehash`), in addition to `ca_file`.
  std::string ca_dir;
  /// Client certificate (chain, leaf first) and its unencrypted private key,
  /// for servers that authenticate clients (etcd `--client-cert-auth`). Both
  /// or neither.
  std::string cert_file, key_file;
  /// Name the server's certificate must carry, and the SNI; empty: the
  /// endpoint's host. For connecting by address to a server named otherwise.
  std::string server_name;
  /// INSECURE when false: no certificate or name check at all, so anyone on
  /// the path can impersonate the server and read or change every request.
  /// For tests against throwaway servers only.
  bool verify_peer = true;
};

/// Limits and timeouts of a client.
struct http_options {
  std::chrono::milliseconds connect_timeout{
      2000}; ///< per endpoint and connection, TLS handshake included
  std::chrono::milliseconds request_timeout{10000}; ///< write of the request + read of the response
  std::size_t max_body = std::size_t{64} << 20;     ///< larger response bodies: length_overflow
  std::string user_agent = "dcr";
  tls_options tls{}; ///< for https endpoints
};

/// Synchronous keep-alive HTTP/1.1 client over one or more equivalent
/// endpoints (see file comment). The connection state lives in the compiled
/// library (`impl`), so this class's layout is the same in every build.
class http_client {
public:
  /// `endpoints` must not be empty (`dcr::error(invalid_argument)` otherwise,
  /// and for an https endpoint without TLS support or with TLS options that
  /// cannot be loaded).
  explicit http_client(std::vector<http_endpoint> endpoints, http_options opt = {});
  explicit http_client(http_endpoint endpoint, http_options opt = {});

  http_client(const http_client&) = delete;
  http_client& operator=(const http_client&) = delete;
  http_client(http_client&&) noexcept;
  http_client& operator=(http_client&&) noexcept;
  ~http_client();

  /// The endpoint used last (or to be tried first).
  const http_endpoint& current_endpoint() const noexcept;
  const std::vector<http_endpoint>& endpoints() const noexcept;
  const http_options& options() const noexcept;

  /// Drop the kept-alive connection (the next request connects afresh); a
  /// TLS connection is told so with a close_notify first.
  void close() noexcept;

  /// Send `rq` and read the whole response into `out` (see file comment).
  status request(const http_request& rq, http_response& out);

private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

} // namespace dcr::net
