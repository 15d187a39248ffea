#pragma once
/// \file
/// Baseline and delta builder of one owner (one training rank).
///
/// An `owner` holds its baseline: trackers (copies of the shards it owns, at
/// the committed version) and the residual baseline (the committed canonical
/// outputs of the residual tasks whose baseline it owns). Building a delta
/// never changes the baseline; only `commit_baseline` does, after the joint
/// commit. Construction, per attempt:
///  1. flags: every owner compares the shards it owns that feed residual
///     tasks (`flagged_inputs`); the union of flags selects the required set
///     U_req (`make_required`), the same on every owner;
///  2. `build_buckets`: the owner walks its tasks in plan order (owned affine
///     shards, then owned required residual tasks), grouped into chunks of
///     whole tasks (byte target: local shard bytes for affine tasks, converted
///     canonical bytes for residual tasks). Affine: `detect_changes` against the
///     tracker, then direct projection through the shard's map. Residual:
///     convert from the candidate's inputs, then diff against the residual
///     baseline. Records become `dcr::item`s (one per canonical tensor and
///     encoding in a bucket); chunks that emit records fill buckets (byte
///     target: full input bytes of those chunks); each bucket is one payload.
/// Encodings: `mixed` uses a relative encoding for affine items whose map is
/// unique (the map preserves stored words, so old^new, or new - old, of the
/// source is that of the canonical element) and overwrites for residual
/// items; `overwrite_all` (retries) uses overwrites everywhere. The relative
/// encoding is, per item, the smaller of XOR masks and zigzag integer
/// differences (`add`, format v2) by `stages::choose_smaller`, or the one
/// `builder_options::relative` names. Same candidate, baseline and options
/// give byte-identical payloads.
///
/// Per-item work: the stages of source/stages.hpp, compare<Dtype> ->
/// project<piecewise_map> -> encode<Encoding, Locations>. `build` selects the
/// instantiation for each shard's dtype and encoding from a table built at
/// compile time over the policy lists (pipeline/dispatch.hpp); `build<P>`
/// runs one statically composed `stages::refit_pipeline` P and nothing else.

#include <bit>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "dcr/codec/item.hpp"
#include "dcr/codec/payload.hpp"
#include "dcr/core/set_digest.hpp"
#include "dcr/pipeline/dispatch.hpp"
#include "dcr/pipeline/parallel.hpp"
#include "dcr/source/detect.hpp"
#include "dcr/source/plan.hpp"
#include "dcr/source/stages.hpp"
#include "dcr/source/state.hpp"

