#pragma once
/// \file
/// The control channel: checked frames (control_frame.hpp) over TCP, one
/// call at a time per connection. A coordinator-side `control_client` sends a
/// call and waits for its reply; a role-side `control_server` runs each call
/// on a worker thread and, while it runs, sends a heartbeat every
/// `heartbeat` and listens for a `stop` frame.
///
/// Deadlines (why a call never hangs): a peer whose process is gone refuses
/// or resets the connection, which fails the call at once; a host that does
/// not answer fails the dial after `connect_timeout`; a peer that stops
/// sending (frozen, partitioned) fails the call after `liveness` without a
/// frame. Every failure is `errc::unavailable` and drops the connection; the
/// next call dials again, so a restarted peer on the same port is reached.
/// A coordinator that goes away closes its connections, which stops the
/// calls it had running (`stop` set), so a dead coordinator's attempt ends
/// at every role.
///
/// POSIX sockets through net/framed_socket.hpp, the layer the relay links
/// (transport/relay_tcp.hpp) use too: non-blocking, every wait a bounded
/// `poll`, `MSG_NOSIGNAL`; one thread per call, synchronous deadline-bounded
/// I/O, no Boost in the header.
///
/// Wake-ups come from the events themselves, not from the end of a polling
/// slice: the server polls the connection together with an eventfd its
/// worker signals when the handler returns (the reply leaves at once) and
/// one that `shutdown` signals; heartbeats are due at a poll timeout. The
/// client's wait for a reply wakes on the reply's bytes; it re-checks the
/// caller's `stop` flag (a plain `std::atomic<bool>` the coordinator's
/// threads set, which offers nothing to wait on) every 100 ms, which delays
/// only the `stop` frame of an attempt that already failed.

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dcr/core/error.hpp"
#include "dcr/net/admission.hpp"
#include "dcr/net/framed_socket.hpp"
#include "dcr/net/peer_address.hpp"
#include "dcr/protocol/control_frame.hpp"

namespace dcr::protocol {

/// Timeouts and limits of the control channel (see file comment).
struct channel_options {
  std::chrono::milliseconds connect_timeout{3000};
  std::chrono::milliseconds liveness{3000};
  std::chrono::milliseconds heartbeat{200};
  std::chrono::milliseconds frame_timeout{10000}; ///< to finish a started frame
  std::uint64_t max_body = max_control_body;
  /// Job key (empty: no authentication, for the embedded demo and loopback
  /// only). Keyed, every connection starts with an exchange of nonces and
  /// every frame carries a keyed tag (control_frame.hpp); a server refuses a
  /// peer without the key, a client refuses a server without it
  /// (`errc::verification`).
  seal_key key{};
  /// Keyed: the largest frame body read before the key exchange is done
  /// (a hello carries 16 bytes, an error reply a message): what a peer
  /// without the key can make this end allocate.
  std::uint64_t max_unauthenticated_body = net::max_unauthenticated_bytes;
  /// Keyed server: a connection that has not finished the key exchange
  /// this long after it was accepted is dropped.
  std::chrono::milliseconds hello_timeout = net::default_hello_timeout;
  /// Server: connections served at once; one more is closed on accept.
  std::size_t max_connections = net::default_max_connections;
  /// Unkeyed server: a call whose attempt lies more than this past the
  /// newest attempt the server has taken is refused (`invalid_argument`)
  /// before its handler runs, so it fences nothing (net/admission.hpp).
  /// Keyed callers proved the job key and are not limited.
  std::uint64_t attempt_window = net::default_attempt_window;
};

/// 16 fresh random bytes: one side's nonce of a keyed connection.
inline control_nonce new_control_nonce() {
  std::random_device rd;
  control_nonce n{};
  for (auto& b : n) b = static_cast<std::uint8_t>(rd());
  return n;
}

/// The status a `reply_err` body carries (`bad_format` for a malformed body
/// or an unknown code); `who` prefixes its message.
inline status decode_error_reply(std::span<const std::byte> body, const std::string& who) {
  body_reader r(body);
  std::uint16_t code = 0;
  std::string msg;
  DCR_TRY(r.u16(code));
  DCR_TRY(r.str(msg));
  DCR_TRY(r.done());
  DCR_RETURN_ERROR_IF(code == 0 || code > static_cast<std::uint16_t>(errc::foreign_incarnation),
                      bad_format, who + ": reply with unknown error code " + std::to_string(code));
  return fail(static_cast<errc>(code), who + ": " + msg);
}

using net::parse_peer_address;
using net::peer_address;

namespace detail {
/// An eventfd one thread signals and another polls beside a socket. Owns the
/// descriptor; `fd()` is -1 when none could be made (descriptors exhausted),
/// and then the waits fall back to short polling slices.
class wake_fd {
public:
  wake_fd() noexcept : fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}
  wake_fd(const wake_fd&) = delete;
  wake_fd& operator=(const wake_fd&) = delete;
  ~wake_fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int fd() const noexcept { return fd_; }
  /// Make `fd()` readable until `drain` (any thread).
  void signal() noexcept {
    const std::uint64_t one = 1;
    if (fd_ >= 0) (void)!::write(fd_, &one, sizeof one);
  }
  void drain() noexcept {
    std::uint64_t v = 0;
    if (fd_ >= 0) (void)!::read(fd_, &v, sizeof v);
  }

private:
  int fd_;
};

/// Milliseconds until `t` for `poll`, rounded up (a timeout that ends early
/// would spin), at least 0 and at most `cap`.
inline int poll_ms_until(std::chrono::steady_clock::time_point t, int cap) {
  const auto left =
      std::chrono::ceil<std::chrono::milliseconds>(t - std::chrono::steady_clock::now());
  return static_cast<int>(std::clamp<long long>(left.count(), 0, cap));
}
} // namespace detail

