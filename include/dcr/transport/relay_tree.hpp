#pragma once
/// \file
/// Relay-tree transport (docs/architecture.md, "Relay tree"): owners stream
/// their payloads to one root rollout node, which forwards them through a
/// balanced k-ary tree; every node hands each payload to the readers of its
/// local receivers. A node acknowledges a frame once it sits in the node's
/// bounded staging queue ("queueing ACK": queued, not applied), fences stale
/// attempts and suppresses duplicates. Links are `frame_conn`s made by a
/// `relay_network`: in-process pipes (relay_links.hpp) or TCP (relay_tcp.hpp).

///
/// This header: the owner-side writer, the receiver-side reader and the tree
/// that models `attempt_transport`. The parts: relay_topology.hpp (shape),
/// relay_links.hpp (links), relay_node.hpp (one node), relay_frame.hpp
/// (frames).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "dcr/codec/payload_format.hpp"
#include "dcr/core/error.hpp"
#include "dcr/pipeline/bounded_queue.hpp"
#include "dcr/transport/attempt_objects.hpp"
#include "dcr/transport/attempt_transport.hpp"
#include "dcr/transport/relay_frame.hpp"
#include "dcr/transport/relay_links.hpp"
#include "dcr/transport/relay_node.hpp"
#include "dcr/transport/relay_stream.hpp"
#include "dcr/transport/relay_topology.hpp"

namespace dcr::transport {

/// Owner side of one attempt: streams payload frames to the root with at most
/// `window` unacknowledged, then owner_done. Every failure is typed: a lost or
/// closed link or a missing ACK is `errc::unavailable`, a reject (attempt
/// replaced or failed at the root) is `errc::aborted`.
class relay_writer {
public:
  relay_writer(relay_network& net, const relay_options& opt, std::uint64_t attempt,
               std::uint32_t owner)
      : s_(std::make_unique<shared>()) {
    s_->net = &net;
    s_->opt = &opt;
    s_->attempt = attempt;
    s_->owner = owner;
  }
  relay_writer(relay_writer&&) noexcept = default;
  relay_writer& operator=(relay_writer&& o) noexcept {
    if (this != &o) {
      if (s_) s_->end();
      s_ = std::move(o.s_);
    }
    return *this;
  }
  ~relay_writer() {
    if (s_) s_->end();
  }

  /// Send the next payload; blocks while the window is full.
  status put_payload(std::span<const std::byte> bytes) {
    auto& s = *s_;
    payload_id pid;
    DCR_TRY(read_payload_id(bytes, pid, s.opt->key));
    DCR_RETURN_ERROR_IF(pid.attempt != s.attempt || pid.owner != s.owner, invalid_argument,
                        "relay writer of owner " + std::to_string(s.owner) + ", attempt " +
                            std::to_string(s.attempt) + " got a payload of owner " +
                            std::to_string(pid.owner) + ", attempt " + std::to_string(pid.attempt));
    DCR_TRY(s.connect());
    const frame_header h{frame_kind::payload, s.attempt, s.owner, pid.sequence, bytes.size()};
    DCR_TRY(s.send(h, bytes));
    if (s.opt->duplicate_payloads) DCR_TRY(s.send(h, bytes));
    ++s.sent;
    return status::success();
  }

  /// Send owner_done and wait until every frame is acknowledged.
  status finish() {
    auto& s = *s_;
    if (s.opt->before_finish) s.opt->before_finish(s.attempt, s.owner);
    DCR_TRY(s.connect());
    DCR_TRY(s.send({frame_kind::owner_done, s.attempt, s.owner, s.sent, 0}, {}));
    {
      std::unique_lock l(s.m);
      const bool got = s.cv.wait_until(l, detail::after(s.opt->io_timeout),
                                       [&] { return !s.err || (s.done_acked && s.unacked == 0); });
      if (!s.err) return s.err;
      DCR_RETURN_ERROR_IF(!got, unavailable,
                          "owner " + std::to_string(s.owner) +
                              ": no queueing ACK for owner_done of attempt " +
                              std::to_string(s.attempt) + " within " +
                              std::to_string(s.opt->io_timeout.count()) + " ms");
    }
    s.end();
    return status::success();
  }

private:
  struct shared {
    relay_network* net = nullptr;
    const relay_options* opt = nullptr;
    std::uint64_t attempt = 0;
    std::uint32_t owner = 0, sent = 0;
    std::shared_ptr<frame_conn> conn;
    std::thread acks;
    std::mutex m;
    std::condition_variable cv;
    std::size_t unacked = 0;
    bool done_acked = false, closing = false;
    status err;

