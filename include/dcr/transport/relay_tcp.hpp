#pragma once
/// \file
/// TCP links for the relay tree, over plain POSIX sockets. Every node listens
/// on its own port (bound with port 0, so the OS picks a free one; `ports()`
/// reports them); a parent dials its children and owners dial the root.
/// Sockets are non-blocking and every wait is a `poll` with a timeout, so a
/// stalled peer is a typed `errc::unavailable`, never a hang; a full socket
/// buffer blocks the writer, which is the tree's backpressure.
///
/// Why POSIX and not Asio: the tree runs one thread per link with
/// synchronous, deadline-bounded reads and writes, and wakes a blocked reader
/// by `shutdown(2)`. Asio's reactor would never run here (it was used only as
/// a socket wrapper), while its headers cost about 70k preprocessed lines in
/// every translation unit that builds a TCP tree. With POSIX calls the header
/// stays light and free of Boost, and `send` carries `MSG_NOSIGNAL`, so a
/// peer that vanished is an error, never a SIGPIPE.

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dcr/core/error.hpp"
#include "dcr/transport/relay_frame.hpp"
#include "dcr/transport/relay_tree.hpp"

namespace dcr::transport {

namespace detail {
inline std::string errno_text(int e) { return std::strerror(e); }

/// Wait until `fd` is ready for `events` or `deadline` passes, in slices of
/// at most 200 ms so that a closed flag is seen promptly. False: timed out.
inline bool poll_until(int fd, short events, std::chrono::steady_clock::time_point deadline) {
  const auto now = std::chrono::steady_clock::now();
  if (now >= deadline) return false;
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count();
  pollfd pf{fd, events, 0};
  (void)::poll(&pf, 1, static_cast<int>(std::min<long long>(left + 1, 200)));
  return true;
}
} // namespace detail

/// One TCP connection carrying relay frames. Owns the descriptor.
class tcp_frame_conn final : public frame_conn {
public:
  /// `fd`: a connected, non-blocking stream socket. `body_timeout`: how long
  /// a peer that started a frame may take to finish it.
  tcp_frame_conn(int fd, std::uint64_t max_body, std::chrono::milliseconds body_timeout)
      : fd_(fd), max_(max_body), body_timeout_(body_timeout) {
    const int one = 1;
    (void)::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  tcp_frame_conn(const tcp_frame_conn&) = delete;
  tcp_frame_conn& operator=(const tcp_frame_conn&) = delete;
  ~tcp_frame_conn() override { ::close(fd_); }

  status write(const frame_header& h, std::span<const std::byte> body,
               std::chrono::milliseconds timeout) override {
    std::lock_guard l(wm_);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    const auto hdr = encode_frame_header(h);
    DCR_TRY(io(const_cast<std::byte*>(hdr.data()), hdr.size(), true, deadline));
    return io(const_cast<std::byte*>(body.data()), body.size(), true, deadline);
  }
  status read(frame& out) override {
    std::array<std::byte, frame_header_size> hdr;
    DCR_TRY(io(hdr.data(), hdr.size(), false, std::chrono::steady_clock::time_point::max()));
    frame_header h;
    DCR_TRY(decode_frame_header(hdr, max_, h)); // before the body is allocated
    out.header = h;
    out.body.resize(h.length);
    const auto started = std::chrono::steady_clock::now();
    // A peer that started a frame finishes it promptly or is dropped.
    DCR_TRY(io(out.body.data(), out.body.size(), false, started + body_timeout_));
    if (observer_) observer_(h, std::chrono::steady_clock::now() - started);
    return status::success();
  }
  /// Called after each frame read in full with the time its body took to
  /// arrive after its header: the frame's own transfer, not the wait for it
  /// (a timeline of a node's reads). Set before the connection is read.
  using read_observer =
      std::function<void(const frame_header&, std::chrono::steady_clock::duration)>;
  void observe_reads(read_observer f) { observer_ = std::move(f); }
  /// `shutdown(2)` is safe while other threads poll the socket and wakes them;
  /// the descriptor itself is closed only by the destructor.
  void close() override {
    closed_ = true;
    ::shutdown(fd_, SHUT_RDWR);
  }

private:
  status io(std::byte* p, std::size_t n, bool out, std::chrono::steady_clock::time_point deadline) {
    while (n > 0) {
      DCR_RETURN_ERROR_IF(closed_.load(), unavailable, "relay link closed");
      const ssize_t k = out ? ::send(fd_, p, n, MSG_NOSIGNAL) : ::recv(fd_, p, n, 0);
      if (k > 0) {
        p += k;
        n -= static_cast<std::size_t>(k);
        continue;
      }
      DCR_RETURN_ERROR_IF(k == 0 && !out, unavailable,
                          "relay link: receive: connection closed by the peer");
      const int e = errno;
      if (k < 0 && e != EAGAIN && e != EWOULDBLOCK && e != EINTR)
        return fail(errc::unavailable, std::string("relay link: ") +
                                           (out ? "send: " : "receive: ") + detail::errno_text(e));
      DCR_RETURN_ERROR_IF(
          !detail::poll_until(fd_, static_cast<short>(out ? POLLOUT : POLLIN), deadline),
          unavailable,
          std::string("relay link: peer ") + (out ? "took no bytes" : "sent no bytes") +
              " in time");
    }
    return status::success();
  }

  int fd_;
  std::uint64_t max_;
  std::chrono::milliseconds body_timeout_;
  read_observer observer_;
  std::mutex wm_;
  std::atomic<bool> closed_{false};
};

/// Limits of TCP relay links.
struct tcp_link_options {
  std::uint64_t max_body = default_max_frame_body; ///< largest frame body accepted
  std::chrono::milliseconds connect_timeout{5000}; ///< per dial
  std::chrono::milliseconds body_timeout{30000};   ///< to finish a started frame
};

/// Relay links over TCP on 127.0.0.1 (loopback; one acceptor thread per node).
class tcp_network final : public relay_network {
public:
  explicit tcp_network(tcp_link_options opt = {}) : opt_(opt) {}
  explicit tcp_network(std::uint64_t max_body) { opt_.max_body = max_body; }
  tcp_network(const tcp_network&) = delete;
  tcp_network& operator=(const tcp_network&) = delete;
  ~tcp_network() override { shutdown(); }