namespace dcr {

/// Which relative encoding `mixed` uses where one is exact.
enum class relative_choice : std::uint8_t {
  smallest, ///< per item, XOR or add, whichever codes smaller (add needs format v2)
  xor_only, ///< XOR masks (what format v1 readers understand)
  add_only, ///< zigzag integer differences
};

/// How a bucket's items are grouped into payloads.
enum class payload_grouping : std::uint8_t {
  none,      ///< one payload per bucket (the bytes of every earlier release)
  by_expert, ///< one payload per expert index of the bucket's tensors, plus one of the rest
};

/// The group of canonical tensor `name` under `by_expert`: 0 for a tensor of
/// no expert, 1 + E for a name containing `.experts.<E>.` (decimal E, the
/// canonical MoE naming, model/config.hpp).
inline std::uint64_t expert_group(std::string_view name) noexcept {
  constexpr std::string_view key = ".experts.";
  for (auto at = name.find(key); at != std::string_view::npos; at = name.find(key, at + 1)) {
    std::size_t i = at + key.size();
    std::uint64_t e = 0;
    std::size_t digits = 0;
    while (i < name.size() && name[i] >= '0' && name[i] <= '9' && digits < 18) {
      e = e * 10 + static_cast<std::uint64_t>(name[i] - '0');
      ++i;
      ++digits;
    }
    if (digits > 0 && i < name.size() && name[i] == '.') return 1 + e;
  }
  return 0;
}

/// Chunk and bucket targets (bytes; tasks and chunks are never split, so a
/// chunk or bucket can exceed its target) and the encoding policy.
struct builder_options {
  std::size_t chunk_bytes = std::size_t{64} << 20, bucket_bytes = std::size_t{512} << 20;
  refit_mode mode = refit_mode::mixed; ///< mixed: relative encodings for unique affine maps,
                                       ///< overwrite for residual items
  relative_choice relative = relative_choice::smallest; ///< (mixed only)
  /// In mixed mode, residual outputs become XOR masks too (old ^ new of the
  /// converted words against the residual baseline) instead of overwrites:
  /// for receivers whose paths for those tensors are XOR-allowed (an FP8
  /// rollout's codes and scales placed by plain copies). Off by default.
  bool residual_xor = false;
  encode_options encoding{};
  /// Threads that build chunks (0: `std::thread::hardware_concurrency()`;
  /// 1, the default: the calling thread only). Payload bytes do not depend
  /// on it. One is the default because the merge into buckets and their
  /// encoding stay on the calling thread: on 2 hardware threads a 2-thread
  /// build is 1.56x faster at 1.2 % change but 0.59x at 5 %
  /// (docs/training-side.md). With
  /// more than one, residual rules (`residual_rule::convert`) of different
  /// tasks run concurrently, so a rule must not share mutable state.
  std::size_t threads = 1;
  /// Memory bound of a parallel build: at most this many chunks are being
  /// built or wait, built, for their turn to be merged into a bucket (0:
  /// twice the threads). With the open bucket, what a build holds beyond its
  /// inputs is at most this many chunks' records plus one bucket.
  std::size_t chunks_in_flight = 0;
  /// `by_expert` splits each bucket into one payload per expert (and one of
  /// every other tensor), in group order: with a manifest index, a node
  /// that holds some experts only (expert parallelism) then fetches only
  /// their payloads and the dense one. More, smaller payloads; what the
  /// items say is the same, so every receiver ends in the same bytes.
  payload_grouping grouping = payload_grouping::none;
  /// With `by_expert`: 0, one payload per expert; N > 0, the experts in N
  /// contiguous blocks (expert E of X in block E·N/X), one payload per block.
  /// N = the expert-parallel nodes under vLLM's linear placement (node j
  /// holds block j) gives each node exactly its payloads with N + 1 payloads
  /// per bucket instead of X + 1: fewer, larger objects (each a request).
  std::uint32_t expert_blocks = 0;
};

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

/// The records one bucket carries, before encoding.
struct delta_bucket {
  std::uint32_t owner = 0, sequence = 0;
  std::vector<item> items;
  std::uint64_t input_bytes = 0; ///< full input bytes of the chunks that emitted records
};

/// What an owner holds and how much (baseline memory).
struct baseline_memory {
  std::uint64_t tracker_bytes = 0, residual_bytes = 0;
  std::uint64_t total() const noexcept { return tracker_bytes + residual_bytes; }
};

/// The words of an owner's shards that differ between its baseline and a
/// candidate (`owner::changes`): what the candidate's state digest and a
/// sparse baseline update need, O(changes) in size.
struct owner_changes {
  /// Per owned shard (in `owner::owned_shards()` order): changed local word indices, sorted.
  std::vector<std::vector<std::uint64_t>> changed;
  /// Set digest of the candidate's owned shards minus the baseline's.
  set_digest delta;
  std::uint64_t count() const noexcept {
    std::uint64_t n = 0;
    for (auto& c : changed) n += c.size();
    return n;
  }
};

/// One owner: its baseline and its delta builder (see the file comment).
class owner {
public:
  /// Baseline at the committed source state `committed` (reads the shards
  /// this owner owns and the inputs of its residual tasks).
  owner(std::shared_ptr<const source_plan> plan, std::uint32_t id, const source_view& committed)
      : plan_(std::move(plan)), id_(id), shards_(plan_->owned_shards(id)),
        tasks_(plan_->owned_tasks(id)) {
    for (auto s : shards_) trackers_.emplace_back(tracked(committed, s));
    // 1 + the largest expert index of the model: its expert count.
    for (auto& m : plan_->canonical) experts_ = std::max(experts_, expert_group(m.name));
    residual_.resize(tasks_.size());
    for (std::size_t i = 0; i < tasks_.size(); ++i)
      throw_if_failed(run_rule(plan_->tasks[tasks_[i]].rule,
                               task_inputs(*plan_, tasks_[i], committed), residual_[i]));
  }

  std::uint32_t id() const noexcept { return id_; }
  const source_plan& plan() const noexcept { return *plan_; }
  std::span<const std::uint32_t> owned_shards() const noexcept { return shards_; }
  std::span<const std::uint32_t> owned_tasks() const noexcept { return tasks_; }

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

