#pragma once
// The relay-tree transport of a cluster job (`--transport relay_tree`,
// docs/deployment.md): every dcr-rollout process hosts its node of the tree,
// listening on its --relay-nodes address, forwarding to its children and
// handing payloads to the node's reader; every dcr-owner streams its payloads
// to the root (node 0). The tree's shape is relay_topology's k-ary heap order
// over the nodes (--relay-fanout). Each node process has one reader slot:
// the node link reads every payload once and feeds all local receivers.
// Dense exports and restores still go through the object store.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <netdb.h>
#include <sys/socket.h>

#include "dcr/protocol/control_channel.hpp"
#include "dcr/transport/relay_tcp.hpp"
#include "dcr/transport/relay_tree.hpp"
#include "examples/cluster/cluster_job.hpp"
#include "examples/cluster/timeline.hpp"

namespace dcr::cluster {

/// What one owner streamed through the relay tree in attempt τ, as one
/// digest: BLAKE2b-128 (keyed by the job key, if any) over
/// "dcr-relay-stream 1", τ, the owner, the payload count and the
/// BLAKE2b-128 of each payload's bytes, sorted (the tree delivers each
/// payload once, not in a fixed order across owners; each payload's header
/// carries its sequence number, so the set fixes the stream). The relay
/// tree's stand-in for a manifest digest: the owner computes it over what
/// it sent, every node over what it delivered.
inline digest128 relay_stream_digest(std::uint64_t attempt, std::uint32_t owner,
                                     std::vector<digest128> payloads, const seal_key& key) {
  std::sort(payloads.begin(), payloads.end());
  blake2b_128 h{key};
  const std::string head = "dcr-relay-stream 1\n" + std::to_string(attempt) + " " +
                           std::to_string(owner) + " " + std::to_string(payloads.size()) + "\n";
  h.update(std::as_bytes(std::span(head)));
  for (const auto& d : payloads) h.update(std::as_bytes(std::span(d)));
  return h.final();
}

/// Relay links between processes: node i is at `addrs[i]`; this process
/// listens only for its own node (`self`; none in an owner).
class process_relay_network final : public transport::relay_network {
public:
  process_relay_network(std::vector<protocol::peer_address> addrs,
                        std::optional<std::uint32_t> self, transport::tcp_link_options opt)
      : addrs_(std::move(addrs)), self_(self), opt_(opt) {}
  process_relay_network(const process_relay_network&) = delete;
  process_relay_network& operator=(const process_relay_network&) = delete;
  ~process_relay_network() override { shutdown(); }

