#pragma once
/// \file
/// TCP links for the relay tree, over plain POSIX sockets. Every node listens
/// on its own port (bound with port 0, so the OS picks a free one; `ports()`
/// reports them); a parent dials its children and owners dial the root.
/// Sockets are non-blocking and every wait is a `poll` with a timeout, so a
/// stalled peer is a typed `errc::unavailable`, never a hang; a full socket
/// buffer blocks the writer, which is the tree's backpressure. The socket
/// loops, dial and listen are net/framed_socket.hpp's, shared with the
/// control channel.
///
/// Why POSIX and not Asio: the tree runs one thread per link with
/// synchronous, deadline-bounded reads and writes, and wakes a blocked reader
/// by `shutdown(2)`. Asio's reactor would never run here (it was used only as
/// a socket wrapper), while its headers cost about 70k preprocessed lines in
/// every translation unit that builds a TCP tree.

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
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

#include "dcr/core/endian.hpp"
#include "dcr/core/error.hpp"
#include "dcr/core/hash.hpp"
#include "dcr/net/admission.hpp"
#include "dcr/net/framed_socket.hpp"
#include "dcr/transport/relay_frame.hpp"
#include "dcr/transport/relay_tree.hpp"

namespace dcr::transport {

namespace detail {
inline std::string errno_text(int e) { return std::strerror(e); }
/// `net::poll_until` in the relay links' 200 ms slices.
inline bool poll_until(int fd, short events, std::chrono::steady_clock::time_point deadline) {
  return net::poll_until(fd, events, deadline, 200);
}
} // namespace detail

/// One TCP connection carrying relay frames (net/framed_socket.hpp moves the
/// bytes). Owns the descriptor.
class tcp_frame_conn final : public frame_conn {
public:
  /// `fd`: a connected, non-blocking stream socket. `body_timeout`: how long
  /// a peer that started a frame may take to finish it.
  tcp_frame_conn(int fd, std::uint64_t max_body, std::chrono::milliseconds body_timeout)
      : sock_(fd, "relay link", 200), max_(max_body), body_timeout_(body_timeout) {}
  tcp_frame_conn(const tcp_frame_conn&) = delete;
  tcp_frame_conn& operator=(const tcp_frame_conn&) = delete;

  /// Keyed link, dialling end: right after connecting (before any other
  /// use), run the key exchange with the accepting end (`accept_key`):
  /// ```
  /// dialler  → "DCRA" + 16-byte nonce c
  /// acceptor → "DCRA" + 16-byte nonce s, then its proof: tag("DCRP", 1, c, s)
  /// dialler  → its proof: tag("DCRP", 0, c, s)
  /// ```
  /// (a tag is keyed BLAKE2b-128 over the label, the direction, both nonces
  /// and, for a frame, its sequence number and bytes). Each end checks the
  /// other's proof before it reads anything else, so a peer without the key
  /// gets 36 bytes read from it, never a frame header: its announced length
  /// allocates nothing (net/admission.hpp). An acceptor that answers without
  /// a valid proof (no key, another key, or anyone else on the path) fails
  /// the dial with `errc::verification`; nothing it sent is believed. From
  /// then on every frame each way is followed by its 16-byte tag over
  /// "DCRL", the direction, both nonces, the frame's sequence number in its
  /// direction and the frame; a frame whose tag fails is
  /// `errc::verification` (a peer without the key, a modified, replayed or
  /// reordered frame). An empty key does nothing (an unauthenticated link).
  status dial_key(const seal_key& key, std::chrono::milliseconds timeout) {
    if (key.empty()) return status::success();
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    auto hello = make_hello();
    DCR_TRY(io(hello.data(), hello.size(), true, deadline));
    std::array<std::byte, hello_size + proof_size> theirs;
    DCR_TRY(io(theirs.data(), theirs.size(), false, deadline));
    DCR_RETURN_ERROR_IF(std::memcmp(theirs.data(), "DCRA", 4) != 0, verification,
                        "relay link: the peer did not answer the key exchange (no job key?)");
    key_ = key;
    std::memcpy(client_nonce_.data(), hello.data() + 4, 16);
    std::memcpy(server_nonce_.data(), theirs.data() + 4, 16);
    DCR_RETURN_ERROR_IF(!proof_matches(1, std::span(theirs).subspan(hello_size)), verification,
                        "relay link: the accepting end did not prove the job key (no key, "
                        "another key, or not the node dialled)");
    auto mine = proof(0);
    DCR_TRY(io(reinterpret_cast<std::byte*>(mine.data()), mine.size(), true, deadline));
    client_ = true;
    keyed_ = true;
    return status::success();
  }
  /// Keyed link, accepting end: the first read runs the key exchange
  /// (`dial_key`): anything but a hello and a valid proof within
  /// `hello_timeout` of this call is `errc::verification` (`unavailable`
  /// when the peer sends too little in time). Call before the connection is
  /// used, when it is accepted.
  void accept_key(const seal_key& key,
                  std::chrono::milliseconds hello_timeout = net::default_hello_timeout) {
    key_ = key;
    accept_pending_ = !key.empty();
    hello_by_ = std::chrono::steady_clock::now() + hello_timeout;
  }
  /// This connection holds a place under its listener's cap until it is
  /// closed or destroyed.
  void hold(net::connection_slots::ticket t) {
    std::lock_guard l(ticket_m_);
    ticket_ = std::move(t);
  }