  /// Builds this owner's buckets for one attempt and passes each to
  /// `sink(delta_bucket&&)` in sequence order (so a pipeline can send bucket
  /// l while l+1 is built). Does not touch the baseline. Throws `dcr::error`
  /// (e.g. `errc::coverage`, `errc::parts_disagree` from a residual task).
  template <class Sink>
  void build_buckets(const source_view& candidate, const required_set& req,
                     const builder_options& opt, Sink&& sink) const {
    build_with(dispatched{}, candidate, req, opt, sink, nullptr);
  }
  /// As above with the changed words found already (`changes(candidate)`
  /// against this baseline): the affine shards are not compared again, so
  /// the build costs O(changes) outside the required residual tasks. Same
  /// buckets, byte for byte. `invalid_argument` when `ch` is of another owner.
  template <class Sink>
  void build_buckets(const owner_changes& ch, const source_view& candidate, const required_set& req,
                     const builder_options& opt, Sink&& sink) const {
    if (ch.changed.size() != shards_.size())
      throw error(errc::invalid_argument, "build_buckets: changes of another owner");
    build_with(dispatched{}, candidate, req, opt, sink, &ch);
  }
  /// As above, through the statically composed pipeline `P` only (a
  /// `stages::refit_pipeline` over `piecewise_map`): its encoding for affine
  /// shards, overwrites for residual outputs. Throws `errc::bad_dtype` for a
  /// shard or output of another dtype and `errc::invalid_argument` for an
  /// affine shard whose encoding under `opt.mode` is not P's, so a result is
  /// always the bytes `build_buckets` gives. A pipeline encoding XOR stands
  /// for the relative encoding: under `relative_choice::smallest` it records
  /// add differences too and each item takes the smaller, as `build_buckets`
  /// does; one encoding add needs `relative_choice::add_only`.
  template <class P, class Sink>
  void build_buckets(const source_view& candidate, const required_set& req,
                     const builder_options& opt, Sink&& sink) const {
    build_with(composed<P>{}, candidate, req, opt, sink, nullptr);
  }

  /// All buckets of one attempt.
  std::vector<delta_bucket> build_items(const source_view& candidate, const required_set& req,
                                        const builder_options& opt = {}) const {
    std::vector<delta_bucket> out;
    build_buckets(candidate, req, opt, [&](delta_bucket&& b) { out.push_back(std::move(b)); });
    return out;
  }

  /// Payloads of one attempt: bucket `l` becomes the payload with id
  /// `{base_id.attempt, base_id.source_version, this owner, l}`.
  std::vector<std::vector<std::byte>> build(const source_view& candidate, const required_set& req,
                                            const payload_id& base_id,
                                            const builder_options& opt = {}) const {
    std::vector<std::vector<std::byte>> out;
    build_buckets(candidate, req, opt, [&](delta_bucket&& b) {
      payload_id id = base_id;
      id.owner = id_;
      id.sequence = b.sequence;
      throw_if_failed(codec::encode_payload_with(
          id, b.items, opt.encoding, pipeline::dispatched_locations{opt.encoding.locations},
          out.emplace_back()));
    });
    return out;
  }
  /// As above through the statically composed pipeline `P`, whose location
  /// policy codes the payloads (`opt.encoding.locations` is not read).
  template <class P>
  std::vector<std::vector<std::byte>> build(const source_view& candidate, const required_set& req,
                                            const payload_id& base_id,
                                            const builder_options& opt = {}) const {
    std::vector<std::vector<std::byte>> out;
    build_buckets<P>(candidate, req, opt, [&](delta_bucket&& b) {
      payload_id id = base_id;
      id.owner = id_;
      id.sequence = b.sequence;
      throw_if_failed(codec::encode_payload_with(id, b.items, opt.encoding, typename P::locations{},
                                                 out.emplace_back()));
    });
    return out;
  }

