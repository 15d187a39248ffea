#pragma once
// A loopback HTTP/1.1 peer for the S3 store's unit tests: it records each
// request and answers with whatever the test's handler returns (raw bytes),
// or drops the connection unanswered when the handler returns "", which is
// how a reset looks to the client.
#include <atomic>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

namespace dcr::test_s3 {

struct recorded_request {
  std::string method, target, body;
  std::vector<std::pair<std::string, std::string>> headers; // names lower-cased, in order
  std::string header(const std::string& n) const {
    for (auto& [k, v] : headers)
      if (k == n) return v;
    return {};
  }
};

inline std::string http_response(unsigned status, std::string_view reason, std::string_view body,
                                 std::string_view extra_headers = "") {
  return "HTTP/1.1 " + std::to_string(status) + " " + std::string(reason) +
         "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n" +
         std::string(extra_headers) + "\r\n" + std::string(body);
}

class fake_http_server {
public:
  using handler_t = std::function<std::string(const recorded_request&)>;
  explicit fake_http_server(handler_t h) : handler_(std::move(h)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd_, 16) != 0)
      throw std::runtime_error("fake server: bind/listen failed");
    socklen_t len = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~fake_http_server() {
    stop_ = true;
    thread_.join();
    ::close(fd_);
  }
  std::uint16_t port() const { return port_; }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::vector<recorded_request> requests() {
    std::lock_guard g(m_);
    return requests_;
  }

private:
  void serve() {
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      connection(c);
      ::close(c);
    }
  }
  // One connection, requests in sequence until EOF, a drop, or stop.
  void connection(int c) {
    std::string buf;
    for (;;) {
      std::size_t head_end;
      while ((head_end = buf.find("\r\n\r\n")) == std::string::npos)
        if (!read_more(c, buf)) return;
      recorded_request rq;
      std::string head = buf.substr(0, head_end);
      buf.erase(0, head_end + 4);
      auto line_end = head.find("\r\n");
      std::string line = head.substr(0, line_end);
      auto sp1 = line.find(' '), sp2 = line.rfind(' ');
      rq.method = line.substr(0, sp1);
      rq.target = line.substr(sp1 + 1, sp2 - sp1 - 1);
      std::size_t pos = line_end == std::string::npos ? head.size() : line_end + 2;
      std::size_t length = 0;
      while (pos < head.size()) {
        auto e = head.find("\r\n", pos);
        if (e == std::string::npos) e = head.size();
        auto h = head.substr(pos, e - pos);
        auto colon = h.find(':');
        std::string name = h.substr(0, colon);
        for (auto& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
        std::string value = h.substr(colon + 1);
        while (!value.empty() && value.front() == ' ') value.erase(0, 1);
        if (name == "content-length") length = std::stoul(value);
        rq.headers.emplace_back(name, value);
        pos = e + 2;
      }
      while (buf.size() < length)
        if (!read_more(c, buf)) return;
      rq.body = buf.substr(0, length);
      buf.erase(0, length);
      std::string answer = handler_(rq);
      {
        std::lock_guard g(m_);
        requests_.push_back(rq);
      }
      if (answer.empty()) return; // drop unanswered
      std::size_t done = 0;
      while (done < answer.size()) {
        auto n = ::send(c, answer.data() + done, answer.size() - done, MSG_NOSIGNAL);
        if (n <= 0) return;
        done += static_cast<std::size_t>(n);
      }
    }
  }
  bool read_more(int c, std::string& buf) {
    while (!stop_) {
      pollfd p{c, POLLIN, 0};
      int r = ::poll(&p, 1, 20);
      if (r == 0) continue;
      if (r < 0) return false;
      char tmp[65536];
      auto n = ::recv(c, tmp, sizeof tmp, 0);
      if (n <= 0) return false;
      buf.append(tmp, static_cast<std::size_t>(n));
      return true;
    }
    return false;
  }

  handler_t handler_;
  int fd_ = -1;
  std::uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::mutex m_;
  std::vector<recorded_request> requests_;
  std::thread thread_;
};

} // namespace dcr::test_s3