  status write(const frame_header& h, std::span<const std::byte> body,
               std::chrono::milliseconds timeout) override {
    std::lock_guard l(wm_);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    const auto hdr = encode_frame_header(h);
    DCR_TRY(io(const_cast<std::byte*>(hdr.data()), hdr.size(), true, deadline));
    DCR_TRY(io(const_cast<std::byte*>(body.data()), body.size(), true, deadline));
    if (!keyed_) return status::success();
    auto t = tag(client_ ? 0 : 1, send_seq_++, hdr, body);
    return io(reinterpret_cast<std::byte*>(t.data()), t.size(), true, deadline);
  }
  status read(frame& out) override {
    if (accept_pending_) DCR_TRY(accept_exchange());
    std::array<std::byte, frame_header_size> hdr;
    DCR_TRY(io(hdr.data(), hdr.size(), false, std::chrono::steady_clock::time_point::max()));
    frame_header h;
    DCR_TRY(decode_frame_header(hdr, max_, h)); // before the body is allocated
    out.header = h;
    out.body.resize(h.length);
    const auto started = std::chrono::steady_clock::now();
    // A peer that started a frame finishes it promptly or is dropped.
    DCR_TRY(io(out.body.data(), out.body.size(), false, started + body_timeout_));
    if (keyed_) {
      digest128 got{};
      DCR_TRY(
          io(reinterpret_cast<std::byte*>(got.data()), got.size(), false, started + body_timeout_));
      DCR_RETURN_ERROR_IF(!same_digest(got, tag(client_ ? 1 : 0, recv_seq_++, hdr, out.body)),
                          verification,
                          "relay link: authentication tag does not match (a peer without the "
                          "job key, or a modified, replayed or reordered frame)");
    }
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
    sock_.shutdown();
    std::lock_guard l(ticket_m_);
    ticket_.release();
  }

  static constexpr std::size_t hello_size = 20, proof_size = 16;

private:
  /// The accepting end of the key exchange (`dial_key`); reads exactly the
  /// hello and the proof, by `hello_by_`.
  status accept_exchange() {
    std::array<std::byte, hello_size> theirs;
    DCR_TRY(io(theirs.data(), theirs.size(), false, hello_by_));
    DCR_RETURN_ERROR_IF(std::memcmp(theirs.data(), "DCRA", 4) != 0, verification,
                        "relay link: this node requires the job key; the peer did not "
                        "authenticate");
    {
      std::lock_guard l(wm_);
      auto hello = make_hello();
      std::memcpy(client_nonce_.data(), theirs.data() + 4, 16);
      std::memcpy(server_nonce_.data(), hello.data() + 4, 16);
      std::array<std::byte, hello_size + proof_size> out;
      std::memcpy(out.data(), hello.data(), hello_size);
      const auto mine = proof(1);
      std::memcpy(out.data() + hello_size, mine.data(), proof_size);
      DCR_TRY(io(out.data(), out.size(), true,
                 std::min(hello_by_, std::chrono::steady_clock::now() + body_timeout_)));
    }
    std::array<std::byte, proof_size> their_proof;
    DCR_TRY(io(their_proof.data(), their_proof.size(), false, hello_by_));
    DCR_RETURN_ERROR_IF(!proof_matches(0, their_proof), verification,
                        "relay link: the peer did not prove the job key (no key or another key)");
    accept_pending_ = false;
    keyed_ = true;
    return status::success();
  }
  digest128 proof(std::uint8_t direction) const { return relay_link_proof(link_mac(), direction); }
  bool proof_matches(std::uint8_t direction, std::span<const std::byte> got) const {
    digest128 g{};
    std::memcpy(g.data(), got.data(), g.size());
    return same_digest(g, proof(direction));
  }

