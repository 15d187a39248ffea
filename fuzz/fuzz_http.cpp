// libFuzzer target: the HTTP response reader of `net::http_client` (Boost.Beast's
// response parser with the client's limits and error mapping,
// src/net/http_response_parse.hpp), as the etcd commit store and the S3
// object store get their answers. Input: one byte of flags (bit 0: the
// request was HEAD; bits 1-7: the bytes per socket read of the first
// parse), one byte (the bytes per read of the second parse), then the bytes
// the peer sent before closing. Checked: no crash, hang or out-of-bounds
// read; a failure is one of the client's codes (length_overflow, bad_format,
// unavailable); a response that parses has a status of three digits and a body
// within the limit (none for HEAD); and the outcome - success or failure,
// the whole response and its keep-alive, the failure's code except for a
// response cut off mid-header or a header longer than the limit (see
// `same`) - does not depend on how the bytes were split into reads, nor on
// reading them all at once.
// As in the dcr-net library (meson.build): Beast's debug assertions are off,
// since one of them (a last chunk split across reads) is reachable by a peer.
#define BOOST_DISABLE_ASSERTS 1
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "../src/net/http_response_parse.hpp"

namespace {

constexpr std::size_t max_body = 4096; // small, so that the body limit is reached

struct outcome {
  dcr::status s;
  dcr::net::http_response r;
  bool keep_alive = false;
};

outcome parse(std::string_view bytes, bool head, std::size_t step) {
  outcome o;
  o.s = dcr::net::detail::parse_response_bytes(bytes, max_body, head, step, o.r, o.keep_alive);
  return o;
}

/// Beast's limit on a response header (the client keeps the default).
constexpr std::size_t header_limit = 8192;

bool same(const outcome& a, const outcome& b, bool header_over_limit) {
  if (a.s.ok() != b.s.ok()) return false;
  // A response the peer cut off before its header ended may be refused as
  // malformed when the parser sees the bad bytes in one piece, or as cut off
  // (`unavailable`) when it is still waiting for the header's end at the
  // close: Beast validates a header only once its end has arrived. Likewise
  // a header whose end is not within the header limit: refused as malformed
  // when a bad line is among the bytes Beast parsed at once, as too large
  // (`length_overflow`) when it waited in vain for the end. Both refuse; any
  // other difference of code is a finding.
  if (!a.s.ok()) {
    const auto c = a.s.code, d = b.s.code;
    if (c == d || c == dcr::errc::unavailable || d == dcr::errc::unavailable) return true;
    return header_over_limit && ((c == dcr::errc::bad_format && d == dcr::errc::length_overflow) ||
                                 (c == dcr::errc::length_overflow && d == dcr::errc::bad_format));
  }
  if (a.keep_alive != b.keep_alive || a.r.status != b.r.status || a.r.reason != b.r.reason ||
      a.r.body != b.r.body || a.r.headers.size() != b.r.headers.size())
    return false;
  for (std::size_t i = 0; i < a.r.headers.size(); ++i)
    if (a.r.headers[i].name != b.r.headers[i].name || a.r.headers[i].value != b.r.headers[i].value)
      return false;
  return true;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const bool head = data[0] & 1;
  const std::size_t step1 = 1 + (data[0] >> 1), step2 = 1 + data[1] * 4;
  const std::string_view bytes(reinterpret_cast<const char*>(data + 2), size - 2);
  const auto whole = parse(bytes, head, bytes.size() + 1);
  if (!whole.s.ok() && whole.s.code != dcr::errc::length_overflow &&
      whole.s.code != dcr::errc::bad_format && whole.s.code != dcr::errc::unavailable)
    std::abort();
  if (whole.s.ok()) {
    if (whole.r.status > 999) std::abort(); // three digits (Beast takes "050" as 50)
    if (whole.r.body.size() > max_body) std::abort();
    if (head && !whole.r.body.empty()) std::abort();
  }
  const auto end = bytes.find("\r\n\r\n");
  const bool over = end == std::string_view::npos || end + 4 >= header_limit;
  if (!same(whole, parse(bytes, head, step1), over)) std::abort();
  if (!same(whole, parse(bytes, head, step2), over)) std::abort();
  return 0;
}
