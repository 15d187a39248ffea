#pragma once
/// \file
/// The distributed roles from Python, each in its own process, over the
/// library's control channel (protocol/control_channel.hpp,
/// protocol/remote_links.hpp), as the C++ programs `dcr-owner`,
/// `dcr-rollout` and `dcr-coordinator` run them:
///
/// - `py_owner_server`: the owner of one trainer rank (a `torch.distributed`
///   process), served on a control server: the library's `owner_service`
///   over a `local_owner_link` publishing to this process's connection to
///   the object store. Its baseline moves only after it has read in the
///   commit store that the commit record names the attempt it published; it
///   holds the owner lease of its rank for its life (optional) and checks it
///   before and after every write.
/// - `py_node_server`: a rollout node of Python receivers (a serving
///   worker's, or an engine driver's), served on a control server: the
///   library's `node_service` over a `local_node_link` of `receiver_endpoint`s
///   (fencing, duplicate suppression, fetch and apply pipeline), with an
///   optional request gate the serving side admits requests through.
/// - `py_cluster_coordinator`: the library's `link_coordinator` over remote
///   owner and node links: the same attempts, overwrite retries, manifest
///   binding and joint commit as in-process, with the payload bytes going
///   from the owner processes to the store and from the store to the nodes,
///   never through the coordinator.
///
/// The wire format is the C++ programs' own, so each Python role talks to
/// the C++ ones (tests/python/test_remote.py runs both directions). With a
/// job key (`channel_options::key`) every control call is authenticated and
/// manifests, payloads and the commit record are sealed with it (the stores
/// are given the same key).
///
/// Threads: a control server runs each connection on a thread of its own.
/// Owner calls never enter Python (the candidate's tensors are read by
/// pointer); node calls take the GIL inside `py_receiver`. So a server is
/// shut down with the GIL released (`close`), or a connection thread
/// waiting for the GIL would never end.

#include <pybind11/pybind11.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "adapter.hpp"
#include "coordinator.hpp"
#include "dcr/protocol/control_channel.hpp"
#include "dcr/protocol/coordinator.hpp"
#include "dcr/protocol/remote_links.hpp"
#include "dcr/protocol/request_gate.hpp"
#include "dcr/transport/dense_export.hpp"
#include "dcr/transport/relay_process.hpp"

namespace dcr_py {

namespace py = pybind11;

/// "HOST:PORT" as a peer address (`invalid_argument` otherwise).
inline dcr::protocol::peer_address peer_of(const std::string& text) {
  dcr::protocol::peer_address p;
  dcr::throw_if_failed(dcr::protocol::parse_peer_address(text, p));
  return p;
}

/// Control channel options: the job key (empty: unauthenticated, for
/// loopback only) and the library's default deadlines.
inline dcr::protocol::channel_options channel_of(const dcr::seal_key& key) {
  dcr::protocol::channel_options o;
  o.key = key;
  return o;
}

/// How an owner server holds its rank's owner lease.
struct lease_args {
  bool hold = false;  ///< claim the lease at start (the commit store's owner lease)
  double ttl_s = 10;  ///< etcd: the lease's TTL
  double wait_s = -1; ///< < 0: 2 s (file store), TTL + 2 s (etcd)
};

/// The job's relay tree across processes (`--transport relay_tree` of the
/// C++ programs): every rollout node's relay address in node order, and the
/// fanout. Empty `nodes`: payloads go through the object store.
struct process_relay_args {
  std::vector<std::string> nodes;
  std::uint32_t fanout = 2;
};

/// This process's part of the relay tree: node `self` (a node server) or
/// only the writer to the root (an owner server).
inline std::unique_ptr<dcr::transport::process_relay>
make_process_relay(const process_relay_args& a, std::optional<std::uint32_t> self,
                   const dcr::seal_key& key) {
  dcr::transport::process_relay_options o;
  for (const auto& n : a.nodes) o.nodes.push_back(peer_of(n));
  o.self = self;
  o.fanout = a.fanout;
  o.key = key; // links authenticated, payload and stream digests keyed
  return std::make_unique<dcr::transport::process_relay>(std::move(o));
}

/// A control server's handler: the library's owner or node service over
/// this process's link, whichever medium the link reads or writes.
using control_handler = std::function<dcr::status(
    const dcr::protocol::control_frame&, const std::atomic<bool>&, dcr::protocol::body_writer&)>;

/// One trainer rank's owner, served on the control channel (file comment).
class py_owner_server {
public:
  using member = dcr::protocol::training_round::member;