  std::array<std::byte, 20> make_hello() const {
    std::array<std::byte, 20> h;
    std::memcpy(h.data(), "DCRA", 4);
    std::random_device rd;
    for (std::size_t i = 4; i < h.size(); ++i) h[i] = static_cast<std::byte>(rd());
    return h;
  }
  digest128 tag(std::uint8_t direction, std::uint64_t seq, std::span<const std::byte> hdr,
                std::span<const std::byte> body) const {
    return relay_link_tag(link_mac(), direction, seq, hdr, body);
  }
  relay_link_mac link_mac() const { return {key_, client_nonce_, server_nonce_}; }

  status io(std::byte* p, std::size_t n, bool out, std::chrono::steady_clock::time_point deadline) {
    return out ? sock_.send_all(p, n, deadline) : sock_.receive_all(p, n, deadline);
  }

  net::stream_socket sock_;
  std::uint64_t max_;
  std::chrono::milliseconds body_timeout_;
  read_observer observer_;
  std::mutex wm_;
  // Keyed link state: set by `dial_key` or the first read after
  // `accept_key`, before frames flow; the sequence numbers are the writer's
  // (under `wm_`) and the single reader's.
  seal_key key_;
  bool client_ = false, keyed_ = false, accept_pending_ = false;
  std::array<std::uint8_t, 16> client_nonce_{}, server_nonce_{};
  std::uint64_t send_seq_ = 0, recv_seq_ = 0;
  std::chrono::steady_clock::time_point hello_by_ = std::chrono::steady_clock::time_point::max();
  std::mutex ticket_m_;
  net::connection_slots::ticket ticket_;
};

/// Limits of TCP relay links.
struct tcp_link_options {
  std::uint64_t max_body = default_max_frame_body; ///< largest frame body accepted
  std::chrono::milliseconds connect_timeout{5000}; ///< per dial
  std::chrono::milliseconds body_timeout{30000};   ///< to finish a started frame
  /// Job key (empty: unauthenticated links, for loopback only): every link
  /// exchanges nonces and tags every frame (`tcp_frame_conn::dial_key`).
  seal_key key{};
  /// Keyed listener: an accepted link that has not finished the key
  /// exchange this long after it was accepted is dropped.
  std::chrono::milliseconds hello_timeout = net::default_hello_timeout;
  /// Accepted links served at once by one listener (each is a thread at the
  /// node); one more is closed on accept, before anything of it is read.
  std::size_t max_connections = net::default_max_connections;
};

/// Accepts relay connections on listening socket `lfd` until `stop`: each
/// a `tcp_frame_conn` under `opt`'s limits, expecting the job key's hello
/// within `opt.hello_timeout` (a peer without the key fails its first
/// read), observed by `observe` if set, handed to `take`. Past
/// `opt.max_connections` links still open, a new one is closed at once.
/// Polls in 50 ms slices, so `stop` ends it promptly.
template <class Take>
void accept_relay_links(int lfd, const std::atomic<bool>& stop, const tcp_link_options& opt,
                        const tcp_frame_conn::read_observer& observe, Take&& take) {
  net::connection_slots slots(opt.max_connections);
  while (!stop) {
    pollfd pf{lfd, POLLIN, 0};
    if (::poll(&pf, 1, 50) <= 0) continue;
    const int fd = ::accept4(lfd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) continue; // the peer gave up, or a transient error: keep listening
    net::connection_slots::ticket place;
    if (!slots.try_take(place)) {
      ::close(fd); // over the cap: nothing of it is read
      continue;
    }
    auto conn = std::make_shared<tcp_frame_conn>(fd, opt.max_body, opt.body_timeout);
    conn->hold(std::move(place));
    conn->accept_key(opt.key, opt.hello_timeout);
    if (observe) conn->observe_reads(observe);
    take(std::move(conn));
  }
}

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
      int fd = -1;
      unsigned short port = 0;
      auto s = net::listen_tcp(loopback(0), who, fd, port);
      if (fd >= 0) listeners_.push_back(fd); // closed by `shutdown`, also on failure
      DCR_TRY(std::move(s));
      ports_.push_back(port);
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
    DCR_TRY(net::connect_within(fd, loopback(ports_[node]), opt_.connect_timeout, who, &stop_));
    DCR_TRY(conn->dial_key(opt_.key, opt_.connect_timeout));
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
    accept_relay_links(listeners_[i], stop_, opt_, {},
                       [&](std::shared_ptr<tcp_frame_conn> c) { accept_(i, std::move(c)); });
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
  // The tree's job key keys the links as well as the payload digests.
  tcp_link_options lo;
  lo.max_body = opt.max_frame_body;
  lo.key = opt.key;
  auto net = std::make_unique<tcp_network>(lo);
  return std::make_unique<relay_tree>(std::move(opt), std::move(net));
}

} // namespace dcr::transport
