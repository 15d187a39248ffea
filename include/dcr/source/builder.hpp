#pragma once
/// \file
/// One owner (one training rank): its baseline (baseline.hpp), its delta
/// builder (delta_builder.hpp) and the grouping of its records into buckets
/// and payloads (grouping.hpp), composed. Construction, per attempt:
///  1. flags: every owner compares the shards it owns that feed residual
///     tasks (`flagged_inputs`); the union of flags selects the required set
///     U_req (`make_required`), the same on every owner;
///  2. `build_buckets`: the delta builder walks the owner's units in plan
///     order, chunk by chunk (compare -> project -> encode per affine or
///     blockwise shard, convert -> compare -> encode per required residual
///     task: source/stages.hpp); the bucket assembler merges each chunk's
///     records into the open bucket (one `dcr::item` per canonical tensor
///     and encoding) and closes it at the byte target (full input bytes of
///     the chunks that emitted records); each bucket is one payload, or one
///     per expert (block) under `payload_grouping::by_expert`.
/// Encodings: `mixed` uses a relative encoding for affine items whose map is
/// unique (the map preserves stored words, so old^new, or new - old, of the
/// source is that of the canonical element) and overwrites for residual
/// items; `overwrite_all` (retries) uses overwrites everywhere. The relative
/// encoding is, per item, the smaller of XOR masks and zigzag integer
/// differences (`add`, format v2) by `stages::choose_smaller`, or the one
/// `builder_options::relative` names. Same candidate, baseline and options
/// give byte-identical payloads, for any thread count.
///
/// `build` selects the stage instantiation for each shard's dtype and
/// encoding from a table built at compile time over the policy lists
/// (pipeline/dispatch.hpp); `build<P>` runs one statically composed
/// `stages::refit_pipeline` P and nothing else.
///
/// Record memory: an owner keeps the vectors of its records between builds
/// (`stages::record_pool`), as it persists across training steps, so that
/// a build writes its records into pages an earlier build already mapped.
/// `build` returns every bucket's vectors after encoding it; a
/// `build_buckets` caller returns a bucket it is done with by `recycle`
/// (else it is freed as usual). What is kept is bounded: at most
/// `record_pool::per_tensor` index and value vectors per canonical tensor,
/// each of a capacity an earlier build reserved (address space; resident
/// are the pages its records touched, about the largest build's records);
/// `record_memory` reports it and `release_record_memory` frees it.
/// Vectors are handed out empty, so no record of one build can reach
/// another: the bytes are those of a fresh owner (builder_test.cpp).

#include <memory>
#include <vector>

#include "dcr/codec/item.hpp"
#include "dcr/codec/payload.hpp"
#include "dcr/pipeline/dispatch.hpp"
#include "dcr/source/baseline.hpp"
#include "dcr/source/delta_builder.hpp"
#include "dcr/source/grouping.hpp"
#include "dcr/source/options.hpp"
#include "dcr/source/plan.hpp"
#include "dcr/source/state.hpp"

namespace dcr {

/// One owner: its baseline, delta builder and payload grouping (see the file
/// comment).
class owner {
public:
  /// Baseline at the committed source state `committed` (reads the shards
  /// this owner owns and the inputs of its residual tasks).
  owner(std::shared_ptr<const source_plan> plan, std::uint32_t id, const source_view& committed)
      : base_(std::move(plan), id, committed),
        experts_(bucket_assembler::experts_of(base_.plan().canonical)),
        pool_(std::make_shared<stages::record_pool>()) {}

  std::uint32_t id() const noexcept { return base_.id(); }
  const source_plan& plan() const noexcept { return base_.plan(); }
  std::span<const std::uint32_t> owned_shards() const noexcept { return base_.owned_shards(); }
  std::span<const std::uint32_t> owned_tasks() const noexcept { return base_.owned_tasks(); }
  /// The baseline (trackers and residual baseline).
  const dcr::baseline& baseline() const noexcept { return base_; }

  /// Flags: owned shards that feed residual tasks and whose bits differ from
  /// their trackers.
  std::vector<std::uint32_t> flagged_inputs(const source_view& candidate) const {
    return base_.flagged_inputs(candidate);
  }

