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
/// The per-owner and per-node work are operations on links (links.hpp):
/// `coordinator` drives owners and endpoints of this process through local
/// links, `link_coordinator` drives any links, e.g. proxies of owner and
/// rollout processes (remote_links.hpp), with the same code.
/// Every per-owner call of a step (digests, publish, baseline commit, dense
/// export) runs on a thread per owner, and so do the per-node calls where the
/// node link allows (`link_calls_concurrent`, `call_links` in links.hpp): a
/// step takes as long as its slowest owner or node, not the sum of them.
/// Results are gathered in owner and node order, never completion order, so
/// the combined digests are those of calling them in turn.
/// A failed attempt is stopped and waited for (`stop_and_wait`: every thread
/// of the attempt has ended, so none of its writes can land later; late
/// deliveries are fenced by τ anyway), and the transition retries with every
/// record an overwrite, computed again from the same candidate and the
/// unchanged baseline.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
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
#include "dcr/protocol/links.hpp"
#include "dcr/protocol/request_gate.hpp"
#include "dcr/protocol/roles.hpp"
#include "dcr/transport/attempt_objects.hpp"
#include "dcr/transport/attempt_transport.hpp"
#include "dcr/transport/object_store.hpp"

namespace dcr::protocol {

/// The points of a transition where the protocol must survive the
/// coordinator's death (docs/protocol.md, failure table): a coordinator that
/// dies there stops acting, and what it started is left exactly as it is.
enum class crash_point {
  after_prepare,   ///< τ handed out, nothing streamed
  after_first_ack, ///< some receivers applied everything and acknowledged
  before_commit,   ///< every receiver acknowledged, K^{v+1} not yet written
  after_commit,    ///< K^{v+1} written, owners' baselines not yet updated
};

/// A fault-injection policy of the coordinator: asked at each crash point
/// whether the coordinator dies there (true: it stops acting, as if its
/// process had been killed). `armed` false promises the policy never fires,
/// so the coordinator compiles every question away.
/// Minimal complete definition: `static constexpr bool armed` and a call
/// operator `bool(crash_point)`.
template <class F>
concept fault_policy = requires(F& f, crash_point p) {
  { F::armed } -> std::convertible_to<bool>;
  { f(p) } -> std::convertible_to<bool>;
};

/// The policy of every production coordinator: never fires. Injecting
/// policies (a predicate over crash points) are test scaffolding and live
/// with the tests (`support/faults.hpp`).
struct no_faults {
  static constexpr bool armed = false;
  constexpr bool operator()(crash_point) const noexcept { return false; }
};
static_assert(fault_policy<no_faults>);

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

/// A best-effort step of a transition: one whose failure does not change
/// the transition's result (the protocol stays correct without it) but
/// leaves something an operator may want to see (garbage kept, a gate shut,
/// a receiver not dropped).
enum class best_effort_step {
  read_manifests,     ///< after a failed attempt: manifests unreadable, every staged receiver
                      ///< distrusted
  drop_receiver,      ///< after a failed attempt: a distrusted receiver was not dropped
  list_staged,        ///< after a failed attempt: a node could not say what it staged (all dropped)
  collect_garbage,    ///< objects of the finished attempts not deleted
  list_stale_exports, ///< dense exports of older versions not listed
  remove_stale_export, ///< a dense export of an older version not deleted
  open_gate,           ///< a node's request gate not reopened after the transition
};

inline const char* name_of(best_effort_step s) noexcept {
  switch (s) {
  case best_effort_step::read_manifests:
    return "read_manifests";
  case best_effort_step::drop_receiver:
    return "drop_receiver";
  case best_effort_step::list_staged:
    return "list_staged";
  case best_effort_step::collect_garbage:
    return "collect_garbage";
  case best_effort_step::list_stale_exports:
    return "list_stale_exports";
  case best_effort_step::remove_stale_export:
    return "remove_stale_export";
  case best_effort_step::open_gate:
    return "open_gate";
  }
  return "?";
}

/// One best-effort step that failed: which, in which attempt, on what
/// (a node, receiver or object), and the status it failed with.
struct best_effort_failure {
  best_effort_step step = best_effort_step::collect_garbage;
  std::uint64_t attempt = 0;
  std::string subject;
  status cause;

