#pragma once
/// \file
/// A small synchronous HTTP/1.1 client over Boost.Beast (header-only, like
/// Beast and Asio themselves), for the control-plane and object-store
/// backends that talk to servers over plain HTTP.
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
///    `errc::invalid_argument` (malformed endpoint URL). Messages name the
///    endpoint, method and target.
///
/// Not thread-safe: one client per thread, or callers serialise access.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <poll.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/dynamic_body.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/span_body.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>

#include "dcr/core/error.hpp"

namespace dcr::net {

/// A server address: host name or IP literal, and TCP port.
struct http_endpoint {
  std::string host;
  std::uint16_t port = 80;
  /// "host:port" (IPv6 literals in brackets), as in messages and Host headers.
  std::string authority() const {
    const bool v6 = host.find(':') != std::string::npos;
    return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
  }
  friend bool operator==(const http_endpoint&, const http_endpoint&) = default;
};

/// Parse "http://host:port", "host:port" or "http://[::1]:port" (a trailing
/// "/" is allowed; no path, no https). `errc::invalid_argument` otherwise.
inline status parse_endpoint(std::string_view url, http_endpoint& out) {
  const std::string orig(url);
  if (url.substr(0, 7) == "http://") url.remove_prefix(7);
  DCR_RETURN_ERROR_IF(url.find("://") != std::string_view::npos, invalid_argument,
                      "endpoint '" + orig + "': only http:// is supported");
  if (!url.empty() && url.back() == '/') url.remove_suffix(1);
  DCR_RETURN_ERROR_IF(url.find('/') != std::string_view::npos, invalid_argument,
                      "endpoint '" + orig + "': a path is not allowed");
  http_endpoint e;
  std::string_view port;
  if (!url.empty() && url.front() == '[') {
    const auto close = url.find(']');
    DCR_RETURN_ERROR_IF(close == std::string_view::npos, invalid_argument, "endpoint '" + orig + "': unclosed '['");
    e.host = std::string(url.substr(1, close - 1));
    url.remove_prefix(close + 1);
    DCR_RETURN_ERROR_IF(url.empty() || url.front() != ':', invalid_argument, "endpoint '" + orig + "': expected ':port'");
    port = url.substr(1);
  } else {
    const auto colon = url.rfind(':');
    DCR_RETURN_ERROR_IF(colon == std::string_view::npos, invalid_argument, "endpoint '" + orig + "': expected host:port");
    e.host = std::string(url.substr(0, colon));
    port = url.substr(colon + 1);
  }
  DCR_RETURN_ERROR_IF(e.host.empty(), invalid_argument, "endpoint '" + orig + "': empty host");
  unsigned long p = 0;
  DCR_RETURN_ERROR_IF(port.empty() || port.size() > 5 ||
                          !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; }),
                      invalid_argument, "endpoint '" + orig + "': bad port");
  for (char c : port) p = p * 10 + static_cast<unsigned long>(c - '0');
  DCR_RETURN_ERROR_IF(p == 0 || p > 65535, invalid_argument, "endpoint '" + orig + "': port out of range");
  e.port = static_cast<std::uint16_t>(p);
  out = std::move(e);
  return status::success();
}

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
  std::optional<std::string_view> header(std::string_view name) const {
    for (auto& h : headers)
      if (std::equal(h.name.begin(), h.name.end(), name.begin(), name.end(),
                     [](char a, char b) { return ascii_lower(a) == ascii_lower(b); }))
        return std::string_view(h.value);
    return std::nullopt;
  }

private:
  static char ascii_lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }
};

/// Limits and timeouts of a client.
struct http_options {
  std::chrono::milliseconds connect_timeout{2000}; ///< per endpoint and connection
  std::chrono::milliseconds request_timeout{10000}; ///< write of the request + read of the response
  std::size_t max_body = std::size_t{64} << 20;     ///< larger response bodies: length_overflow
  std::string user_agent = "dcr";
};

