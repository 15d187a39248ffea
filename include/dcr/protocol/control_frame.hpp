#pragma once
/// \file
/// Checked frames of the control channel between a coordinator and the owner
/// and rollout processes it drives (layout in docs/protocol.md, "Control
/// channel"). Little-endian:
/// ```
/// 0  u32 magic "DCRC"   4  u16 version (1)   6  u16 type
/// 8  u64 attempt τ (0: a call outside any attempt)
/// 16 u64 length of the body
/// 24 body (length bytes)
/// 24+length  BLAKE2b-128 of every byte before it (16 bytes)
/// ```
/// The header is checked before the body is allocated (the length against
/// the receiver's cap), the digest before any field of the body is read; a
/// body is a sequence of fields read by `body_reader`, which never reads past
/// its end and requires the whole body to be consumed.
///
/// Keyed channels (a job key on both ends; docs/protocol.md, "Control channel
/// authentication"): each side first sends an `auth_hello` frame carrying 16
/// random bytes (its nonce), sealed as above. Every later frame keeps the
/// same layout, but its last 16 bytes are a keyed BLAKE2b-128 tag over
/// "DCRA", the direction, both nonces, the frame's sequence number in its
/// direction (0, 1, ... counted by each end, never sent) and the header and
/// body. A frame from a peer without the key, modified, replayed (on this
/// connection or another: the sequence number or the nonces differ) or
/// reordered fails its tag (`errc::verification`) and the connection is
/// dropped.

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dcr/core/endian.hpp"
#include "dcr/core/error.hpp"
#include "dcr/core/hash.hpp"
#include "dcr/net/frame_preamble.hpp"