/// One connected socket carrying control frames (net/framed_socket.hpp
/// moves the bytes). Owns the descriptor.
class control_socket {
public:
  control_socket(int fd, channel_options opt) : sock_(fd, "control channel", 100), opt_(opt) {}
  control_socket(const control_socket&) = delete;
  control_socket& operator=(const control_socket&) = delete;
  /// The descriptor, to poll beside others (reads and writes go through this object).
  int fd() const noexcept { return sock_.fd(); }

  /// From now on every frame each way carries the keyed tag of this
  /// connection (`client`: this end dialled).
  void authenticate(const seal_key& key, const control_nonce& client_nonce,
                    const control_nonce& server_nonce, bool client) {
    send_mac_ = {key, client_nonce, server_nonce, static_cast<std::uint8_t>(client ? 0 : 1), 0};
    recv_mac_ = {key, client_nonce, server_nonce, static_cast<std::uint8_t>(client ? 1 : 0), 0};
    keyed_ = true;
  }
  bool authenticated() const noexcept { return keyed_; }

  status send(control_type t, std::uint64_t attempt, std::span<const std::byte> body) {
    const auto f = encode_control_frame(t, attempt, body, keyed_ ? &send_mac_ : nullptr);
    if (keyed_) ++send_mac_.sequence;
    return sock_.send_all(f.data(), f.size(),
                          std::chrono::steady_clock::now() + opt_.frame_timeout);
  }

