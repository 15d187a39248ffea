#pragma once
/// \file
/// TCP links for the relay tree (Boost.Asio). Every node listens on its own
/// port (bound with port 0, so the OS picks a free one; `ports()` reports
/// them); a parent dials its children and owners dial the root. Sockets are
/// non-blocking and every wait is a `poll` with a timeout, so a stalled peer
/// is a typed `errc::unavailable`, never a hang; a full socket buffer blocks
/// the writer, which is the tree's backpressure. Only this header includes
/// Asio, so one translation unit per program pays for it.

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include "dcr/core/error.hpp"
#include "dcr/transport/relay_frame.hpp"
#include "dcr/transport/relay_tree.hpp"

namespace dcr::transport {

/// One TCP connection carrying relay frames.
class tcp_frame_conn final : public frame_conn {
public:
  tcp_frame_conn(boost::asio::ip::tcp::socket s, std::uint64_t max_body) : s_(std::move(s)), max_(max_body) {
    boost::system::error_code ec;
    s_.non_blocking(true, ec);
    s_.set_option(boost::asio::ip::tcp::no_delay(true), ec);
    fd_ = s_.native_handle();
  }
  ~tcp_frame_conn() override {
    boost::system::error_code ec;
    s_.close(ec);
  }

  status write(const frame_header& h, std::span<const std::byte> body, std::chrono::milliseconds timeout) override {
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
    // A peer that started a frame finishes it promptly or is dropped.
    return io(out.body.data(), out.body.size(), false, std::chrono::steady_clock::now() + std::chrono::seconds(30));
  }
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
      boost::system::error_code ec;
      const std::size_t k = out ? s_.write_some(boost::asio::buffer(p, n), ec)
                                : s_.read_some(boost::asio::buffer(p, n), ec);
      if (!ec) {
        p += k;
        n -= k;
        continue;
      }
      if (ec != boost::asio::error::would_block && ec != boost::asio::error::try_again &&
          ec != boost::asio::error::interrupted)
        return fail(errc::unavailable, std::string("relay link: ") + (out ? "send: " : "receive: ") + ec.message());
      const auto now = std::chrono::steady_clock::now();
      DCR_RETURN_ERROR_IF(now >= deadline, unavailable,
                          std::string("relay link: peer ") + (out ? "took no bytes" : "sent no bytes") + " in time");
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count();
      pollfd pf{fd_, static_cast<short>(out ? POLLOUT : POLLIN), 0};
      (void)::poll(&pf, 1, static_cast<int>(std::min<long long>(left + 1, 200)));
    }
    return status::success();
  }

  boost::asio::ip::tcp::socket s_;
  int fd_ = -1;
  std::uint64_t max_;
  std::mutex wm_;
  std::atomic<bool> closed_{false};
};

/// Relay links over TCP on 127.0.0.1 (loopback; one acceptor thread per node).
class tcp_network final : public relay_network {
public:
  explicit tcp_network(std::uint64_t max_body = default_max_frame_body) : max_(max_body) {}
  ~tcp_network() override { shutdown(); }

  status listen(std::uint32_t nodes, acceptor accept) override {
    namespace ip = boost::asio::ip;
    accept_ = std::move(accept);
    for (std::uint32_t i = 0; i < nodes; ++i) {
      boost::system::error_code ec;
      auto a = std::make_unique<ip::tcp::acceptor>(io_);
      const ip::tcp::endpoint ep(ip::address_v4::loopback(), 0);
      a->open(ep.protocol(), ec);
      if (!ec) a->set_option(ip::tcp::acceptor::reuse_address(true), ec);
      if (!ec) a->bind(ep, ec);
      if (!ec) a->listen(64, ec);
      if (!ec) a->non_blocking(true, ec);
      DCR_RETURN_ERROR_IF(ec, io, "relay node " + std::to_string(i) + ": listen: " + ec.message());
      ports_.push_back(a->local_endpoint().port());
      acceptors_.push_back(std::move(a));
    }
    for (std::uint32_t i = 0; i < nodes; ++i) threads_.emplace_back([this, i] { accept_loop(i); });
    return status::success();
  }

  status dial(std::uint32_t node, std::shared_ptr<frame_conn>& out) override {
    namespace ip = boost::asio::ip;
    DCR_RETURN_ERROR_IF(node >= ports_.size() || stop_, unavailable, "relay node " + std::to_string(node) + " unreachable");
    ip::tcp::socket s(io_);
    boost::system::error_code ec;
    s.connect(ip::tcp::endpoint(ip::address_v4::loopback(), ports_[node]), ec);
    DCR_RETURN_ERROR_IF(ec, unavailable, "relay node " + std::to_string(node) + ": connect: " + ec.message());
    out = std::make_shared<tcp_frame_conn>(std::move(s), max_);
    return status::success();
  }

  void shutdown() override {
    if (stop_.exchange(true)) return;
    for (auto& t : threads_) t.join();
    threads_.clear();
    boost::system::error_code ec;
    for (auto& a : acceptors_) a->close(ec);
  }

  /// Bound port of each node.
  const std::vector<unsigned short>& ports() const noexcept { return ports_; }

private:
  void accept_loop(std::uint32_t i) {
    auto& a = *acceptors_[i];
    while (!stop_) {
      pollfd pf{a.native_handle(), POLLIN, 0};
      if (::poll(&pf, 1, 50) <= 0) continue;
      boost::system::error_code ec;
      boost::asio::ip::tcp::socket s(io_);
      a.accept(s, ec);
      if (ec) continue;
      accept_(i, std::make_shared<tcp_frame_conn>(std::move(s), max_));
    }
  }

  boost::asio::io_context io_; // owns no running loop: every operation is synchronous
  std::uint64_t max_;
  acceptor accept_;
  std::vector<std::unique_ptr<boost::asio::ip::tcp::acceptor>> acceptors_;
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
