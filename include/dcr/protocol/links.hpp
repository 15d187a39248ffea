#pragma once
/// \file
/// Links: what the coordinator does at one owner and at one rollout node,
/// as operations it calls, so that the same coordinator drives roles in its
/// own process (`local_owner_link`, `local_node_link`: the work runs on the
/// caller's thread) and roles in other processes (`remote_owner_link`,
/// `remote_node_link` in remote_links.hpp: the same local links run in the
/// owner or rollout process, which has its own connection to the medium, so
/// payload bytes never pass through the coordinator).
///
/// Owner side, per attempt τ: `publish` = build the changed set, upload
/// every payload (payload ℓ uploads while ℓ+1 is built), then the manifest.
/// Rollout side, per attempt τ: `refit` = fetch every payload of τ once per
/// node, stage/apply it at each of the node's receivers (ℓ applied while
/// ℓ+1 is fetched), check that exactly the listed payloads were staged,
/// finish, and return one ACK digest per receiver.
///
/// Every call carries the attempt id; a call of a replaced attempt is
/// refused (`errc::stale_attempt`) or ignored exactly as the endpoint and
/// request gate do it (endpoint.hpp, request_gate.hpp).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <concepts>
#include <cstdint>
#include <ctime>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "dcr/codec/payload_decode.hpp"
#include "dcr/core/error.hpp"
#include "dcr/core/hash.hpp"
#include "dcr/pipeline/stage.hpp"
#include "dcr/protocol/endpoint.hpp"
#include "dcr/protocol/request_gate.hpp"
#include "dcr/protocol/roles.hpp"
#include "dcr/transport/attempt_objects.hpp"
#include "dcr/transport/attempt_transport.hpp"
#include "dcr/transport/object_store.hpp"