  /// Wait until `deadline` for a frame to start (`timed_out` set when none
  /// did), then read and check all of it.
  status receive(control_frame& out, std::chrono::steady_clock::time_point deadline,
                 bool& timed_out) {
    timed_out = false;
    std::array<std::byte, control_header_size> hdr;
    {
      // First byte: up to `deadline`; the rest of the frame: frame_timeout.
      auto s = sock_.receive_all(hdr.data(), 1, deadline);
      if (!s) {
        timed_out = sock_.timed_out();
        return s;
      }
    }
    const auto rest_deadline = std::chrono::steady_clock::now() + opt_.frame_timeout;
    DCR_TRY(sock_.receive_all(hdr.data() + 1, hdr.size() - 1, rest_deadline));
    control_header h;
    // Before the body is allocated; before the key exchange only as much as
    // a hello or an error reply needs.
    const auto limit = !opt_.key.empty() && !keyed_
                           ? std::min(opt_.max_body, opt_.max_unauthenticated_body)
                           : opt_.max_body;
    DCR_TRY(decode_control_header(hdr, limit, h));
    std::vector<std::byte> rest(h.length + control_trailer_size);
    DCR_TRY(sock_.receive_all(rest.data(), rest.size(), rest_deadline));
    DCR_TRY(check_control_digest(hdr, h, rest, keyed_ ? &recv_mac_ : nullptr));
    if (keyed_) ++recv_mac_.sequence;
    out.type = h.type;
    out.attempt = h.attempt;
    rest.resize(h.length);
    out.body = std::move(rest);
    return status::success();
  }
  /// Wakes blocked calls on this socket (any thread); closes on destruction.
  void shutdown() { sock_.shutdown(); }

private:
  net::stream_socket sock_;
  channel_options opt_;
  // Keyed connection state; one thread sends and receives at a time (the
  // client under its lock, the server on its connection's thread).
  bool keyed_ = false;
  control_mac send_mac_, recv_mac_;
};

/// Connect to `peer` within `opt.connect_timeout`.
inline status dial_control(const peer_address& peer, const channel_options& opt,
                           std::unique_ptr<control_socket>& out) {
  const std::string who = "control channel to " + peer.text();
  sockaddr_in a{};
  DCR_TRY(net::resolve_ipv4(peer, who, a));
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  DCR_RETURN_ERROR_IF(fd < 0, unavailable, who + ": socket: " + std::strerror(errno));
  auto sock = std::make_unique<control_socket>(fd, opt); // owns fd from here
  DCR_TRY(net::connect_within(fd, a, opt.connect_timeout, who));
  if (!opt.key.empty()) {
    // Nonces first (see control_frame.hpp). A server without the key
    // answers with a refusal it cannot tag, so anyone on the path could have
    // written it: its code is not believed (a forged `fenced` or `not_found`
    // must not steer the coordinator). It fails the dial as an
    // unauthenticated refusal, `errc::verification`, quoting what it said.
    const auto mine = new_control_nonce();
    DCR_TRY(sock->send(control_type::auth_hello, 0, std::as_bytes(std::span(mine))));
    control_frame f;
    bool timed_out = false;
    if (auto s = sock->receive(f, std::chrono::steady_clock::now() + opt.liveness, timed_out); !s)
      return fail(s.code == errc::unavailable ? errc::unavailable : s.code,
                  who + ": key exchange: " + s.message);
    if (f.type == control_type::reply_err) {
      const auto said = decode_error_reply(f.body, who);
      return fail(errc::verification,
                  who +
                      ": key exchange refused by an unauthenticated reply (not trusted; it said " +
                      std::string(to_string(said.code)) + ": " + said.message + ")");
    }
    DCR_RETURN_ERROR_IF(f.type != control_type::auth_hello || f.body.size() != control_nonce_size,
                        verification, who + ": the server did not answer the key exchange");
    control_nonce theirs{};
    std::memcpy(theirs.data(), f.body.data(), theirs.size());
    sock->authenticate(opt.key, mine, theirs, true);
  }
  out = std::move(sock);
  return status::success();
}

/// Coordinator side of one connection: one call at a time.
class control_client {
public:
  control_client(peer_address peer, channel_options opt = {}) : peer_(std::move(peer)), opt_(opt) {}
  const peer_address& peer() const noexcept { return peer_; }

  /// Send call `t` of attempt τ and wait for its reply. `stop` (optional)
  /// set while waiting sends a `stop` frame; the reply then says how the call
  /// ended. A `reply_err` is returned as the peer's status.
  status call(control_type t, std::uint64_t attempt, std::span<const std::byte> body,
              std::vector<std::byte>& result, const std::atomic<bool>* stop = nullptr) {
    std::lock_guard l(m_);
    auto s = call_locked(t, attempt, body, result, stop);
    // The next call dials again (after a failed tag the stream is not trusted).
    if (!s && (s.code == errc::unavailable || s.code == errc::verification)) sock_.reset();
    return s;
  }

