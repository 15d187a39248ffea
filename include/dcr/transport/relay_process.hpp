#pragma once
/// \file
/// The relay tree across processes (docs/deployment.md, "Relay tree"): every
/// rollout process hosts one node of the tree, listening on its own address,
/// forwarding to its children and handing payloads to that process's one
/// reader; every owner process streams its payloads to the root (node 0).
/// The tree's shape is relay_topology's k-ary heap order over the nodes.
/// `process_relay` is the `attempt_transport` one process sees: a node's
/// relay (a rollout process) or only the writer to the root (an owner).
/// Writers and readers digest their streams (relay_stream.hpp), so the
/// coordinator binds every attempt to what each owner sent.
///
/// The cluster programs (examples/cluster/relay_job.hpp) and the Python
/// roles (python/src/remote.hpp) both run on it.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dcr/core/error.hpp"
#include "dcr/net/framed_socket.hpp"
#include "dcr/net/peer_address.hpp"
#include "dcr/transport/relay_stream.hpp"
#include "dcr/transport/relay_tcp.hpp"
#include "dcr/transport/relay_tree.hpp"

namespace dcr::transport {

/// Relay links between processes: node i listens at `nodes[i]`; this
/// process listens only for its own node (`self`; none in an owner) and
/// dials the others' addresses.
class process_network final : public relay_network {
public:
  process_network(std::vector<net::peer_address> nodes, std::optional<std::uint32_t> self,
                  tcp_link_options opt, tcp_frame_conn::read_observer observe = {})
      : addrs_(std::move(nodes)), self_(self), opt_(opt), observe_(std::move(observe)) {}
  process_network(const process_network&) = delete;
  process_network& operator=(const process_network&) = delete;
  ~process_network() override { shutdown(); }

  status listen(std::uint32_t, acceptor accept) override {
    if (!self_) return status::success();
    accept_ = std::move(accept);
    const auto& me = addrs_.at(*self_);
    const std::string who = "relay node " + std::to_string(*self_) + " at " + me.text() + ": ";
    sockaddr_in a{};
    DCR_TRY(net::resolve_ipv4(me, who + "listen", a));
    unsigned short port = 0;
    auto s = net::listen_tcp(a, who, lfd_, port);
    if (!s) {
      if (lfd_ >= 0) ::close(lfd_);
      lfd_ = -1;
      return s;
    }
    acceptor_ = std::thread([this] { accept_loop(); });
    return status::success();
  }

  status dial(std::uint32_t node, std::shared_ptr<frame_conn>& out) override {
    const std::string who = "relay node " + std::to_string(node);
    DCR_RETURN_ERROR_IF(node >= addrs_.size() || stop_, unavailable, who + " unreachable");
    const std::string at = who + " (" + addrs_[node].text() + ")";
    sockaddr_in a{};
    DCR_TRY(net::resolve_ipv4(addrs_[node], at, a));
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    DCR_RETURN_ERROR_IF(fd < 0, unavailable, at + ": socket: " + detail::errno_text(errno));
    auto conn = std::make_shared<tcp_frame_conn>(fd, opt_.max_body, opt_.body_timeout); // owns fd
    DCR_TRY(net::connect_within(fd, a, opt_.connect_timeout, at, &stop_));
    DCR_TRY(conn->dial_key(opt_.key, opt_.connect_timeout));
    out = std::move(conn);
    return status::success();
  }

  void shutdown() override {
    if (stop_.exchange(true)) return;
    if (acceptor_.joinable()) acceptor_.join();
    if (lfd_ >= 0) ::close(lfd_);
    lfd_ = -1;
  }

private:
  void accept_loop() {
    accept_relay_links(lfd_, stop_, opt_, observe_,
                       [&](std::shared_ptr<tcp_frame_conn> c) { accept_(*self_, std::move(c)); });
  }

