#pragma once
/// \file
/// The baseline of one owner (one training rank): trackers (copies of the
/// shards it owns, at the committed version; for a blockwise FP8 shard its
/// converted codes and scales) and the residual baseline (the committed
/// canonical outputs of the residual tasks it owns). Building a delta reads
/// it and never changes it; only `commit` does, after the joint commit.
/// Also here: the flags that select the required residual tasks, change
/// detection against the trackers (`changes`) and the state digests.

#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dcr/core/detect.hpp"
#include "dcr/core/error.hpp"
#include "dcr/core/set_digest.hpp"
#include "dcr/source/plan.hpp"
#include "dcr/source/state.hpp"

namespace dcr {

/// The required set U_req: which residual tasks must be converted this attempt.
struct required_set {
  std::vector<std::uint8_t> task; ///< per residual task id: 1 when required
  bool contains(std::uint32_t t) const noexcept { return t < task.size() && task[t]; }
  std::size_t size() const noexcept {
    std::size_t n = 0;
    for (auto x : task) n += x;
    return n;
  }
  friend bool operator==(const required_set&, const required_set&) = default;
};

/// U_req from the union of all owners' flags (shard ids whose bits changed):
/// every task with a flagged declared input.
inline required_set make_required(const source_plan& p, std::span<const std::uint32_t> flagged) {
  required_set r;
  r.task.assign(p.tasks.size(), 0);
  for (auto s : flagged)
    for (auto t : p.shards.at(s).feeds) r.task[t] = 1;
  return r;
}

/// What an owner holds and how much (baseline memory).
struct baseline_memory {
  std::uint64_t tracker_bytes = 0, residual_bytes = 0;
  std::uint64_t total() const noexcept { return tracker_bytes + residual_bytes; }
};

/// The words of an owner's shards that differ between its baseline and a
/// candidate (`baseline::changes`): what the candidate's state digest and a
/// sparse baseline update need, O(changes) in size.
struct owner_changes {
  /// Per owned shard (in `owned_shards()` order): changed local word indices, sorted.
  std::vector<std::vector<std::uint64_t>> changed;
  /// Set digest of the candidate's owned shards minus the baseline's.
  set_digest delta;
  std::uint64_t count() const noexcept {
    std::uint64_t n = 0;
    for (auto& c : changed) n += c.size();
    return n;
  }
};

/// One owner's baseline (see the file comment).
class baseline {
public:
  /// Baseline at the committed source state `committed` (reads the shards
  /// owner `id` owns and the inputs of its residual tasks).
  baseline(std::shared_ptr<const source_plan> plan, std::uint32_t id, const source_view& committed)
      : plan_(std::move(plan)), id_(id), shards_(plan_->owned_shards(id)),
        tasks_(plan_->owned_tasks(id)) {
    for (auto s : shards_) trackers_.emplace_back(tracked(committed, s));
    residual_.resize(tasks_.size());
    for (std::size_t i = 0; i < tasks_.size(); ++i)
      throw_if_failed(run_rule(plan_->tasks[tasks_[i]].rule,
                               task_inputs(*plan_, tasks_[i], committed), residual_[i]));
  }

  /// `f(W{})` with the unsigned word type of a dtype's width.
  template <class F>
  static void visit_width(dtype_id d, F&& f) {
    switch (width_of(d)) {
    case 1:
      f(std::uint8_t{});
      break;
    case 2:
      f(std::uint16_t{});
      break;
    case 4:
      f(std::uint32_t{});
      break;
    default:
      f(std::uint64_t{});
      break;
    }
  }

  /// `b` as words of type `W`.
  template <class W>
  static std::span<const W> as_words(std::span<const std::byte> b) noexcept {
    return {reinterpret_cast<const W*>(b.data()), b.size() / sizeof(W)};
  }

  std::uint32_t id() const noexcept { return id_; }
  const source_plan& plan() const noexcept { return *plan_; }
  const std::shared_ptr<const source_plan>& plan_ptr() const noexcept { return plan_; }
  std::span<const std::uint32_t> owned_shards() const noexcept { return shards_; }
  std::span<const std::uint32_t> owned_tasks() const noexcept { return tasks_; }
  /// The tracker of the `i`-th owned shard (`owned_shards()[i]`).
  std::span<const std::byte> tracker(std::size_t i) const noexcept { return trackers_[i]; }
  /// The residual baseline of the `i`-th owned task (`owned_tasks()[i]`), one
  /// tensor per output.
  std::span<const host_tensor> residual(std::size_t i) const noexcept { return residual_[i]; }

