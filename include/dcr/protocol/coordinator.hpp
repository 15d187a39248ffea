#pragma once
/// \file
/// The coordinator: runs one transition v → v+1 as a sequence of attempts and
/// publishes it by joint commit (state machine and failure table in
/// docs/protocol.md).
///
/// Per attempt τ:
///   membership (restore dead receivers densely) → prepare (τ, fences older
///   attempts) → gate (sync: close) → begin(τ) at every receiver → owners
///   build and upload payloads (bucket ℓ+1 built while ℓ uploads) and then
///   their manifests; receivers fetch every payload as it appears and
///   stage/apply it (ℓ applied while ℓ+1 is fetched; async: stage only, then
///   close the gate and apply) → finish (flush, sync, check) → ACK(digest) →
///   compare-and-set K^v → K^{v+1} → owners commit their baselines → GC of
///   attempt objects → gate opens.
/// A failed attempt is stopped and waited for (`stop_and_wait`: every thread
/// of the attempt has ended, so none of its writes can land later; late
/// deliveries are fenced by τ anyway), and the transition retries with every
/// record an overwrite, computed again from the same candidate and the
/// unchanged baseline.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <time.h>

#include "dcr/core/error.hpp"
#include "dcr/pipeline/stage.hpp"
#include "dcr/protocol/commit_store.hpp"
#include "dcr/protocol/endpoint.hpp"
#include "dcr/protocol/request_gate.hpp"
#include "dcr/protocol/roles.hpp"
#include "dcr/transport/attempt_objects.hpp"
#include "dcr/transport/attempt_transport.hpp"
#include "dcr/transport/object_store.hpp"

namespace dcr::protocol {

/// Points where a test makes the coordinator die (it stops acting; what it
/// started is left exactly as it is at that point).
enum class crash_point {
  after_prepare,   ///< τ handed out, nothing streamed
  after_first_ack, ///< some receivers applied everything and acknowledged
  after_commit,    ///< K^{v+1} written, owners' baselines not yet updated
};

/// Timings and sizes of one attempt (seconds are wall-clock maxima over the
/// parallel workers of that kind).
struct attempt_report {
  std::uint64_t attempt = 0;
  refit_mode mode = refit_mode::mixed;
  status result;
  std::size_t payloads = 0;
  std::uint64_t payload_bytes = 0;
  double construct_seconds = 0; ///< owners inside build, excluding upload waits
  double upload_seconds = 0;    ///< owners' puts
  double fetch_seconds = 0;     ///< receivers' gets (incl. polling)
  double apply_seconds = 0;     ///< receivers staging + applying
  /// CPU time of the receivers' threads in staging + applying (max over
  /// receivers); `apply_seconds` minus this is time spent waiting for a core.
  double apply_cpu_seconds = 0;
  double wall_seconds = 0;
};

/// Outcome of one transition.
struct transition_report {
  status result;
  std::uint64_t committed_version = 0;
  bool rolled_forward = false; ///< found K^{v+1} committed, only finished the baselines
  std::vector<attempt_report> attempts;
  double restore_seconds = 0; ///< dense restores of restarted receivers
  double commit_seconds = 0;  ///< CAS + baseline update + GC
  double wall_seconds = 0;
  std::size_t collected_objects = 0;
};

/// Knobs of a coordinator (runtime values; what changes code paths is a template parameter).
struct coordinator_options {
  rl_mode mode = rl_mode::synchronous;
  std::size_t upload_queue = 2; ///< payloads built ahead of upload, per owner
  std::size_t apply_queue = 8;  ///< fetched payloads waiting for apply, per receiver
  int max_attempts = 4;
  std::chrono::milliseconds attempt_deadline{120000};
  bool collect_garbage = true;
  /// Test hook: return true to make the coordinator die at that point.
  std::function<bool(crash_point)> crash;
};

/// Drives owners and receiver endpoints over an object store or another
/// attempt transport (e.g. a relay tree), committing in a commit store.
template <owner_role Owner, receiver_role Receiver, transport::attempt_medium Store,
          commit_store Commits>
class coordinator {
public:
  using endpoint = receiver_endpoint<Receiver>;