  /// `version`: the committed version the owner's baseline holds (0 for a
  /// fresh job; a restarted rank passes the record's version after checking
  /// its baseline against it). `commits` may be null: commits are then not
  /// checked before the baseline moves (tests of the channel alone).
  /// `next_candidate(v)` (may be empty): called after the baseline moved to
  /// version v, inside that call, to set the candidate of v + 1 before the
  /// coordinator's next call reads it (a trainer that steps on its own, as
  /// `dcr-owner` does); a status it returns fails the next call.
  py_owner_server(owner& o, std::shared_ptr<any_store> store, std::shared_ptr<any_commits> commits,
                  std::uint64_t version, const std::string& host, unsigned short port,
                  const dcr::seal_key& key, const lease_args& lease,
                  std::function<dcr::status(std::uint64_t)> next_candidate = {},
                  const process_relay_args& relay = {})
      : owner_(&o), store_(std::move(store)), commits_(std::move(commits)), key_(key),
        next_(std::move(next_candidate)), base_(version) {
    const auto who = "owner " + std::to_string(o.rank());
    if (lease.hold) {
      if (!commits_)
        throw dcr::error(dcr::errc::invalid_argument,
                         who + ": an owner lease needs a commit store");
      const auto ttl =
          std::chrono::seconds(std::max<std::int64_t>(1, static_cast<std::int64_t>(lease.ttl_s)));
      const double wait =
          lease.wait_s >= 0 ? lease.wait_s : (commits_->is_etcd() ? lease.ttl_s + 2.0 : 2.0);
      dcr::throw_if_failed(commits_->claim_owner(
          o.rank(), ttl, std::chrono::milliseconds(static_cast<std::int64_t>(wait * 1e3))));
      leased_ = true;
    }
    dcr::protocol::owner_hooks h;
    h.verify_commit = [this, who](std::uint64_t tau, std::uint64_t v) -> dcr::status {
      if (!commits_) return dcr::status::success();
      dcr::protocol::stored_record r;
      DCR_TRY(commits_->load(r));
      DCR_RETURN_ERROR_IF(
          r.revision == 0 || r.record.version != v || r.record.attempt != tau, verification,
          who + ": the commit store does not hold version " + std::to_string(v) +
              " committed by attempt " + std::to_string(tau) + " (it holds version " +
              std::to_string(r.record.version) + ", attempt " + std::to_string(r.record.attempt) +
              "): baseline not moved");
      const auto base = version_now();
      DCR_RETURN_ERROR_IF(v != base + 1, verification,
                          who + ": commit of version " + std::to_string(v) + ", baseline is at " +
                              std::to_string(base));
      return dcr::status::success();
    };
    h.at_version = [this](std::uint64_t v) { return v == version_now(); };
    h.committed = [this](std::uint64_t v) {
      {
        std::lock_guard l(state_m_);
        base_ = v;
      }
      moved_.notify_all();
      if (next_) next_error_ = next_(v);
    };
    h.export_dense = [this, who](std::uint64_t v, const std::string& inc) -> dcr::status {
      DCR_RETURN_ERROR_IF(v != version_now(), not_found,
                          who + ": dense export of version " + std::to_string(v) +
                              ", the committed baseline is version " +
                              std::to_string(version_now()));
      dcr::transport::incarnation_scope<any_store> scoped(*store_, inc);
      for (auto s : owner_->owned_shards()) {
        const auto name = dcr::transport::dense_shard_name(v, s);
        DCR_TRY(scoped.put(
            name, dcr::transport::seal_dense_shard(inc, name, owner_->committed_shard(s), key_)));
      }
      return dcr::status::success();
    };
    // Payloads go to the object store or stream to the relay root; dense
    // exports go to the object store either way (the hook above).
    if (!relay.nodes.empty()) {
      relay_ = make_process_relay(relay, std::nullopt, key);
      serve_with(*relay_, std::move(h));
    } else {
      serve_with(*store_, std::move(h));
    }
    server_ = std::make_unique<dcr::protocol::control_server>(
        [this](const dcr::protocol::control_frame& f, const std::atomic<bool>& stop,
               dcr::protocol::body_writer& out) { return serve(f, stop, out); },
        channel_of(key));
    dcr::throw_if_failed(server_->listen(host, port));
  }
  ~py_owner_server() { close(); }