  /// Flags: owned shards that feed residual tasks and whose bits differ from
  /// their trackers.
  std::vector<std::uint32_t> flagged_inputs(const source_view& candidate) const {
    std::vector<std::uint32_t> f;
    for (std::size_t i = 0; i < shards_.size(); ++i) {
      const auto s = shards_[i];
      if (plan_->shards[s].feeds.empty()) continue;
      auto c = view_of(candidate, s);
      if (std::memcmp(c.data(), trackers_[i].data(), c.size()) != 0) f.push_back(s);
    }
    return f;
  }

  /// Explicit post-commit update: trackers take the candidate's owned shards;
  /// residual baselines of required tasks take their converted candidate.
  void commit(const source_view& candidate, const required_set& req) {
    std::vector<std::vector<host_tensor>> next(tasks_.size());
    for (std::size_t i = 0; i < tasks_.size();
         ++i) // convert first: a failure leaves the baseline untouched
      if (req.contains(tasks_[i]))
        throw_if_failed(run_rule(plan_->tasks[tasks_[i]].rule,
                                 task_inputs(*plan_, tasks_[i], candidate), next[i]));
    for (std::size_t i = 0; i < shards_.size(); ++i) {
      if (plan_->shards[shards_[i]].blockwise) {
        trackers_[i] = tracked(candidate, shards_[i]);
        continue;
      }
      auto c = view_of(candidate, shards_[i]);
      std::memcpy(trackers_[i].data(), c.data(), c.size());
    }
    for (std::size_t i = 0; i < tasks_.size(); ++i)
      if (req.contains(tasks_[i])) residual_[i] = std::move(next[i]);
  }

  /// `commit` that copies only the changed words into the trackers:
  /// O(changes) instead of O(owned bytes). `ch` must be `changes(candidate)`
  /// against the current baseline (`invalid_argument` when its shape does not fit).
  void commit(const source_view& candidate, const required_set& req, const owner_changes& ch) {
    if (ch.changed.size() != shards_.size())
      throw error(errc::invalid_argument, "commit_baseline: changes of another owner");
    std::vector<std::vector<host_tensor>> next(tasks_.size());
    for (std::size_t i = 0; i < tasks_.size(); ++i)
      if (req.contains(tasks_[i]))
        throw_if_failed(run_rule(plan_->tasks[tasks_[i]].rule,
                                 task_inputs(*plan_, tasks_[i], candidate), next[i]));
    for (std::size_t i = 0; i < shards_.size(); ++i) { // check first: a failure changes nothing
      const auto n =
          plan_->shards[shards_[i]].blockwise
              ? trackers_[i].size()
              : view_of(candidate, shards_[i]).size() / width_of(plan_->shards[shards_[i]].dtype);
      if (!ch.changed[i].empty() && ch.changed[i].back() >= n)
        throw error(errc::invalid_argument,
                    "commit_baseline: change outside " + plan_->shards[shards_[i]].key);
    }
    for (std::size_t i = 0; i < shards_.size(); ++i) {
      if (plan_->shards[shards_[i]].blockwise) {
        // Converted codes and scales: converting the shard again is what a
        // tile's change costs anyway (its scale may move every code).
        if (!ch.changed[i].empty()) trackers_[i] = tracked(candidate, shards_[i]);
        continue;
      }
      auto c = view_of(candidate, shards_[i]);
      visit_width(plan_->shards[shards_[i]].dtype, [&](auto word) {
        using W = decltype(word);
        auto* t = reinterpret_cast<W*>(trackers_[i].data());
        auto cw = as_words<W>(c);
        for (auto j : ch.changed[i]) t[j] = cw[j];
      });
    }
    for (std::size_t i = 0; i < tasks_.size(); ++i)
      if (req.contains(tasks_[i])) residual_[i] = std::move(next[i]);
  }

