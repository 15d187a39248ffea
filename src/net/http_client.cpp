/// \file
/// The compiled core of `net::http_client` (see dcr/net/http_client.hpp for
/// the contract): Boost.Beast over Asio, OpenSSL when built with TLS
/// (`DCR_NET_TLS`, set by the `tls` option of the dcr-net library only, never
/// by its users).

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
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

#if defined(DCR_NET_TLS) && DCR_NET_TLS
#include <boost/asio/ip/address.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/error.hpp>
#include <boost/asio/ssl/host_name_verification.hpp>
#include <boost/asio/ssl/verify_context.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509_vfy.h>
#endif

#include "dcr/core/error.hpp"
#include "dcr/net/http_client.hpp"
#include "http_response_parse.hpp"

namespace dcr::net {

#if defined(DCR_NET_TLS) && DCR_NET_TLS
bool tls_supported() noexcept { return true; }
#else
bool tls_supported() noexcept { return false; }
#endif

namespace detail {
inline std::string tls_missing_message(std::string_view what) {
  return std::string(what) +
         ": https needs TLS support, which this build of the dcr-net library lacks: "
         "configure it with -Dtls=enabled (needs libssl)";
}
} // namespace detail

status parse_endpoint(std::string_view url, http_endpoint& out) {
  const std::string orig(url);
  http_endpoint e;
  bool has_scheme = true;
  if (url.substr(0, 7) == "http://") {
    url.remove_prefix(7);
  } else if (url.substr(0, 8) == "https://") {
    DCR_RETURN_ERROR_IF(!tls_supported(), invalid_argument,
                        detail::tls_missing_message("endpoint '" + orig + "'"));
    url.remove_prefix(8);
    e.tls = true;
  } else {
    has_scheme = false;
  }
  DCR_RETURN_ERROR_IF(url.find("://") != std::string_view::npos, invalid_argument,
                      "endpoint '" + orig + "': only http:// and https:// are supported");
  if (!url.empty() && url.back() == '/') url.remove_suffix(1);
  DCR_RETURN_ERROR_IF(url.find('/') != std::string_view::npos, invalid_argument,
                      "endpoint '" + orig + "': a path is not allowed");
  std::string_view port;
  bool has_port = true;
  if (!url.empty() && url.front() == '[') {
    const auto close = url.find(']');
    DCR_RETURN_ERROR_IF(close == std::string_view::npos, invalid_argument,
                        "endpoint '" + orig + "': unclosed '['");
    e.host = std::string(url.substr(1, close - 1));
    url.remove_prefix(close + 1);
    has_port = !url.empty();
    DCR_RETURN_ERROR_IF(has_port && url.front() != ':', invalid_argument,
                        "endpoint '" + orig + "': expected ':port'");
    if (has_port) port = url.substr(1);
  } else {
    const auto colon = url.rfind(':');
    has_port = colon != std::string_view::npos;
    e.host = std::string(url.substr(0, has_port ? colon : url.size()));
    if (has_port) port = url.substr(colon + 1);
  }
  DCR_RETURN_ERROR_IF(!has_port && !has_scheme, invalid_argument,
                      "endpoint '" + orig + "': expected host:port");
  DCR_RETURN_ERROR_IF(e.host.empty(), invalid_argument, "endpoint '" + orig + "': empty host");
  if (!has_port) {
    e.port = e.tls ? 443 : 80;
    out = std::move(e);
    return status::success();
  }
  unsigned long p = 0;
  DCR_RETURN_ERROR_IF(
      port.empty() || port.size() > 5 ||
          !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; }),
      invalid_argument, "endpoint '" + orig + "': bad port");
  for (char c : port) p = p * 10 + static_cast<unsigned long>(c - '0');
  DCR_RETURN_ERROR_IF(p == 0 || p > 65535, invalid_argument,
                      "endpoint '" + orig + "': port out of range");
  e.port = static_cast<std::uint16_t>(p);
  out = std::move(e);
  return status::success();
}