  unsigned short port() const noexcept { return server_->port(); }
  /// The version the baseline holds.
  std::uint64_t version_now() const {
    std::lock_guard l(state_m_);
    return base_;
  }
  /// Wait (GIL released by the caller) until the baseline holds `v`;
  /// false after `timeout_s`.
  bool wait_committed(std::uint64_t v, double timeout_s) {
    std::unique_lock l(state_m_);
    return moved_.wait_for(l, std::chrono::duration<double>(timeout_s), [&] { return base_ >= v; });
  }
  /// Runs `f` between calls: the candidate may be replaced only while no
  /// call reads it (a publish builds from it on a server thread).
  template <class F>
  void between_calls(F&& f) {
    std::lock_guard l(one_call_);
    f();
  }
  std::string lease_token() const { return leased_ ? commits_->owner_token() : std::string(); }
  /// Stop serving (every running call is stopped and answered first).
  void close() {
    if (server_) server_->shutdown();
    if (relay_) relay_->shutdown();
  }

private:
  dcr::status serve(const dcr::protocol::control_frame& f, const std::atomic<bool>& stop,
                    dcr::protocol::body_writer& out) {
    using dcr::protocol::control_type;
    std::lock_guard l(one_call_);
    if (!next_error_) {
      auto e = std::exchange(next_error_, dcr::status::success());
      e.message = "owner " + std::to_string(owner_->rank()) + ": next candidate: " + e.message;
      return e;
    }
    // The fence of the owner lease (owner.cpp does the same): a process that
    // lost its lease publishes, exports and moves its baseline no more, and
    // a write is answered with success only if the lease was held after it.
    const bool writes = f.type == control_type::publish || f.type == control_type::export_dense;
    if (leased_ && (writes || f.type == control_type::commit_baseline))
      DCR_TRY(commits_->hold_owner()); // claims the id again if it lapsed in a partition
    DCR_TRY(service_(f, stop, out));
    if (leased_ && writes) DCR_TRY(commits_->check_owner());
    return dcr::status::success();
  }

  template <class Medium>
  void serve_with(Medium& medium, dcr::protocol::owner_hooks h) {
    using link = dcr::protocol::local_owner_link<member, Medium>;
    struct held {
      link l;
      dcr::protocol::owner_service<link> s;
      held(member& m, Medium& md, dcr::protocol::owner_hooks hk) : l(m, md), s(l, std::move(hk)) {}
    };
    auto p = std::make_shared<held>(owner_->member(), medium, std::move(h));
    service_ = [p](const dcr::protocol::control_frame& f, const std::atomic<bool>& stop,
                   dcr::protocol::body_writer& out) { return p->s(f, stop, out); };
  }

  owner* owner_;
  std::shared_ptr<any_store> store_;
  std::shared_ptr<any_commits> commits_;
  dcr::seal_key key_;
  std::function<dcr::status(std::uint64_t)> next_;
  dcr::status next_error_ = dcr::status::success();
  bool leased_ = false;
  mutable std::mutex state_m_;
  std::condition_variable moved_;
  std::uint64_t base_ = 0;
  std::mutex one_call_;
  std::unique_ptr<dcr::transport::process_relay> relay_; // with a relay tree
  control_handler service_; // the owner service over its link (holds both)
  std::unique_ptr<dcr::protocol::control_server> server_;
};

/// A rollout node of Python receivers, served on the control channel.
class py_node_server {
public:
  using endpoint = dcr::protocol::receiver_endpoint<py_receiver>;

  /// `receivers`: (id, receiver) pairs at the committed version. `restore`
  /// (may be None): `restore(id)` returns a new receiver restored densely to
  /// the committed version. `verify` (may be None): `verify(version,
  /// incarnation)` returns, per receiver in order, whether it equals a
  /// dense load of that version (the coordinator's `verify`). `gate`: the
  /// receivers' applies wait for in-flight requests admitted through
  /// `admit()` and hold new ones back until the transition ends. `relay`
  /// (nodes given): payloads come from node `relay_node` of the relay tree,
  /// which this server hosts, instead of the object store.
  py_node_server(std::vector<std::pair<std::string, py::object>> receivers, py::object digest_parts,
                 py::object restore, py::object verify, std::shared_ptr<any_store> store,
                 bool fetch_all, bool gate, const std::string& host, unsigned short port,
                 const dcr::seal_key& key, const process_relay_args& relay = {},
                 std::uint32_t relay_node = 0)
      : store_(std::move(store)), verify_(std::move(verify)) {
    if (receivers.empty())
      throw dcr::error(dcr::errc::invalid_argument, "node server: no receivers");
    if (gate) gate_ = std::make_unique<dcr::protocol::request_gate>();
    endpoints_ = make_endpoints(std::move(receivers), digest_parts, restore, gate_.get());
    if (!relay.nodes.empty()) {
      if (relay_node >= relay.nodes.size())
        throw dcr::error(dcr::errc::invalid_argument, "node server: relay node " +
                                                          std::to_string(relay_node) + " of " +
                                                          std::to_string(relay.nodes.size()));
      relay_ = make_process_relay(relay, relay_node, key);
      serve_with(*relay_, fetch_all, relay_node);
    } else {
      serve_with(*store_, fetch_all, 0);
    }
    server_ = std::make_unique<dcr::protocol::control_server>(
        [this](const dcr::protocol::control_frame& f, const std::atomic<bool>& stop,
               dcr::protocol::body_writer& out) { return service_(f, stop, out); },
        channel_of(key));
    dcr::throw_if_failed(server_->listen(host, port));
  }
  ~py_node_server() {
    close();
    py::gil_scoped_acquire gil; // the receivers hold Python objects
    service_ = nullptr;
    relay_.reset();
    endpoints_.clear();
    verify_ = py::object();
  }

