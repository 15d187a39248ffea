#pragma once
/// \file
/// Assembly layer (above protocol/, transport/, source/ and receiver/): the
/// wiring of the library's own roles into the protocol's concepts. The names
/// stay in `dcr::protocol`, where the concepts they model live.
///
/// Adapters that make the library's training side (`dcr::owner`) and rollout
/// side (`dcr::receiver<L>`) models of `owner_role` and `receiver_role`.
///
/// `training_round` holds every in-process owner of one source plan, the
/// candidate the next transition publishes and its required set U_req (the
/// union of all owners' flags; a multi-process trainer all-gathers them).
/// Owner state digests are set digests (core/set_digest.hpp) of the owned
/// shards' (shard, element, word) triples: the baseline's is computed in full
/// once, at construction; a candidate's is the baseline's plus the change
/// of its changed words (found by the change detection `set_candidate` runs
/// anyway), and committing adopts it, so no step after detection reads the
/// whole model. `full_baseline_digest` / `full_candidate_digest` recompute
/// them from every byte (checks).

#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dcr/codec/payload.hpp"
#include "dcr/core/endian.hpp"
#include "dcr/core/error.hpp"
#include "dcr/core/hash.hpp"
#include "dcr/core/set_digest.hpp"
#include "dcr/protocol/roles.hpp"
#include "dcr/source/builder.hpp"

namespace dcr::protocol {

/// Every owner of one plan in this process, and the candidate being published.
class training_round {
public:
  /// Owners whose baselines start at `committed`.
  training_round(std::shared_ptr<const source_plan> plan, const source_view& committed,
                 builder_options opt = {})
      : training_round(plan, committed, opt, every_owner(*plan)) {}
  /// Only owners `ids` (distinct owner ids) in this process, e.g. the one
  /// owner of a training rank's process, whose `committed` view need hold
  /// only the shards they read (`owned_inputs`). Their flags are then the
  /// whole of U_req only if no residual task joins an owner in `ids` with one
  /// outside (as its baseline owner or as the owner of an input):
  /// `errc::invalid_argument` names such a task (a trainer whose residual
  /// tasks span ranks all-gathers its flags instead).
  training_round(std::shared_ptr<const source_plan> plan, const source_view& committed,
                 builder_options opt, std::vector<std::uint32_t> ids)
      : plan_(std::move(plan)), opt_(opt), ids_(std::move(ids)) {
    std::vector<std::uint8_t> here(plan_->world, 0);
    for (auto r : ids_) {
      if (r >= plan_->world || here[r])
        throw error(errc::invalid_argument, "training_round: owner " + std::to_string(r) +
                                                " repeated or outside a world of " +
                                                std::to_string(plan_->world));
      here[r] = 1;
    }
    for (auto& t : plan_->tasks) {
      bool in = here[t.owner], out = !here[t.owner];
      for (auto s : t.inputs) (here[plan_->shards[s].owner] ? in : out) = true;
      if (in && out)
        throw error(errc::invalid_argument,
                    "training_round: residual task " + t.rule.name +
                        " joins owners in this process with owners outside it; its flags "
                        "need an all-gather");
    }
    for (auto r : ids_) owners_.emplace_back(plan_, r, committed);
    for (auto& o : owners_) baseline_set_.push_back(o.baseline_set());
    set_candidate(committed);
  }

  /// The candidate of the next transition (the trainer's current state; must
  /// stay valid and unchanged until the transition ends). Computes U_req and
  /// the owners' candidate digests.
  /// This is the change detection of the transition, the one pass over the
  /// owned shards: the changed words give the flags (a residual input is
  /// flagged when any of its words changed), the candidate digests, and what
  /// `build` and `commit_baseline` touch.
  void set_candidate(const source_view& candidate) {
    candidate_ = candidate;
    changes_.clear();
    candidate_set_.clear();
    std::vector<std::uint32_t> flags;
    for (std::uint32_t r = 0; r < size(); ++r) {
      changes_.push_back(owners_[r].changes(candidate_));
      candidate_set_.push_back(baseline_set_[r]);
      candidate_set_.back() += changes_.back().delta;
      const auto owned = owners_[r].owned_shards();
      for (std::size_t i = 0; i < owned.size(); ++i)
        if (!plan_->shards[owned[i]].feeds.empty() && !changes_.back().changed[i].empty())
          flags.push_back(owned[i]);
    }
    req_ = make_required(*plan_, flags);
  }
  /// Changed words of owner `r`'s candidate against its baseline.
  const owner_changes& changes(std::uint32_t r) const { return changes_.at(local(r)); }

