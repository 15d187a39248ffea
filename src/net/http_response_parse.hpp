#pragma once
/// \file
/// How `net::http_client` turns the bytes of an HTTP response into an
/// `http_response`: Boost.Beast's response parser with the client's limits,
/// the mapping of its errors to `errc`, and the conversion of the parsed
/// message. Private to the dcr-net library (it includes Beast); the client
/// reads from its socket through it, and fuzz/fuzz_http.cpp feeds it bytes.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <boost/asio/buffer.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

#include "dcr/core/error.hpp"
#include "dcr/net/http_client.hpp"

namespace dcr::net::detail {

/// What a failed read of a response means.
enum class response_failure {
  body_too_large,   ///< the body limit (`errc::length_overflow`)
  header_too_large, ///< Beast's header limit (`errc::length_overflow`)
  malformed,        ///< the peer spoke, but not HTTP (`errc::bad_format`)
  transport,        ///< closed, cut or timed out before a whole response (`errc::unavailable`)
};

inline response_failure classify_read_error(const boost::beast::error_code& ec) {
  namespace http = boost::beast::http;
  if (ec == http::error::body_limit) return response_failure::body_too_large;
  if (ec == http::error::header_limit) return response_failure::header_too_large;
  if (ec.category() == http::make_error_code(http::error::bad_version).category() &&
      ec != http::error::end_of_stream && ec != http::error::partial_message)
    return response_failure::malformed;
  return response_failure::transport;
}

/// The status of a non-transport failure (`where`: the request, for messages).
inline status read_error_status(response_failure f, const boost::beast::error_code& ec,
                                std::size_t max_body, const std::string& where) {
  switch (f) {
  case response_failure::body_too_large:
    return fail(errc::length_overflow,
                where + ": response body larger than " + std::to_string(max_body) + " bytes");
  case response_failure::header_too_large:
    return fail(errc::length_overflow, where + ": response header too large");
  case response_failure::malformed:
    return fail(errc::bad_format, where + ": malformed HTTP response: " + ec.message());
  case response_failure::transport:
    break;
  }
  return fail(errc::unavailable, where + ": read failed: " + ec.message());
}

using response_parser = boost::beast::http::response_parser<boost::beast::http::string_body>;

/// How every status line Beast accepts begins: "HTTP/1.0 " or "HTTP/1.1 ",
/// three digits, a space.
inline constexpr std::size_t status_line_start = 13;
/// Whether `arrived`, the first bytes of a response (any number of them),
/// can begin a status line. The reader checks these bytes itself as they
/// arrive: Beast checks the version only once 8 bytes have arrived and the
/// status once 13 have, and when the header's end ("\r\n\r\n") arrives
/// among those first bytes it asks for more and from then on looks for the
/// header's end only past it. A response such as "\x9a\r\n\r\n" and more
/// bytes was then refused as malformed when read whole but waited on to the
/// header limit (or the close) when read in pieces (found by
/// fuzz/fuzz_http.cpp). Exactly Beast's rule, so no response Beast would
/// parse is refused; once 13 bytes pass, a header's end lies past them.
inline bool begins_as_status_line(std::string_view arrived) noexcept {
  constexpr std::string_view shape = "HTTP/1.v ddd "; // v: 0 or 1; d: a digit
  const std::size_t n = std::min(arrived.size(), status_line_start);
  for (std::size_t i = 0; i < n; ++i) {
    const char c = arrived[i];
    const bool ok = shape[i] == 'v'   ? (c == '0' || c == '1')
                    : shape[i] == 'd' ? (c >= '0' && c <= '9')
                                      : c == shape[i];
    if (!ok) return false;
  }
  return true;
}
/// The failure of a response that does not begin as a status line.
inline status not_a_status_line(const std::string& where) {
  return fail(errc::bad_format, where +
                                    ": malformed HTTP response: it does not begin with a status "
                                    "line (\"HTTP/1.0 \" or \"HTTP/1.1 \", three digits, a space)");
}

/// The most bytes a response header may take, start line to its empty line
/// (Beast's default). Counted by the reader over every read: Beast applies
/// its own limit per call to the bytes it has not consumed, and it consumes
/// the start line and whole field lines as they arrive, so a header read in
/// pieces could grow past its limit (found by fuzz/fuzz_http.cpp).
inline constexpr std::size_t header_limit = 8192;

/// A response parser with the client's limits: the body limit, and no body
/// for a HEAD request whatever its length says. Chunked bodies are counted
/// here, once per chunk, when the parser reports a chunk header complete,
/// and not by Beast's body limit: Beast (1.81) subtracts a chunk's size from
/// its limit before it has parsed the chunk's extensions, and when these run
/// past the bytes that have arrived it asks for more and later parses the
/// chunk header again, subtracting again; a response arriving in small
/// reads was then refused as too large where the same bytes in one read
/// were malformed (found by fuzz/fuzz_http.cpp). Beast's limit stays for
/// bodies of a stated length (refused at the header, before any allocation)
/// and bodies that run to the end of the stream. Not copyable: the parser
/// keeps a reference to the chunk counter.
class response_reader {
public:
  response_reader(std::size_t max_body, bool head) : chunks_{max_body} {
    parser_.header_limit(static_cast<std::uint32_t>(header_limit));
    parser_.body_limit(max_body);
    if (head) parser_.skip(true);
    parser_.on_chunk_header(chunks_);
  }
  response_reader(const response_reader&) = delete;
  response_reader& operator=(const response_reader&) = delete;