  /// Explicit post-commit update: trackers take the candidate's owned shards;
  /// residual baselines of required tasks take their converted candidate.
  void commit_baseline(const source_view& candidate, const required_set& req) {
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

  /// `commit_baseline` that copies only the changed words into the trackers:
  /// O(changes) instead of O(owned bytes). `ch` must be `changes(candidate)`
  /// against the current baseline (`invalid_argument` when its shape does not fit).
  void commit_baseline(const source_view& candidate, const required_set& req,
                       const owner_changes& ch) {
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

  /// Bytes of this owner's baseline.
  baseline_memory memory() const noexcept {
    baseline_memory m;
    for (auto& t : trackers_) m.tracker_bytes += t.size();
    for (auto& r : residual_)
      for (auto& t : r) m.residual_bytes += t.bytes.size();
    return m;
  }

private:
  struct builder : stages::record_buffer {
    std::uint32_t tensor;
    value_encoding enc;
  };
  struct state {
    const builder_options& opt;
    std::vector<builder> chunk;                     // records of the open chunk
    std::vector<item> bucket;                       // items of the open bucket
    std::vector<std::vector<std::byte>> bucket_alt; // per bucket item: add words (XOR items
                                                    // under relative_choice::smallest)
    std::unordered_map<std::uint64_t, std::size_t> bucket_slot;
    std::uint64_t chunk_bytes = 0, bucket_bytes = 0;
    std::uint32_t sequence = 0;
    /// Changed local indices of the shard being projected, when known (else compare).
    const std::vector<std::uint64_t>* changed = nullptr;
    builder& get(std::uint32_t tensor, value_encoding e) {
      for (auto it = chunk.rbegin(); it != chunk.rend(); ++it)
        if (it->tensor == tensor && it->enc == e) return *it;
      chunk.push_back({{}, tensor, e});
      return chunk.back();
    }
  };

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
  std::vector<std::byte> copy_of(const source_view& v, std::uint32_t s) const {
    auto b = view_of(v, s);
    return {b.begin(), b.end()};
  }
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
    if (!sh.blockwise) return copy_of(v, s);
    std::vector<std::byte> out(sh.blockwise->converted_bytes());
    sh.blockwise->convert(view_of(v, s), out);
    return out;
  }
  template <class W>
  static std::span<const W> as_words(std::span<const std::byte> b) noexcept {
    return {reinterpret_cast<const W*>(b.data()), b.size() / sizeof(W)};
  }
  /// `f(W{})` with the unsigned word type of a dtype.
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

  /// One unit of the walk: an owned shard (affine or blockwise) or an owned
  /// required residual task, by its position in `shards_` / `tasks_`.
  struct unit {
    bool residual;
    std::uint32_t at;
  };
  /// Whole units, in walk order, whose bytes reach the chunk target (the
  /// last may be short).
  struct chunk_span {
    std::size_t first, last;
    std::uint64_t bytes;
  };

  /// The walk of one attempt: owned affine shards, then owned required
  /// residual tasks, in plan order, grouped into chunks and buckets; the
  /// per-shard work is `select.affine` / `select.residual`. Chunk boundaries
  /// depend on the plan only, so chunks are built independently (on
  /// `opt.threads` threads, at most `opt.chunks_in_flight` at a time) and
  /// merged into buckets in chunk order: the same bytes for any thread count.
  template <class Select, class Sink>
  void build_with(const Select& select, const source_view& candidate, const required_set& req,
                  const builder_options& opt, Sink& sink, const owner_changes* ch) const {
    std::vector<unit> units;
    std::vector<chunk_span> chunks;
    auto add = [&](unit u, std::uint64_t b) {
      if (chunks.empty() || chunks.back().bytes >= opt.chunk_bytes)
        chunks.push_back({units.size(), units.size(), 0});
      units.push_back(u);
      chunks.back().last = units.size();
      chunks.back().bytes += b;
    };
    for (std::size_t i = 0; i < shards_.size(); ++i) {
      const auto& sh = plan_->shards[shards_[i]];
      if (sh.blockwise || sh.affine()) add({false, static_cast<std::uint32_t>(i)}, sh.nbytes());
    }
    for (std::size_t i = 0; i < tasks_.size(); ++i)
      if (req.contains(tasks_[i]))
        add({true, static_cast<std::uint32_t>(i)}, plan_->tasks[tasks_[i]].output_bytes);

    state st{opt, {}, {}, {}, {}};
    pipeline::for_each_ordered(
        chunks.size(), pipeline::resolve_threads(opt.threads), opt.chunks_in_flight,
        [&](std::size_t c) {
          state local{opt, {}, {}, {}, {}};
          build_chunk(select, candidate, opt, ch, units, chunks[c], local);
          return std::move(local.chunk);
        },
        [&](std::size_t c, std::vector<builder>&& records) {
          st.chunk = std::move(records);
          st.chunk_bytes = chunks[c].bytes;
          close_chunk(st, sink);
        });
    flush(st, sink);
  }

  /// The records of one chunk, each tensor's sorted (on the worker, so the
  /// merge in chunk order only concatenates or merges sorted lists).
  template <class Select>
  void build_chunk(const Select& select, const source_view& candidate, const builder_options& opt,
                   const owner_changes* ch, const std::vector<unit>& units, const chunk_span& span,
                   state& st) const {
    // add items need format v2: a v1 payload offers XOR only.
    const bool either =
        opt.relative == relative_choice::smallest && opt.encoding.format_version >= 2;
    std::vector<std::byte> converted;
    std::vector<host_tensor> produced;
    const auto residual_enc = opt.mode == refit_mode::mixed && opt.residual_xor
                                  ? value_encoding::xor_mask
                                  : value_encoding::overwrite;
    for (std::size_t u = span.first; u < span.last; ++u) {
      const std::size_t i = units[u].at;
      if (units[u].residual) {
        const auto& task = plan_->tasks[tasks_[i]];
        throw_if_failed(run_rule(task.rule, task_inputs(*plan_, tasks_[i], candidate), produced));
        for (std::size_t k = 0; k < produced.size(); ++k) {
          const auto& meta = plan_->canonical[task.outputs[k]];
          if (produced[k].bytes.size() != meta.nbytes() ||
              residual_[i][k].bytes.size() != meta.nbytes())
            throw error(errc::shape_mismatch,
                        task.rule.name + ": output " + meta.name + " has the wrong size");
          select.residual(plan_->canonical[task.outputs[k]], task.outputs[k], residual_[i][k].bytes,
                          produced[k].bytes, residual_enc, st);
        }
        continue;
      }
      const auto& sh = plan_->shards[shards_[i]];
      if (sh.blockwise) {
        // Shard-local FP8: quantise the candidate shard, diff codes and
        // scales against the converted tracker, project both directly.
        const auto& b = *sh.blockwise;
        converted.resize(b.converted_bytes());
        b.convert(view_of(candidate, shards_[i]), converted);
        const auto enc =
            opt.mode == refit_mode::mixed ? value_encoding::xor_mask : value_encoding::overwrite;
        std::span<const std::byte> old_b = trackers_[i], new_b = converted;
        select.blockwise(sh, b.code_part(old_b), b.code_part(new_b), b.scale_part(old_b),
                         b.scale_part(new_b), enc, st);
        continue;
      }
      auto cand = view_of(candidate, shards_[i]);
      const bool relative_ok = opt.mode == refit_mode::mixed && sh.map->is_unique();
      const value_encoding e = !relative_ok ? value_encoding::overwrite
                               : opt.relative == relative_choice::add_only
                                   ? value_encoding::add
                                   : value_encoding::xor_mask;
      st.changed = ch ? &ch->changed[i] : nullptr;
      select.affine(sh, trackers_[i], cand, e, relative_ok && either, st);
      st.changed = nullptr;
    }
    for (auto& b : st.chunk)
      if (!b.indices.empty())
        visit_dtype(plan_->canonical[b.tensor].dtype,
                    [&](auto tag) { stages::sort_records<word_t<decltype(tag)>>(b); });
  }

  /// compare<D> -> project<M> -> encode<E> (or encode_either<E, A> when `A`
  /// is not void) of one shard into the open chunk.
  template <class D, class M, class E, class A = void>
  static void project_shard(const M& map, std::span<const std::byte> old_b,
                            std::span<const std::byte> new_b, state& st) {
    using W = word_t<D>;
    using Enc = std::conditional_t<
        std::is_void_v<A>, stages::encode<E, codec::by_scheme>,
        stages::encode_either<E, std::conditional_t<std::is_void_v<A>, E, A>, codec::by_scheme>>;
    auto target = [&](std::uint32_t tensor) -> builder& { return st.get(tensor, E::id); };
    if (st.changed)
      stages::changes_to_records<stages::compare<D>, stages::project<M>, Enc>(
          stages::project<M>{map}, as_words<W>(old_b), as_words<W>(new_b),
          std::span<const std::uint64_t>(*st.changed), target);
    else
      stages::changes_to_records<stages::compare<D>, stages::project<M>, Enc>(
          stages::project<M>{map}, as_words<W>(old_b), as_words<W>(new_b), target);
  }
  /// The instantiations a table entry runs.
  struct affine_fn {
    template <class D, class E>
    static void call(const piecewise_map& m, std::span<const std::byte> o,
                     std::span<const std::byte> c, state& st) {
      project_shard<D, piecewise_map, E>(m, o, c, st);
    }
  };
  /// XOR masks with add differences alongside (the per-item choice).
  struct affine_either_fn {
    template <class D>
    static void call(const piecewise_map& m, std::span<const std::byte> o,
                     std::span<const std::byte> c, state& st) {
      project_shard<D, piecewise_map, codec::xor_mask, codec::add_delta>(m, o, c, st);
    }
  };
  struct residual_fn {
    template <class D, class E>
    static void call(const tensor_meta& meta, std::uint32_t tensor, std::span<const std::byte> o,
                     std::span<const std::byte> c, state& st) {
      project_shard<D, stages::identity_map, E>(stages::identity_map{tensor, meta.numel()}, o, c,
                                                st);
    }
  };
  /// The general path: one table lookup per shard (dtype x encoding) and per
  /// residual output (dtype).
  struct dispatched {
    void affine(const source_shard& sh, std::span<const std::byte> o, std::span<const std::byte> c,
                value_encoding e, bool either, state& st) const {
      if (either) {
        static constexpr pipeline::dispatch_table<affine_either_fn,
                                                  void(const piecewise_map&,
                                                       std::span<const std::byte>,
                                                       std::span<const std::byte>, state&),
                                                  pipeline::dtype_list>
            either_table{};
        auto* f = either_table(pipeline::position_of<pipeline::dtype_list>(sh.dtype));
        if (!f) throw error(errc::bad_dtype, sh.key + ": no pipeline for its dtype");
        f(*sh.map, o, c, st);
        return;
      }
      static constexpr pipeline::dispatch_table<affine_fn,
                                                void(const piecewise_map&,
                                                     std::span<const std::byte>,
                                                     std::span<const std::byte>, state&),
                                                pipeline::dtype_list, pipeline::encoding_list>
          table{};
      auto* f = table(pipeline::position_of<pipeline::dtype_list>(sh.dtype),
                      pipeline::position_of<pipeline::encoding_list>(e));
      if (!f) throw error(errc::bad_dtype, sh.key + ": no pipeline for its dtype");
      f(*sh.map, o, c, st);
    }
    void residual(const tensor_meta& meta, std::uint32_t tensor, std::span<const std::byte> o,
                  std::span<const std::byte> c, value_encoding e, state& st) const {
      static constexpr pipeline::dispatch_table<residual_fn,
                                                void(const tensor_meta&, std::uint32_t,
                                                     std::span<const std::byte>,
                                                     std::span<const std::byte>, state&),
                                                pipeline::dtype_list, pipeline::encoding_list>
          table{};
      auto* f = table(pipeline::position_of<pipeline::dtype_list>(meta.dtype),
                      pipeline::position_of<pipeline::encoding_list>(e));
      if (!f) throw error(errc::bad_dtype, meta.name + ": no pipeline for its dtype");
      f(meta, tensor, o, c, st);
    }
    void blockwise(const source_shard& sh, std::span<const std::byte> oc,
                   std::span<const std::byte> nc, std::span<const std::byte> os,
                   std::span<const std::byte> ns, value_encoding e, state& st) const {
      blockwise_items(sh, oc, nc, os, ns, e, st);
    }
  };
  /// Codes (E4M3) and scales (F32) of a blockwise shard, each through its map.
  static void blockwise_items(const source_shard& sh, std::span<const std::byte> oc,
                              std::span<const std::byte> nc, std::span<const std::byte> os,
                              std::span<const std::byte> ns, value_encoding e, state& st) {
    const auto& b = *sh.blockwise;
    if (e == value_encoding::xor_mask) {
      project_shard<f8e4m3fn, piecewise_map, codec::xor_mask>(b.codes, oc, nc, st);
      project_shard<f32, piecewise_map, codec::xor_mask>(b.scales, os, ns, st);
    } else {
      project_shard<f8e4m3fn, piecewise_map, codec::overwrite>(b.codes, oc, nc, st);
      project_shard<f32, piecewise_map, codec::overwrite>(b.scales, os, ns, st);
    }
  }
  /// A statically composed pipeline: P's instantiation or a typed error.
  template <class P>
  struct composed {
    static_assert(std::is_same_v<typename P::map_type, piecewise_map>,
                  "an owner's shards carry piecewise maps");
    using D = typename P::dtype;
    using E = typename P::encoding;
    void affine(const source_shard& sh, std::span<const std::byte> o, std::span<const std::byte> c,
                value_encoding e, bool either, state& st) const {
      if (sh.dtype != dtype_traits<D>::id)
        throw error(errc::bad_dtype, sh.key + ": " + std::string(name_of(sh.dtype)) +
                                         " shard, pipeline for " +
                                         std::string(name_of(dtype_traits<D>::id)));
      if (e != E::id)
        throw error(errc::invalid_argument, sh.key + ": needs " + std::string(to_string(e)) +
                                                " items, pipeline encodes " +
                                                std::string(to_string(E::id)));
      if constexpr (E::id == value_encoding::xor_mask)
        if (either) {
          project_shard<D, piecewise_map, E, codec::add_delta>(*sh.map, o, c, st);
          return;
        }
      project_shard<D, piecewise_map, E>(*sh.map, o, c, st);
    }
    void residual(const tensor_meta& meta, std::uint32_t tensor, std::span<const std::byte> o,
                  std::span<const std::byte> c, value_encoding e, state& st) const {
      if (e != value_encoding::overwrite)
        throw error(errc::invalid_argument,
                    meta.name + ": residual_xor needs the dispatched builder (a composed "
                                "pipeline encodes residual outputs as overwrites)");
      if (meta.dtype != dtype_traits<D>::id)
        throw error(errc::bad_dtype, meta.name + ": " + std::string(name_of(meta.dtype)) +
                                         " output, pipeline for " +
                                         std::string(name_of(dtype_traits<D>::id)));
      project_shard<D, stages::identity_map, codec::overwrite>(
          stages::identity_map{tensor, meta.numel()}, o, c, st);
    }
    void blockwise(const source_shard& sh, std::span<const std::byte>, std::span<const std::byte>,
                   std::span<const std::byte>, std::span<const std::byte>, value_encoding,
                   state&) const {
      throw error(errc::invalid_argument,
                  sh.key + ": a blockwise FP8 shard emits codes and scales of two dtypes; "
                           "build it with the dispatched builder");
    }
  };

  /// Merges two sorted record lists of one tensor (disjoint by construction:
  /// each destination has one owner); `dst_alt` and `src.alt_values` (add
  /// words, when recorded) follow the same order.
  static void merge_into(item& dst, std::vector<std::byte>& dst_alt, builder& src, std::size_t w) {
    if (dst.indices.empty() || src.indices.front() > dst.indices.back()) {
      dst.indices.insert(dst.indices.end(), src.indices.begin(), src.indices.end());
      dst.values.insert(dst.values.end(), src.values.begin(), src.values.end());
      dst_alt.insert(dst_alt.end(), src.alt_values.begin(), src.alt_values.end());
      return;
    }
    item m{dst.tensor, dst.encoding, {}, {}};
    std::vector<std::byte> m_alt;
    m.indices.reserve(dst.indices.size() + src.indices.size());
    m.values.reserve(dst.values.size() + src.values.size());
    m_alt.reserve(dst_alt.size() + src.alt_values.size());
    std::size_t a = 0, b = 0;
    auto take = [&](const std::vector<std::uint64_t>& ii, const std::vector<std::byte>& vv,
                    const std::vector<std::byte>& aa, std::size_t& k) {
      m.indices.push_back(ii[k]);
      const auto lo = static_cast<std::ptrdiff_t>(k * w),
                 hi = static_cast<std::ptrdiff_t>((k + 1) * w);
      m.values.insert(m.values.end(), vv.begin() + lo, vv.begin() + hi);
      if (!aa.empty()) m_alt.insert(m_alt.end(), aa.begin() + lo, aa.begin() + hi);
      ++k;
    };
    while (a < dst.indices.size() || b < src.indices.size()) {
      if (b == src.indices.size() || (a < dst.indices.size() && dst.indices[a] < src.indices[b]))
        take(dst.indices, dst.values, dst_alt, a);
      else
        take(src.indices, src.values, src.alt_values, b);
    }
    dst = std::move(m);
    dst_alt = std::move(m_alt);
  }

  template <class Sink>
  void close_chunk(state& st, Sink& sink) const {
    bool emitted = false;
    for (auto& b : st.chunk) {
      if (b.indices.empty()) continue;
      emitted = true;
      const auto& meta = plan_->canonical[b.tensor];
      const std::size_t w = width_of(meta.dtype); // records sorted by build_chunk
      const std::uint64_t key = (std::uint64_t{b.tensor} << 8) | static_cast<std::uint8_t>(b.enc);
      auto [pos, fresh] = st.bucket_slot.try_emplace(key, st.bucket.size());
      if (fresh) {
        st.bucket.push_back(item{meta, b.enc, std::move(b.indices), std::move(b.values)});
        st.bucket_alt.push_back(std::move(b.alt_values));
      } else {
        merge_into(st.bucket[pos->second], st.bucket_alt[pos->second], b, w);
      }
    }
    st.chunk.clear();
    if (emitted) st.bucket_bytes += st.chunk_bytes;
    st.chunk_bytes = 0;
    if (emitted && st.bucket_bytes >= st.opt.bucket_bytes) flush(st, sink);
  }

  template <class Sink>
  void flush(state& st, Sink& sink) const {
    if (st.bucket.empty()) return;
    // The per-item choice, on whole items (after every chunk's records of a
    // tensor are merged), so it is the choice for exactly what travels.
    for (std::size_t i = 0; i < st.bucket.size(); ++i)
      stages::choose_smaller(st.bucket[i], st.bucket_alt[i], value_encoding::add,
                             st.opt.encoding.filter);
    auto items = std::move(st.bucket);
    const auto input = st.bucket_bytes;
    st.bucket.clear();
    st.bucket_alt.clear();
    st.bucket_slot.clear();
    st.bucket_bytes = 0;
    if (st.opt.grouping == payload_grouping::none) {
      sink(delta_bucket{id_, st.sequence++, std::move(items), input});
      return;
    }
    // One payload per group, in group order, items in bucket order within
    // it; the first part carries the bucket's input bytes (their sum over
    // all buckets stays that of the chunks that emitted records).
    std::map<std::uint64_t, std::vector<item>> parts;
    for (auto& it : items) parts[group_of(it.tensor.name, st.opt)].push_back(std::move(it));
    bool first = true;
    for (auto& [g, part] : parts) {
      sink(delta_bucket{id_, st.sequence++, std::move(part), first ? input : 0});
      first = false;
    }
  }

  /// The payload group of tensor `name` (`builder_options::grouping`).
  std::uint64_t group_of(std::string_view name, const builder_options& opt) const {
    const auto g = expert_group(name);
    if (g == 0 || opt.expert_blocks == 0) return g;
    return 1 + (g - 1) * opt.expert_blocks / experts_;
  }

  std::shared_ptr<const source_plan> plan_;
  std::uint32_t id_;
  std::vector<std::uint32_t> shards_, tasks_;
  std::vector<std::vector<std::byte>> trackers_;
  std::vector<std::vector<host_tensor>> residual_;
  std::uint64_t experts_ = 0; ///< experts of the model (0: dense)
};

/// All owners of a plan in one process (tests, benches, the demo; a real
/// trainer runs one `owner` per rank and all-gathers the flags).
class training_side {
public:
  training_side(std::shared_ptr<const source_plan> plan, const source_view& committed)
      : plan_(std::move(plan)) {
    for (std::uint32_t r = 0; r < plan_->world; ++r) owners_.emplace_back(plan_, r, committed);
  }
  const source_plan& plan() const noexcept { return *plan_; }
  std::span<const owner> owners() const noexcept { return owners_; }