  std::vector<net::peer_address> addrs_;
  std::optional<std::uint32_t> self_;
  tcp_link_options opt_;
  tcp_frame_conn::read_observer observe_;
  acceptor accept_;
  int lfd_ = -1;
  std::thread acceptor_;
  std::atomic<bool> stop_{false};
};

/// How one process takes part in a relay tree across processes.
struct process_relay_options {
  /// Every node's listening address, in node order (node 0 is the root).
  std::vector<net::peer_address> nodes;
  /// The node this process hosts (a rollout process); none in an owner.
  std::optional<std::uint32_t> self;
  std::uint32_t fanout = 2;
  /// Job key: links authenticated, payload digests and stream digests
  /// keyed (empty: unauthenticated, for loopback only).
  seal_key key{};
  /// Observes every frame a node reads from upstream (a timeline).
  tcp_frame_conn::read_observer observe_reads;
};

/// The relay tree as one process sees it (an `attempt_transport`). Each
/// node process has one reader slot: its node link reads every payload
/// once and feeds all of the process's receivers. Not movable (writers
/// point into it).
class process_relay {
public:
  using writer = digesting_writer<relay_writer>;
  using reader = digesting_reader<relay_reader>;

  /// Throws `dcr::error` on a bad configuration or when the node cannot listen.
  explicit process_relay(process_relay_options o) : key_(o.key) {
    if (o.nodes.empty()) throw error(errc::invalid_argument, "relay tree: no node addresses");
    if (o.self && *o.self >= o.nodes.size())
      throw error(errc::invalid_argument, "relay tree: node " + std::to_string(*o.self) + " of " +
                                              std::to_string(o.nodes.size()));
    if (o.fanout == 0) throw error(errc::invalid_argument, "relay tree: fanout 0");
    opt_.nodes = static_cast<std::uint32_t>(o.nodes.size());
    opt_.fanout = o.fanout;
    opt_.receivers_per_node = 1;
    opt_.receivers = opt_.nodes;
    opt_.key = o.key; // every node checks each payload's keyed digest
    tcp_link_options lo;
    lo.max_body = opt_.max_frame_body;
    lo.key = o.key;
    const relay_topology topo(opt_.nodes, opt_.fanout);
    net_ = std::make_unique<process_network>(std::move(o.nodes), o.self, lo,
                                             std::move(o.observe_reads));
    if (o.self) {
      node_ = std::make_unique<relay_node>(*o.self, topo, opt_, net_.get(), 1);
      throw_if_failed(
          net_->listen(opt_.nodes, [this](std::uint32_t, auto c) { node_->accept(std::move(c)); }));
    }
  }
  process_relay(const process_relay&) = delete;
  process_relay& operator=(const process_relay&) = delete;
  ~process_relay() { shutdown(); }

  /// Stop listening and end the node's links (a process that stops serving
  /// frees its relay address at once). Idempotent.
  void shutdown() {
    net_->shutdown();
    if (node_) node_->shutdown();
  }

  writer open_writer(std::uint64_t attempt, std::uint32_t owner) {
    return writer(relay_writer(*net_, opt_, attempt, owner), attempt, owner, key_);
  }
  reader open_reader(std::uint64_t attempt, std::size_t, std::vector<std::uint32_t> owners) {
    if (!node_)
      return reader(relay_reader(nullptr, 0, attempt, owners,
                                 fail(errc::invalid_argument,
                                      "relay tree: this process hosts no relay node")),
                    attempt, owners, key_);
    return reader(relay_reader(node_.get(), 0, attempt, owners), attempt, owners, key_);
  }
  /// A node holds only the current attempt, which the next one replaces.
  status collect(std::uint64_t, std::size_t* removed) {
    if (removed) *removed = 0;
    return status::success();
  }

  /// This process's node (null in an owner).
  relay_node* node() noexcept { return node_.get(); }
  /// What this process's node counted, as a line for a log ("" in an owner).
  std::string counters_text() const {
    if (!node_) return "";
    const auto c = node_->counters();
    return "relay node " + std::to_string(node_->index()) + ": " + std::to_string(c.payloads) +
           " payloads queued, " + std::to_string(c.forwarded) + " frames forwarded, " +
           std::to_string(c.duplicates) + " duplicates, " + std::to_string(c.stale) + " stale, " +
           std::to_string(c.rejected) + " rejected, " + std::to_string(c.failures) +
           " attempts failed";
  }

private:
  seal_key key_;
  relay_options opt_;
  std::unique_ptr<process_network> net_;
  std::unique_ptr<relay_node> node_;
};
static_assert(attempt_transport<process_relay>);

} // namespace dcr::transport
