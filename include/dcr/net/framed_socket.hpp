#pragma once
/// \file
/// The socket and frame-header layer under dcr's two TCP protocols, the
/// control channel (protocol/control_channel.hpp) and the relay links
/// (transport/relay_tcp.hpp): a connected non-blocking stream socket that
/// moves whole buffers under deadlines, a dial with a connect timeout, and
/// with net/frame_preamble.hpp, the checks every frame header of both starts
/// with (magic, version, the type word, the body cap). Each protocol keeps
/// its own header fields, trailer and keyed tag; what they share is written
/// once here.
///
/// Why POSIX and not Asio: both protocols run one thread per connection with
/// synchronous, deadline-bounded reads and writes, and wake a blocked reader
/// by `shutdown(2)`. Every wait is a `poll` with a timeout, so a stalled peer
/// is a typed `errc::unavailable`, never a hang; `send` carries
/// `MSG_NOSIGNAL`, so a peer that vanished is an error, never a SIGPIPE.

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dcr/core/error.hpp"

namespace dcr::net {

using steady_deadline = std::chrono::steady_clock::time_point;

/// Wait until `fd` is ready for `events` or `deadline` passes, in slices of
/// at most `slice_ms` so that a closed flag is seen promptly. False: the
/// deadline had already passed.
inline bool poll_until(int fd, short events, steady_deadline deadline, long long slice_ms) {
  const auto now = std::chrono::steady_clock::now();
  if (now >= deadline) return false;
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count();
  pollfd pf{fd, events, 0};
  (void)::poll(&pf, 1, static_cast<int>(std::min<long long>(left + 1, slice_ms)));
  return true;
}

/// One connected, non-blocking TCP stream socket. Owns the descriptor.
/// `label` starts every error message ("control channel", "relay link").
class stream_socket {
public:
  stream_socket(int fd, const char* label, long long poll_slice_ms)
      : fd_(fd), label_(label), slice_ms_(poll_slice_ms) {
    const int one = 1;
    (void)::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  stream_socket(const stream_socket&) = delete;
  stream_socket& operator=(const stream_socket&) = delete;
  ~stream_socket() { ::close(fd_); }

  /// The descriptor, to poll beside others (reads and writes go through this object).
  int fd() const noexcept { return fd_; }

  /// Send all `n` bytes by `deadline`.
  status send_all(const std::byte* p, std::size_t n, steady_deadline deadline) {
    return io(const_cast<std::byte*>(p), n, true, deadline);
  }
  /// Receive exactly `n` bytes by `deadline`.
  status receive_all(std::byte* p, std::size_t n, steady_deadline deadline) {
    return io(p, n, false, deadline);
  }
  /// Whether the last `send_all` / `receive_all` failed at its deadline.
  bool timed_out() const noexcept { return timed_out_; }

  /// `shutdown(2)`: safe while other threads poll the socket, and wakes
  /// them; the descriptor itself is closed only by the destructor.
  void shutdown() noexcept {
    closed_ = true;
    ::shutdown(fd_, SHUT_RDWR);
  }

private:
  status io(std::byte* p, std::size_t n, bool out, steady_deadline deadline) {
    timed_out_ = false;
    while (n > 0) {
      DCR_RETURN_ERROR_IF(closed_.load(), unavailable, std::string(label_) + " closed");
      const ssize_t k = out ? ::send(fd_, p, n, MSG_NOSIGNAL) : ::recv(fd_, p, n, 0);
      if (k > 0) {
        p += k;
        n -= static_cast<std::size_t>(k);
        continue;
      }
      DCR_RETURN_ERROR_IF(k == 0 && !out, unavailable,
                          std::string(label_) + ": receive: connection closed by the peer");
      const int e = errno;
      if (k < 0 && e != EAGAIN && e != EWOULDBLOCK && e != EINTR)
        return fail(errc::unavailable,
                    std::string(label_) + ": " + (out ? "send: " : "receive: ") + std::strerror(e));
      if (!poll_until(fd_, static_cast<short>(out ? POLLOUT : POLLIN), deadline, slice_ms_)) {
        timed_out_ = true;
        return fail(errc::unavailable, std::string(label_) + ": peer " +
                                           (out ? "took no bytes" : "sent no bytes") + " in time");
      }
    }
    return status::success();
  }

  int fd_;
  const char* label_;
  long long slice_ms_;
  std::atomic<bool> closed_{false};
  bool timed_out_ = false;
};

/// Finish a non-blocking `connect` of `fd` to `a` within `timeout` (`stop`,
/// optional, abandons the wait). `who` starts the error messages. The caller
/// owns `fd` whatever happens.
inline status connect_within(int fd, const sockaddr_in& a, std::chrono::milliseconds timeout,
                             const std::string& who, const std::atomic<bool>* stop = nullptr) {
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0) return status::success();
  DCR_RETURN_ERROR_IF(errno != EINPROGRESS, unavailable,
                      who + ": connect: " + std::strerror(errno));
  // A non-blocking connect completes when the socket turns writable;
  // SO_ERROR then tells whether it succeeded.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    pollfd pf{fd, POLLOUT, 0};
    if (::poll(&pf, 1, 0) > 0) break;
    DCR_RETURN_ERROR_IF(
        (stop && stop->load()) || !poll_until(fd, POLLOUT, deadline, 200), unavailable,
        who + ": connect timed out after " + std::to_string(timeout.count()) + " ms");
  }
  int err = 0;
  socklen_t len = sizeof err;
  (void)::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
  DCR_RETURN_ERROR_IF(err != 0, unavailable, who + ": connect: " + std::strerror(err));
  return status::success();
}

/// Listen on `a` (port 0: the OS picks one) with a non-blocking socket;
/// `fd` receives the descriptor as soon as it exists (the caller closes it,
/// also on failure) and `port` the bound port. `who` starts the messages
/// (`errc::io`).
inline status listen_tcp(sockaddr_in a, const std::string& who, int& fd, unsigned short& port) {
  fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  DCR_RETURN_ERROR_IF(fd < 0, io, who + std::strerror(errno));
  const int one = 1;
  (void)::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  DCR_RETURN_ERROR_IF(::bind(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0, io,
                      who + "bind: " + std::strerror(errno));
  DCR_RETURN_ERROR_IF(::listen(fd, 64) != 0, io, who + "listen: " + std::strerror(errno));
  socklen_t len = sizeof a;
  DCR_RETURN_ERROR_IF(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0, io,
                      who + std::strerror(errno));
  port = ntohs(a.sin_port);
  return status::success();
}

} // namespace dcr::net