  /// U_req of a candidate: union of every owner's flags.
  required_set required(const source_view& candidate) const {
    std::vector<std::uint32_t> flags;
    for (auto& o : owners_)
      for (auto s : o.flagged_inputs(candidate)) flags.push_back(s);
    return make_required(*plan_, flags);
  }
  /// Every owner's buckets (owner-major).
  std::vector<delta_bucket> build_items(const source_view& candidate,
                                        const builder_options& opt = {}) const {
    const auto req = required(candidate);
    std::vector<delta_bucket> out;
    for (auto& o : owners_)
      o.build_buckets(candidate, req, opt, [&](delta_bucket&& b) { out.push_back(std::move(b)); });
    return out;
  }
  /// Every owner's payloads, indexed by owner id.
  std::vector<std::vector<std::vector<std::byte>>> build(const source_view& candidate,
                                                         const payload_id& base_id,
                                                         const builder_options& opt = {}) const {
    const auto req = required(candidate);
    std::vector<std::vector<std::vector<std::byte>>> out;
    for (auto& o : owners_) out.push_back(o.build(candidate, req, base_id, opt));
    return out;
  }
  /// Post-commit update of every owner's baseline.
  void commit(const source_view& candidate) {
    const auto req = required(candidate); // before trackers move: flags compare against them
    for (auto& o : owners_) o.commit_baseline(candidate, req);
  }
  /// Baseline memory of all owners together and per owner.
  baseline_memory memory() const noexcept {
    baseline_memory m;
    for (auto& o : owners_) {
      auto x = o.memory();
      m.tracker_bytes += x.tracker_bytes;
      m.residual_bytes += x.residual_bytes;
    }
    return m;
  }
  balance_report memory_balance() const {
    std::vector<std::uint64_t> b;
    for (auto& o : owners_) b.push_back(o.memory().total());
    return make_balance_report(std::move(b));
  }
  /// Baseline memory as a multiple of the canonical checkpoint.
  double memory_vs_checkpoint() const noexcept {
    const auto c = plan_->checkpoint_bytes();
    return c ? static_cast<double>(memory().total()) / static_cast<double>(c) : 0.0;
  }

private:
  std::shared_ptr<const source_plan> plan_;
  std::vector<owner> owners_;
};

} // namespace dcr