  /// Drop the connection (the peer's running call, if any, is stopped).
  void disconnect() {
    std::lock_guard l(m_);
    sock_.reset();
  }

private:
  status call_locked(control_type t, std::uint64_t attempt, std::span<const std::byte> body,
                     std::vector<std::byte>& result, const std::atomic<bool>* stop) {
    const std::string who = "peer " + peer_.text();
    if (!sock_) DCR_TRY(dial_control(peer_, opt_, sock_));
    if (auto s = sock_->send(t, attempt, body); !s) {
      sock_.reset();
      return fail(errc::unavailable, who + ": " + s.message);
    }
    bool stop_sent = false;
    auto heard = std::chrono::steady_clock::now();
    for (;;) {
      if (stop && stop->load() && !stop_sent) {
        stop_sent = true;
        if (auto s = sock_->send(control_type::stop, attempt, {}); !s)
          return fail(errc::unavailable, who + ": " + s.message);
      }
      // Wake every 100 ms to notice `stop` (see file comment; a reply wakes
      // the wait at once); give up after `liveness` of silence.
      const auto slice = std::min(heard + opt_.liveness, std::chrono::steady_clock::now() +
                                                             std::chrono::milliseconds(100));
      control_frame f;
      bool timed_out = false;
      auto s = sock_->receive(f, slice, timed_out);
      if (!s && timed_out) {
        if (std::chrono::steady_clock::now() < heard + opt_.liveness) continue;
        return fail(errc::unavailable, who + " sent nothing for " +
                                           std::to_string(opt_.liveness.count()) + " ms (call " +
                                           std::to_string(static_cast<unsigned>(t)) + ")");
      }
      if (!s) {
        const auto code = s.code == errc::unavailable ? errc::unavailable : s.code;
        sock_.reset(); // a bad frame leaves the stream unusable
        return fail(code, who + ": " + s.message);
      }
      heard = std::chrono::steady_clock::now();
      if (f.type == control_type::heartbeat) continue;
      if (f.attempt != attempt) {
        sock_.reset();
        return fail(errc::bad_format, who + ": reply of attempt " + std::to_string(f.attempt) +
                                          " to a call of attempt " + std::to_string(attempt));
      }
      if (f.type == control_type::reply_ok) {
        result = std::move(f.body);
        return status::success();
      }
      if (f.type == control_type::reply_err) return decode_error_reply(f.body, who);
      sock_.reset();
      return fail(errc::bad_format, who + ": frame of type " +
                                        std::to_string(static_cast<unsigned>(f.type)) +
                                        " where a reply was due");
    }
  }

  peer_address peer_;
  channel_options opt_;
  std::mutex m_;
  std::unique_ptr<control_socket> sock_;
};

/// Role side: accepts connections and runs each call through `handler`
/// (see file comment). A call that throws `dcr::error` replies with its code.
class control_server {
public:
  /// `(call, stop, result)`: run the call; write its result into `result`.
  using handler =
      std::function<status(const control_frame&, const std::atomic<bool>&, body_writer&)>;

  control_server(handler h, channel_options opt = {})
      : h_(std::move(h)), opt_(opt), attempts_(opt.attempt_window) {}
  control_server(const control_server&) = delete;
  control_server& operator=(const control_server&) = delete;
  ~control_server() { shutdown(); }

  /// Listen on `host:port` (port 0: the OS picks one; `port()` tells).
  status listen(const std::string& host, unsigned short port) {
    const std::string who = "control server " + host + ":" + std::to_string(port) + ": ";
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    DCR_RETURN_ERROR_IF(::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1, invalid_argument,
                        who + "not an IPv4 address");
    DCR_TRY(net::listen_tcp(a, who, lfd_, port_));
    acceptor_ = std::thread([this] { accept_loop(); });
    return status::success();
  }
  unsigned short port() const noexcept { return port_; }