    std::string who() const {
      return "owner " + std::to_string(owner) + ", attempt " + std::to_string(attempt);
    }
    status connect() {
      if (conn) return status::success();
      auto s = net->dial(0, conn);
      if (!s) return fail(errc::unavailable, who() + ": cannot reach the relay root: " + s.message);
      acks = std::thread([this] { ack_loop(); });
      return status::success();
    }
    status send(const frame_header& h, std::span<const std::byte> body) {
      {
        std::unique_lock l(m);
        const bool room = cv.wait_until(l, detail::after(opt->io_timeout),
                                        [&] { return !err || unacked < opt->window; });
        if (!err) return err;
        DCR_RETURN_ERROR_IF(!room, unavailable,
                            who() + ": no queueing ACK within " +
                                std::to_string(opt->io_timeout.count()) + " ms");
        ++unacked;
      }
      auto s = conn->write(h, body, opt->io_timeout);
      if (!s) {
        std::lock_guard l(m);
        if (err) err = fail(errc::unavailable, who() + ": " + s.message);
        return err;
      }
      return status::success();
    }
    void ack_loop() {
      for (;;) {
        frame f;
        auto s = conn->read(f);
        std::lock_guard l(m);
        if (!s) {
          if (!closing && err && !(done_acked && unacked == 0))
            err = fail(errc::unavailable, who() + ": link to the relay root lost: " + s.message);
          cv.notify_all();
          return;
        }
        const auto& h = f.header;
        if (h.kind == frame_kind::reject) {
          if (err)
            err = fail(errc::aborted,
                       who() + ": rejected by the relay root (attempt replaced or failed)");
        } else if ((h.kind != frame_kind::payload_ack && h.kind != frame_kind::done_ack) ||
                   h.attempt != attempt || h.owner != owner || unacked == 0) {
          if (err) err = fail(errc::bad_format, who() + ": unexpected frame from the relay root");
        } else {
          --unacked;
          if (h.kind == frame_kind::done_ack) done_acked = true;
        }
        cv.notify_all();
      }
    }
    void end() {
      {
        std::lock_guard l(m);
        closing = true;
      }
      if (conn) conn->close();
      if (acks.joinable()) acks.join();
    }
  };
  std::unique_ptr<shared> s_;
};

/// Receiver side of one attempt at one node slot (contract of `attempt_reader`:
/// each payload delivered once, complete when every required owner's
/// owner_done arrived and all its payloads were delivered). Payload names are
/// the object-store names, so endpoints see the same ids on either transport.
class relay_reader {
public:
  relay_reader(relay_node* node, std::uint32_t slot, std::uint64_t attempt,
               std::vector<std::uint32_t> owners, status setup = status::success())
      : node_(node), slot_(slot), attempt_(attempt), owners_(owners.begin(), owners.end()),
        setup_(std::move(setup)) {}