  unsigned short port() const noexcept { return server_->port(); }
  std::vector<std::string> ids() const {
    std::vector<std::string> v;
    for (auto& e : endpoints_) v.push_back(e->id());
    return v;
  }
  dcr::protocol::request_gate* gate() const noexcept { return gate_.get(); }
  dcr::protocol::endpoint_counters counters(const std::string& id) const {
    for (auto& e : endpoints_)
      if (e->id() == id) return e->counters();
    throw dcr::error(dcr::errc::not_found, "no receiver '" + id + "' at this node");
  }
  /// Stop serving: the control server (every running call is stopped and
  /// answered first), then the relay node, whose address is free then.
  void close() {
    if (server_) server_->shutdown();
    if (relay_) relay_->shutdown();
  }

private:
  template <class Medium>
  void serve_with(Medium& medium, bool fetch_all, std::size_t reader_index) {
    using link = dcr::protocol::local_node_link<py_receiver, Medium>;
    using service = dcr::protocol::node_service<link>;
    std::vector<endpoint*> eps;
    for (auto& e : endpoints_) eps.push_back(e.get());
    typename service::verifier v;
    if (!verify_.is_none())
      v = [this](std::uint64_t version, const std::string& inc, std::vector<bool>& equal,
                 std::vector<dcr::digest128>& digests) {
        return run_verify(version, inc, equal, digests);
      };
    struct held {
      link l;
      service s;
      held(std::vector<endpoint*> e, Medium& m, std::size_t i, typename service::verifier vf)
          : l(std::move(e), m, i), s(l, std::move(vf)) {}
    };
    auto p = std::make_shared<held>(std::move(eps), medium, reader_index, std::move(v));
    p->l.fetch_all(fetch_all);
    service_ = [p](const dcr::protocol::control_frame& f, const std::atomic<bool>& stop,
                   dcr::protocol::body_writer& out) { return p->s(f, stop, out); };
  }

  dcr::status run_verify(std::uint64_t version, const std::string& inc, std::vector<bool>& equal,
                         std::vector<dcr::digest128>& digests) {
    py::gil_scoped_acquire gil;
    try {
      auto got = verify_(version, inc).cast<std::vector<bool>>();
      DCR_RETURN_ERROR_IF(got.size() != endpoints_.size(), invalid_argument,
                          "verify returned " + std::to_string(got.size()) + " results for " +
                              std::to_string(endpoints_.size()) + " receivers");
      equal = std::move(got);
    } catch (py::error_already_set& e) {
      return status_of(e, "node verify");
    } catch (const py::cast_error& e) {
      return dcr::fail(dcr::errc::invalid_argument,
                       std::string("node verify: expected a list of bools: ") + e.what());
    }
    digests.assign(endpoints_.size(), {});
    for (std::size_t k = 0; k < endpoints_.size(); ++k) {
      if (!endpoints_[k]->alive()) {
        equal[k] = false;
        continue;
      }
      endpoints_[k]->with_receiver([&](py_receiver& r) { digests[k] = r.state_digest(); });
    }
    return dcr::status::success();
  }

  std::shared_ptr<any_store> store_;
  py::object verify_;
  std::unique_ptr<dcr::protocol::request_gate> gate_;
  std::vector<std::unique_ptr<endpoint>> endpoints_;
  std::unique_ptr<dcr::transport::process_relay> relay_; // with a relay tree
  control_handler service_; // the node service over its link (holds both)
  std::unique_ptr<dcr::protocol::control_server> server_;
};

/// The coordinator of owner and node processes (file comment).
class py_cluster_coordinator {
public:
  using run_t =
      dcr::protocol::link_coordinator<dcr::protocol::remote_owner_link,
                                      dcr::protocol::remote_node_link, any_store, any_commits>;