  response_parser& parser() noexcept { return parser_; }
  /// Count `n` more bytes the parser consumed before the header was
  /// complete; false once the header has taken more than `header_limit`.
  bool header_bytes(std::size_t n) noexcept {
    header_bytes_ += n;
    return header_bytes_ <= header_limit;
  }
  /// Call once the header is complete, before the body is read.
  void header_done() {
    if (parser_.chunked()) parser_.body_limit(boost::none);
  }

private:
  struct chunk_counter {
    std::uint64_t max, total = 0;
    void operator()(std::uint64_t size, boost::beast::string_view, boost::beast::error_code& ec) {
      if (size > max - total) {
        ec = boost::beast::http::error::body_limit;
        return;
      }
      total += size;
    }
  };
  chunk_counter chunks_; // before parser_: outlives it
  response_parser parser_;
  std::size_t header_bytes_ = 0;
};

/// The parsed message as an `http_response`; `keep_alive`: whether the
/// connection may carry the next request.
inline void to_response(boost::beast::http::response<boost::beast::http::string_body>&& res,
                        http_response& out, bool& keep_alive) {
  out.status = res.result_int();
  out.reason = std::string(res.reason());
  out.headers.clear();
  for (auto& f : res) out.headers.push_back({std::string(f.name_string()), std::string(f.value())});
  out.body = std::move(res.body());
  keep_alive = res.keep_alive();
}

/// Parse `bytes` (everything the peer sent before it closed the connection)
/// as the client would read them off a socket that delivers `step` bytes per
/// read: the parser gets what has arrived and not been consumed, asks for
/// more, and sees end of stream after the last byte. The result does not
/// depend on `step` (fuzz/fuzz_http.cpp checks this); bytes after a complete
/// response stay unread, as on a kept-alive connection.
inline status parse_response_bytes(std::string_view bytes, std::size_t max_body, bool head,
                                   std::size_t step, http_response& out, bool& keep_alive) {
  namespace http = boost::beast::http;
  response_reader reader(max_body, head);
  auto& p = reader.parser();
  bool header = false;
  step = std::max<std::size_t>(step, 1);
  std::size_t at = 0, end = std::min(bytes.size(), step);
  boost::beast::error_code ec;
  // Closed before the first byte: what a socket read reports (Beast's
  // parser must not see an end of stream before any input).
  if (bytes.empty())
    return read_error_status(response_failure::transport, http::error::end_of_stream, max_body,
                             "HTTP response");
  while (!p.is_done()) {
    if (at == end && end == bytes.size()) {
      p.put_eof(ec);
      if (!ec && !p.is_done()) ec = http::error::partial_message;
      break;
    }
    // Nothing consumed yet: the bytes so far are the status line's first.
    if (at == 0 && !begins_as_status_line(bytes.substr(0, end)))
      return not_a_status_line("HTTP response");
    const auto n = p.put(boost::asio::buffer(bytes.data() + at, end - at), ec);
    at += n;
    // The parser stops after the header (it is not eager), so before the
    // header is done every consumed byte is the header's.
    if (!header && (!ec || ec == http::error::need_more) && !reader.header_bytes(n)) {
      ec = http::error::header_limit;
      break;
    }
    if (ec == http::error::need_more || (!ec && n == 0)) {
      ec = {};
      if (end == bytes.size()) {
        p.put_eof(ec);
        if (!ec && !p.is_done()) ec = http::error::partial_message;
        break;
      }
      end = std::min(bytes.size(), end + step);
      continue;
    }
    if (ec) break;
    // As the client, which reads the header before the body.
    if (!header && p.is_header_done()) {
      reader.header_done();
      header = true;
    }
    if (at == end && end < bytes.size() && !p.is_done()) end = std::min(bytes.size(), end + step);
  }
  if (ec) return read_error_status(classify_read_error(ec), ec, max_body, "HTTP response");
  to_response(p.release(), out, keep_alive);
  return status::success();
}

} // namespace dcr::net::detail