  /// Element-hash key of owned shard `s` (a plan shard id) in state digests.
  set_digest_key shard_key(std::uint32_t s) const {
    const auto& sh = plan_->shards.at(s);
    return region_key(sh.key, sh.dtype, sh.shape);
  }
  /// Set digest of the owned shards of the baseline (trackers), recomputed
  /// from every byte: O(owned bytes), at construction and as a check.
  set_digest baseline_set() const {
    set_digest d;
    for (std::size_t i = 0; i < shards_.size(); ++i)
      d.add_bytes(shard_key(shards_[i]), trackers_[i], tracked_width(shards_[i]));
    return d;
  }
  /// Set digest of the owned shards of `v`, recomputed from every byte.
  set_digest state_set(const source_view& v) const {
    set_digest d;
    for (auto s : shards_) {
      if (plan_->shards[s].blockwise)
        d.add_bytes(shard_key(s), tracked(v, s), tracked_width(s));
      else
        d.add_bytes(shard_key(s), view_of(v, s), tracked_width(s));
    }
    return d;
  }
  /// The changed words of `candidate` against the baseline (change detection
  /// over the owned shards, the one O(model) step) and the change of the set
  /// digest they make (O(changes)).
  owner_changes changes(const source_view& candidate) const {
    owner_changes ch;
    ch.changed.resize(shards_.size());
    for (std::size_t i = 0; i < shards_.size(); ++i) {
      const auto s = shards_[i];
      const auto key = shard_key(s);
      if (plan_->shards[s].blockwise) {
        // The tracker holds converted codes and scales: compare those bytes.
        const auto conv = tracked(candidate, s);
        auto o = as_words<std::uint8_t>(trackers_[i]);
        auto c = as_words<std::uint8_t>(conv);
        detect_changes(o, c, 0, ch.changed[i]);
        ch.delta.replace_at<std::uint8_t>(key, ch.changed[i], o, c);
        continue;
      }
      auto cand = view_of(candidate, s);
      visit_width(plan_->shards[s].dtype, [&](auto word) {
        using W = decltype(word);
        auto o = as_words<W>(trackers_[i]);
        auto c = as_words<W>(cand);
        detect_changes(o, c, 0, ch.changed[i]);
        ch.delta.replace_at<W>(key, ch.changed[i], o, c);
      });
    }
    return ch;
  }

  /// The committed bytes of owned shard `s` (a plan shard id): its tracker,
  /// for dense exports of the committed version without a copy of the
  /// model. `not_found` for a shard this owner does not own;
  /// `invalid_argument` for a blockwise shard, whose tracker holds the
  /// converted codes and scales rather than the source words.
  std::span<const std::byte> committed_shard(std::uint32_t s) const {
    for (std::size_t i = 0; i < shards_.size(); ++i) {
      if (shards_[i] != s) continue;
      if (plan_->shards[s].blockwise)
        throw error(errc::invalid_argument,
                    plan_->shards[s].key + ": a blockwise tracker holds converted words");
      return trackers_[i];
    }
    throw error(errc::not_found,
                "owner " + std::to_string(id_) + " does not own shard " + std::to_string(s));
  }

  /// Bytes of this baseline.
  baseline_memory memory() const noexcept {
    baseline_memory m;
    for (auto& t : trackers_) m.tracker_bytes += t.size();
    for (auto& r : residual_)
      for (auto& t : r) m.residual_bytes += t.bytes.size();
    return m;
  }

  /// Shard `s` of `v`, checked against the plan (`not_found`, `shape_mismatch`).
  std::span<const std::byte> view_of(const source_view& v, std::uint32_t s) const {
    if (s >= v.shards.size())
      throw error(errc::not_found, "source view lacks shard " + plan_->shards[s].key);
    auto b = v.shards[s];
    if (b.empty() && plan_->shards[s].nbytes() != 0)
      throw error(errc::not_found, "source view lacks shard " + plan_->shards[s].key);
    if (b.size() != plan_->shards[s].nbytes())
      throw error(errc::shape_mismatch, plan_->shards[s].key + ": " + std::to_string(b.size()) +
                                            " bytes, plan says " +
                                            std::to_string(plan_->shards[s].nbytes()));
    return b;
  }

private:
  /// Word width of what the tracker of shard `s` holds (digests, change
  /// sets): the shard's dtype, or bytes for a blockwise shard's mixed codes
  /// and scales.
  std::size_t tracked_width(std::uint32_t s) const {
    return plan_->shards[s].blockwise ? 1 : width_of(plan_->shards[s].dtype);
  }
  /// What the tracker of shard `s` holds: its stored bytes, or for a
  /// blockwise shard its converted FP8 scales and codes (the BF16 bits are
  /// not kept: only converted changes are ever sent).
  std::vector<std::byte> tracked(const source_view& v, std::uint32_t s) const {
    const auto& sh = plan_->shards[s];
    auto b = view_of(v, s);
    if (!sh.blockwise) return {b.begin(), b.end()};
    std::vector<std::byte> out(sh.blockwise->converted_bytes());
    sh.blockwise->convert(b, out);
    return out;
  }

  std::shared_ptr<const source_plan> plan_;
  std::uint32_t id_;
  std::vector<std::uint32_t> shards_, tasks_;
  std::vector<std::vector<std::byte>> trackers_;
  std::vector<std::vector<host_tensor>> residual_;
};

} // namespace dcr
