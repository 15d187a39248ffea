// libFuzzer target: the keyed relay link's read path and the payload seal
// check a node runs on what it reads. The first byte picks the path:
//  0: the bytes are what a peer without the key sends to a keyed accepting
//     end (tcp_frame_conn::read over a socketpair, the real code): it must
//     fail typed after reading at most the hello and the proof, allocating
//     no frame body, whatever the bytes announce;
//  1: the same bytes to an unkeyed accepting end (frames read as they come,
//     under a small body cap);
//  2: the bytes are frames on an authenticated link, each followed by a tag
//     byte: odd, the harness tags the frame with the link's key (as the
//     peer holding it would); even, 16 bytes of the input are the tag. Each
//     frame is checked the way tcp_frame_conn checks it (header before the
//     body, then the tag), and a payload whose tag passed goes through the
//     node's checks: its seal with the job key and its ids against the
//     frame header.
// No input may crash, hang, read out of bounds or allocate past the cap.
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include <sys/socket.h>
#include <unistd.h>

#include "dcr/codec/payload_format.hpp"
#include "dcr/transport/relay_frame.hpp"
#include "dcr/transport/relay_tcp.hpp"

namespace {

using namespace dcr;
using namespace dcr::transport;

constexpr std::uint64_t cap = 1 << 16;

const seal_key& job_key() {
  static const seal_key k = [] {
    seal_key key;
    if (!seal_key::make(std::string_view("fuzz-relay-job-key-0123456789"), key)) std::abort();
    return key;
  }();
  return k;
}

/// Path 0 and 1: the input is the whole stream from the peer.
void read_as_acceptor(std::span<const std::byte> in, bool keyed) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) != 0) return;
  // The peer's bytes are all queued before the read starts, then its end
  // is shut for writing: every read ends at once (no hang on short input).
  const auto n = ::send(sv[1], in.data(), in.size(), MSG_NOSIGNAL);
  (void)n;
  ::shutdown(sv[1], SHUT_WR);
  {
    tcp_frame_conn c(sv[0], cap, std::chrono::milliseconds(1000));
    if (keyed) c.accept_key(job_key(), std::chrono::milliseconds(1000));
    for (int i = 0; i < 64; ++i) {
      frame f;
      const auto s = c.read(f);
      if (keyed && s) std::abort(); // nobody without the key gets a frame through
      if (!s) {
        if (f.body.capacity() > cap) std::abort();
        break;
      }
      if (f.body.size() != f.header.length || f.header.length > cap) std::abort();
    }
  }
  ::close(sv[1]);
}

/// Path 2: frames with tags on an authenticated link.
void check_frames(std::span<const std::byte> in) {
  relay_link_mac mac{job_key(), {}, {}};
  for (std::size_t i = 0; i < 16; ++i) {
    mac.client_nonce[i] = static_cast<std::uint8_t>(i);
    mac.server_nonce[i] = static_cast<std::uint8_t>(0xF0 + i);
  }
  std::uint64_t seq = 0;
  while (in.size() >= frame_header_size) {
    frame_header h;
    if (!decode_frame_header(in.first(frame_header_size), cap, h)) return;
    if (h.length > cap) std::abort(); // the cap holds before any body
    const auto hdr = in.first(frame_header_size);
    in = in.subspan(frame_header_size);
    if (in.size() < h.length + 1) return;
    const auto body = in.first(h.length);
    const bool sign = (static_cast<std::uint8_t>(in[h.length]) & 1) != 0;
    in = in.subspan(h.length + 1);
    const auto want = relay_link_tag(mac, 0, seq++, hdr, body);
    digest128 got{};
    if (sign) {
      got = want;
    } else {
      if (in.size() < got.size()) return;
      std::memcpy(got.data(), in.data(), got.size());
      in = in.subspan(got.size());
    }
    if (!same_digest(got, want)) return; // the link ends at a failed tag
    if (h.kind != frame_kind::payload) continue;
    codec::payload_header ph;
    codec::decode_limits limits;
    limits.key = job_key();
    if (!codec::read_payload_header(body, ph, limits)) return; // refused, link dropped
    if (ph.id.attempt != h.attempt || ph.id.owner != h.owner || ph.id.sequence != h.sequence)
      return; // header and payload disagree: link dropped
  }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const auto in = std::as_bytes(std::span(data + 1, size - 1));
  switch (data[0] % 3) {
  case 0:
    read_as_acceptor(in, true);
    break;
  case 1:
    read_as_acceptor(in, false);
    break;
  default:
    check_frames(in);
  }
  return 0;
}