  /// "open_gate, attempt 7, node 1: <cause>", for logs.
  std::string text() const {
    return std::string(name_of(step)) + ", attempt " + std::to_string(attempt) +
           (subject.empty() ? "" : ", " + subject) + ": " + cause.message;
  }
};

/// Outcome of one transition.
struct transition_report {
  status result;
  std::uint64_t committed_version = 0;
  bool rolled_forward = false; ///< found K^{v+1} committed, only finished the baselines
  std::vector<attempt_report> attempts;
  double restore_seconds = 0; ///< dense restores of restarted receivers (wall time)
  double commit_seconds = 0;  ///< CAS + baseline update + GC
  double wall_seconds = 0;
  std::size_t collected_objects = 0;
  /// Best-effort steps that failed, in the order they ran: the transition's
  /// `result` stands, these say what it left behind.
  std::vector<best_effort_failure> best_effort;
};

/// Knobs of a coordinator (runtime values; what changes code paths is a template parameter).
struct coordinator_options {
  rl_mode mode = rl_mode::synchronous;
  std::size_t upload_queue = 2; ///< payloads built ahead of upload, per owner
  std::size_t apply_queue = 8;  ///< fetched payloads waiting for apply, per receiver
  int max_attempts = 4;
  std::chrono::milliseconds attempt_deadline{120000};
  bool collect_garbage = true;
};

/// Drives owner links and rollout-node links over an object store or another
/// attempt transport (e.g. a relay tree), committing in a commit store. The
/// coordinator itself touches the medium only for listings, manifests and
/// garbage collection: payload bytes go from the owners' links to the nodes'.
/// `Faults` decides where the coordinator dies (tests); the default never
/// fires and costs nothing.
template <owner_link OwnerLink, node_link NodeLink, transport::attempt_medium Store,
          commit_store Commits, fault_policy Faults = no_faults>
class link_coordinator {
public:
  link_coordinator(Commits& commits, Store& store, std::vector<OwnerLink*> owners,
                   std::vector<NodeLink*> nodes, coordinator_options opt = {}, Faults faults = {})
      : commits_(&commits), store_(&store), owners_(std::move(owners)), nodes_(std::move(nodes)),
        opt_(std::move(opt)), faults_(std::move(faults)) {
    // A transport sized for another receiver set (a relay tree's reader
    // slots) would make readers wait for receivers that never come.
    if constexpr (requires {
                    { store.receiver_count() } -> std::convertible_to<std::size_t>;
                  })
      if (store.receiver_count() != nodes_.size())
        throw error(errc::invalid_argument,
                    "coordinator: transport serves " + std::to_string(store.receiver_count()) +
                        " receivers, " + std::to_string(nodes_.size()) + " given");
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
    DCR_TRY(baseline_digest(k.source_baseline));
    DCR_TRY(export_for_restore(0, k.incarnation));
    const membership initial{0, k.incarnation, {}};
    std::vector<std::vector<digest128>> acks(nodes_.size());
    DCR_TRY(each_node([&](std::size_t r) -> status {
      auto* n = nodes_[r];
      std::size_t restored = 0;
      DCR_TRY(n->ensure_member(initial, restored));
      DCR_TRY(n->begin(tau));
      DCR_TRY(n->acknowledge(tau, acks[r]));
      const auto ids = n->ids();
      DCR_RETURN_ERROR_IF(acks[r].size() != ids.size(), verification,
                          "node of " + std::to_string(ids.size()) + " receivers sent " +
                              std::to_string(acks[r].size()) + " ACKs");
      return status::success();
    }));
    for (std::size_t r = 0; r < nodes_.size(); ++r) {
      const auto ids = nodes_[r]->ids();
      for (std::size_t i = 0; i < ids.size(); ++i) k.receivers.push_back({ids[i], acks[r][i]});
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
  status check_alive() const {
    DCR_RETURN_ERROR_IF(dead_, aborted, "coordinator is dead (crash injected)");
    return status::success();
  }
  bool crash_at(crash_point p) {
    if constexpr (!Faults::armed) {
      return false;
    } else {
      if (faults_(p)) dead_ = true;
      return dead_;
    }
  }

  /// `f(k)` at every owner k, concurrently (see file comment).
  template <class F>
  status each_owner(F&& f) {
    return call_links(owners_.size(), link_calls_concurrent<OwnerLink>, f, [&](std::size_t k) {
      return "owner " + std::to_string(owners_[k]->owner_id());
    });
  }
  /// `f(r)` at every node r, concurrently where the node link allows.
  template <class F>
  status each_node(F&& f) {
    return call_links(nodes_.size(), link_calls_concurrent<NodeLink>, f, [&](std::size_t r) {
      std::string name = "node " + std::to_string(r);
      if constexpr (requires(NodeLink & n) { n.peer().text(); })
        name += " (" + nodes_[r]->peer().text() + ")";
      return name;
    });
  }

  // Combined in owner order whatever order the owners answer in.
  status baseline_digests(std::vector<digest128>& d) {
    d.assign(owners_.size(), digest128{});
    return each_owner([&](std::size_t k) { return owners_[k]->baseline_digest(d[k]); });
  }
  status candidate_digests(std::vector<digest128>& d) {
    d.assign(owners_.size(), digest128{});
    return each_owner([&](std::size_t k) { return owners_[k]->candidate_digest(d[k]); });
  }
  status baseline_digest(digest128& out) {
    std::vector<digest128> d;
    DCR_TRY(baseline_digests(d));
    out = combine(d);
    return status::success();
  }
  status commit_baselines(std::uint64_t tau, std::uint64_t version) {
    return each_owner([&](std::size_t k) { return owners_[k]->commit_baseline(tau, version); });
  }
  /// Owners a baseline update left behind: when the update of a committed
  /// version was cut short (the coordinator died, or a link went down part
  /// way), some owners' baselines are at the record's version and the others'
  /// candidates are, while the owners that moved may already hold their next
  /// candidate. The owners behind are the set whose candidates, with the
  /// others' baselines, combine to the record's source digest: found by trying
  /// every split (up to `max_split_owners` owners, 2^n combinations of n
  /// digests). An owner whose two digests are equal is at the record's state
  /// either way and is counted behind: moving it changes no bits, and an
  /// owner that had not moved gets its update (an owner process trains its
  /// next candidate then). `verification` when no split matches, or when
  /// more owners than that would have to be tried.
  static constexpr std::size_t max_split_owners = 20;
  static status owners_behind(const std::vector<digest128>& base,
                              const std::vector<digest128>& cand, const digest128& committed,
                              std::vector<bool>& behind) {
    const std::size_t n = base.size();
    std::vector<std::size_t> open; // owners with two different digests
    for (std::size_t k = 0; k < n; ++k)
      if (base[k] != cand[k]) open.push_back(k);
    DCR_RETURN_ERROR_IF(open.size() > max_split_owners, verification,
                        "owners' baseline matches neither the committed record nor their "
                        "candidate, and " +
                            std::to_string(open.size()) +
                            " owners whose baseline and candidate differ are too many to try "
                            "every mix of the two (at most " +
                            std::to_string(max_split_owners) + ")");
    std::vector<digest128> mix = base;
    for (std::uint64_t m = 0; m < (std::uint64_t{1} << open.size()); ++m) {
      for (std::size_t i = 0; i < open.size(); ++i)
        mix[open[i]] = (m >> i) & 1 ? cand[open[i]] : base[open[i]];
      if (combine(mix) != committed) continue;
      behind.assign(n, true);
      for (std::size_t i = 0; i < open.size(); ++i) behind[open[i]] = (m >> i) & 1;
      return status::success();
    }
    return fail(errc::verification, "owners' baseline matches neither the committed record nor "
                                    "their candidate, nor any mix of the two");
  }

  /// Owner links that can export their committed baseline densely (owners
  /// in other processes) do so when some node has a receiver to restore;
  /// an owner without a dense export (`not_found`) leaves the restore to the
  /// node's own source of the committed version.
  status export_for_restore(std::uint64_t version, const std::string& inc) {
    if constexpr (requires(OwnerLink & o, NodeLink & n, std::size_t & c) {
                    { o.export_dense(version, inc) } -> std::same_as<status>;
                    { n.down(c) } -> std::same_as<status>;
                  }) {
      std::vector<std::size_t> down(nodes_.size());
      DCR_TRY(each_node([&](std::size_t r) { return nodes_[r]->down(down[r]); }));
      if (std::find_if(down.begin(), down.end(), [](std::size_t c) { return c > 0; }) != down.end())
        return each_owner([&](std::size_t k) {
          auto s = owners_[k]->export_dense(version, inc);
          return !s && s.code == errc::not_found ? status::success() : s;
        });
    }
    return status::success();
  }

  /// Receivers distrusted (their storage may hold changes outside the
  /// changed set) whose drop has not landed: their node did not answer.
  /// Every membership step retries them first and fails while one is left,
  /// since an attempt over such a receiver could commit what it holds.
  std::set<std::pair<std::size_t, std::string>> to_drop_;
  /// The version the attempts this coordinator prepared since the last
  /// commit start from, and the candidate they published (see
  /// `run_transition`: a retry over another candidate restores densely).
  std::optional<std::pair<std::uint64_t, digest128>> attempted_;

  void distrust(std::size_t r, const std::string& id) { to_drop_.insert({r, id}); }
  void distrust_all() {
    for (std::size_t r = 0; r < nodes_.size(); ++r)
      for (auto& id : nodes_[r]->ids()) distrust(r, id);
  }
  /// `now` becomes the transition's candidate; one other than `cand` means
  /// receivers may hold part of an attempt of another candidate, which the
  /// overwrite retry does not rewrite: every receiver is distrusted.
  /// Returns whether it changed.
  bool adopt_candidate(digest128& cand, const digest128& now) {
    if (now == cand) return false;
    cand = now;
    distrust_all();
    return true;
  }
  /// Drops every distrusted receiver, so the membership step restores it
  /// densely; `drop_receiver` in `rep.best_effort` for each that did not
  /// drop, and the first such failure as the status.
  status drop_distrusted(std::uint64_t tau, transition_report& rep) {
    status first = status::success();
    for (auto it = to_drop_.begin(); it != to_drop_.end();) {
      const std::string who = "node " + std::to_string(it->first) + ", receiver " + it->second;
      auto s = nodes_[it->first]->kill(it->second);
      if (s || s.code == errc::not_found) { // gone already counts: nothing of it is left
        it = to_drop_.erase(it);
        continue;
      }
      if (first)
        first = fail(s.code, who +
                                 ": distrusted, and its drop did not land (no attempt runs "
                                 "until it does): " +
                                 s.message);
      rep.best_effort.push_back({best_effort_step::drop_receiver, tau, who, std::move(s)});
      ++it;
    }
    return first;
  }

  /// Membership step: every distrusted receiver is dropped, then every node
  /// restores its dead receivers to the committed version.
  status membership_step(const membership& m, std::uint64_t tau, transition_report& rep) {
    DCR_TRY(drop_distrusted(tau, rep));
    DCR_TRY(export_for_restore(m.version, m.incarnation));
    // Restore time: the wall time of a step that restored something (the
    // nodes restore concurrently where their links allow).
    const auto tr = clock::now();
    std::vector<std::size_t> restored(nodes_.size());
    auto s = each_node([&](std::size_t r) { return nodes_[r]->ensure_member(m, restored[r]); });
    if (std::find_if(restored.begin(), restored.end(), [](std::size_t c) { return c > 0; }) !=
        restored.end())
      rep.restore_seconds += seconds_since(tr);
    return s;
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
    std::vector<digest128> base_k, cand_k;
    DCR_TRY(baseline_digests(base_k));
    DCR_TRY(candidate_digests(cand_k));
    digest128 cand = combine(cand_k);
    if (cur.record.source_baseline != combine(base_k)) {
      // A coordinator died after committing and before the baseline update
      // ended, or a link went down during it: roll forward, as the record
      // already publishes the candidates, moving only the owners left behind
      // (an owner's commit_baseline is not asked to be idempotent).
      std::vector<bool> behind;
      DCR_TRY(owners_behind(base_k, cand_k, cur.record.source_baseline, behind));
      const auto tc = clock::now();
      DCR_TRY(each_owner([&](std::size_t k) {
        return behind[k] ? owners_[k]->commit_baseline(cur.record.attempt, cur.record.version)
                         : status::success();
      }));
      finish_transition(inc, cur.record.attempt, rep);
      rep.commit_seconds = seconds_since(tc);
      rep.rolled_forward = true;
      rep.committed_version = cur.record.version;
      return status::success();
    }
    // Any attempt prepared since the last commit may have left partial
    // writes. The overwrite retry repairs them only if those attempts
    // published the same candidate: elements a lost attempt changed that
    // this candidate does not change are outside what the retry rewrites.
    // So a candidate other than the one this coordinator's earlier attempts
    // published (a trainer restarted and trained again) has every receiver
    // restored densely first. (Attempts another coordinator prepared are not
    // known here: the owners' candidate must then be the one they published,
    // as a deterministic trainer restarted from the committed weights gives;
    // docs/protocol.md.)
    refit_mode mode =
        cur.attempt == cur.record.attempt ? refit_mode::mixed : refit_mode::overwrite_all;
    if (attempted_ && attempted_->first != cur.record.version) attempted_.reset();
    if (mode == refit_mode::overwrite_all && attempted_ && attempted_->second != cand)
      distrust_all();
    membership members{cur.record.version, inc, {}};
    for (auto& a : cur.record.receivers) members.committed[a.receiver] = a.state;
    status last = fail(errc::aborted, "no attempt ran");
    for (int i = 0; i < opt_.max_attempts; ++i) {
      if (i > 0) {
        // After a failed attempt the candidate may have moved (an owner
        // restarted): the retry's candidate is then another one (above).
        if (candidate_digests(cand_k)) adopt_candidate(cand, combine(cand_k));
      }
      // Membership changes only here, between attempts.
      DCR_TRY(membership_step(members, cur.attempt, rep));
      attempted_ = {cur.record.version, cand};
      std::uint64_t tau = 0;
      DCR_TRY(commits_->prepare(epoch_, tau));
      if (crash_at(crash_point::after_prepare))
        return fail(errc::aborted, "coordinator died after prepare");
      attempt_report ar;
      ar.attempt = tau;
      ar.mode = mode;
      std::vector<receiver_ack> acks;
      std::vector<publish_report> published;
      std::vector<char> publish_ok; // per owner: its publish succeeded
      if constexpr (transport::object_store<Store>) {
        transport::incarnation_scope<Store> scoped(*store_, inc);
        ar.result = run_attempt(scoped, inc, tau, cur.record.version + 1, mode, ar, acks, published,
                                publish_ok);
        if (!ar.result && !dead_) distrust_unlisted(scoped, tau, published, publish_ok, rep);
      } else {
        ar.result = run_attempt(*store_, inc, tau, cur.record.version + 1, mode, ar, acks,
                                published, publish_ok);
        if (!ar.result && !dead_) distrust_unlisted(*store_, tau, published, publish_ok, rep);
      }
      if (ar.result && !dead_) {
        // The candidate the record will name must be the one every owner
        // published from: one that changed during the attempt (views
        // mutated, an owner restarted with another state) leaves receivers
        // holding a mix. Such an attempt fails; every receiver is restored
        // densely and the retry publishes the candidate as it is now.
        const digest128 was = cand;
        if (auto s = candidate_digests(cand_k); !s)
          ar.result = s;
        else if (adopt_candidate(cand, combine(cand_k)))
          ar.result = fail(errc::verification,
                           "the owners' candidate changed during attempt " + std::to_string(tau) +
                               " (digest " + to_hex(was) + ", now " + to_hex(cand) +
                               "): every receiver is restored before the retry");
      }
      rep.attempts.push_back(ar);
      if (dead_) return fail(errc::aborted, "coordinator died after some ACKs");
      if (!ar.result) {
        last = ar.result;
        mode = refit_mode::overwrite_all;
        continue;
      }
      if (crash_at(crash_point::before_commit))
        return fail(errc::aborted, "coordinator died before commit");
      const auto tc = clock::now();
      commit_record next{cur.record.version + 1, cand, tau, std::move(acks), unix_time_ns(), inc};
      DCR_TRY(commits_->compare_and_set(epoch_, tau, cur.revision, next));
      if (crash_at(crash_point::after_commit))
        return fail(errc::aborted, "coordinator died after commit");
      DCR_TRY(commit_baselines(tau, next.version));
      finish_transition(inc, tau, rep);
      rep.commit_seconds = seconds_since(tc);
      rep.committed_version = next.version;
      return status::success();
    }
    return fail(last.code, "transition to version " + std::to_string(cur.record.version + 1) +
                               " failed after " + std::to_string(opt_.max_attempts) +
                               " attempts (operator intervention required); last: " + last.message);
  }

  /// After failed attempt τ: what each receiver staged is judged against
  /// what each owner reported publishing (`published`), never against
  /// whatever lies in the medium now: anyone who can write the bucket can
  /// rewrite or delete a manifest after the readers took it. Per owner:
  ///  - it reported a manifest in the store: the manifest there now must be
  ///    exactly those bytes (present, readable, same digest, well-formed);
  ///    then a staged payload of that owner counts only if that manifest
  ///    lists it with the digest staged. Absent, unreadable or different:
  ///    what the readers took as its list is unknown, so every receiver that
  ///    staged a payload of that owner is distrusted;
  ///  - it published through a medium without manifests (a relay tree,
  ///    with a stream digest or none): nothing of it lies in the store; a
  ///    staged payload of that owner counts only if the owner reported
  ///    sending that sequence number with the digest staged
  ///    (`publish_report::payload_digests`, complete once its publish
  ///    succeeded; the nodes' digests are judged in `distrust_streamed`);
  ///  - it reported no publish (it failed first): its payloads are this
  ///    attempt's own partial writes, which the retry repairs in place, as
  ///    long as no manifest of it is there. One that is was written by
  ///    someone else (or landed after the owner saw its put fail) and may
  ///    have listed anything to the readers: every receiver that staged a
  ///    payload of that owner is distrusted.
  /// A receiver that staged a payload named for no owner of this transition
  /// is distrusted too; so is every one that staged anything when the
  /// manifests cannot be listed. A distrusted receiver may hold changes
  /// outside the changed set, which the `overwrite_all` retry does not
  /// rewrite: it is dropped and restored densely at the next membership step.
  template <class Medium>
  void distrust_unlisted(Medium& medium, std::uint64_t tau,
                         const std::vector<publish_report>& published,
                         const std::vector<char>& publish_ok, transition_report& rep) {
    auto report = [&](best_effort_step step, std::string subject, status cause) {
      rep.best_effort.push_back({step, tau, std::move(subject), std::move(cause)});
    };
    transport::listed_payloads listed; // stays empty where the medium has no manifests
    bool known = true;
    if constexpr (transport::object_store<Medium>) {
      auto read = transport::read_listed(medium, tau, listed);
      known = read.ok();
      if (!known) report(best_effort_step::read_manifests, {}, std::move(read));
    }
    enum class judged { in_place, by_manifest, by_sent, distrusted };
    std::map<std::uint32_t, std::pair<judged, const publish_report*>> how; // this transition's
    for (std::size_t k = 0; k < owners_.size(); ++k) {
      const auto o = owners_[k]->owner_id();
      const auto& p = published[k]; // sized by run_attempt before anything can fail
      const auto found = listed.found.find(o);
      const bool there = found != listed.found.end();
      judged j = there ? judged::distrusted : judged::in_place; // reported no publish
      if (publish_ok[k] && !(p.manifest_bound && p.manifest_stored) &&
          (p.manifest_bound || !transport::object_store<Medium>))
        j = judged::by_sent; // a relay tree's owner: its payload digests are complete
      else if (p.manifest_bound)
        j = there && found->second == p.manifest_digest && listed.owners.count(o)
                ? judged::by_manifest
                : judged::distrusted;
      how[o] = {j, &p};
    }
    for (std::size_t r = 0; r < nodes_.size(); ++r) {
      auto* n = nodes_[r];
      std::vector<staged_set> staged;
      if (auto s = n->staged_payloads(tau, staged); !s) {
        // The node cannot tell what it staged (it is gone): drop all of it.
        report(best_effort_step::list_staged, "node " + std::to_string(r), std::move(s));
        for (auto& id : n->ids()) distrust(r, id);
        continue;
      }
      for (auto& set : staged) {
        bool trusted = true;
        for (auto& [name, d] : set.payloads) {
          const auto owner = transport::payload_owner(name, tau);
          const auto h = owner ? how.find(*owner) : how.end();
          const auto j = h == how.end() ? judged::distrusted : h->second.first;
          if (!known || j == judged::distrusted) {
            trusted = false;
            break;
          }
          if (j == judged::in_place) continue;
          if (j == judged::by_sent) {
            const auto seq = transport::payload_sequence(name, tau);
            const auto& sent = h->second.second->payload_digests;
            trusted = trusted && seq && *seq < sent.size() && sent[*seq] == d;
            continue;
          }
          const auto it = listed.entries.find(name);
          trusted = trusted && it != listed.entries.end() && it->second == d;
        }
        if (!trusted) distrust(r, set.receiver);
      }
    }
  }

  /// After failed attempt τ whose payloads travelled through a transport
  /// without manifests in the object store (a relay tree; or owners that
  /// reported stream digests): beside each staged payload judged by the
  /// digests its owner reported sending (`distrust_unlisted`), what the
  /// nodes reported.
  ///  - A node whose stream digest for an owner differs from the owner's
  ///    (`contradicted`) delivered a payload set the owner did not send (one
  ///    more, or another one): its receivers may hold changes outside the
  ///    changed set, and are distrusted (restored densely before the retry).
  ///  - A node that failed with `verification` saw bytes under an owner's
  ///    name and sequence other than those it had taken (relay_node: a
  ///    second frame with another digest). Which copy reached which node
  ///    before that was noticed is not known here (the tree forwards as it
  ///    takes; a node stopped by the failure meanwhile reports `aborted`),
  ///    and an owner that reported no publish reported no digests to judge
  ///    its payloads by: every receiver is distrusted.
  /// Nodes whose digests match delivered exactly what the owners sent; what
  /// they hold is repaired in place by the retry.
  template <class Medium>
  void distrust_streamed(const std::vector<publish_report>& published,
                         const std::vector<status>& refitted,
                         const std::vector<bool>& contradicted) {
    bool streamed = !transport::object_store<Medium>;
    for (auto& p : published) streamed = streamed || (p.manifest_bound && !p.manifest_stored);
    if (!streamed) return; // object stores: `distrust_unlisted` judges every staged payload
    for (auto& s : refitted)
      if (s.code == errc::verification) {
        distrust_all();
        return;
      }
    for (std::size_t r = 0; r < contradicted.size(); ++r)
      if (contradicted[r])
        for (auto& id : nodes_[r]->ids()) distrust(r, id);
  }

  /// After a commit: garbage collection and gates, best effort (the commit
  /// stands whatever they do; failures go to `rep.best_effort`).
  void finish_transition(const std::string& inc, std::uint64_t tau, transition_report& rep) {
    auto report = [&](best_effort_step step, std::string subject, status cause) {
      if (!cause) rep.best_effort.push_back({step, tau, std::move(subject), std::move(cause)});
    };
    if (opt_.collect_garbage) {
      if constexpr (transport::object_store<Store>) {
        transport::incarnation_scope<Store> scoped(*store_, inc);
        report(best_effort_step::collect_garbage, {},
               transport::collect(scoped, tau, &rep.collected_objects));
        // Dense exports of an older committed version (restores) are stale now.
        std::vector<std::string> dense;
        auto listed = scoped.list("dense/", dense);
        report(best_effort_step::list_stale_exports, "dense/", listed);
        if (listed)
          for (auto& d : dense) report(best_effort_step::remove_stale_export, d, scoped.remove(d));
      } else {
        report(best_effort_step::collect_garbage, {},
               transport::collect(*store_, tau, &rep.collected_objects));
      }
    }
    // A node that cannot be reached keeps its gate as it is; it is restored
    // (and its gate reopened) when it rejoins. Every other node's gate opens
    // all the same: each call reports its own outcome.
    std::vector<status> gates(nodes_.size(), status::success());
    (void)each_node([&](std::size_t r) { // never fails: the outcomes are in `gates`
      gates[r] = nodes_[r]->open_gate(tau);
      return status::success();
    });
    for (std::size_t r = 0; r < gates.size(); ++r)
      report(best_effort_step::open_gate, "node " + std::to_string(r), std::move(gates[r]));
  }

  /// One attempt over `medium` (the object store seen through this history's
  /// incarnation scope, or the attempt transport); returns only after every
  /// thread it started has ended.
  template <class Medium>
  status run_attempt(Medium& medium, const std::string& inc, std::uint64_t tau,
                     std::uint64_t target, refit_mode mode, attempt_report& ar,
                     std::vector<receiver_ack>& acks, std::vector<publish_report>& published,
                     std::vector<char>& publish_ok) {
    const auto t0 = clock::now();
    // What each owner reports publishing: the repair after a failure judges
    // the receivers by it (none reported where the attempt ends before).
    published.assign(owners_.size(), publish_report{});
    publish_ok.assign(owners_.size(), 0);
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
    const bool sync = opt_.mode == rl_mode::synchronous;
    DCR_TRY(each_node([&](std::size_t r) -> status {
      if (sync) DCR_TRY(nodes_[r]->close_gate(tau));
      return nodes_[r]->begin(tau);
    }));

    std::vector<std::thread> threads;
    std::vector<refit_result> refits(nodes_.size());
    std::vector<status> refitted(nodes_.size(), status::success());
    std::atomic<std::size_t> acked{0};

    for (std::size_t k = 0; k < owners_.size(); ++k) {
      threads.emplace_back([&, k] {
        publish_request rq{tau, target, mode, inc, opt_.upload_queue};
        auto s = owners_[k]->publish(rq, stop, published[k]);
        publish_ok[k] = s.ok() ? 1 : 0; // one element per owner thread (chars, not packed bits)
        record(std::move(s));
      });
    }
    for (std::size_t r = 0; r < nodes_.size(); ++r) {
      threads.emplace_back([&, r] {
        refit_request rq{tau, inc, owner_ids, sync, opt_.apply_queue, deadline};
        auto s = nodes_[r]->refit(rq, stop, refits[r]);
        if (s && refits[r].acks.size() != nodes_[r]->ids().size())
          s = fail(errc::verification, "node sent " + std::to_string(refits[r].acks.size()) +
                                           " ACKs for " + std::to_string(nodes_[r]->ids().size()) +
                                           " receivers");
        if (!s) {
          refitted[r] = s;
          record(std::move(s));
          return;
        }
        if (acked.fetch_add(1) == 0 && crash_at(crash_point::after_first_ack)) stop = true;
      });
    }
    for (auto& t : threads) t.join(); // stop_and_wait: nothing of τ runs after this
    for (auto& p : published) {
      ar.payloads += p.payloads;
      ar.payload_bytes += p.bytes;
      ar.construct_seconds = std::max(ar.construct_seconds, p.construct_seconds);
      ar.upload_seconds = std::max(ar.upload_seconds, p.upload_seconds);
    }
    for (auto& f : refits) {
      ar.fetch_seconds = std::max(ar.fetch_seconds, f.fetch_seconds);
      ar.apply_seconds = std::max(ar.apply_seconds, f.apply_seconds);
      ar.apply_cpu_seconds = std::max(ar.apply_cpu_seconds, f.apply_cpu_seconds);
    }
    ar.wall_seconds = seconds_since(t0);
    if (dead_) return fail(errc::aborted, "coordinator died");
    std::vector<bool> contradicted(nodes_.size(), false);
    // The nodes report the digests they took only when they succeeded.
    auto bound = first ? check_manifest_binding(published, refits, contradicted) : first;
    if (!bound) {
      distrust_streamed<Medium>(published, refitted, contradicted);
      return bound;
    }
    acks.clear();
    for (std::size_t r = 0; r < nodes_.size(); ++r) {
      const auto ids = nodes_[r]->ids();
      for (std::size_t i = 0; i < ids.size(); ++i) acks.push_back({ids[i], refits[r].acks[i]});
    }
    return status::success();
  }

  /// The attempt commits only what its owners published: every node must
  /// have taken, for every owner that reported a manifest digest, exactly
  /// that manifest. A manifest written under an owner's name by anyone else
  /// (a forgery, a stale or second process claiming the owner) is either
  /// never read, or read by some node and then this fails the attempt,
  /// naming the owner; the retry writes and reads under a fresh attempt.
  /// Every node is checked, and `contradicted[r]` marks each one whose
  /// report differs from an owner's (the repair distrusts them where no
  /// manifest can be read back, `distrust_streamed`); the first difference
  /// is the status.
  status check_manifest_binding(const std::vector<publish_report>& published,
                                const std::vector<refit_result>& refits,
                                std::vector<bool>& contradicted) const {
    status first = status::success();
    contradicted.assign(nodes_.size(), false);
    for (std::size_t k = 0; k < owners_.size(); ++k) {
      if (!published[k].manifest_bound) continue;
      const auto o = owners_[k]->owner_id();
      for (std::size_t r = 0; r < nodes_.size(); ++r) {
        const auto& got = refits[r].manifests;
        // A node whose transport reports no manifests (a relay tree) has
        // nothing to compare; one that reports any must report this owner's.
        if (got.empty()) continue;
        const auto it =
            std::find_if(got.begin(), got.end(), [&](const auto& e) { return e.first == o; });
        const auto ids = nodes_[r]->ids();
        const std::string node = ids.empty() ? std::to_string(r) : ids.front();
        status s = status::success();
        if (it == got.end())
          s = fail(errc::verification,
                   "owner " + std::to_string(o) + ": node of " + node + " read no manifest of it");
        else if (it->second != published[k].manifest_digest)
          s = fail(errc::verification, "owner " + std::to_string(o) + ": node of " + node +
                                           " read manifest " + to_hex(it->second) +
                                           ", the owner reported publishing " +
                                           to_hex(published[k].manifest_digest));
        if (s) continue;
        contradicted[r] = true;
        if (first) first = std::move(s);
      }
    }
    return first;
  }

  Commits* commits_;
  Store* store_;
  std::vector<OwnerLink*> owners_;
  std::vector<NodeLink*> nodes_;
  coordinator_options opt_;
  [[no_unique_address]] Faults faults_;
  std::uint64_t epoch_ = 0;
  std::atomic<bool> dead_{false};
};

namespace detail {
/// The local links of an in-process coordinator, built before the engine
/// that points at them (base-from-member).
template <class Owner, class Receiver, class Store>
struct local_links {
  using owner_link_t = local_owner_link<Owner, Store>;
  using node_link_t = local_node_link<Receiver, Store>;
  std::vector<std::unique_ptr<owner_link_t>> owner_links;
  std::vector<std::unique_ptr<node_link_t>> node_links;
  std::vector<owner_link_t*> owner_ptrs;
  std::vector<node_link_t*> node_ptrs;

  local_links(Store& store, const std::vector<Owner*>& owners,
              const std::vector<receiver_endpoint<Receiver>*>& receivers) {
    for (auto* o : owners) {
      owner_links.push_back(std::make_unique<owner_link_t>(*o, store));
      owner_ptrs.push_back(owner_links.back().get());
    }
    // One node per receiver: each reads the medium on its own, as before
    // nodes existed (and as a relay tree with one leaf per receiver needs).
    for (std::size_t r = 0; r < receivers.size(); ++r) {
      node_links.push_back(std::make_unique<node_link_t>(
          std::vector<receiver_endpoint<Receiver>*>{receivers[r]}, store, r));
      node_ptrs.push_back(node_links.back().get());
    }
  }
};
} // namespace detail

/// Drives owners and receiver endpoints of this process (through local
/// links, one node per receiver) over an object store or another attempt
/// transport, committing in a commit store; `Faults` as for
/// `link_coordinator`.
template <owner_role Owner, receiver_role Receiver, transport::attempt_medium Store,
          commit_store Commits, fault_policy Faults = no_faults>
class coordinator
    : private detail::local_links<Owner, Receiver, Store>,
      public link_coordinator<local_owner_link<Owner, Store>, local_node_link<Receiver, Store>,
                              Store, Commits, Faults> {
  using links = detail::local_links<Owner, Receiver, Store>;
  using engine = link_coordinator<local_owner_link<Owner, Store>, local_node_link<Receiver, Store>,
                                  Store, Commits, Faults>;

public:
  using endpoint = receiver_endpoint<Receiver>;

  coordinator(Commits& commits, Store& store, std::vector<Owner*> owners,
              std::vector<endpoint*> receivers, coordinator_options opt = {}, Faults faults = {})
      : links(store, owners, receivers), engine(commits, store, links::owner_ptrs, links::node_ptrs,
                                                std::move(opt), std::move(faults)) {}

  /// The node of each receiver, in receiver order (to set how it fetches,
  /// `local_node_link::fetch_all`, or read its fetch totals).
  const std::vector<typename links::node_link_t*>& node_links() const noexcept {
    return links::node_ptrs;
  }
};

} // namespace dcr::protocol