  coordinator(Commits& commits, Store& store, std::vector<Owner*> owners,
              std::vector<endpoint*> receivers, coordinator_options opt = {})
      : commits_(&commits), store_(&store), owners_(std::move(owners)),
        receivers_(std::move(receivers)), opt_(std::move(opt)) {
    // A transport sized for another receiver set (a relay tree's reader
    // slots) would make readers wait for receivers that never come.
    if constexpr (requires {
                    { store.receiver_count() } -> std::convertible_to<std::size_t>;
                  })
      if (store.receiver_count() != receivers_.size())
        throw error(errc::invalid_argument,
                    "coordinator: transport serves " + std::to_string(store.receiver_count()) +
                        " receivers, " + std::to_string(receivers_.size()) + " given");
  }

  /// Become the active coordinator; fences every older one.
  status take_over() {
    DCR_TRY(check_alive());
    return commits_->take_over(epoch_);
  }
  std::uint64_t epoch() const noexcept { return epoch_; }
  bool dead() const noexcept { return dead_; }

  /// First commit (version 0): every receiver restored densely from the
  /// owners' baseline, then K^0 written by CAS on revision 0. A store that
  /// already holds a record is left as it is.
  status bootstrap() {
    DCR_TRY(check_alive());
    stored_record cur;
    DCR_TRY(commits_->load(cur));
    if (cur.revision != 0) return status::success();
    // No record: a fresh deployment, unless the object store still holds
    // attempt objects. Then the record that wrote them was lost or replaced,
    // and starting a new history next to them is the operator's decision.
    if constexpr (transport::object_store<Store>) {
      std::vector<std::string> names, more;
      DCR_TRY(store_->list("attempt/", names));
      DCR_TRY(store_->list("incarnation/", more));
      names.insert(names.end(), more.begin(), more.end());
      DCR_RETURN_ERROR_IF(!names.empty(), foreign_incarnation,
                          "the commit store holds no record, but the object store holds " +
                              std::to_string(names.size()) +
                              " attempt object(s) of an earlier commit history (e.g. '" +
                              names.front() +
                              "'): restore the commit record that wrote them, or remove the " +
                              "objects under 'incarnation/' and 'attempt/' to start a new history");
    }
    std::uint64_t tau = 0;
    DCR_TRY(commits_->prepare(epoch_, tau));
    commit_record k;
    k.version = 0;
    k.attempt = tau;
    k.incarnation = new_incarnation();
    k.source_baseline = baseline_digest();
    for (auto* e : receivers_) {
      DCR_TRY(e->ensure_member(nullptr));
      e->begin(tau);
      digest128 d{};
      DCR_TRY(e->finish(tau, d));
      k.receivers.push_back({e->id(), d});
    }
    k.time_unix_ns = unix_time_ns();
    return commits_->compare_and_set(epoch_, tau, 0, k);
  }

  /// Run the transition to the owners' candidate (see file comment).
  transition_report transition() {
    transition_report rep;
    const auto t0 = clock::now();
    rep.result = run_transition(rep);
    rep.wall_seconds = seconds_since(t0);
    return rep;
  }

private:
  using clock = std::chrono::steady_clock;
  static double seconds_since(clock::time_point t) {
    return std::chrono::duration<double>(clock::now() - t).count();
  }
  /// CPU time of the calling thread (POSIX), for `attempt_report::apply_cpu_seconds`.
  static double thread_cpu_seconds() noexcept {
    timespec ts{};
    ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  }

  status check_alive() const {
    DCR_RETURN_ERROR_IF(dead_, aborted, "coordinator is dead (crash injected)");
    return status::success();
  }
  bool crash_at(crash_point p) {
    if (opt_.crash && opt_.crash(p)) dead_ = true;
    return dead_;
  }

  digest128 baseline_digest() const {
    std::vector<digest128> d;
    for (auto* o : owners_) d.push_back(o->baseline_digest());
    return combine(d);
  }
  digest128 candidate_digest() const {
    std::vector<digest128> d;
    for (auto* o : owners_) d.push_back(o->candidate_digest());
    return combine(d);
  }