  status listen(std::uint32_t nodes, acceptor accept) override {
    accept_ = std::move(accept);
    for (std::uint32_t i = 0; i < nodes; ++i) {
      const std::string who = "relay node " + std::to_string(i) + ": listen: ";
      const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      DCR_RETURN_ERROR_IF(fd < 0, io, who + detail::errno_text(errno));
      listeners_.push_back(fd);
      const int one = 1;
      (void)::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      sockaddr_in a = loopback(0);
      socklen_t len = sizeof a;
      DCR_RETURN_ERROR_IF(::bind(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0, io,
                          who + detail::errno_text(errno));
      DCR_RETURN_ERROR_IF(::listen(fd, 64) != 0, io, who + detail::errno_text(errno));
      DCR_RETURN_ERROR_IF(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0, io,
                          who + detail::errno_text(errno));
      ports_.push_back(ntohs(a.sin_port));
    }
    for (std::uint32_t i = 0; i < nodes; ++i) threads_.emplace_back([this, i] { accept_loop(i); });
    return status::success();
  }

  status dial(std::uint32_t node, std::shared_ptr<frame_conn>& out) override {
    const std::string who = "relay node " + std::to_string(node);
    DCR_RETURN_ERROR_IF(node >= ports_.size() || stop_, unavailable, who + " unreachable");
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    DCR_RETURN_ERROR_IF(fd < 0, unavailable, who + ": socket: " + detail::errno_text(errno));
    auto conn =
        std::make_shared<tcp_frame_conn>(fd, opt_.max_body, opt_.body_timeout); // owns fd from here
    const sockaddr_in a = loopback(ports_[node]);
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) {
      DCR_RETURN_ERROR_IF(errno != EINPROGRESS, unavailable,
                          who + ": connect: " + detail::errno_text(errno));
      // A non-blocking connect completes when the socket turns writable;
      // SO_ERROR then tells whether it succeeded.
      const auto deadline = std::chrono::steady_clock::now() + opt_.connect_timeout;
      for (;;) {
        pollfd pf{fd, POLLOUT, 0};
        if (::poll(&pf, 1, 0) > 0) break;
        DCR_RETURN_ERROR_IF(stop_ || !detail::poll_until(fd, POLLOUT, deadline), unavailable,
                            who + ": connect timed out after " +
                                std::to_string(opt_.connect_timeout.count()) + " ms");
      }
      int err = 0;
      socklen_t len = sizeof err;
      (void)::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      DCR_RETURN_ERROR_IF(err != 0, unavailable, who + ": connect: " + detail::errno_text(err));
    }
    out = std::move(conn);
    return status::success();
  }

  void shutdown() override {
    if (stop_.exchange(true)) return;
    for (auto& t : threads_) t.join();
    threads_.clear();
    for (int fd : listeners_) ::close(fd);
    listeners_.clear();
  }

  /// Bound port of each node.
  const std::vector<unsigned short>& ports() const noexcept { return ports_; }

private:
  static sockaddr_in loopback(unsigned short port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return a;
  }

  void accept_loop(std::uint32_t i) {
    const int lfd = listeners_[i];
    while (!stop_) {
      pollfd pf{lfd, POLLIN, 0};
      if (::poll(&pf, 1, 50) <= 0) continue;
      const int fd = ::accept4(lfd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) continue; // the peer gave up, or a transient error: keep listening
      accept_(i, std::make_shared<tcp_frame_conn>(fd, opt_.max_body, opt_.body_timeout));
    }
  }

  tcp_link_options opt_;
  acceptor accept_;
  std::vector<int> listeners_;
  std::vector<unsigned short> ports_;
  std::vector<std::thread> threads_;
  std::atomic<bool> stop_{false};
};

/// A relay tree whose links are TCP connections on loopback.
inline std::unique_ptr<relay_tree> make_tcp_relay_tree(relay_options opt) {
  auto net = std::make_unique<tcp_network>(opt.max_frame_body);
  return std::make_unique<relay_tree>(std::move(opt), std::move(net));
}

} // namespace dcr::transport