/// Synchronous keep-alive HTTP/1.1 client over one or more equivalent
/// endpoints (see file comment).
class http_client {
public:
  /// `endpoints` must not be empty (`dcr::error(invalid_argument)` otherwise).
  explicit http_client(std::vector<http_endpoint> endpoints, http_options opt = {})
      : endpoints_(std::move(endpoints)), opt_(std::move(opt)) {
    if (endpoints_.empty()) throw error(errc::invalid_argument, "http_client: no endpoint");
  }
  explicit http_client(http_endpoint endpoint, http_options opt = {})
      : http_client(std::vector<http_endpoint>{std::move(endpoint)}, std::move(opt)) {}

  http_client(const http_client&) = delete;
  http_client& operator=(const http_client&) = delete;
  ~http_client() { close(); }

  /// The endpoint used last (or to be tried first).
  const http_endpoint& current_endpoint() const noexcept { return endpoints_[current_]; }
  const std::vector<http_endpoint>& endpoints() const noexcept { return endpoints_; }
  const http_options& options() const noexcept { return opt_; }

  /// Drop the kept-alive connection (the next request connects afresh).
  void close() noexcept {
    boost::beast::error_code ignored;
    if (stream_) {
      stream_->socket().shutdown(boost::asio::ip::tcp::socket::shutdown_both, ignored);
      stream_->socket().close(ignored);
    }
    stream_.reset();
    buffer_.clear();
  }

  /// Send `rq` and read the whole response into `out` (see file comment).
  status request(const http_request& rq, http_response& out) {
    // The first failure on a reused connection may only mean the server had
    // dropped it in the instant before we wrote: that one case is retried on
    // a fresh connection for idempotent requests. Connect failures fail over.
    status last = fail(errc::unavailable, "no endpoint tried");
    const std::size_t n = endpoints_.size();
    for (std::size_t tried = 0; tried < n;) {
      bool reused = false;
      if (stream_ && !connection_is_idle_open()) close();
      if (!stream_) {
        auto c = connect();
        if (!c) {
          last = std::move(c);
          current_ = (current_ + 1) % n;
          ++tried;
          continue;
        }
      } else {
        reused = true;
      }
      bool sent = false;
      auto s = exchange(rq, out, sent);
      if (s) return s;
      close();
      if (s.code != errc::unavailable) return s; // the server answered, badly: not a transport failure
      last = std::move(s);
      if (sent && !rq.idempotent) {
        last.message += " (the request may have been applied: outcome unknown)";
        return last;
      }
      // A reused connection that broke (rather than timed out) was most
      // likely closed by the server while idle: same endpoint, fresh
      // connection, not counted as a try. A timeout moves on.
      if (reused && !timed_out_) continue;
      current_ = (current_ + 1) % n;
      ++tried;
    }
    return last;
  }

private:
  using tcp = boost::asio::ip::tcp;

  std::string where(const http_request* rq = nullptr) const {
    std::string w = "http://" + current_endpoint().authority();
    if (rq) w = rq->method + " " + w + rq->target;
    return w;
  }

  /// An idle kept-alive socket that polls readable has seen EOF or stray
  /// bytes from the server: either way it cannot carry the next exchange.
  bool connection_is_idle_open() {
    if (buffer_.size() != 0) return false; // unread bytes after the last response
    pollfd p{};
    p.fd = stream_->socket().native_handle();
    p.events = POLLIN;
    const int r = ::poll(&p, 1, 0);
    return r == 0;
  }

  /// Run the io_context until the started operation's handler ran.
  void run() {
    ioc_.restart();
    ioc_.run();
  }

  status connect() {
    const auto& ep = current_endpoint();
    boost::beast::error_code ec;
    tcp::resolver resolver(ioc_);
    tcp::resolver::results_type results;
    resolver.async_resolve(ep.host, std::to_string(ep.port), tcp::resolver::numeric_service,
                           [&](const boost::beast::error_code& e, tcp::resolver::results_type r) {
                             ec = e;
                             results = std::move(r);
                           });
    run();
    if (ec) return fail(errc::unavailable, where() + ": cannot resolve host: " + ec.message());
    stream_.emplace(ioc_);
    stream_->expires_after(opt_.connect_timeout);
    stream_->async_connect(results, [&](const boost::beast::error_code& e, const tcp::endpoint&) { ec = e; });
    run();
    if (ec) {
      const bool timeout = ec == boost::beast::error::timeout;
      stream_.reset();
      return fail(errc::unavailable,
                  where() + ": cannot connect: " +
                      (timeout ? "timed out after " + std::to_string(opt_.connect_timeout.count()) + " ms"
                               : ec.message()));
    }
    stream_->socket().set_option(tcp::no_delay(true), ec);
    buffer_.clear();
    return status::success();
  }

