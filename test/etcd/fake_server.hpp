#pragma once
// A scripted HTTP peer for the client tests: a loopback listener whose
// handler serves each accepted connection in turn and may misbehave.
#include <doctest/doctest.h>

#include <atomic>
#include <functional>
#include <string>
#include <string_view>
#include <thread>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dcr/net/http_client.hpp"

namespace dcr::test_net {

using net::http_endpoint;

/// A one-connection-at-a-time TCP peer on a loopback port; `handle` serves
/// one accepted connection (its index counts connections) and closes it.
class fake_server {
public:
  using handler = std::function<void(int fd, int connection)>;
  explicit fake_server(handler h) : handle_(std::move(h)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(fd_, 8) == 0);
    REQUIRE(::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] {
      for (int n = 0; !stop_;) {
        pollfd p{fd_, POLLIN, 0};
        if (::poll(&p, 1, 20) <= 0) continue;
        const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (c < 0) continue;
        connections = ++n;
        handle_(c, n);
        ::close(c);
      }
    });
  }
  ~fake_server() {
    stop_ = true;
    thread_.join();
    ::close(fd_);
  }
  http_endpoint endpoint() const { return {"127.0.0.1", port_}; }
  bool stopping() const { return stop_; }

  /// Read one request (head and Content-Length body); empty at EOF.
  static std::string read_request(int fd) {
    std::string s;
    char buf[4096];
    for (;;) {
      const auto head = s.find("\r\n\r\n");
      if (head != std::string::npos) {
        std::size_t len = 0;
        const auto cl = s.find("Content-Length: ");
        if (cl != std::string::npos && cl < head) len = std::stoul(s.substr(cl + 16));
        if (s.size() >= head + 4 + len) return s;
      }
      const auto n = ::read(fd, buf, sizeof buf);
      if (n <= 0) return {};
      s.append(buf, static_cast<std::size_t>(n));
    }
  }
  /// Until the client closes: a write to a closed connection fails instead
  /// of raising SIGPIPE (a client may close as soon as it has refused).
  static void write_all(int fd, std::string_view s) {
    while (!s.empty()) {
      const auto n = ::send(fd, s.data(), s.size(), MSG_NOSIGNAL);
      if (n <= 0) return;
      s.remove_prefix(static_cast<std::size_t>(n));
    }
  }
  static std::string ok(std::string_view body, std::string_view extra = "") {
    return "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(body.size()) + "\r\n" +
           std::string(extra) + "\r\n" + std::string(body);
  }

  std::atomic<int> connections{0};

private:
  handler handle_;
  int fd_ = -1;
  std::uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

} // namespace dcr::test_net