  status listen(std::uint32_t, acceptor accept) override {
    if (!self_) return status::success();
    accept_ = std::move(accept);
    const auto& me = addrs_.at(*self_);
    const std::string who = "relay node " + std::to_string(*self_) + ": listen on " + me.text();
    sockaddr_in a{};
    DCR_TRY(resolve(me, a));
    lfd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    DCR_RETURN_ERROR_IF(lfd_ < 0, io, who + ": " + transport::detail::errno_text(errno));
    const int one = 1;
    (void)::setsockopt(lfd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    DCR_RETURN_ERROR_IF(::bind(lfd_, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0, io,
                        who + ": " + transport::detail::errno_text(errno));
    DCR_RETURN_ERROR_IF(::listen(lfd_, 64) != 0, io,
                        who + ": " + transport::detail::errno_text(errno));
    acceptor_ = std::thread([this] { accept_loop(); });
    return status::success();
  }

  status dial(std::uint32_t node, std::shared_ptr<transport::frame_conn>& out) override {
    const std::string who = "relay node " + std::to_string(node);
    DCR_RETURN_ERROR_IF(node >= addrs_.size() || stop_, unavailable, who + " unreachable");
    sockaddr_in a{};
    if (auto s = resolve(addrs_[node], a); !s) return fail(errc::unavailable, s.message);
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    DCR_RETURN_ERROR_IF(fd < 0, unavailable,
                        who + ": socket: " + transport::detail::errno_text(errno));
    auto conn = std::make_shared<transport::tcp_frame_conn>(fd, opt_.max_body, opt_.body_timeout);
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) {
      DCR_RETURN_ERROR_IF(errno != EINPROGRESS, unavailable,
                          who + " (" + addrs_[node].text() +
                              "): connect: " + transport::detail::errno_text(errno));
      const auto deadline = std::chrono::steady_clock::now() + opt_.connect_timeout;
      for (;;) {
        pollfd pf{fd, POLLOUT, 0};
        if (::poll(&pf, 1, 0) > 0) break;
        DCR_RETURN_ERROR_IF(stop_ || !transport::detail::poll_until(fd, POLLOUT, deadline),
                            unavailable,
                            who + " (" + addrs_[node].text() + "): connect timed out after " +
                                std::to_string(opt_.connect_timeout.count()) + " ms");
      }
      int err = 0;
      socklen_t len = sizeof err;
      (void)::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      DCR_RETURN_ERROR_IF(err != 0, unavailable,
                          who + " (" + addrs_[node].text() +
                              "): connect: " + transport::detail::errno_text(err));
    }
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
  static status resolve(const protocol::peer_address& p, sockaddr_in& out) {
    addrinfo hints{};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    const int rc = ::getaddrinfo(p.host.c_str(), nullptr, &hints, &res);
    DCR_RETURN_ERROR_IF(rc != 0 || !res, invalid_argument,
                        "relay address " + p.text() + ": " + ::gai_strerror(rc));
    out = *reinterpret_cast<const sockaddr_in*>(res->ai_addr);
    out.sin_port = htons(p.port);
    ::freeaddrinfo(res);
    return status::success();
  }
  void accept_loop() {
    while (!stop_) {
      pollfd pf{lfd_, POLLIN, 0};
      if (::poll(&pf, 1, 50) <= 0) continue;
      const int fd = ::accept4(lfd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) continue; // the peer gave up, or a transient error: keep listening
      auto conn = std::make_shared<transport::tcp_frame_conn>(fd, opt_.max_body, opt_.body_timeout);
      conn->accept_key(opt_.key); // a peer without the job key fails its first read
      // The node's reads from the tree (from its parent; at the root, from
      // the owners) on the timeline as "fetch" intervals, one per payload
      // frame, as a node's gets from the object store are: its side of the
      // transport lower bound (docs/benchmarks.md). Bytes already buffered
      // when the header is read count as no time: it never over-counts.
      conn->observe_reads([](const transport::frame_header& h, auto took) {
        if (h.kind != transport::frame_kind::payload) return;
        const auto t1 = timeline::now_ns();
        const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(took).count();
        timeline::record("fetch", t1 - std::uint64_t(ns), t1, h.length);
      });
      accept_(*self_, std::move(conn));
    }
  }

  std::vector<protocol::peer_address> addrs_;
  std::optional<std::uint32_t> self_;
  transport::tcp_link_options opt_;
  acceptor accept_;
  int lfd_ = -1;
  std::thread acceptor_;
  std::atomic<bool> stop_{false};
};

/// The job's relay tree as one process sees it (an `attempt_transport`):
/// in a dcr-rollout, node `node` of the tree; in a dcr-owner (no node), only
/// the writer that streams to the root. Not movable (writers point into it).
class process_relay {
public:
  /// Called after each payload an owner's writer sent (a fault hook).
  std::function<void()> after_payload;
  /// Fault hook of a node: true makes the reader report a wrong stream
  /// digest for the first owner of that attempt (as a node that took a
  /// forged stream would), to show that the coordinator compares them.
  std::function<bool(std::uint64_t attempt)> forge_digest;

  process_relay(const job& j, std::optional<std::uint32_t> node) {
    std::vector<protocol::peer_address> addrs;
    for (const auto& s : j.flags.relay_nodes) {
      protocol::peer_address p;
      throw_if_failed(protocol::parse_peer_address(s, p));
      addrs.push_back(p);
    }
    if (addrs.size() != j.flags.nodes)
      throw error(errc::invalid_argument, "--relay-nodes: one address per rollout node");
    opt_.nodes = j.flags.nodes;
    opt_.fanout = j.flags.relay_fanout;
    opt_.receivers_per_node = 1; // one reader per node process (the node link's)
    opt_.receivers = j.flags.nodes;
    opt_.key = j.flags.key; // payloads are checked against the job key at every node
    const transport::relay_topology topo(opt_.nodes, opt_.fanout);
    transport::tcp_link_options lo;
    lo.key = j.flags.key; // links authenticated by the job key, if any
    net_ = std::make_unique<process_relay_network>(std::move(addrs), node, lo);
    if (node) {
      node_ = std::make_unique<transport::relay_node>(*node, topo, opt_, net_.get(), 1);
      throw_if_failed(
          net_->listen(opt_.nodes, [this](std::uint32_t, auto c) { node_->accept(std::move(c)); }));
    }
  }
  process_relay(const process_relay&) = delete;
  process_relay& operator=(const process_relay&) = delete;
  ~process_relay() {
    net_->shutdown();
    if (node_) node_->shutdown();
  }

  /// Streams one owner's payloads of one attempt to the root, and digests
  /// what it sent (`relay_stream_digest`): the owner reports it with its
  /// publish reply (`manifest_digest`), as an object-store owner reports its
  /// manifest's, so the coordinator binds the attempt to it.
  class writer {
  public:
    writer(transport::relay_writer w, const std::function<void()>* hook, std::uint64_t attempt,
           std::uint32_t owner, const seal_key& key)
        : w_(std::move(w)), hook_(hook), attempt_(attempt), owner_(owner), key_(key) {}
    status put_payload(std::span<const std::byte> b) {
      // Timed as an "upload", as the object store's puts are: the write of
      // one payload into the tree, which returns once the writer's window
      // takes it (its bytes may still be crossing the link; the nodes'
      // "fetch" intervals time that side).
      const auto t0 = timeline::now_ns();
      DCR_TRY(w_.put_payload(b));
      sent_.push_back(digest(b));
      timeline::record("upload", t0, timeline::now_ns(), b.size());
      if (*hook_) (*hook_)();
      return status::success();
    }
    status finish() { return w_.finish(); }
    digest128 manifest_digest() const { return relay_stream_digest(attempt_, owner_, sent_, key_); }

  private:
    transport::relay_writer w_;
    const std::function<void()>* hook_;
    std::uint64_t attempt_;
    std::uint32_t owner_;
    seal_key key_;
    std::vector<digest128> sent_;
  };

  /// Reads one attempt at this node and digests, per owner, what it
  /// delivered (`relay_stream_digest`); the node reports those digests with
  /// its refit reply (`manifest_digests`), and the coordinator compares them
  /// with what each owner reported sending (docs/protocol.md, "Binding an
  /// attempt to the owners' manifests").
  class reader {
  public:
    reader(transport::relay_reader r, std::uint64_t attempt, std::vector<std::uint32_t> owners,
           const seal_key& key, bool forge = false)
        : r_(std::move(r)), attempt_(attempt), owners_(std::move(owners)), key_(key),
          forge_(forge) {}
    template <class Deliver>
    status run(Deliver&& deliver, const std::atomic<bool>& stop,
               std::chrono::steady_clock::time_point deadline) {
      return r_.run(
          [&](std::string_view name, std::span<const std::byte> b) -> status {
            DCR_TRY(deliver(name, b));
            std::uint32_t owner = 0;
            DCR_RETURN_ERROR_IF(!payload_owner(name, owner), bad_format,
                                "relay_tree: payload name " + std::string(name) +
                                    " names no owner");
            std::lock_guard l(m_);
            got_[owner].push_back(digest(b));
            return status::success();
          },
          stop, deadline);
    }
    std::vector<std::pair<std::uint32_t, digest128>> manifest_digests() const {
      std::lock_guard l(m_);
      std::vector<std::pair<std::uint32_t, digest128>> out;
      for (auto o : owners_) {
        const auto it = got_.find(o);
        out.emplace_back(
            o, relay_stream_digest(attempt_, o,
                                   it == got_.end() ? std::vector<digest128>{} : it->second, key_));
      }
      if (forge_ && !out.empty()) out.front().second[0] ^= 1;
      return out;
    }

  private:
    /// The owner in a payload name (`transport::payload_name`: ".../payload/o<10 digits>-s...").
    static bool payload_owner(std::string_view name, std::uint32_t& owner) {
      const auto at = name.rfind("/payload/o");
      if (at == std::string_view::npos || name.size() < at + 10 + 10) return false;
      std::uint64_t v = 0;
      for (char c : name.substr(at + 10, 10)) {
        if (c < '0' || c > '9') return false;
        v = v * 10 + static_cast<std::uint64_t>(c - '0');
      }
      if (v > 0xffffffffu) return false;
      owner = static_cast<std::uint32_t>(v);
      return true;
    }
    transport::relay_reader r_;
    std::uint64_t attempt_;
    std::vector<std::uint32_t> owners_;
    seal_key key_;
    bool forge_ = false;
    mutable std::mutex m_;
    std::map<std::uint32_t, std::vector<digest128>> got_;
  };

  writer open_writer(std::uint64_t attempt, std::uint32_t owner) {
    return writer(transport::relay_writer(*net_, opt_, attempt, owner), &after_payload, attempt,
                  owner, opt_.key);
  }
  reader open_reader(std::uint64_t attempt, std::size_t, std::vector<std::uint32_t> owners) {
    if (!node_)
      return reader(transport::relay_reader(nullptr, 0, attempt, owners,
                                            fail(errc::invalid_argument,
                                                 "relay_tree: this process hosts no relay node")),
                    attempt, owners, opt_.key);
    const bool forge = forge_digest && forge_digest(attempt);
    return reader(transport::relay_reader(node_.get(), 0, attempt, owners), attempt, owners,
                  opt_.key, forge);
  }
  /// A node holds only the current attempt, which the next one replaces.
  status collect(std::uint64_t, std::size_t* removed) {
    if (removed) *removed = 0;
    return status::success();
  }
  transport::relay_node* node() noexcept { return node_.get(); }
  /// What this process's node counted, for its log ("" in an owner).
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
  transport::relay_options opt_;
  std::unique_ptr<process_relay_network> net_;
  std::unique_ptr<transport::relay_node> node_;
};
static_assert(transport::attempt_transport<process_relay>);

} // namespace dcr::cluster