  /// Owner `r`'s digests recomputed from every byte of its baseline and of
  /// the candidate (O(owned bytes)); equal to the kept ones unless a
  /// baseline or the candidate changed behind the round's back.
  digest128 full_baseline_digest(std::uint32_t r) const {
    return seal(local(r), owners_.at(local(r)).baseline_set());
  }
  digest128 full_candidate_digest(std::uint32_t r) const {
    return seal(local(r), owners_.at(local(r)).state_set(candidate_));
  }
  /// Owner `r`'s baseline (its trackers are the committed version of its shards).
  const owner& baseline(std::uint32_t r) const { return owners_.at(local(r)); }
  /// The owner ids in this process, in member order.
  std::span<const std::uint32_t> owner_ids() const noexcept { return ids_; }

  const source_plan& plan() const noexcept { return *plan_; }
  std::uint32_t size() const noexcept { return static_cast<std::uint32_t>(owners_.size()); }
  const source_view& candidate() const noexcept { return candidate_; }
  const required_set& required() const noexcept { return req_; }
  builder_options& options() noexcept { return opt_; }

  /// Protocol view of owner `r` (a `owner_role`).
  class member {
  public:
    /// Member of the round's `k`-th owner (`owner_ids()[k]`).
    member(training_round& t, std::uint32_t k) : t_(&t), r_(k) {}
    std::uint32_t owner_id() const { return t_->ids_[r_]; }
    status build(const build_request& rq, const payload_sink& emit) {
      builder_options opt = t_->opt_;
      opt.mode = rq.mode;
      struct stop_build {
        status s;
      };
      std::uint64_t records = 0;
      struct count_on_exit {
        training_round* t;
        std::uint64_t attempt;
        std::uint64_t& n;
        ~count_on_exit() { t->add_records(attempt, n); }
      } counter{t_, rq.attempt, records};
      try {
        // From the changed set `set_candidate` found: no second comparison.
        t_->owners_[r_].build_buckets(
            t_->changes_[r_], t_->candidate_, t_->req_, opt, [&](delta_bucket&& b) {
              for (auto& it : b.items) records += it.indices.size();
              std::vector<std::byte> bytes;
              auto s =
                  codec::encode_payload({rq.attempt, rq.target_version, owner_id(), b.sequence},
                                        b.items, opt.encoding, bytes);
              if (s) s = emit(std::move(bytes));
              if (!s) throw stop_build{std::move(s)};
            });
      } catch (stop_build& e) {
        return std::move(e.s);
      } catch (const error& e) {
        return fail(e.code(), "owner " + std::to_string(owner_id()) + ": " + e.what());
      }
      return status::success();
    }
    void commit_baseline() {
      // Only the changed words move into the trackers (O(changes)).
      t_->owners_[r_].commit_baseline(t_->candidate_, t_->req_, t_->changes_[r_]);
      t_->baseline_set_[r_] = t_->candidate_set_[r_];
      t_->changes_[r_] = owner_changes{}; // the candidate is the baseline now
      t_->changes_[r_].changed.resize(t_->owners_[r_].owned_shards().size());
    }
    digest128 baseline_digest() const { return t_->seal(r_, t_->baseline_set_[r_]); }
    digest128 candidate_digest() const { return t_->seal(r_, t_->candidate_set_[r_]); }

  private:
    training_round* t_;
    std::uint32_t r_;
  };

