#pragma once
/// \file
/// "host:port" addresses of the TCP peers (control servers, relay nodes) and
/// their resolution to an IPv4 socket address, shared by the control channel
/// (protocol/control_channel.hpp) and the relay links between processes
/// (transport/relay_process.hpp).

#include <cstring>
#include <string>
#include <string_view>

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "dcr/core/error.hpp"

namespace dcr::net {

/// "host:port" of a peer.
struct peer_address {
  std::string host = "127.0.0.1";
  unsigned short port = 0;
  std::string text() const { return host + ":" + std::to_string(port); }
};

/// Parse "host:port" (or ":port", meaning 127.0.0.1).
inline status parse_peer_address(std::string_view s, peer_address& out) {
  const auto c = s.rfind(':');
  DCR_RETURN_ERROR_IF(c == std::string_view::npos, invalid_argument,
                      "address '" + std::string(s) + "' is not host:port");
  const auto port = s.substr(c + 1);
  unsigned long p = 0;
  DCR_RETURN_ERROR_IF(port.empty() || port.size() > 5, invalid_argument,
                      "address '" + std::string(s) + "': bad port");
  for (char ch : port) {
    DCR_RETURN_ERROR_IF(ch < '0' || ch > '9', invalid_argument,
                        "address '" + std::string(s) + "': bad port");
    p = p * 10 + static_cast<unsigned long>(ch - '0');
  }
  DCR_RETURN_ERROR_IF(p > 65535, invalid_argument, "address '" + std::string(s) + "': bad port");
  out.host = c == 0 ? "127.0.0.1" : std::string(s.substr(0, c));
  out.port = static_cast<unsigned short>(p);
  return status::success();
}

/// The IPv4 socket address of `peer` (`errc::unavailable` when the host
/// does not resolve: a name service that is down is a peer out of reach).
/// `who` starts the message.
inline status resolve_ipv4(const peer_address& peer, const std::string& who, sockaddr_in& out) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const auto port = std::to_string(peer.port);
  const int gai = ::getaddrinfo(peer.host.c_str(), port.c_str(), &hints, &res);
  DCR_RETURN_ERROR_IF(gai != 0 || !res, unavailable,
                      who + ": cannot resolve host " + peer.host + ": " + ::gai_strerror(gai));
  std::memcpy(&out, res->ai_addr, sizeof out);
  ::freeaddrinfo(res);
  return status::success();
}

/// Whether `peer` names only this host's loopback (127.0.0.0/8, "localhost"):
/// the one place an unkeyed listener is acceptable.
inline bool is_loopback(const peer_address& peer) {
  sockaddr_in a{};
  if (!resolve_ipv4(peer, "", a)) return false;
  return (ntohl(a.sin_addr.s_addr) >> 24) == 127;
}

} // namespace dcr::net
