#pragma once
// The relay-tree transport of a cluster job (`--transport relay_tree`,
// docs/deployment.md): the library's relay tree across processes
// (dcr/transport/relay_process.hpp) at the job's --relay-nodes addresses and
// --relay-fanout, with the programs' timeline intervals and fault hooks
// around it. Dense exports and restores still go through the object store.

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dcr/protocol/control_channel.hpp"
#include "dcr/transport/relay_process.hpp"
#include "examples/cluster/cluster_job.hpp"
#include "examples/cluster/timeline.hpp"

namespace dcr::cluster {

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

  process_relay(const job& j, std::optional<std::uint32_t> node) : relay_(options(j, node)) {}

  /// Streams one owner's payloads of one attempt to the root; its digest of
  /// what it sent is the publish's manifest digest (relay_stream.hpp).
  class writer {
  public:
    writer(transport::process_relay::writer w, const std::function<void()>* hook)
        : w_(std::move(w)), hook_(hook) {}
    status put_payload(std::span<const std::byte> b) {
      // Timed as an "upload", as the object store's puts are: the write of
      // one payload into the tree, which returns once the writer's window
      // takes it (its bytes may still be crossing the link; the nodes'
      // "fetch" intervals time that side).
      const auto t0 = timeline::now_ns();
      DCR_TRY(w_.put_payload(b));
      timeline::record("upload", t0, timeline::now_ns(), b.size());
      if (*hook_) (*hook_)();
      return status::success();
    }
    status finish() { return w_.finish(); }
    digest128 manifest_digest() const { return w_.manifest_digest(); }

  private:
    transport::process_relay::writer w_;
    const std::function<void()>* hook_;
  };

  /// Reads one attempt at this node; its per-owner digests of what it
  /// delivered go with the node's refit reply.
  class reader {
  public:
    reader(transport::process_relay::reader r, bool forge) : r_(std::move(r)), forge_(forge) {}
    template <class Deliver>
    status run(Deliver&& deliver, const std::atomic<bool>& stop,
               std::chrono::steady_clock::time_point deadline) {
      return r_.run(std::forward<Deliver>(deliver), stop, deadline);
    }
    std::vector<std::pair<std::uint32_t, digest128>> manifest_digests() const {
      auto out = r_.manifest_digests();
      if (forge_ && !out.empty()) out.front().second[0] ^= 1;
      return out;
    }

  private:
    transport::process_relay::reader r_;
    bool forge_ = false;
  };

  writer open_writer(std::uint64_t attempt, std::uint32_t owner) {
    return writer(relay_.open_writer(attempt, owner), &after_payload);
  }
  reader open_reader(std::uint64_t attempt, std::size_t r, std::vector<std::uint32_t> owners) {
    const bool forge = relay_.node() && forge_digest && forge_digest(attempt);
    return reader(relay_.open_reader(attempt, r, std::move(owners)), forge);
  }
  status collect(std::uint64_t up_to, std::size_t* removed) {
    return relay_.collect(up_to, removed);
  }
  transport::relay_node* node() noexcept { return relay_.node(); }
  std::string counters_text() const { return relay_.counters_text(); }

private:
  static transport::process_relay_options options(const job& j, std::optional<std::uint32_t> node) {
    transport::process_relay_options o;
    for (const auto& s : j.flags.relay_nodes) {
      protocol::peer_address p;
      throw_if_failed(protocol::parse_peer_address(s, p));
      o.nodes.push_back(p);
    }
    if (o.nodes.size() != j.flags.nodes)
      throw error(errc::invalid_argument, "--relay-nodes: one address per rollout node");
    o.self = node;
    o.fanout = j.flags.relay_fanout;
    o.key = j.flags.key; // links authenticated and digests keyed by the job key, if any
    // The node's reads from the tree (from its parent; at the root, from
    // the owners) on the timeline as "fetch" intervals, one per payload
    // frame, as a node's gets from the object store are: its side of the
    // transport lower bound (docs/benchmarks.md). Bytes already buffered
    // when the header is read count as no time: it never over-counts.
    o.observe_reads = [](const transport::frame_header& h, auto took) {
      if (h.kind != transport::frame_kind::payload) return;
      const auto t1 = timeline::now_ns();
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(took).count();
      timeline::record("fetch", t1 - std::uint64_t(ns), t1, h.length);
    };
    return o;
  }

  transport::process_relay relay_;
};
static_assert(transport::attempt_transport<process_relay>);

} // namespace dcr::cluster