  /// Records (changed canonical elements) all owners emitted in attempt τ.
  std::uint64_t emitted_records(std::uint64_t attempt) const {
    std::lock_guard l(m_);
    auto it = records_.find(attempt);
    return it == records_.end() ? 0 : it->second;
  }

  /// One protocol member per owner of this process, in `owner_ids()` order
  /// (stable addresses: keep the vector alive).
  std::vector<member> members() {
    std::vector<member> m;
    for (std::uint32_t r = 0; r < size(); ++r) m.emplace_back(*this, r);
    return m;
  }

private:
  void add_records(std::uint64_t attempt, std::uint64_t n) {
    std::lock_guard l(m_);
    records_[attempt] += n;
  }
  static std::vector<std::uint32_t> every_owner(const source_plan& p) {
    std::vector<std::uint32_t> v(p.world);
    for (std::uint32_t r = 0; r < p.world; ++r) v[r] = r;
    return v;
  }
  /// Position of owner id `r` among this process's owners.
  std::size_t local(std::uint32_t r) const {
    for (std::size_t k = 0; k < ids_.size(); ++k)
      if (ids_[k] == r) return k;
    throw error(errc::not_found,
                "training_round: owner " + std::to_string(r) + " is not in this process");
  }
  /// The `k`-th owner's set digest sealed with its identity (owner id, owned shard ids).
  digest128 seal(std::size_t k, const set_digest& d) const {
    std::vector<std::byte> layout(4);
    store_le(layout.data(), ids_[k]);
    for (auto s : owners_[k].owned_shards()) {
      const auto at = layout.size();
      layout.resize(at + 4);
      store_le(layout.data() + at, s);
    }
    return d.seal(layout);
  }

  std::shared_ptr<const source_plan> plan_;
  builder_options opt_;
  std::vector<std::uint32_t> ids_; ///< owner ids, by position
  std::vector<owner> owners_;
  source_view candidate_;
  required_set req_;
  std::vector<set_digest> baseline_set_, candidate_set_;
  std::vector<owner_changes> changes_;
  mutable std::mutex m_;
  std::map<std::uint64_t, std::uint64_t> records_;
};
static_assert(owner_role<training_round::member>);

/// A `dcr::receiver<L>` (or anything with its `begin_attempt`, `stage`,
/// `apply_staged`, `applied_payloads` and `state_digest`) as a
/// `receiver_role`: a receiver id, and a post-apply check run by `finish`.
/// Attempt fencing, deduplication and staging are the receiver's own; the
/// adapter asks it for what the protocol requires: every byte validated at
/// `stage`, and only `begin_attempt` starting an attempt.
template <class R>
class receiver_role_adapter {
public:
  /// Optional post-apply check run by `finish` (e.g. `verify` against a reference).
  using check = std::function<status(R&)>;

  receiver_role_adapter(std::string id, std::unique_ptr<R> r, check post_apply = {})
      : id_(std::move(id)), r_(std::move(r)), check_(std::move(post_apply)) {
    if (!r_) throw error(errc::invalid_argument, "receiver_role_adapter " + id_ + ": no receiver");
  }
  std::string receiver_id() const { return id_; }
  void begin_attempt(std::uint64_t a) { r_->begin_attempt(a); }
  status stage(std::span<const std::byte> bytes) {
    return r_->stage(bytes, {.decode_now = true, .exact_attempt = true});
  }
  status apply_staged() { return r_->apply_staged(); }
  status finish() { return check_ ? check_(*r_) : status::success(); }
  digest128 state_digest() const { return r_->state_digest(); }

  /// Whether updates of `name` must reach this receiver (`receiver::needs`;
  /// always, for a receiver that cannot say).
  bool needs(std::string_view name) const {
    if constexpr (requires { r_->needs(name); })
      return r_->needs(name);
    else
      return true;
  }

  R& inner() noexcept { return *r_; }
  const R& inner() const noexcept { return *r_; }
  std::uint64_t applied_payloads() const noexcept { return r_->applied_payloads(); }

private:
  std::string id_;
  std::unique_ptr<R> r_;
  check check_;
};

} // namespace dcr::protocol
