#pragma once
/// \file
/// Frames of the relay tree (layout in docs/wire-format.md, "Relay frames"),
/// and the connection interface both link kinds implement.
///
/// A frame is a 32-byte little-endian header, then `length` body bytes:
/// ```
/// 0  u32 magic "DCRF"   4  u16 version (1)   6  u16 kind
/// 8  u64 attempt τ     16  u32 owner        20  u32 sequence
/// 24 u64 length of the body
/// ```
/// Every field is checked before the body is read or allocated: a peer is
/// never trusted with a length larger than the receiver's cap.

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "dcr/core/endian.hpp"
#include "dcr/core/error.hpp"
#include "dcr/core/hash.hpp"
#include "dcr/net/frame_preamble.hpp"

namespace dcr::transport {

/// What a frame carries.
enum class frame_kind : std::uint16_t {
  payload = 1,     ///< one payload (body) of `owner`, sequence `sequence`
  owner_done = 2,  ///< `owner` finished the attempt with `sequence` payloads
  payload_ack = 3, ///< the payload (attempt, owner, sequence) is queued at the rollout node
  done_ack = 4,    ///< the owner_done (attempt, owner) is queued at the rollout node
  reject =
      5, ///< the frame (attempt, owner, sequence) was refused: its attempt is replaced or failed
  abort = 6, ///< parent to child: the attempt failed upstream; `sequence` is the `errc`
};

/// "DCRF" read as a little-endian u32.
inline constexpr std::uint32_t frame_magic = 0x46524344u;
inline constexpr std::uint16_t frame_version = 1;
inline constexpr std::size_t frame_header_size = 32;
inline constexpr net::frame_preamble frame_preamble_spec{"relay frame", frame_magic, frame_version,
                                                         frame_header_size};
/// Largest body accepted unless a smaller cap is configured.
inline constexpr std::uint64_t default_max_frame_body = std::uint64_t{1} << 30;

/// Decoded frame header.
struct frame_header {
  frame_kind kind = frame_kind::payload;
  std::uint64_t attempt = 0;
  std::uint32_t owner = 0;
  std::uint32_t sequence = 0;
  std::uint64_t length = 0;
  friend bool operator==(const frame_header&, const frame_header&) = default;
};

/// A header with its body.
struct frame {
  frame_header header;
  std::vector<std::byte> body;
};

/// The 32 header bytes of `h`.
inline std::array<std::byte, frame_header_size> encode_frame_header(const frame_header& h) {
  std::array<std::byte, frame_header_size> b{};
  store_le(b.data() + 0, frame_magic);
  store_le(b.data() + 4, frame_version);
  store_le(b.data() + 6, static_cast<std::uint16_t>(h.kind));
  store_le(b.data() + 8, h.attempt);
  store_le(b.data() + 16, h.owner);
  store_le(b.data() + 20, h.sequence);
  store_le(b.data() + 24, h.length);
  return b;
}

/// Decode and check the first 32 bytes of `b`: magic (`bad_magic`), version
/// (`unsupported_version`), kind and attempt (`bad_format`), body length
/// against the kind (`bad_format`: control frames have none, a payload has
/// some) and against `max_body` (`length_overflow`).
inline status decode_frame_header(std::span<const std::byte> b, std::uint64_t max_body,
                                  frame_header& out) {
  std::uint16_t kind = 0;
  DCR_TRY(net::check_preamble(b, frame_preamble_spec, kind));
  DCR_RETURN_ERROR_IF(kind < 1 || kind > 6, bad_format,
                      "relay frame: unknown kind " + std::to_string(kind));
  frame_header h;
  h.kind = static_cast<frame_kind>(kind);
  h.attempt = load_le<std::uint64_t>(b.data() + 8);
  h.owner = load_le<std::uint32_t>(b.data() + 16);
  h.sequence = load_le<std::uint32_t>(b.data() + 20);
  h.length = load_le<std::uint64_t>(b.data() + 24);
  DCR_RETURN_ERROR_IF(h.attempt == 0, bad_format, "relay frame: attempt 0 (attempts start at 1)");
  DCR_TRY(net::check_body_cap(frame_preamble_spec, h.length, max_body));
  if (h.kind == frame_kind::payload)
    DCR_RETURN_ERROR_IF(h.length == 0, bad_format, "relay frame: payload with an empty body");
  else
    DCR_RETURN_ERROR_IF(h.length != 0, bad_format,
                        "relay frame: control frame (kind " + std::to_string(kind) +
                            ") with a body");
  out = h;
  return status::success();
}

/// Header and body in one buffer; `h.length` is set from `body`.
inline std::vector<std::byte> encode_frame(frame_header h, std::span<const std::byte> body) {
  h.length = body.size();
  const auto hdr = encode_frame_header(h);
  std::vector<std::byte> out(hdr.begin(), hdr.end());
  out.insert(out.end(), body.begin(), body.end());
  return out;
}

/// Decode one whole frame: the header as `decode_frame_header`, then the body
/// must be exactly `length` bytes (`truncated` / `trailing_bytes`).
inline status decode_frame(std::span<const std::byte> b, std::uint64_t max_body, frame& out) {
  frame_header h;
  DCR_TRY(decode_frame_header(b, max_body, h));
  const auto rest = b.size() - frame_header_size;
  DCR_RETURN_ERROR_IF(rest < h.length, truncated,
                      "relay frame: body has " + std::to_string(rest) + " of " +
                          std::to_string(h.length) + " bytes");
  DCR_RETURN_ERROR_IF(rest > h.length, trailing_bytes,
                      "relay frame: " + std::to_string(rest - h.length) + " bytes after the body");
  out.header = h;
  out.body.assign(b.begin() + frame_header_size, b.end());
  return status::success();
}

/// What the tags of one keyed link bind (transport/relay_tcp.hpp): the job
/// key and both ends' nonces.
struct relay_link_mac {
  seal_key key;
  std::array<std::uint8_t, 16> client_nonce{}, server_nonce{};
};

/// Keyed BLAKE2b-128 over `label`, `direction` (0: dialler → acceptor), both
/// nonces, `seq` and the frame's header and body bytes. `label` is "DCRL"
/// for a frame's tag and "DCRP" for a key-exchange proof, so no frame's tag
/// can be taken for a proof.
inline digest128 relay_link_tag(const relay_link_mac& m, std::uint8_t direction, std::uint64_t seq,
                                std::span<const std::byte> hdr, std::span<const std::byte> body,
                                const char* label = "DCRL") {
  std::byte pre[4 + 1 + 32 + 8];
  std::memcpy(pre, label, 4);
  pre[4] = static_cast<std::byte>(direction);
  std::memcpy(pre + 5, m.client_nonce.data(), 16);
  std::memcpy(pre + 21, m.server_nonce.data(), 16);
  store_le(pre + 37, seq);
  blake2b_128 h{m.key};
  h.update(pre);
  h.update(hdr);
  h.update(body);
  return h.final();
}

/// One end's proof of the key in the key exchange (`direction` its sending
/// direction).
inline digest128 relay_link_proof(const relay_link_mac& m, std::uint8_t direction) {
  return relay_link_tag(m, direction, 0, {}, {}, "DCRP");
}

/// One bidirectional frame connection (an in-process pipe or a TCP socket).
/// `write` blocks while the peer does not take frames (backpressure) and fails
/// with `errc::unavailable` after `timeout` or once the connection is closed;
/// `read` blocks until a whole, checked frame is there, the connection closes
/// (`errc::unavailable`) or the peer sends bytes that are not a valid frame
/// (the decode error). `close` may be called from any thread, at any time, and
/// wakes every blocked call on both ends.
class frame_conn {
public:
  virtual ~frame_conn() = default;
  virtual status write(const frame_header& h, std::span<const std::byte> body,
                       std::chrono::milliseconds timeout) = 0;
  virtual status read(frame& out) = 0;
  virtual void close() = 0;
};

} // namespace dcr::transport
