// libFuzzer target: the small decoders of what arrives over the network.
// The first byte picks one; the rest is its input:
//   0  relay TCP frames (`decode_frame`): what decodes encodes back to the
//      same bytes, and the header alone decodes the same;
//   1  peer addresses (`parse_peer_address`): what parses prints back to an
//      address that parses to the same host and port;
//   2  base64 (`base64_decode`, strict): what decodes encodes back to the same
//      text (every byte string has exactly one encoding), and any bytes
//      encode to text that decodes back to them;
//   3  etcd v3 gateway transaction responses (dcr/protocol/etcd_response.hpp):
//      the response, its three range responses (record, epoch, attempt) and
//      the commit record in it, as `etcd_commit_store::load` reads them; a
//      record that decodes has the key's version as its revision. The same
//      body as an error response (HTTP 500) must give a typed error.
// No input may crash, hang, read out of bounds or allocate past its size.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>
#include <string_view>

#include "dcr/net/base64.hpp"
#include "dcr/protocol/control_channel.hpp"
#include "dcr/protocol/etcd_response.hpp"
#include "dcr/transport/relay_frame.hpp"

namespace {

void relay(std::span<const std::byte> bytes) {
  using namespace dcr::transport;
  constexpr std::uint64_t max_body = 1u << 16;
  frame f;
  if (!decode_frame(bytes, max_body, f).ok()) return;
  frame_header h;
  if (!decode_frame_header(bytes, max_body, h).ok() || !(h == f.header)) std::abort();
  const auto again = encode_frame(f.header, f.body);
  if (again.size() != bytes.size() || !std::equal(again.begin(), again.end(), bytes.begin()))
    std::abort();
}

void peer(std::string_view text) {
  dcr::protocol::peer_address a;
  if (!dcr::protocol::parse_peer_address(text, a).ok()) return;
  dcr::protocol::peer_address b;
  if (!dcr::protocol::parse_peer_address(a.text(), b).ok() || a.host != b.host || a.port != b.port)
    std::abort();
}

void base64(std::string_view text) {
  std::string out;
  if (dcr::net::base64_decode(text, out).ok() && dcr::net::base64_encode(out) != text) std::abort();
  std::string back;
  if (!dcr::net::base64_decode(dcr::net::base64_encode(text), back).ok() || back != text)
    std::abort();
}

void etcd(std::string_view body) {
  using namespace dcr::protocol;
  if (etcd::http_error("etcd load", 500, "Internal Server Error", body).ok()) std::abort();
  etcd::txn_result t;
  if (!etcd::parse_txn_response(body, "etcd load", t).ok()) return;
  etcd::snapshot snap;
  if (!etcd::snapshot_of(t, 0, "dcr/record", "dcr/epoch", "dcr/attempt", snap, true).ok()) return;
  stored_record r;
  if (etcd::record_of(snap, "dcr/record", r).ok() && r.revision != snap.counters.revision)
    std::abort();
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (data[0] % 4) {
  case 0:
    relay(std::as_bytes(std::span(data + 1, size - 1)));
    break;
  case 1:
    peer(rest);
    break;
  case 2:
    base64(rest);
    break;
  default:
    etcd(rest);
    break;
  }
  return 0;
}