std::optional<std::string_view> http_response::header(std::string_view name) const {
  auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; };
  for (auto& h : headers)
    if (std::equal(h.name.begin(), h.name.end(), name.begin(), name.end(),
                   [&](char a, char b) { return lower(a) == lower(b); }))
      return std::string_view(h.value);
  return std::nullopt;
}

struct http_client::impl {
  /// `endpoints` must not be empty (`dcr::error(invalid_argument)` otherwise,
  /// and for an https endpoint without TLS support or with TLS options that
  /// cannot be loaded).
  impl(std::vector<http_endpoint> endpoints, http_options opt)
      : endpoints_(std::move(endpoints)), opt_(std::move(opt)) {
    if (endpoints_.empty()) throw error(errc::invalid_argument, "http_client: no endpoint");
    for (auto& e : endpoints_) {
      if (!e.tls) continue;
#if defined(DCR_NET_TLS) && DCR_NET_TLS
      if (!tls_ctx_) tls_ctx_.emplace(make_tls_context(opt_.tls));
#else
      throw error(errc::invalid_argument,
                  detail::tls_missing_message("http_client: endpoint " + e.url()));
#endif
    }
  }
  impl(const impl&) = delete;
  impl& operator=(const impl&) = delete;
  ~impl() { close(); }

  /// The endpoint used last (or to be tried first).
  const http_endpoint& current_endpoint() const noexcept { return endpoints_[current_]; }
  const std::vector<http_endpoint>& endpoints() const noexcept { return endpoints_; }
  const http_options& options() const noexcept { return opt_; }