  /// Stop accepting; every running call sees `stop` and its reply (usually
  /// `aborted`) is sent; then every connection closes and its thread is joined.
  void shutdown() {
    if (stopping_.exchange(true)) return;
    stop_wake_.signal(); // the acceptor and every connection's wait see it at once
    if (acceptor_.joinable()) acceptor_.join();
    std::lock_guard l(m_);
    for (auto& c : conns_)
      if (c.thread.joinable()) c.thread.join();
    for (auto& c : conns_) c.sock->shutdown();
    conns_.clear();
    if (lfd_ >= 0) ::close(lfd_);
    lfd_ = -1;
  }

private:
  struct connection {
    std::shared_ptr<control_socket> sock;
    std::shared_ptr<std::atomic<bool>> ended;
    std::thread thread;
  };

  void accept_loop() {
    while (!stopping_) {
      pollfd pf[2] = {{lfd_, POLLIN, 0}, {stop_wake_.fd(), POLLIN, 0}};
      if (::poll(pf, 2, stop_wake_.fd() >= 0 ? 1000 : 50) <= 0 || pf[0].revents == 0) continue;
      const int fd = ::accept4(lfd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) continue;
      auto sock = std::make_shared<control_socket>(fd, opt_);
      auto ended = std::make_shared<std::atomic<bool>>(false);
      std::lock_guard l(m_);
      if (stopping_) break;
      // Join the threads of connections that ended (peers that went away).
      for (auto it = conns_.begin(); it != conns_.end();)
        if (it->ended->load()) {
          it->thread.join();
          it = conns_.erase(it);
        } else {
          ++it;
        }
      // Each connection is a thread: past the cap a new one is closed at
      // once (the socket's destructor), before anything of it is read.
      if (conns_.size() >= opt_.max_connections) continue;
      conns_.push_back({sock, ended, {}});
      conns_.back().thread = std::thread([this, sock, ended] {
        serve(*sock);
        sock->shutdown();
        *ended = true;
      });
    }
  }

  static std::vector<std::byte> error_body(const status& s) {
    body_writer w;
    w.u16(static_cast<std::uint16_t>(s.code)).str(s.message);
    return std::move(w.bytes());
  }