namespace dcr::protocol {

/// What a control frame is: a call (coordinator → role process), its reply,
/// or a keep-alive.
enum class control_type : std::uint16_t {
  // owner calls
  owner_hello = 1,      ///< → u32 owner id
  baseline_digest = 2,  ///< → digest
  candidate_digest = 3, ///< → digest
  publish = 4,          ///< u64 target, u8 mode, str incarnation, u64 queue → report
  commit_baseline = 5,  ///< u64 version (τ in the header) → nothing
  export_dense = 6,     ///< u64 version, str incarnation → nothing
  // rollout-node calls
  node_hello = 16,    ///< → u32 n, n × str receiver id
  ensure_member = 17, ///< u64 version, str inc, u32 n, n × (str id, digest) → u64 restored
  down = 18,          ///< → u64 receivers without storage
  begin = 19,         ///< → nothing
  close_gate = 20,    ///< → nothing
  open_gate = 21,     ///< → nothing
  refit = 22, ///< str incarnation, u32 n, n × u32 owner, u8 sync, u64 queue, u64 ms → result
  acknowledge = 23,     ///< → u32 n, n × digest
  staged_payloads = 24, ///< → u32 n, n × (str id, u32 m, m × (str name, digest))
  kill = 25,            ///< str id → nothing
  verify = 26,          ///< u64 version, str incarnation → u32 n, n × (u8 equal, digest)
  // either direction
  stop = 32,       ///< coordinator → role: stop the call in flight on this connection
  reply_ok = 33,   ///< role → coordinator: the call succeeded; body is its result
  reply_err = 34,  ///< role → coordinator: u16 errc, str message
  heartbeat = 35,  ///< role → coordinator while a call runs: the peer is alive
  auth_hello = 36, ///< first frame each way on a keyed channel: 16-byte nonce
};

inline bool known_control_type(std::uint16_t t) {
  return (t >= 1 && t <= 6) || (t >= 16 && t <= 26) || (t >= 32 && t <= 36);
}

/// Bytes of an `auth_hello` nonce.
inline constexpr std::size_t control_nonce_size = 16;
using control_nonce = std::array<std::uint8_t, control_nonce_size>;

/// What the tag of one frame on a keyed channel binds: the job key, both
/// connection nonces, the direction (0: client → server, 1: server → client)
/// and the frame's sequence number in that direction.
struct control_mac {
  seal_key key;
  control_nonce client_nonce{}, server_nonce{};
  std::uint8_t direction = 0;
  std::uint64_t sequence = 0;
};

/// The tag of a frame whose header and body are `framed` (see file comment).
inline digest128 control_tag(const control_mac& m, std::span<const std::byte> framed) {
  std::byte pre[4 + 1 + 2 * control_nonce_size + 8];
  std::memcpy(pre, "DCRA", 4);
  pre[4] = static_cast<std::byte>(m.direction);
  std::memcpy(pre + 5, m.client_nonce.data(), control_nonce_size);
  std::memcpy(pre + 5 + control_nonce_size, m.server_nonce.data(), control_nonce_size);
  store_le(pre + 5 + 2 * control_nonce_size, m.sequence);
  blake2b_128 h{m.key};
  h.update(pre);
  h.update(framed);
  return h.final();
}

/// "DCRC" read as a little-endian u32.
inline constexpr std::uint32_t control_magic = 0x43524344u;
/// 2: the publish reply says whether its digest is a stored manifest's or a
/// relay stream's and lists the payload digests sent; a version-1 peer is
/// refused (`unsupported_version`) instead of misreading the reply.
inline constexpr std::uint16_t control_version = 2;
inline constexpr std::size_t control_header_size = 24;
inline constexpr net::frame_preamble control_preamble{"control frame", control_magic,
                                                      control_version, control_header_size};
inline constexpr std::size_t control_trailer_size = 16;
/// Largest body accepted: control calls carry ids, digests and names only.
inline constexpr std::uint64_t max_control_body = std::uint64_t{64} << 20;

struct control_header {
  control_type type = control_type::heartbeat;
  std::uint64_t attempt = 0;
  std::uint64_t length = 0;
  friend bool operator==(const control_header&, const control_header&) = default;
};

struct control_frame {
  control_type type = control_type::heartbeat;
  std::uint64_t attempt = 0;
  std::vector<std::byte> body;
};

/// The whole frame: header, body, digest (or, with `mac`, the keyed tag).
inline std::vector<std::byte> encode_control_frame(control_type type, std::uint64_t attempt,
                                                   std::span<const std::byte> body,
                                                   const control_mac* mac = nullptr) {
  std::vector<std::byte> out(control_header_size + body.size() + control_trailer_size);
  store_le(out.data() + 0, control_magic);
  store_le(out.data() + 4, control_version);
  store_le(out.data() + 6, static_cast<std::uint16_t>(type));
  store_le(out.data() + 8, attempt);
  store_le(out.data() + 16, static_cast<std::uint64_t>(body.size()));
  if (!body.empty()) std::memcpy(out.data() + control_header_size, body.data(), body.size());
  const auto framed = std::span<const std::byte>(out.data(), control_header_size + body.size());
  const auto d = mac ? control_tag(*mac, framed) : digest(framed);
  std::memcpy(out.data() + control_header_size + body.size(), d.data(), d.size());
  return out;
}

/// Check the first 24 bytes: magic (`bad_magic`), version
/// (`unsupported_version`), type (`bad_format`), length against `max_body`
/// (`length_overflow`).
inline status decode_control_header(std::span<const std::byte> b, std::uint64_t max_body,
                                    control_header& out) {
  std::uint16_t type = 0;
  DCR_TRY(net::check_preamble(b, control_preamble, type));
  DCR_RETURN_ERROR_IF(!known_control_type(type), bad_format,
                      "control frame: unknown type " + std::to_string(type));
  control_header h;
  h.type = static_cast<control_type>(type);
  h.attempt = load_le<std::uint64_t>(b.data() + 8);
  h.length = load_le<std::uint64_t>(b.data() + 16);
  DCR_TRY(net::check_body_cap(control_preamble, h.length, max_body));
  out = h;
  return status::success();
}

/// Check the digest of a frame whose header `h` was decoded from `header`:
/// `rest` is the body followed by the 16 digest bytes. With `mac`, the
/// trailer must be that keyed tag (`errc::verification` otherwise).
inline status check_control_digest(std::span<const std::byte> header, const control_header& h,
                                   std::span<const std::byte> rest,
                                   const control_mac* mac = nullptr) {
  DCR_RETURN_ERROR_IF(rest.size() != h.length + control_trailer_size, truncated,
                      "control frame: body and digest need " +
                          std::to_string(h.length + control_trailer_size) + " bytes, got " +
                          std::to_string(rest.size()));
  digest128 got{};
  std::memcpy(got.data(), rest.data() + h.length, got.size());
  if (mac) {
    std::vector<std::byte> framed(control_header_size + h.length);
    std::memcpy(framed.data(), header.data(), control_header_size);
    if (h.length > 0) std::memcpy(framed.data() + control_header_size, rest.data(), h.length);
    DCR_RETURN_ERROR_IF(!same_digest(control_tag(*mac, framed), got), verification,
                        "control frame: authentication tag does not match (a peer without the "
                        "job key, or a modified, replayed or reordered frame)");
    return status::success();
  }
  blake2b_128 d;
  d.update(header.first(control_header_size));
  d.update(rest.first(h.length));
  const auto want = d.final();
  DCR_RETURN_ERROR_IF(!same_digest(want, got), digest_mismatch,
                      "control frame: digest does not match its bytes");
  return status::success();
}

/// Decode one whole frame from exactly `b` (`truncated` / `trailing_bytes`
/// when it is shorter or longer than the header says).
inline status decode_control_frame(std::span<const std::byte> b, std::uint64_t max_body,
                                   control_frame& out) {
  control_header h;
  DCR_TRY(decode_control_header(b, max_body, h));
  const auto rest = b.size() - control_header_size;
  DCR_RETURN_ERROR_IF(rest < h.length + control_trailer_size, truncated,
                      "control frame: " + std::to_string(rest) + " bytes after the header, " +
                          std::to_string(h.length + control_trailer_size) + " declared");
  DCR_RETURN_ERROR_IF(rest > h.length + control_trailer_size, trailing_bytes,
                      "control frame: " + std::to_string(rest - h.length - control_trailer_size) +
                          " bytes after the digest");
  DCR_TRY(check_control_digest(b, h, b.subspan(control_header_size)));
  out.type = h.type;
  out.attempt = h.attempt;
  out.body.assign(b.begin() + control_header_size, b.begin() + control_header_size + h.length);
  return status::success();
}

/// Appends fields to a body.
class body_writer {
public:
  body_writer& u8(std::uint8_t v) {
    b_.push_back(static_cast<std::byte>(v));
    return *this;
  }
  body_writer& u16(std::uint16_t v) { return put(v); }
  body_writer& u32(std::uint32_t v) { return put(v); }
  body_writer& u64(std::uint64_t v) { return put(v); }
  body_writer& f64(double v) {
    std::uint64_t u;
    std::memcpy(&u, &v, 8);
    return put(u);
  }
  body_writer& str(std::string_view s) {
    u32(static_cast<std::uint32_t>(s.size()));
    const auto* p = reinterpret_cast<const std::byte*>(s.data());
    b_.insert(b_.end(), p, p + s.size());
    return *this;
  }
  body_writer& dig(const digest128& d) {
    const auto* p = reinterpret_cast<const std::byte*>(d.data());
    b_.insert(b_.end(), p, p + d.size());
    return *this;
  }
  std::vector<std::byte>& bytes() noexcept { return b_; }

private:
  template <class T>
  body_writer& put(T v) {
    std::byte tmp[sizeof(T)];
    store_le(tmp, v);
    b_.insert(b_.end(), tmp, tmp + sizeof(T));
    return *this;
  }
  std::vector<std::byte> b_;
};

/// Reads fields of a body; every read past the end is `errc::truncated`.
class body_reader {
public:
  explicit body_reader(std::span<const std::byte> b) : b_(b) {}
  status u8(std::uint8_t& v) {
    DCR_TRY(need(1));
    v = static_cast<std::uint8_t>(b_[at_++]);
    return status::success();
  }
  status u16(std::uint16_t& v) { return get(v); }
  status u32(std::uint32_t& v) { return get(v); }
  status u64(std::uint64_t& v) { return get(v); }
  status f64(double& v) {
    std::uint64_t u = 0;
    DCR_TRY(get(u));
    std::memcpy(&v, &u, 8);
    return status::success();
  }
  status str(std::string& s) {
    std::uint32_t n = 0;
    DCR_TRY(u32(n));
    DCR_TRY(need(n));
    s.assign(reinterpret_cast<const char*>(b_.data() + at_), n);
    at_ += n;
    return status::success();
  }
  status dig(digest128& d) {
    DCR_TRY(need(d.size()));
    std::memcpy(d.data(), b_.data() + at_, d.size());
    at_ += d.size();
    return status::success();
  }
  /// A count of items of at least `min_item` bytes each: larger than what is
  /// left is `length_overflow` (a peer cannot make the reader allocate more
  /// than the body holds).
  status count(std::uint32_t& n, std::size_t min_item) {
    DCR_TRY(u32(n));
    DCR_RETURN_ERROR_IF(min_item > 0 && n > (b_.size() - at_) / min_item, length_overflow,
                        "control body: count " + std::to_string(n) + " exceeds the body");
    return status::success();
  }
  /// The whole body was read (`trailing_bytes` otherwise).
  status done() const {
    DCR_RETURN_ERROR_IF(at_ != b_.size(), trailing_bytes,
                        "control body: " + std::to_string(b_.size() - at_) + " unread bytes");
    return status::success();
  }

private:
  status need(std::size_t n) const {
    DCR_RETURN_ERROR_IF(n > b_.size() - at_, truncated,
                        "control body: field of " + std::to_string(n) + " bytes at offset " +
                            std::to_string(at_) + " runs past its end (" +
                            std::to_string(b_.size()) + " bytes)");
    return status::success();
  }
  template <class T>
  status get(T& v) {
    DCR_TRY(need(sizeof(T)));
    v = load_le<T>(b_.data() + at_);
    at_ += sizeof(T);
    return status::success();
  }
  std::span<const std::byte> b_;
  std::size_t at_ = 0;
};

} // namespace dcr::protocol