  status run_transition(transition_report& rep) {
    DCR_TRY(check_alive());
    stored_record cur;
    DCR_TRY(commits_->load(cur));
    DCR_RETURN_ERROR_IF(cur.revision == 0, not_found, "no commit record: bootstrap first");
    DCR_RETURN_ERROR_IF(cur.record.version >= max_counter, length_overflow,
                        "committed version " + std::to_string(cur.record.version) +
                            " has no successor");
    const std::string& inc = cur.record.incarnation;
    const auto base = baseline_digest(), cand = candidate_digest();
    if (cur.record.source_baseline != base) {
      // A coordinator died after committing and before the baseline update:
      // roll forward, as the record already publishes the candidate.
      DCR_RETURN_ERROR_IF(
          cur.record.source_baseline != cand, verification,
          "owners' baseline matches neither the committed record nor their candidate");
      const auto tc = clock::now();
      for (auto* o : owners_) o->commit_baseline();
      finish_transition(inc, cur.record.attempt, rep);
      rep.commit_seconds = seconds_since(tc);
      rep.rolled_forward = true;
      rep.committed_version = cur.record.version;
      return status::success();
    }
    // Any attempt prepared since the last commit may have left partial writes.
    refit_mode mode =
        cur.attempt == cur.record.attempt ? refit_mode::mixed : refit_mode::overwrite_all;
    std::map<std::string, digest128> committed;
    for (auto& a : cur.record.receivers) committed[a.receiver] = a.state;
    status last = fail(errc::aborted, "no attempt ran");
    for (int i = 0; i < opt_.max_attempts; ++i) {
      // Membership changes only here, between attempts.
      for (auto* e : receivers_) {
        auto it = committed.find(e->id());
        const auto tr = clock::now();
        const bool was_alive = e->alive();
        DCR_TRY(e->ensure_member(it == committed.end() ? nullptr : &it->second));
        if (!was_alive) rep.restore_seconds += seconds_since(tr);
      }
      std::uint64_t tau = 0;
      DCR_TRY(commits_->prepare(epoch_, tau));
      if (crash_at(crash_point::after_prepare))
        return fail(errc::aborted, "coordinator died after prepare");
      attempt_report ar;
      ar.attempt = tau;
      ar.mode = mode;
      std::vector<receiver_ack> acks;
      if constexpr (transport::object_store<Store>) {
        transport::incarnation_scope<Store> scoped(*store_, inc);
        ar.result = run_attempt(scoped, tau, cur.record.version + 1, mode, ar, acks);
        if (!ar.result && !dead_) distrust_unlisted(scoped, tau);
      } else {
        ar.result = run_attempt(*store_, tau, cur.record.version + 1, mode, ar, acks);
      }
      rep.attempts.push_back(ar);
      if (dead_) return fail(errc::aborted, "coordinator died after some ACKs");
      if (!ar.result) {
        last = ar.result;
        mode = refit_mode::overwrite_all;
        continue;
      }
      const auto tc = clock::now();
      commit_record next{cur.record.version + 1, cand, tau, std::move(acks), unix_time_ns(), inc};
      DCR_TRY(commits_->compare_and_set(epoch_, tau, cur.revision, next));
      if (crash_at(crash_point::after_commit))
        return fail(errc::aborted, "coordinator died after commit");
      for (auto* o : owners_) o->commit_baseline();
      finish_transition(inc, tau, rep);
      rep.commit_seconds = seconds_since(tc);
      rep.committed_version = next.version;
      return status::success();
    }
    return fail(last.code, "transition to version " + std::to_string(cur.record.version + 1) +
                               " failed after " + std::to_string(opt_.max_attempts) +
                               " attempts (operator intervention required); last: " + last.message);
  }

  /// After failed attempt τ: a receiver that staged a payload its owner's
  /// manifest contradicts (not listed there, or listed with another digest;
  /// a stray copy or another history's object, applied before the manifest
  /// said otherwise) may hold changes outside the changed set, which the
  /// overwrite retry does not rewrite. Its storage is not trusted: it is
  /// dropped and restored densely at the next membership step. Payloads of
  /// owners that never published a manifest are this attempt's own partial
  /// writes, which the retry repairs in place.
  template <class Scoped>
  void distrust_unlisted(Scoped& medium, std::uint64_t tau) {
    transport::listed_payloads listed;
    const bool known = transport::read_listed(medium, tau, listed).ok();
    std::set<std::uint32_t> ours;
    for (auto* o : owners_) ours.insert(o->owner_id());
    for (auto* e : receivers_) {
      bool trusted = true;
      for (auto& [name, d] : e->staged_payloads(tau)) {
        const auto owner = transport::payload_owner(name, tau);
        if (!known || !owner || !ours.count(*owner)) {
          trusted = false;
          break;
        }
        if (!listed.owners.count(*owner)) continue;
        const auto it = listed.entries.find(name);
        trusted = trusted && it != listed.entries.end() && it->second == d;
      }
      if (!trusted) e->kill();
    }
  }