  void serve(control_socket& sock) {
    // Signalled by the worker when the handler returned; drained after each call.
    detail::wake_fd done_wake;
    const auto hello_by = std::chrono::steady_clock::now() + opt_.hello_timeout;
    const bool keyed_server = !opt_.key.empty();
    while (!stopping_) {
      // A peer that holds a connection open without proving the key
      // (nothing sent, or a hello never finished) is dropped.
      if (keyed_server && !sock.authenticated() && std::chrono::steady_clock::now() >= hello_by)
        return;
      // Wait for the next call; a shutdown wakes the wait.
      {
        pollfd pf[2] = {{sock.fd(), POLLIN, 0}, {stop_wake_.fd(), POLLIN, 0}};
        const int cap = stop_wake_.fd() >= 0 ? 1000 : 200;
        (void)::poll(pf, 2,
                     keyed_server && !sock.authenticated() ? detail::poll_ms_until(hello_by, cap)
                                                           : cap);
        if (stopping_) return;
        if (pf[0].revents == 0) continue;
      }
      control_frame call;
      bool timed_out = false;
      // Readable: the frame's first byte is there (or the connection ended).
      auto s = sock.receive(call, std::chrono::steady_clock::now(), timed_out);
      if (!s && timed_out) continue;
      if (!s) {
        // A bad frame gets its typed error back, then the stream is dropped
        // (its framing can no longer be trusted); a closed one just ends.
        if (s.code != errc::unavailable) (void)sock.send(control_type::reply_err, 0, error_body(s));
        return;
      }
      if (!sock.authenticated() && !opt_.key.empty()) {
        // Keyed server: the first frame must open the key exchange.
        if (call.type != control_type::auth_hello || call.body.size() != control_nonce_size) {
          (void)sock.send(control_type::reply_err, call.attempt,
                          error_body(fail(errc::verification,
                                          "control server: this server requires the job key; "
                                          "the peer did not authenticate")));
          return;
        }
        const auto mine = new_control_nonce();
        control_nonce theirs{};
        std::memcpy(theirs.data(), call.body.data(), theirs.size());
        if (!sock.send(control_type::auth_hello, 0, std::as_bytes(std::span(mine)))) return;
        sock.authenticate(opt_.key, theirs, mine, false);
        continue;
      }
      if (call.type == control_type::auth_hello) {
        // A keyed peer at a server without the key (or a second exchange).
        (void)sock.send(
            control_type::reply_err, call.attempt,
            error_body(fail(errc::verification,
                            opt_.key.empty() ? "control server: the peer has a job key, this "
                                               "server has none"
                                             : "control server: key exchange repeated")));
        return;
      }
      if (call.type == control_type::stop) continue; // for a call already answered
      if (call.type == control_type::reply_ok || call.type == control_type::reply_err ||
          call.type == control_type::heartbeat) {
        (void)sock.send(control_type::reply_err, call.attempt,
                        error_body(fail(errc::bad_format, "control server: reply or heartbeat "
                                                          "frame where a call was due")));
        return;
      }
      // Checked before the handler runs, so a refused id fences nothing.
      if (auto w = attempts_.admit(call.attempt, sock.authenticated(), "control server"); !w) {
        if (!sock.send(control_type::reply_err, call.attempt, error_body(w))) return;
        continue;
      }
      std::atomic<bool> stop{false}, done{false};
      status result = status::success();
      body_writer out;
      std::thread worker([&] {
        try {
          result = h_(call, stop, out);
        } catch (const error& e) {
          result = fail(e.code(), e.what());
        } catch (const std::exception& e) {
          result = fail(errc::aborted, std::string("control server: ") + e.what());
        }
        done = true;
        done_wake.signal();
      });
      bool gone = false;
      auto next_beat = std::chrono::steady_clock::now() + opt_.heartbeat;
      while (!done) {
        if (std::chrono::steady_clock::now() >= next_beat) {
          if (!sock.send(control_type::heartbeat, call.attempt, {})) {
            stop = true;
            gone = true;
            break;
          }
          next_beat = std::chrono::steady_clock::now() + opt_.heartbeat;
        }
        // Sleep until a frame comes, the handler returns, the server shuts
        // down (ignored once `stop` is set) or the next heartbeat is due.
        pollfd pf[3] = {{sock.fd(), POLLIN, 0},
                        {done_wake.fd(), POLLIN, 0},
                        {stop.load() ? -1 : stop_wake_.fd(), POLLIN, 0}};
        (void)::poll(pf, 3, detail::poll_ms_until(next_beat, done_wake.fd() >= 0 ? 60000 : 20));
        if (stopping_) stop = true;
        if (pf[0].revents == 0) continue;
        control_frame f;
        bool idle = false;
        auto r = sock.receive(f, std::chrono::steady_clock::now(), idle);
        if (r && f.type == control_type::stop) stop = true;
        if (!r && !idle) {
          stop = true; // the coordinator is gone: end its call
          gone = true;
          break;
        }
      }
      worker.join();
      done_wake.drain();
      if (gone) return;
      const auto sent = result
                            ? sock.send(control_type::reply_ok, call.attempt, out.bytes())
                            : sock.send(control_type::reply_err, call.attempt, error_body(result));
      if (!sent) return;
    }
  }

  handler h_;
  channel_options opt_;
  net::attempt_window attempts_; ///< newest attempt taken, on any connection
  int lfd_ = -1;
  unsigned short port_ = 0;
  std::thread acceptor_;
  std::atomic<bool> stopping_{false};
  detail::wake_fd stop_wake_; ///< signalled once, by `shutdown`
  std::mutex m_;
  std::list<connection> conns_;
};

} // namespace dcr::protocol