  /// Drop the kept-alive connection (the next request connects afresh); a
  /// TLS connection is told so with a close_notify first.
  void close() noexcept {
    shutdown_tls();
    drop();
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
      if (stream_ && !connection_is_idle_open()) drop();
      if (!stream_) {
        auto c = connect();
        if (!c) {
          // A refused handshake says more than another endpoint's refused
          // connection: it is what gets reported if nothing answers.
          if (last.code == errc::unavailable) last = std::move(c);
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
      drop();
      if (s.code != errc::unavailable)
        return s; // the server answered, badly: not a transport failure
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

  using tcp = boost::asio::ip::tcp;
  using tcp_stream = boost::beast::tcp_stream;
#if defined(DCR_NET_TLS) && DCR_NET_TLS
  using tls_stream = boost::beast::ssl_stream<tcp_stream>;
  using any_stream = std::variant<tcp_stream, tls_stream>;
#else
  using any_stream = std::variant<tcp_stream>;
#endif

  std::string where(const http_request* rq = nullptr) const {
    std::string w = current_endpoint().url();
    if (rq) w = rq->method + " " + w + rq->target;
    return w;
  }

  /// The TCP layer under either stream (timeouts and the socket live there).
  tcp_stream& tcp_layer() {
    return std::visit([](auto& s) -> tcp_stream& { return boost::beast::get_lowest_layer(s); },
                      *stream_);
  }

  /// An idle kept-alive socket that polls readable has seen EOF or stray
  /// bytes from the server: either way it cannot carry the next exchange.
  bool connection_is_idle_open() {
    if (buffer_.size() != 0) return false; // unread bytes after the last response
#if defined(DCR_NET_TLS) && DCR_NET_TLS
    if (auto* t = std::get_if<tls_stream>(&*stream_); t && SSL_pending(t->native_handle()) > 0)
      return false;
#endif
    pollfd p{};
    p.fd = tcp_layer().socket().native_handle();
    p.events = POLLIN;
    const int r = ::poll(&p, 1, 0);
    return r == 0;
  }

  /// Run the io_context until the started operation's handler ran.
  void run() {
    ioc_.restart();
    ioc_.run();
  }

  /// Close the socket without a word to the peer (broken, or closed by it).
  void drop() noexcept {
    boost::beast::error_code ignored;
    if (stream_) {
      auto& s = tcp_layer().socket();
      s.shutdown(tcp::socket::shutdown_both, ignored);
      s.close(ignored);
    }
    stream_.reset();
    buffer_.clear();
  }

  status connect() {
    const auto& ep = current_endpoint();
    const auto deadline = std::chrono::steady_clock::now() + opt_.connect_timeout;
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
    tcp_stream s(ioc_);
    s.expires_at(deadline);
    s.async_connect(results,
                    [&](const boost::beast::error_code& e, const tcp::endpoint&) { ec = e; });
    run();
    if (ec)
      return fail(errc::unavailable,
                  where() + ": cannot connect: " + timeout_or(ec, opt_.connect_timeout));
    s.socket().set_option(tcp::no_delay(true), ec);
    buffer_.clear();
#if defined(DCR_NET_TLS) && DCR_NET_TLS
    if (ep.tls) {
      stream_.emplace(std::in_place_type<tls_stream>, std::move(s), *tls_ctx_);
      auto h = handshake(std::get<tls_stream>(*stream_), deadline);
      if (!h) drop();
      return h;
    }
#endif
    stream_.emplace(std::in_place_type<tcp_stream>, std::move(s));
    return status::success();
  }

  static std::string timeout_or(const boost::beast::error_code& ec,
                                std::chrono::milliseconds limit) {
    return ec == boost::beast::error::timeout
               ? "timed out after " + std::to_string(limit.count()) + " ms"
               : ec.message();
  }

  status exchange(const http_request& rq, http_response& out, bool& sent) {
    return std::visit([&](auto& s) { return exchange_on(s, rq, out, sent); }, *stream_);
  }

  template <class Stream>
  status exchange_on(Stream& stream, const http_request& rq, http_response& out, bool& sent) {
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
    if (!has_host) req.set(http::field::host, current_endpoint().host_header());
    if (!has_agent && !opt_.user_agent.empty()) req.set(http::field::user_agent, opt_.user_agent);
    req.body() = {rq.body.data(), rq.body.size()};
    req.prepare_payload();
    if (rq.body.empty() && rq.method != "GET" && rq.method != "HEAD" && rq.method != "DELETE")
      req.content_length(0); // some servers insist on a length for bodiless PUT/POST

    boost::beast::error_code ec;
    timed_out_ = false;
    boost::beast::get_lowest_layer(stream).expires_after(opt_.request_timeout);
    std::size_t written = 0;
    http::async_write(stream, req, [&](const boost::beast::error_code& e, std::size_t n) {
      ec = e;
      written = n;
    });
    run();
    // Bytes that left this process may have been acted upon.
    sent = written > 0 || !ec;
    if (ec) return transport_error(rq, "write", ec);

    // The header first, then the body: the reader's limits depend on how
    // the body is framed (src/net/http_response_parse.hpp).
    detail::response_reader reader(opt_.max_body, rq.method == "HEAD");
    auto& parser = reader.parser();
    // The status line's first bytes, checked as they arrive
    // (`detail::begins_as_status_line` says why).
    const auto buffered = [&] {
      return std::string_view(static_cast<const char*>(buffer_.data().data()), buffer_.size());
    };
    while (!ec && buffer_.size() < detail::status_line_start &&
           detail::begins_as_status_line(buffered())) {
      std::size_t got = 0;
      stream.async_read_some(buffer_.prepare(4096),
                             [&](const boost::beast::error_code& e, std::size_t n) {
                               ec = e;
                               got = n;
                             });
      run();
      buffer_.commit(got);
    }
    if (!detail::begins_as_status_line(buffered())) return detail::not_a_status_line(where(&rq));
    // One read at a time until the header is complete, counting what the
    // parser consumed against the header limit (the reader's reason).
    while (!ec && !parser.is_header_done()) {
      std::size_t consumed = 0;
      http::async_read_some(stream, buffer_, parser,
                            [&](const boost::beast::error_code& e, std::size_t n) {
                              ec = e;
                              consumed = n;
                            });
      run();
      if (!ec && !reader.header_bytes(consumed)) ec = http::error::header_limit;
    }
    if (!ec) {
      reader.header_done();
      http::async_read(stream, buffer_, parser,
                       [&](const boost::beast::error_code& e, std::size_t) { ec = e; });
      run();
    }
    if (ec) {
      // A closed or cut connection is a transport failure; any other parser
      // error means the peer spoke, but not HTTP (src/net/http_response_parse.hpp).
      const auto f = detail::classify_read_error(ec);
      if (f != detail::response_failure::transport)
        return detail::read_error_status(f, ec, opt_.max_body, where(&rq));
      return transport_error(rq, "read", ec);
    }
    bool keep_alive = false;
    detail::to_response(parser.release(), out, keep_alive);
    if (!keep_alive) drop();
    return status::success();
  }

  status transport_error(const http_request& rq, const char* phase,
                         const boost::beast::error_code& ec) {
#if defined(DCR_NET_TLS) && DCR_NET_TLS
    // An alert after the handshake (TLS 1.3 servers reject a client
    // certificate only once the client has finished) is a refusal, not a
    // broken link.
    if (ec.category() == boost::asio::error::get_ssl_category())
      return fail(errc::io, where(&rq) + ": " + phase + " failed: TLS: " + ec.message());
#endif
    timed_out_ = ec == boost::beast::error::timeout;
    return fail(errc::unavailable,
                where(&rq) + ": " + phase + " failed: " + timeout_or(ec, opt_.request_timeout));
  }

#if defined(DCR_NET_TLS) && DCR_NET_TLS
  static boost::asio::ssl::context make_tls_context(const tls_options& t) {
    namespace ssl = boost::asio::ssl;
    ssl::context ctx(ssl::context::tls_client);
    auto check = [](const boost::beast::error_code& ec, const std::string& what) {
      if (ec)
        throw error(errc::invalid_argument, "http_client: TLS: " + what + ": " + ec.message());
    };
    if (SSL_CTX_set_min_proto_version(ctx.native_handle(), TLS1_2_VERSION) != 1)
      throw error(errc::invalid_argument, "http_client: TLS: cannot require TLS 1.2");
    boost::beast::error_code ec;
    if (t.ca_file.empty() && t.ca_dir.empty()) {
      ctx.set_default_verify_paths(ec);
      check(ec, "cannot load the system trust store");
    }
    if (!t.ca_file.empty()) {
      ctx.load_verify_file(t.ca_file, ec);
      check(ec, "cannot load CA file '" + t.ca_file + "'");
    }
    if (!t.ca_dir.empty()) {
      ctx.add_verify_path(t.ca_dir, ec);
      check(ec, "cannot use CA directory '" + t.ca_dir + "'");
    }
    if (t.cert_file.empty() != t.key_file.empty())
      throw error(errc::invalid_argument,
                  "http_client: TLS: a client certificate needs both cert_file and key_file");
    if (!t.cert_file.empty()) {
      ctx.use_certificate_chain_file(t.cert_file, ec);
      check(ec, "cannot load client certificate '" + t.cert_file + "'");
      ctx.use_private_key_file(t.key_file, ssl::context::pem, ec);
      check(ec, "cannot load client key '" + t.key_file + "'");
      if (SSL_CTX_check_private_key(ctx.native_handle()) != 1)
        throw error(errc::invalid_argument, "http_client: TLS: key '" + t.key_file +
                                                "' does not belong to '" + t.cert_file + "'");
    }
    return ctx;
  }

  /// What the client trusts, for verification failure messages.
  std::string trust_source() const {
    const auto& t = opt_.tls;
    if (t.ca_file.empty() && t.ca_dir.empty()) return "the system trust store";
    std::string s;
    if (!t.ca_file.empty()) s = "CA file '" + t.ca_file + "'";
    if (!t.ca_dir.empty())
      s += (s.empty() ? "" : " and ") + std::string("CA directory '") + t.ca_dir + "'";
    return s;
  }

  status handshake(tls_stream& s, std::chrono::steady_clock::time_point deadline) {
    namespace ssl = boost::asio::ssl;
    const std::string name =
        opt_.tls.server_name.empty() ? current_endpoint().host : opt_.tls.server_name;
    boost::beast::error_code ec;
    (void)boost::asio::ip::make_address(name, ec);
    if (ec && SSL_set_tlsext_host_name(s.native_handle(), name.c_str()) !=
                  1) // SNI takes names, not addresses
      return fail(errc::invalid_argument, where() + ": TLS: cannot set server name '" + name + "'");
    verify_failure_.clear();
    if (opt_.tls.verify_peer) {
      s.set_verify_mode(ssl::verify_peer);
      // host_name_verification alone reports every failure as "certificate
      // verify failed"; recording why here lets the message tell an unknown
      // issuer from a wrong name.
      s.set_verify_callback([this, name, names = ssl::host_name_verification(name)](
                                bool preverified, ssl::verify_context& vc) {
        X509_STORE_CTX* x = vc.native_handle();
        if (!preverified) {
          if (verify_failure_.empty())
            verify_failure_ = "certificate at depth " +
                              std::to_string(X509_STORE_CTX_get_error_depth(x)) +
                              " failed verification: " +
                              X509_verify_cert_error_string(X509_STORE_CTX_get_error(x)) +
                              " (trusting " + trust_source() + ")";
          return false;
        }
        if (!names(true, vc)) {
          verify_failure_ = "certificate does not name '" + name + "'";
          return false;
        }
        return true;
      });
    } else {
      s.set_verify_mode(ssl::verify_none);
    }
    boost::beast::get_lowest_layer(s).expires_at(deadline);
    s.async_handshake(ssl::stream_base::client, [&](const boost::beast::error_code& e) { ec = e; });
    run();
    if (!ec) return status::success();
    if (!verify_failure_.empty())
      return fail(errc::io, where() + ": TLS: server " + verify_failure_);
    if (ec.category() == boost::asio::error::get_ssl_category()) {
      const bool not_tls = ERR_GET_REASON(ec.value()) == SSL_R_WRONG_VERSION_NUMBER;
      return fail(errc::io, where() + ": TLS handshake failed: " + ec.message() +
                                (not_tls ? " (not a TLS server?)" : ""));
    }
    return fail(errc::unavailable,
                where() + ": TLS handshake failed: " + timeout_or(ec, opt_.connect_timeout));
  }

  /// close_notify to a live TLS peer, bounded by connect_timeout. Marking the
  /// peer's close_notify as received makes SSL_shutdown send ours and finish
  /// at once instead of waiting for an answer nobody needs.
  void shutdown_tls() noexcept {
    auto* t = stream_ ? std::get_if<tls_stream>(&*stream_) : nullptr;
    if (!t) return;
    try {
      SSL_set_shutdown(t->native_handle(), SSL_RECEIVED_SHUTDOWN);
      boost::beast::get_lowest_layer(*t).expires_after(opt_.connect_timeout);
      t->async_shutdown(
          [](const boost::beast::error_code&) {}); // a peer that already left: nothing to do
      run();
    } catch (...) {
    }
  }

  std::string verify_failure_; ///< why the last handshake's certificate check failed, if it did
  std::optional<boost::asio::ssl::context> tls_ctx_; ///< only with an https endpoint
#else
  void shutdown_tls() noexcept {}
#endif

  std::vector<http_endpoint> endpoints_;
  http_options opt_;
  std::size_t current_ = 0;
  bool timed_out_ = false; ///< the last exchange failed by its deadline
  boost::asio::io_context ioc_{1};
  std::optional<any_stream> stream_;
  boost::beast::flat_buffer buffer_;
};

http_client::http_client(std::vector<http_endpoint> endpoints, http_options opt)
    : impl_(std::make_unique<impl>(std::move(endpoints), std::move(opt))) {}
http_client::http_client(http_endpoint endpoint, http_options opt)
    : http_client(std::vector<http_endpoint>{std::move(endpoint)}, std::move(opt)) {}
http_client::http_client(http_client&&) noexcept = default;
http_client& http_client::operator=(http_client&&) noexcept = default;
http_client::~http_client() = default;

const http_endpoint& http_client::current_endpoint() const noexcept {
  return impl_->current_endpoint();
}
const std::vector<http_endpoint>& http_client::endpoints() const noexcept {
  return impl_->endpoints();
}
const http_options& http_client::options() const noexcept { return impl_->options(); }
void http_client::close() noexcept {
  if (impl_) impl_->close();
}
status http_client::request(const http_request& rq, http_response& out) {
  return impl_->request(rq, out);
}

} // namespace dcr::net