  status exchange(const http_request& rq, http_response& out, bool& sent) {
    namespace http = boost::beast::http;
    // The body is sent from the caller's buffer (no copy: payloads and
    // manifests can be hundreds of MiB).
    http::request<http::span_body<const char>> req;
    req.method_string(rq.method);
    req.target(rq.target);
    req.version(11);
    bool has_host = false, has_agent = false;
    for (auto& h : rq.headers) {
      req.insert(h.name, h.value);
      has_host |= boost::beast::iequals(h.name, "host");
      has_agent |= boost::beast::iequals(h.name, "user-agent");
    }
    if (!has_host) req.set(http::field::host, current_endpoint().authority());
    if (!has_agent && !opt_.user_agent.empty()) req.set(http::field::user_agent, opt_.user_agent);
    req.body() = {rq.body.data(), rq.body.size()};
    req.prepare_payload();
    if (rq.body.empty() && rq.method != "GET" && rq.method != "HEAD" && rq.method != "DELETE")
      req.content_length(0); // some servers insist on a length for bodiless PUT/POST

    boost::beast::error_code ec;
    timed_out_ = false;
    stream_->expires_after(opt_.request_timeout);
    std::size_t written = 0;
    http::async_write(*stream_, req, [&](const boost::beast::error_code& e, std::size_t n) {
      ec = e;
      written = n;
    });
    run();
    // Bytes that left this process may have been acted upon.
    sent = written > 0 || !ec;
    if (ec) return transport_error(rq, "write", ec);

    http::response_parser<http::string_body> parser;
    parser.body_limit(opt_.max_body);
    if (rq.method == "HEAD") parser.skip(true);
    http::async_read(*stream_, buffer_, parser, [&](const boost::beast::error_code& e, std::size_t) { ec = e; });
    run();
    if (ec) {
      if (ec == http::error::body_limit)
        return fail(errc::length_overflow,
                    where(&rq) + ": response body larger than " + std::to_string(opt_.max_body) + " bytes");
      if (ec == http::error::header_limit)
        return fail(errc::length_overflow, where(&rq) + ": response header too large");
      // A closed or cut connection is a transport failure; any other parser
      // error means the peer spoke, but not HTTP.
      if (ec.category() == http::make_error_code(http::error::bad_version).category() &&
          ec != http::error::end_of_stream && ec != http::error::partial_message)
        return fail(errc::bad_format, where(&rq) + ": malformed HTTP response: " + ec.message());
      return transport_error(rq, "read", ec);
    }
    auto res = parser.release();
    out.status = res.result_int();
    out.reason = std::string(res.reason());
    out.headers.clear();
    for (auto& f : res) out.headers.push_back({std::string(f.name_string()), std::string(f.value())});
    out.body = std::move(res.body());
    if (!res.keep_alive()) close();
    return status::success();
  }

  status transport_error(const http_request& rq, const char* phase, const boost::beast::error_code& ec) {
    const bool timeout = ec == boost::beast::error::timeout;
    timed_out_ = timeout;
    return fail(errc::unavailable,
                where(&rq) + ": " + phase + " failed: " +
                    (timeout ? "timed out after " + std::to_string(opt_.request_timeout.count()) + " ms"
                             : ec.message()));
  }

  std::vector<http_endpoint> endpoints_;
  http_options opt_;
  std::size_t current_ = 0;
  bool timed_out_ = false; ///< the last exchange failed by its deadline
  boost::asio::io_context ioc_{1};
  std::optional<boost::beast::tcp_stream> stream_;
  boost::beast::flat_buffer buffer_;
};

} // namespace dcr::net