  /// Builds this owner's buckets for one attempt and passes each to
  /// `sink(delta_bucket&&)` in sequence order (so a pipeline can send bucket
  /// l while l+1 is built). Does not touch the baseline. Throws `dcr::error`
  /// (e.g. `errc::coverage`, `errc::parts_disagree` from a residual task).
  template <class Sink>
  void build_buckets(const source_view& candidate, const required_set& req,
                     const builder_options& opt, Sink&& sink) const {
    build_with(delta_builder::dispatched{}, candidate, req, opt, sink, nullptr);
  }
  /// As above with the changed words found already (`changes(candidate)`
  /// against this baseline): the affine shards are not compared again, so
  /// the build costs O(changes) outside the required residual tasks. Same
  /// buckets, byte for byte. `invalid_argument` when `ch` is of another owner.
  template <class Sink>
  void build_buckets(const owner_changes& ch, const source_view& candidate, const required_set& req,
                     const builder_options& opt, Sink&& sink) const {
    if (ch.changed.size() != base_.owned_shards().size())
      throw error(errc::invalid_argument, "build_buckets: changes of another owner");
    build_with(delta_builder::dispatched{}, candidate, req, opt, sink, &ch);
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
    build_with(delta_builder::composed<P>{}, candidate, req, opt, sink, nullptr);
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
      encode_bucket(b, base_id, opt, pipeline::dispatched_locations{opt.encoding.locations}, out);
      recycle(std::move(b));
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
      encode_bucket(b, base_id, opt, typename P::locations{}, out);
      recycle(std::move(b));
    });
    return out;
  }

  /// Keeps the record vectors of `b` (a bucket of this owner's build, done
  /// with) for the next build (see the file comment). `errc::not_found` for
  /// an item of no canonical tensor of the plan.
  void recycle(delta_bucket&& b) const {
    for (auto& it : b.items)
      pool_->give(base_.plan().tensor_id(it.tensor.name), std::move(it.indices),
                  std::move(it.values));
    b.items.clear();
  }
  /// Bytes of record capacity kept between builds (address space; resident
  /// are the pages records were written to).
  std::uint64_t record_memory() const { return pool_->capacity_bytes(); }
  /// Frees the record memory kept between builds.
  void release_record_memory() { pool_->release(); }

  /// Explicit post-commit update of the baseline (`baseline::commit`).
  void commit_baseline(const source_view& candidate, const required_set& req) {
    base_.commit(candidate, req);
  }
  /// As above, copying only the changed words `ch` (`baseline::commit`).
  void commit_baseline(const source_view& candidate, const required_set& req,
                       const owner_changes& ch) {
    base_.commit(candidate, req, ch);
  }

  /// Element-hash key of owned shard `s` in state digests.
  set_digest_key shard_key(std::uint32_t s) const { return base_.shard_key(s); }
  /// Set digest of the owned shards of the baseline, from every byte.
  set_digest baseline_set() const { return base_.baseline_set(); }
  /// Set digest of the owned shards of `v`, from every byte.
  set_digest state_set(const source_view& v) const { return base_.state_set(v); }
  /// The changed words of `candidate` against the baseline (`baseline::changes`).
  owner_changes changes(const source_view& candidate) const { return base_.changes(candidate); }
  /// The committed bytes of owned shard `s` (`baseline::committed_shard`).
  std::span<const std::byte> committed_shard(std::uint32_t s) const {
    return base_.committed_shard(s);
  }
  /// Bytes of this owner's baseline.
  baseline_memory memory() const noexcept { return base_.memory(); }

private:
  /// delta builder -> bucket assembler -> sink.
  template <class Select, class Sink>
  void build_with(const Select& select, const source_view& candidate, const required_set& req,
                  const builder_options& opt, Sink& sink, const owner_changes* ch) const {
    bucket_assembler buckets(base_.id(), base_.plan().canonical, experts_, opt, pool_.get());
    delta_builder(base_, pool_.get())
        .run(select, candidate, req, opt, ch,
             [&](std::vector<stages::tensor_records>&& records, std::uint64_t bytes) {
               buckets.add_chunk(std::move(records), bytes, sink);
             });
    buckets.flush(sink);
  }

  template <class L>
  void encode_bucket(const delta_bucket& b, const payload_id& base_id, const builder_options& opt,
                     const L& locations, std::vector<std::vector<std::byte>>& out) const {
    payload_id id = base_id;
    id.owner = base_.id();
    id.sequence = b.sequence;
    throw_if_failed(
        codec::encode_payload_with(id, b.items, opt.encoding, locations, out.emplace_back()));
  }

  dcr::baseline base_;
  std::uint64_t experts_ = 0; ///< experts of the model (0: dense)
  /// Record vectors kept between builds (shared by copies of this owner;
  /// thread-safe).
  std::shared_ptr<stages::record_pool> pool_;
};

} // namespace dcr