  /// `owners[k]`: the address of owner k's server; `nodes`: the nodes'
  /// servers. Each is connected now, waiting up to `connect_wait_s` for a
  /// peer that is not listening yet (a process still starting).
  py_cluster_coordinator(std::shared_ptr<any_commits> commits, std::shared_ptr<any_store> store,
                         const std::vector<std::string>& owners,
                         const std::vector<std::string>& nodes, const coordinator_args& a,
                         bool asynchronous, const dcr::seal_key& key, double connect_wait_s)
      : commits_(std::move(commits)), store_(std::move(store)) {
    if (owners.empty()) throw dcr::error(dcr::errc::invalid_argument, "coordinator: no owners");
    if (nodes.empty()) throw dcr::error(dcr::errc::invalid_argument, "coordinator: no nodes");
    const auto until = std::chrono::steady_clock::now() +
                       std::chrono::milliseconds(static_cast<std::int64_t>(connect_wait_s * 1e3));
    auto patiently = [&](auto&& f) {
      for (;;) {
        auto s = f();
        if (s || s.code != dcr::errc::unavailable || std::chrono::steady_clock::now() > until)
          return s;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    };
    std::vector<dcr::protocol::remote_owner_link*> op;
    std::vector<dcr::protocol::remote_node_link*> np;
    for (std::uint32_t k = 0; k < owners.size(); ++k) {
      owners_.push_back(std::make_unique<dcr::protocol::remote_owner_link>(k, peer_of(owners[k]),
                                                                           channel_of(key)));
      dcr::throw_if_failed(patiently([&] { return owners_.back()->connect(); }));
      op.push_back(owners_.back().get());
    }
    for (auto& n : nodes) {
      nodes_.push_back(
          std::make_unique<dcr::protocol::remote_node_link>(peer_of(n), channel_of(key)));
      dcr::throw_if_failed(patiently([&] { return nodes_.back()->connect(); }));
      np.push_back(nodes_.back().get());
    }
    dcr::protocol::coordinator_options o;
    o.mode =
        asynchronous ? dcr::protocol::rl_mode::asynchronous : dcr::protocol::rl_mode::synchronous;
    o.max_attempts = a.max_attempts;
    o.attempt_deadline =
        std::chrono::milliseconds(static_cast<std::int64_t>(a.attempt_deadline_s * 1e3));
    o.collect_garbage = a.collect_garbage;
    run_ = std::make_unique<run_t>(*commits_, *store_, std::move(op), std::move(np), o);
  }

  std::uint64_t take_over() {
    dcr::throw_if_failed(run_->take_over());
    return run_->epoch();
  }
  void bootstrap() { dcr::throw_if_failed(run_->bootstrap()); }
  dcr::protocol::transition_report transition() { return run_->transition(); }
  std::uint64_t epoch() const { return run_->epoch(); }
  /// Every node's receiver ids, in node order (the order of the record's
  /// receivers).
  std::vector<std::vector<std::string>> node_ids() const {
    std::vector<std::vector<std::string>> out;
    for (auto& n : nodes_) out.push_back(n->ids());
    return out;
  }
  /// Every receiver against a dense load of the committed version at its
  /// node (the owners' dense export first): (id, equal, digest) per
  /// receiver, in node order.
  std::vector<std::tuple<std::string, bool, std::string>> verify() {
    dcr::protocol::stored_record cur;
    dcr::throw_if_failed(commits_->load(cur));
    for (auto& o : owners_)
      dcr::throw_if_failed(o->export_dense(cur.record.version, cur.record.incarnation));
    std::vector<std::tuple<std::string, bool, std::string>> out;
    for (auto& n : nodes_) {
      std::vector<bool> eq;
      std::vector<dcr::digest128> d;
      dcr::throw_if_failed(n->verify(cur.record.version, cur.record.incarnation, eq, d));
      const auto ids = n->ids();
      for (std::size_t i = 0; i < ids.size() && i < eq.size(); ++i)
        out.emplace_back(ids[i], eq[i], hex(d[i]));
    }
    return out;
  }
  /// Drop a receiver's storage at its node (as a crash would).
  void kill(const std::string& id) {
    for (auto& n : nodes_)
      for (auto& i : n->ids())
        if (i == id) {
          dcr::throw_if_failed(n->kill(id));
          return;
        }
    throw dcr::error(dcr::errc::not_found, "no receiver '" + id + "'");
  }

private:
  std::shared_ptr<any_commits> commits_;
  std::shared_ptr<any_store> store_;
  std::vector<std::unique_ptr<dcr::protocol::remote_owner_link>> owners_;
  std::vector<std::unique_ptr<dcr::protocol::remote_node_link>> nodes_;
  std::unique_ptr<run_t> run_;
};

} // namespace dcr_py