  void finish_transition(const std::string& inc, std::uint64_t tau, transition_report& rep) {
    if (opt_.collect_garbage) {
      if constexpr (transport::object_store<Store>) {
        transport::incarnation_scope<Store> scoped(*store_, inc);
        (void)transport::collect(scoped, tau, &rep.collected_objects);
      } else {
        (void)transport::collect(*store_, tau, &rep.collected_objects);
      }
    }
    for (auto* e : receivers_) e->open_gate(tau);
  }

  /// One attempt over `medium` (the object store seen through this history's
  /// incarnation scope, or the attempt transport); returns only after every
  /// thread it started has ended.
  template <class Medium>
  status run_attempt(Medium& medium, std::uint64_t tau, std::uint64_t target, refit_mode mode,
                     attempt_report& ar, std::vector<receiver_ack>& acks) {
    const auto t0 = clock::now();
    if constexpr (transport::object_store<Medium>) {
      // A fresh τ has no objects. Some there means attempt ids were handed
      // out again (a commit record rolled back by hand): never read them.
      std::vector<std::string> there;
      DCR_TRY(medium.list(transport::attempt_prefix(tau), there));
      DCR_RETURN_ERROR_IF(
          !there.empty(), stale_attempt,
          "attempt " + std::to_string(tau) + " already has " + std::to_string(there.size()) +
              " object(s) (e.g. '" + there.front() +
              "'): attempt ids were reused, was the commit record replaced by an older one?");
    }
    const auto deadline = t0 + opt_.attempt_deadline;
    std::atomic<bool> stop{false};
    std::mutex m;
    status first = status::success();
    auto record = [&](status s) {
      if (s) return;
      std::lock_guard l(m);
      if (first) first = std::move(s);
      stop = true;
    };
    std::vector<std::uint32_t> owner_ids;
    for (auto* o : owners_) owner_ids.push_back(o->owner_id());
    for (auto* e : receivers_) {
      if (opt_.mode == rl_mode::synchronous) e->close_gate(tau);
      e->begin(tau);
    }

    std::vector<std::thread> threads;
    std::vector<double> construct(owners_.size()), upload(owners_.size());
    std::vector<double> fetch(receivers_.size()), apply(receivers_.size()),
        apply_cpu(receivers_.size());
    std::atomic<std::size_t> payloads{0};
    std::atomic<std::uint64_t> bytes{0};
    std::atomic<std::size_t> acked{0};
    acks.assign(receivers_.size(), {});

    for (std::size_t k = 0; k < owners_.size(); ++k) {
      threads.emplace_back([&, k] {
        auto* o = owners_[k];
        auto w = transport::open_writer(medium, tau, o->owner_id());
        // Build on a producer thread, upload on this one, joined by one
        // bounded queue (pipeline::run): the upload of payload l overlaps the
        // construction of l+1, and a full queue is the builder's backpressure.
        double blocked = 0;
        status built = status::success();
        const auto tb = clock::now();
        status up = pipeline::run_status<std::vector<std::byte>>(
            pipeline::chain<>{},
            [&](auto&& emit) {
              built = o->build({tau, target, mode}, [&](std::vector<std::byte>&& p) -> status {
                DCR_RETURN_ERROR_IF(stop.load(), aborted,
                                    "attempt " + std::to_string(tau) + " stopped");
                const auto tq = clock::now();
                const bool ok = emit(std::move(p));
                blocked += seconds_since(tq);
                DCR_RETURN_ERROR_IF(!ok, aborted,
                                    "upload of attempt " + std::to_string(tau) + " failed");
                return status::success();
              });
              construct[k] = seconds_since(tb) - blocked;
            },
            [&](std::vector<std::byte>&& p) {
              const auto tp = clock::now();
              auto st = stop ? fail(errc::aborted, "attempt stopped") : w.put_payload(p);
              upload[k] += seconds_since(tp);
              throw_if_failed(st);
              payloads += 1;
              bytes += p.size();
            },
            opt_.upload_queue);
        if (!built) built.message = "owner " + std::to_string(o->owner_id()) + ": " + built.message;
        record(std::move(built));
        record(std::move(up));
        if (!stop) {
          const auto tp = clock::now();
          record(w.finish());
          upload[k] += seconds_since(tp);
        }
      });
    }

    for (std::size_t r = 0; r < receivers_.size(); ++r) {
      threads.emplace_back([&, r] {
        auto* e = receivers_[r];
        const bool sync = opt_.mode == rl_mode::synchronous;
        struct fetched {
          std::string name;
          std::vector<std::byte> bytes;
        };
        // Fetch on a producer thread, apply on this one (pipeline::run): the
        // fetch of payload l+1 overlaps the application of l.
        auto reader = transport::open_reader(medium, tau, r, owner_ids);
        status s = status::success();
        const auto tf = clock::now();
        status applied = pipeline::run_status<fetched>(
            pipeline::chain<>{},
            [&](auto&& emit) {
              s = reader.run(
                  [&](std::string_view name, std::span<const std::byte> b) -> status {
                    DCR_RETURN_ERROR_IF(!emit(fetched{std::string(name), {b.begin(), b.end()}}),
                                        aborted, "receiver " + e->id() + ": apply failed");
                    return status::success();
                  },
                  stop, deadline);
            },
            [&](fetched&& p) {
              const auto ta = clock::now();
              const double ca = thread_cpu_seconds();
              auto st = e->deliver(tau, p.name, p.bytes, sync);
              apply[r] += seconds_since(ta);
              apply_cpu[r] += thread_cpu_seconds() - ca;
              throw_if_failed(st);
            },
            opt_.apply_queue);
        fetch[r] = seconds_since(tf) - apply[r];
        if (!applied) {
          record(std::move(applied));
          return;
        }
        if (!s) {
          s.message = "receiver " + e->id() + ": " + s.message;
          record(std::move(s));
          return;
        }
        if constexpr (requires { reader.listed(); }) {
          // Exactly the listed payloads were staged, digest for digest, or
          // the receiver may not acknowledge (async: before anything is applied).
          const auto listed = reader.listed();
          const auto staged = e->staged_digests(tau);
          if (listed != staged) {
            record(fail(errc::verification,
                        "receiver " + e->id() + " staged " + std::to_string(staged.size()) +
                            " payload(s) of attempt " + std::to_string(tau) +
                            " that differ from the " + std::to_string(listed.size()) +
                            " the manifests list"));
            return;
          }
        }
        const auto ta = clock::now();
        const double ca = thread_cpu_seconds();
        if (!sync) {
          // Asynchronous RL: everything is staged; stop serving v, then apply.
          e->close_gate(tau);
          if (auto a = e->apply(tau); !a) {
            record(std::move(a));
            return;
          }
        }
        digest128 d{};
        auto f = e->finish(tau, d);
        apply[r] += seconds_since(ta);
        apply_cpu[r] += thread_cpu_seconds() - ca;
        if (!f) {
          record(std::move(f));
          return;
        }
        acks[r] = {e->id(), d};
        if (acked.fetch_add(1) == 0 && crash_at(crash_point::after_first_ack)) stop = true;
      });
    }
    for (auto& t : threads) t.join(); // stop_and_wait: nothing of τ runs after this
    ar.payloads = payloads;
    ar.payload_bytes = bytes;
    for (auto v : construct) ar.construct_seconds = std::max(ar.construct_seconds, v);
    for (auto v : upload) ar.upload_seconds = std::max(ar.upload_seconds, v);
    for (auto v : fetch) ar.fetch_seconds = std::max(ar.fetch_seconds, v);
    for (auto v : apply) ar.apply_seconds = std::max(ar.apply_seconds, v);
    for (auto v : apply_cpu) ar.apply_cpu_seconds = std::max(ar.apply_cpu_seconds, v);
    ar.wall_seconds = seconds_since(t0);
    if (dead_) return fail(errc::aborted, "coordinator died");
    return first;
  }

  Commits* commits_;
  Store* store_;
  std::vector<Owner*> owners_;
  std::vector<endpoint*> receivers_;
  coordinator_options opt_;
  std::uint64_t epoch_ = 0;
  std::atomic<bool> dead_{false};
};

} // namespace dcr::protocol