namespace dcr::protocol {

/// What the coordinator asks one owner to publish in attempt τ.
struct publish_request {
  std::uint64_t attempt = 0;
  std::uint64_t target_version = 0;
  refit_mode mode = refit_mode::mixed;
  /// The commit history's incarnation: object-store names are scoped under it.
  std::string incarnation;
  std::size_t upload_queue = 2; ///< payloads built ahead of upload
};

/// What publishing took.
struct publish_report {
  std::size_t payloads = 0;
  std::uint64_t bytes = 0;
  double construct_seconds = 0; ///< inside build, excluding waits on a full upload queue
  double upload_seconds = 0;    ///< puts, manifest included
  /// The digest of the manifest bytes the owner wrote (object stores; a
  /// transport without manifests leaves `manifest_bound` false). The
  /// coordinator binds the attempt to it: every node must have read exactly
  /// this manifest for the owner, or the attempt fails.
  bool manifest_bound = false;
  digest128 manifest_digest{};
  /// With `manifest_bound`: the digest is of a manifest object the owner
  /// wrote into the attempt's object store, which the coordinator reads back
  /// after a failed attempt to judge what the receivers staged; false where
  /// it is a stream digest of a transport without manifests (a relay tree),
  /// which only the nodes' reports can be compared with.
  bool manifest_stored = false;
  /// Where the medium keeps no manifest (a relay tree): the digest of each
  /// payload the owner sent, in sequence order (entry ℓ is sequence ℓ). After
  /// a failed attempt the coordinator judges what the receivers staged of
  /// this owner by it, as it judges them by the manifest elsewhere.
  std::vector<digest128> payload_digests;
};

/// What the coordinator asks one rollout node to do in attempt τ.
struct refit_request {
  std::uint64_t attempt = 0;
  std::string incarnation;
  std::vector<std::uint32_t> owners; ///< every owner whose manifest completes τ
  bool synchronous = true;           ///< apply as fetched (else stage, close the gate, apply)
  std::size_t apply_queue = 8;       ///< fetched payloads waiting for apply
  std::chrono::steady_clock::time_point deadline{};
};

/// What refitting produced: the node's receivers' ACKs, in `ids()` order.
struct refit_result {
  std::vector<digest128> acks;
  double fetch_seconds = 0; ///< gets, incl. polling, excluding apply
  double apply_seconds = 0; ///< staging + applying
  /// CPU time of the busiest receiver in staging + applying + finishing
  /// (beside the wall time, which on a loaded machine also counts waiting)
  double apply_cpu_seconds = 0;
  /// Per owner, the digest of the manifest bytes the node's reader took as
  /// that owner's (object stores; empty where the transport has none).
  std::vector<std::pair<std::uint32_t, digest128>> manifests;
};

/// The committed version a node's dead receivers are restored to:
/// `committed[id]` is the digest receiver `id` must reach (absent: none
/// committed yet); version and incarnation name where a dense copy of that
/// version lies (nodes in other processes fetch it; local ones ignore them).
struct membership {
  std::uint64_t version = 0;
  std::string incarnation;
  std::map<std::string, digest128> committed;
};

/// What one receiver staged in attempt τ: (object name, payload digest).
struct staged_set {
  std::string receiver;
  std::vector<std::pair<std::string, digest128>> payloads;
};

/// The coordinator's view of one owner.
///
/// Laws: `publish` uploads the owner's complete changed set of τ and then its
/// manifest, or fails with a typed status (a `stop` seen mid-way is
/// `errc::aborted`); a `publish` of an attempt older than one already
/// published is `errc::stale_attempt` and writes nothing; `commit_baseline(τ, v)`
/// is called only after K^v committed attempt τ; the digests are those of
/// `owner_role`. A link to a peer that is gone fails every call with
/// `errc::unavailable` within its stated deadline. The coordinator calls the
/// owners of one step (digests, publish, commit_baseline, dense export) each
/// on its own thread, so calls on distinct links overlap (unless
/// `link_calls_concurrent` says no); one link gets one call at a time.
template <class L>
concept owner_link = requires(L& l, const L& cl, const publish_request& rq,
                              const std::atomic<bool>& stop, publish_report& rep, digest128& d,
                              std::uint64_t a) {
  { cl.owner_id() } -> std::convertible_to<std::uint32_t>;
  { l.publish(rq, stop, rep) } -> std::same_as<status>;
  { l.commit_baseline(a, a) } -> std::same_as<status>;
  { l.baseline_digest(d) } -> std::same_as<status>;
  { l.candidate_digest(d) } -> std::same_as<status>;
};

/// The coordinator's view of one rollout node serving `ids()` receivers.
///
/// Laws: `ensure_member` restores every dead receiver densely to the
/// committed version (its digest must equal `m.committed[id]` when present,
/// else `errc::verification`) and reports how many it restored; `begin`,
/// `close_gate`, `open_gate` are ignored for attempts older than the newest
/// seen; `refit` of an attempt that is not the current one is
/// `errc::stale_attempt`; `acknowledge(τ)` is `finish` without payloads (the
/// first commit); `kill(id)` drops that receiver's storage. `refit` runs on a
/// thread per node; the other calls of one step (down, ensure_member, begin,
/// gates) too where `link_calls_concurrent` allows; one link gets one call at
/// a time.
template <class L>
concept node_link = requires(L& l, const L& cl, std::uint64_t a, const membership& m,
                             std::size_t& n, const refit_request& rq, const std::atomic<bool>& stop,
                             refit_result& res, std::vector<digest128>& acks,
                             std::vector<staged_set>& staged, const std::string& id) {
  { cl.ids() } -> std::convertible_to<std::vector<std::string>>;
  { l.ensure_member(m, n) } -> std::same_as<status>;
  { l.begin(a) } -> std::same_as<status>;
  { l.close_gate(a) } -> std::same_as<status>;
  { l.open_gate(a) } -> std::same_as<status>;
  { l.refit(rq, stop, res) } -> std::same_as<status>;
  { l.acknowledge(a, acks) } -> std::same_as<status>;
  { l.staged_payloads(a, staged) } -> std::same_as<status>;
  { l.kill(id) } -> std::same_as<status>;
};

/// Whether the coordinator may call different links of type `L` at the same
/// time, one thread per link (it never calls one link from two threads at
/// once). Yes unless the type says `static constexpr bool concurrent_calls =
/// false;`. Remote links are separate connections to separate processes;
/// `local_owner_link` relies on the `owner_role` law that distinct owners'
/// calls may overlap; `local_node_link` says no (see there).
template <class L>
inline constexpr bool link_calls_concurrent = [] {
  if constexpr (requires {
                  { L::concurrent_calls } -> std::convertible_to<bool>;
                })
    return static_cast<bool>(L::concurrent_calls);
  else
    return true;
}();

/// `call(k)` for every link k in [0, n), each on its own thread when
/// `concurrent` (the calling thread takes link 0), else in index order up to
/// the first failure. Concurrently, every call runs to its end before this
/// returns, so a transition waits for its slowest link instead of the sum of
/// all links. A failure names its link (`name(k)`); several failures become
/// one status with the code of the first failed link in index order and
/// every failure in the message (index order, not completion order). An
/// exception a call throws is rethrown here, after every call has ended
/// (the lowest index's when several threw), as if the calls had run in turn.
template <class Call, class Name>
status call_links(std::size_t n, bool concurrent, Call&& call, Name&& name) {
  auto named = [&](std::size_t k, const status& s) {
    return fail(s.code, std::string(name(k)) + ": " + s.message);
  };
  if (!concurrent || n <= 1) {
    for (std::size_t k = 0; k < n; ++k)
      if (auto s = call(k); !s) return named(k, s);
    return status::success();
  }
  std::vector<status> st(n, status::success());
  std::vector<std::exception_ptr> thrown(n);
  auto run = [&](std::size_t k) noexcept {
    try {
      st[k] = call(k);
    } catch (...) {
      thrown[k] = std::current_exception();
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(n - 1);
  for (std::size_t k = 1; k < n; ++k) {
    try {
      threads.emplace_back(run, k);
    } catch (const std::system_error&) {
      run(k); // no thread to be had: this link's call runs here, in turn
    }
  }
  run(0);
  for (auto& t : threads) t.join();
  for (auto& e : thrown)
    if (e) std::rethrow_exception(e);
  std::size_t failed = 0, first = n;
  for (std::size_t k = 0; k < n; ++k)
    if (!st[k]) {
      ++failed;
      first = std::min(first, k);
    }
  if (failed == 0) return status::success();
  if (failed == 1) return named(first, st[first]);
  std::string msg = std::to_string(failed) + " of " + std::to_string(n) + " failed: ";
  for (std::size_t k = first; k < n; ++k)
    if (!st[k]) msg += (k == first ? "" : "; ") + named(k, st[k]).message;
  return fail(st[first].code, std::move(msg));
}

namespace detail {
using link_clock = std::chrono::steady_clock;
inline double seconds_since(link_clock::time_point t) {
  return std::chrono::duration<double>(link_clock::now() - t).count();
}
/// CPU time of the calling thread (POSIX), for `refit_result::apply_cpu_seconds`.
inline double thread_cpu_seconds() noexcept {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

/// Run `f(medium)` on `store` seen through incarnation `inc` (object stores),
/// or on the transport itself.
template <class Store, class F>
decltype(auto) with_medium(Store& store, const std::string& inc, F&& f) {
  if constexpr (transport::object_store<Store>) {
    if (inc.empty()) return f(store);
    transport::incarnation_scope<Store> scoped(store, inc);
    return f(scoped);
  } else {
    return f(store);
  }
}
} // namespace detail

/// An owner in this process, publishing to `Store` (an object store or an
/// attempt transport) on the caller's thread.
template <owner_role Owner, transport::attempt_medium Store>
class local_owner_link {
public:
  local_owner_link(Owner& owner, Store& store) : o_(&owner), store_(&store) {}

  std::uint32_t owner_id() const { return o_->owner_id(); }
  Owner& owner() noexcept { return *o_; }

  status publish(const publish_request& rq, const std::atomic<bool>& stop, publish_report& rep) {
    {
      std::lock_guard l(m_);
      DCR_RETURN_ERROR_IF(rq.attempt < newest_, stale_attempt,
                          "owner " + std::to_string(owner_id()) + ": publish of attempt " +
                              std::to_string(rq.attempt) + ", replaced by attempt " +
                              std::to_string(newest_));
      newest_ = rq.attempt;
    }
    return detail::with_medium(*store_, rq.incarnation,
                               [&](auto& medium) { return publish_on(medium, rq, stop, rep); });
  }
  status commit_baseline(std::uint64_t, std::uint64_t) {
    o_->commit_baseline();
    return status::success();
  }
  status baseline_digest(digest128& d) {
    d = o_->baseline_digest();
    return status::success();
  }
  status candidate_digest(digest128& d) {
    d = o_->candidate_digest();
    return status::success();
  }

private:
  template <class Medium>
  status publish_on(Medium& medium, const publish_request& rq, const std::atomic<bool>& stop,
                    publish_report& rep) {
    using detail::link_clock;
    using detail::seconds_since;
    const auto tau = rq.attempt;
    auto w = transport::open_writer(medium, tau, o_->owner_id());
    // Build on a producer thread, upload on this one, joined by one bounded
    // queue (pipeline::run): the upload of payload l overlaps the
    // construction of l+1, and a full queue is the builder's backpressure.
    double blocked = 0;
    status built = status::success();
    const auto tb = link_clock::now();
    status up = pipeline::run_status<std::vector<std::byte>>(
        pipeline::chain<>{},
        [&](auto&& emit) {
          built = o_->build(
              {tau, rq.target_version, rq.mode}, [&](std::vector<std::byte>&& p) -> status {
                DCR_RETURN_ERROR_IF(stop.load(), aborted,
                                    "attempt " + std::to_string(tau) + " stopped");
                const auto tq = link_clock::now();
                const bool ok = emit(std::move(p));
                blocked += seconds_since(tq);
                DCR_RETURN_ERROR_IF(!ok, aborted,
                                    "upload of attempt " + std::to_string(tau) + " failed");
                return status::success();
              });
          rep.construct_seconds = seconds_since(tb) - blocked;
        },
        [&](std::vector<std::byte>&& p) {
          const auto tp = link_clock::now();
          auto st = stop ? fail(errc::aborted, "attempt stopped") : put(w, p);
          rep.upload_seconds += seconds_since(tp);
          throw_if_failed(st);
          if constexpr (!transport::object_store<Medium>) rep.payload_digests.push_back(digest(p));
          rep.payloads += 1;
          rep.bytes += p.size();
        },
        rq.upload_queue);
    if (!built) {
      built.message = "owner " + std::to_string(o_->owner_id()) + ": " + built.message;
      return built;
    }
    DCR_TRY(up);
    DCR_RETURN_ERROR_IF(stop.load(), aborted, "attempt " + std::to_string(tau) + " stopped");
    const auto tp = link_clock::now();
    auto s = w.finish();
    rep.upload_seconds += seconds_since(tp);
    if constexpr (requires { w.manifest_digest(); }) {
      if (s) {
        rep.manifest_bound = true;
        rep.manifest_digest = w.manifest_digest();
        rep.manifest_stored = transport::object_store<Medium>;
      }
    }
    return s;
  }

  /// Upload one payload; where the writer keeps a tensor index (object
  /// stores, manifest version 3), with the tensors the payload's table
  /// names. A payload whose table cannot be read is listed without an
  /// index: every node fetches it, and its receivers refuse it as before.
  template <class Writer>
  static status put(Writer& w, std::span<const std::byte> p) {
    if constexpr (requires(std::vector<std::string> t) { w.put_payload(p, std::move(t)); }) {
      std::vector<std::string> tensors;
      if (codec::payload_tensors(p, tensors)) return w.put_payload(p, std::move(tensors));
    }
    return w.put_payload(p);
  }

  Owner* o_;
  Store* store_;
  std::mutex m_;
  std::uint64_t newest_ = 0;
};

/// What a node's reader fetched and skipped, over all attempts since the
/// node started (object stores with a manifest index; a relay tree's
/// reader reports nothing skipped).
struct node_fetch_totals {
  std::uint64_t payloads = 0, bytes = 0;                 ///< fetched
  std::uint64_t skipped_payloads = 0, skipped_bytes = 0; ///< listed, not needed here
};

/// A rollout node in this process: its receivers' endpoints (one per serving
/// rank), fed by one reader of `Store`, so that each payload is fetched once
/// per node. `reader_index` is the node's index for transports with
/// per-reader state (a relay tree's leaf slots); object stores ignore it.
template <receiver_role Receiver, transport::attempt_medium Store>
class local_node_link {
public:
  using endpoint = receiver_endpoint<Receiver>;
  /// The coordinator calls in-process nodes one after the other outside
  /// `refit` (which runs concurrently across nodes, as the endpoints allow):
  /// `ensure_member` runs the application's receiver factory and dense
  /// restore, which `receiver_role` does not require to be safe to run for
  /// several receivers at once; the other calls only flip endpoint state.
  static constexpr bool concurrent_calls = false;

  local_node_link(std::vector<endpoint*> endpoints, Store& store, std::size_t reader_index = 0)
      : eps_(std::move(endpoints)), store_(&store), index_(reader_index) {
    if (eps_.empty()) throw error(errc::invalid_argument, "local_node_link: no receivers");
  }

  /// Fetch every listed payload (true, the default), or only those whose
  /// index entry names a tensor one of the node's receivers needs
  /// (false; `receiver_endpoint::needs`): an expert-parallel node skips the
  /// payloads of experts it holds nothing of. Either way a payload reaches
  /// the receivers only once its owner's manifest lists it with its digest;
  /// filtered, a stray object no manifest lists is dropped and does not
  /// fail the attempt (unfiltered it does: attempt_reader.hpp).
  void fetch_all(bool all) noexcept { fetch_all_ = all; }
  /// Whether the node's reader reads each manifest a second time before it
  /// completes (true, the default). The coordinator compares the manifest
  /// digests each node reports with those the owners reported writing
  /// (`coordinator::check_manifest_binding`), which catches a second
  /// manifest under an owner's name as well; false saves one GET per owner
  /// per node at the end of the fetch.
  void recheck_manifests(bool on) noexcept { recheck_ = on; }
  /// Fetched and skipped payloads so far.
  node_fetch_totals fetch_totals() const {
    std::lock_guard l(totals_m_);
    return totals_;
  }

  std::vector<std::string> ids() const {
    std::vector<std::string> v;
    for (auto* e : eps_) v.push_back(e->id());
    return v;
  }
  const std::vector<endpoint*>& endpoints() const noexcept { return eps_; }

  /// How many of the node's receivers hold no storage (need a restore).
  status down(std::size_t& n) {
    n = 0;
    for (auto* e : eps_) n += e->alive() ? 0 : 1;
    return status::success();
  }
  status ensure_member(const membership& m, std::size_t& restored) {
    restored = 0;
    for (auto* e : eps_) {
      const auto it = m.committed.find(e->id());
      const bool was_alive = e->alive();
      DCR_TRY(e->ensure_member(it == m.committed.end() ? nullptr : &it->second));
      restored += was_alive ? 0 : 1;
    }
    return status::success();
  }
  status begin(std::uint64_t tau) {
    for (auto* e : eps_) e->begin(tau);
    return status::success();
  }
  status close_gate(std::uint64_t tau) {
    for (auto* e : eps_) e->close_gate(tau);
    return status::success();
  }
  status open_gate(std::uint64_t tau) {
    for (auto* e : eps_) e->open_gate(tau);
    return status::success();
  }
  status acknowledge(std::uint64_t tau, std::vector<digest128>& acks) {
    acks.assign(eps_.size(), {});
    for (std::size_t k = 0; k < eps_.size(); ++k) DCR_TRY(eps_[k]->finish(tau, acks[k]));
    return status::success();
  }
  status staged_payloads(std::uint64_t tau, std::vector<staged_set>& out) {
    out.clear();
    for (auto* e : eps_) out.push_back({e->id(), e->staged_payloads(tau)});
    return status::success();
  }
  status kill(const std::string& id) {
    for (auto* e : eps_)
      if (e->id() == id) {
        e->kill();
        return status::success();
      }
    return fail(errc::not_found, "no receiver '" + id + "' at this node");
  }

  status refit(const refit_request& rq, const std::atomic<bool>& stop, refit_result& res) {
    for (auto* e : eps_)
      DCR_RETURN_ERROR_IF(e->attempt() != rq.attempt, stale_attempt,
                          "receiver " + e->id() + ": refit of attempt " +
                              std::to_string(rq.attempt) + ", current attempt is " +
                              std::to_string(e->attempt()));
    return detail::with_medium(*store_, rq.incarnation,
                               [&](auto& medium) { return refit_on(medium, rq, stop, res); });
  }

private:
  template <class Medium>
  status refit_on(Medium& medium, const refit_request& rq, const std::atomic<bool>& stop,
                  refit_result& res) {
    using detail::link_clock;
    using detail::seconds_since;
    const auto tau = rq.attempt;
    const bool sync = rq.synchronous;
    struct fetched {
      std::string name;
      std::vector<std::byte> bytes;
    };
    // Fetch on a producer thread, apply on this one (pipeline::run): the
    // fetch of payload l+1 overlaps the application of l. Each fetched
    // payload goes to every receiver of the node (in parallel when there are
    // several), so the node reads it once.
    auto reader = transport::open_reader(medium, tau, index_, rq.owners);
    if constexpr (requires { reader.recheck_manifests(false); }) reader.recheck_manifests(recheck_);
    if constexpr (requires { reader.need_only(transport::tensor_filter{}); }) {
      if (!fetch_all_)
        reader.need_only([this](std::string_view t) {
          for (auto* e : eps_)
            if (e->needs(t)) return true;
          return false;
        });
    }
    // Counted when the reader is done, whatever the outcome.
    struct count_fetches {
      local_node_link* link;
      decltype(reader)& r;
      ~count_fetches() {
        std::lock_guard l(link->totals_m_);
        if constexpr (requires { r.delivered_bytes(); }) {
          link->totals_.payloads += r.delivered();
          link->totals_.bytes += r.delivered_bytes();
          link->totals_.skipped_payloads += r.skipped();
          link->totals_.skipped_bytes += r.skipped_bytes();
        }
      }
    } counted{this, reader};
    status s = status::success();
    double apply = 0;
    // CPU time per receiver, measured on whichever thread serves it.
    std::vector<double> cpu(eps_.size());
    auto timed = [&](endpoint& e, auto&& f) {
      const auto k =
          static_cast<std::size_t>(std::find(eps_.begin(), eps_.end(), &e) - eps_.begin());
      const double c0 = detail::thread_cpu_seconds();
      auto st = f();
      cpu[k] += detail::thread_cpu_seconds() - c0;
      return st;
    };
    auto report_cpu = [&] {
      for (auto c : cpu) res.apply_cpu_seconds = std::max(res.apply_cpu_seconds, c);
    };
    const auto tf = link_clock::now();
    status applied = pipeline::run_status<fetched>(
        pipeline::chain<>{},
        [&](auto&& emit) {
          s = reader.run(
              [&](std::string_view name, std::span<const std::byte> b) -> status {
                DCR_RETURN_ERROR_IF(!emit(fetched{std::string(name), {b.begin(), b.end()}}),
                                    aborted, "node of " + eps_.front()->id() + ": apply failed");
                return status::success();
              },
              stop, rq.deadline);
        },
        [&](fetched&& p) {
          const auto ta = link_clock::now();
          throw_if_failed(each_endpoint([&](endpoint& e) {
            return timed(e, [&] { return e.deliver(tau, p.name, p.bytes, sync); });
          }));
          apply += seconds_since(ta);
        },
        rq.apply_queue);
    res.fetch_seconds = seconds_since(tf) - apply;
    res.apply_seconds = apply;
    DCR_TRY(applied);
    if (!s) {
      s.message = "receiver " + eps_.front()->id() + ": " + s.message;
      return s;
    }
    if constexpr (requires { reader.listed(); }) {
      // Exactly the listed payloads were staged, digest for digest, or the
      // receiver may not acknowledge (async: before anything is applied).
      const auto listed = reader.listed();
      for (auto* e : eps_) {
        const auto staged = e->staged_digests(tau);
        DCR_RETURN_ERROR_IF(listed != staged, verification,
                            "receiver " + e->id() + " staged " + std::to_string(staged.size()) +
                                " payload(s) of attempt " + std::to_string(tau) +
                                " that differ from the " + std::to_string(listed.size()) +
                                " the manifests list");
      }
    }
    const auto ta = link_clock::now();
    if (!sync) {
      // Asynchronous RL: everything is staged; stop serving v, then apply.
      for (auto* e : eps_) e->close_gate(tau);
      DCR_TRY(each_endpoint([&](endpoint& e) { return timed(e, [&] { return e.apply(tau); }); }));
    }
    res.acks.assign(eps_.size(), {});
    for (std::size_t k = 0; k < eps_.size(); ++k)
      DCR_TRY(timed(*eps_[k], [&] { return eps_[k]->finish(tau, res.acks[k]); }));
    res.apply_seconds += seconds_since(ta);
    report_cpu();
    res.manifests.clear();
    if constexpr (requires { reader.manifest_digests(); })
      for (auto& [o, d] : reader.manifest_digests()) res.manifests.emplace_back(o, d);
    return status::success();
  }

  /// `f(endpoint)` at every receiver of the node, concurrently when there are
  /// several; the first failure in receiver order.
  template <class F>
  status each_endpoint(F&& f) {
    if (eps_.size() == 1) return f(*eps_.front());
    std::vector<status> st(eps_.size(), status::success());
    std::vector<std::thread> t;
    for (std::size_t k = 1; k < eps_.size(); ++k) t.emplace_back([&, k] { st[k] = f(*eps_[k]); });
    st[0] = f(*eps_[0]);
    for (auto& x : t) x.join();
    for (auto& x : st) DCR_TRY(x);
    return status::success();
  }

  std::vector<endpoint*> eps_;
  Store* store_;
  std::size_t index_;
  bool fetch_all_ = true;
  bool recheck_ = true;
  mutable std::mutex totals_m_;
  node_fetch_totals totals_;
};

} // namespace dcr::protocol
