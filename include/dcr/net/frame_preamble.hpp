#pragma once
/// \file
/// The frame preamble shared by dcr's two wire formats, the control channel's
/// frames (protocol/control_frame.hpp) and the relay links' frames
/// (transport/relay_frame.hpp), little-endian: u32 magic at byte 0, u16
/// version at 4, u16 type (or kind) at 6; a u64 body length elsewhere in the
/// header is checked against the receiver's cap before any body is
/// allocated. Pure functions over bytes; the sockets are
/// net/framed_socket.hpp's.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "dcr/core/endian.hpp"
#include "dcr/core/error.hpp"

namespace dcr::net {

/// A wire format's frame preamble (see the file comment).
struct frame_preamble {
  const char* what;        ///< "control frame", "relay frame": starts every message
  std::uint32_t magic;     ///< u32 at byte 0
  std::uint16_t version;   ///< u16 at byte 4
  std::size_t header_size; ///< bytes of the whole header
};

/// Check the preamble of header bytes `b`: size (`truncated`), magic
/// (`bad_magic`), version (`unsupported_version`); `type` is the u16 at
/// byte 6, for the format to check.
inline status check_preamble(std::span<const std::byte> b, const frame_preamble& f,
                             std::uint16_t& type) {
  DCR_RETURN_ERROR_IF(b.size() < f.header_size, truncated,
                      std::string(f.what) + ": " + std::to_string(b.size()) +
                          " bytes, header needs " + std::to_string(f.header_size));
  DCR_RETURN_ERROR_IF(load_le<std::uint32_t>(b.data()) != f.magic, bad_magic,
                      std::string(f.what) + ": bad magic at byte 0");
  const auto ver = load_le<std::uint16_t>(b.data() + 4);
  DCR_RETURN_ERROR_IF(ver != f.version, unsupported_version,
                      std::string(f.what) + ": version " + std::to_string(ver));
  type = load_le<std::uint16_t>(b.data() + 6);
  return status::success();
}

/// A declared body `length` against the receiver's cap (`length_overflow`).
inline status check_body_cap(const frame_preamble& f, std::uint64_t length, std::uint64_t cap) {
  DCR_RETURN_ERROR_IF(length > cap, length_overflow,
                      std::string(f.what) + ": body of " + std::to_string(length) +
                          " bytes exceeds the cap of " + std::to_string(cap));
  return status::success();
}

} // namespace dcr::net
