#pragma once
// A real etcd server for the interop tests: /usr/bin/etcd on free loopback
// ports with a temporary data directory, serving clients over plain HTTP or,
// given certificates, HTTPS (optionally requiring client certificates). The
// child gets PR_SET_PDEATHSIG (SIGKILL), so it dies with the test process
// even when the test crashes; the destructor stops it and removes the data
// directory.
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dcr/net/http_client.hpp"

namespace dcr::test_etcd {

inline constexpr const char* etcd_binary = "/usr/bin/etcd";

/// A loopback TCP port that was free a moment ago (the kernel's pick).
inline std::uint16_t free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error("socket failed");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(fd);
    throw std::runtime_error("bind to a free port failed");
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

/// Client-side TLS of a test server: its certificate and key, and (when
/// `client_ca_file` is set) the CA its clients' certificates must chain to.
/// `health` is how the server's own start-up check connects.
struct etcd_tls {
  std::string cert_file, key_file;
  std::string client_ca_file; ///< non-empty: --client-cert-auth
  net::tls_options health;
};

class etcd_server {
public:
  /// Plain HTTP, or HTTPS with `tls` (the health check then needs a client
  /// built with TLS).
  explicit etcd_server(std::optional<etcd_tls> tls = std::nullopt) : tls_(std::move(tls)) {
    char tmpl[] = "/tmp/dcr-etcd-XXXXXX";
    if (!::mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
    dir_ = tmpl;
    client_port_ = free_port();
    peer_port_ = free_port();
    start();
  }
  ~etcd_server() {
    kill(SIGTERM);
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  etcd_server(const etcd_server&) = delete;
  etcd_server& operator=(const etcd_server&) = delete;

  std::string url() const {
    return std::string(tls_ ? "https" : "http") + "://127.0.0.1:" + std::to_string(client_port_);
  }
  std::uint16_t client_port() const { return client_port_; }
  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0; }

  /// Start (again, on the same ports and data) and wait until /health says true.
  void start() {
    if (pid_ > 0) throw std::runtime_error("etcd already running");
    const std::string peer = "http://127.0.0.1:" + std::to_string(peer_port_);
    std::vector<std::string> args = {etcd_binary,
                                     "--name",
                                     "dcr-test",
                                     "--data-dir",
                                     (dir_ / "data").string(),
                                     "--listen-client-urls",
                                     url(),
                                     "--advertise-client-urls",
                                     url(),
                                     "--listen-peer-urls",
                                     peer,
                                     "--initial-advertise-peer-urls",
                                     peer,
                                     "--initial-cluster",
                                     "dcr-test=" + peer,
                                     "--initial-cluster-state",
                                     "new"};
    if (tls_) {
      args.insert(args.end(), {"--cert-file", tls_->cert_file, "--key-file", tls_->key_file});
      if (!tls_->client_ca_file.empty())
        args.insert(args.end(), {"--client-cert-auth", "--trusted-ca-file", tls_->client_ca_file});
    }
    const std::string log = (dir_ / "etcd.log").string();
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(126); // the parent died before prctl
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(etcd_binary, argv.data());
      ::_exit(127);
    }
    pid_ = pid;
    wait_healthy();
  }

  /// Send `sig` and, for a terminating signal, reap the process.
  void kill(int sig = SIGKILL) {
    if (pid_ <= 0) return;
    ::kill(pid_, sig);
    if (sig == SIGSTOP || sig == SIGCONT) return;
    int st = 0;
    for (int i = 0; i < 100; ++i) { // 10 s for a clean stop, then SIGKILL
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &st, 0);
    pid_ = -1;
  }

  std::string log_tail() const {
    std::ifstream in(dir_ / "etcd.log");
    std::stringstream s;
    s << in.rdbuf();
    auto t = s.str();
    return t.size() > 2000 ? t.substr(t.size() - 2000) : t;
  }

private:
  void wait_healthy() {
    net::http_options o;
    o.connect_timeout = std::chrono::milliseconds(500);
    o.request_timeout = std::chrono::milliseconds(2000);
    if (tls_) o.tls = tls_->health;
    net::http_client c(net::http_endpoint{"127.0.0.1", client_port_, tls_.has_value()}, o);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < deadline) {
      int st = 0;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        throw std::runtime_error("etcd exited during start-up; log:\n" + log_tail());
      }
      net::http_request rq;
      rq.target = "/health";
      rq.idempotent = true;
      net::http_response res;
      if (c.request(rq, res).ok() && res.status == 200 &&
          res.body.find("\"true\"") != std::string::npos)
        return;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    kill(SIGKILL);
    throw std::runtime_error("etcd not healthy within 30 s; log:\n" + log_tail());
  }

  std::optional<etcd_tls> tls_;
  std::filesystem::path dir_;
  std::uint16_t client_port_ = 0, peer_port_ = 0;
  pid_t pid_ = -1;
};

} // namespace dcr::test_etcd