  template <class Deliver>
  status run(Deliver&& deliver, const std::atomic<bool>& stop,
             std::chrono::steady_clock::time_point deadline) {
    DCR_TRY(setup_);
    payload_delivery d = [&](std::string_view n, std::span<const std::byte> b) -> status {
      return deliver(n, b);
    };
    return node_->read(attempt_, slot_, owners_, d, stop, deadline);
  }

private:
  relay_node* node_;
  std::uint32_t slot_;
  std::uint64_t attempt_;
  std::set<std::uint32_t> owners_;
  status setup_;
};

/// A relay tree of `opt.nodes` nodes over a network (an `attempt_transport`).
class relay_tree {
public:
  /// Builds the nodes and starts listening; throws `dcr::error` on a bad
  /// configuration or when the network cannot listen.
  relay_tree(relay_options opt, std::unique_ptr<relay_network> net)
      : opt_(std::move(opt)), topo_(opt_.nodes, opt_.fanout), net_(std::move(net)) {
    if (opt_.receivers_per_node == 0 ||
        std::uint64_t{opt_.receivers} > std::uint64_t{opt_.nodes} * opt_.receivers_per_node)
      throw error(errc::invalid_argument, "relay_tree: " + std::to_string(opt_.receivers) +
                                              " receivers do not fit " +
                                              std::to_string(opt_.nodes) + " nodes of " +
                                              std::to_string(opt_.receivers_per_node));
    for (std::uint32_t i = 0; i < opt_.nodes; ++i) {
      const std::uint64_t first = std::uint64_t{i} * opt_.receivers_per_node;
      const auto slots = static_cast<std::uint32_t>(
          first >= opt_.receivers
              ? 0
              : std::min<std::uint64_t>(opt_.receivers_per_node, opt_.receivers - first));
      nodes_.push_back(std::make_unique<relay_node>(i, topo_, opt_, net_.get(), slots));
    }
    throw_if_failed(
        net_->listen(opt_.nodes, [this](std::uint32_t n, std::shared_ptr<frame_conn> c) {
          nodes_[n]->accept(std::move(c));
        }));
  }
  relay_tree(const relay_tree&) = delete;
  relay_tree& operator=(const relay_tree&) = delete;
  ~relay_tree() {
    net_->shutdown();
    for (auto& n : nodes_) n->shutdown();
  }

  /// Writers and readers digest their streams (relay_stream.hpp): the
  /// coordinator binds each attempt to what every owner sent.
  using writer = digesting_writer<relay_writer>;
  using reader = digesting_reader<relay_reader>;

  writer open_writer(std::uint64_t attempt, std::uint32_t owner) {
    return writer(relay_writer(*net_, opt_, attempt, owner), attempt, owner, opt_.key);
  }
  reader open_reader(std::uint64_t attempt, std::size_t receiver,
                     std::vector<std::uint32_t> owners) {
    if (receiver >= opt_.receivers)
      return reader(relay_reader(nodes_[0].get(), 0, attempt, owners,
                                 fail(errc::invalid_argument,
                                      "relay_tree: receiver " + std::to_string(receiver) + " of " +
                                          std::to_string(opt_.receivers))),
                    attempt, owners, opt_.key);
    return reader(relay_reader(nodes_[receiver / opt_.receivers_per_node].get(),
                               static_cast<std::uint32_t>(receiver % opt_.receivers_per_node),
                               attempt, owners),
                  attempt, owners, opt_.key);
  }
  /// Nodes hold only the current attempt, which the next one replaces: nothing to remove.
  status collect(std::uint64_t, std::size_t* removed) {
    if (removed) *removed = 0;
    return status::success();
  }

  /// Receivers the tree has reader slots for (a coordinator checks it against its own).
  std::size_t receiver_count() const noexcept { return opt_.receivers; }
  const relay_topology& topology() const noexcept { return topo_; }
  relay_node& node(std::uint32_t i) { return *nodes_.at(i); }
  relay_network& network() { return *net_; }
  const relay_options& options() const noexcept { return opt_; }

private:
  relay_options opt_;
  relay_topology topo_;
  std::unique_ptr<relay_network> net_;
  std::vector<std::unique_ptr<relay_node>> nodes_;
};
static_assert(attempt_transport<relay_tree>);

/// A relay tree whose links are in-process pipes (tests, single-process runs).
inline std::unique_ptr<relay_tree> make_inproc_relay_tree(relay_options opt) {
  auto net = std::make_unique<inproc_network>(opt.pipe_frames, opt.max_frame_body);
  return std::make_unique<relay_tree>(std::move(opt), std::move(net));
}

} // namespace dcr::transport
