#pragma once
/// \file
/// A receiver: one serving rank's side of a refit. Construction is prewarm
/// (copy plan, one scratch for the largest canonical tensor); `dense_refit`
/// loads full canonical tensors through the native loader (restore path and
/// the reference for bit-exactness); `decode` runs the stage decode<L>;
/// `apply_item` applies one decoded item through the stages of
/// receiver/stages.hpp: scatter<Dtype> (scratch, when needed) -> loader ->
/// intercepting sink -> apply<Encoding, Sink> per mapped copy. The per-item
/// runtime dispatch only picks which composition runs, from a compile-time
/// table over the dtype and encoding lists, or one statically composed
/// pipeline (`apply_item<P>`).
///
/// Storage sink (`Sink`, a `storage_sink`, receiver/storage_sink.hpp): where
/// applied words live besides the host store. `host_sink` (default): nowhere
/// else. `cuda::device_sink`: a device copy of every parameter, written by
/// the CUDA scatter kernels from the apply stage's (element, value) pairs and
/// re-uploaded whole where the apply stage does not see the writes (dense
/// refit, unmapped or overlapping copies, a failed load); after every call
/// it equals the host store. `twin::device_sink` is its host twin. A sink
/// that is not `concurrent` requires `apply_threads` 1.
///
/// Scratch: the loader always runs over the scratch view of the item's
/// tensor. For a direct tensor (every copy maps the scratch through a unique
/// view) the sinks read the item's words instead of the scratch, so apply
/// costs O(entries) and the scratch is never written. A tensor with unmapped
/// copies (loader temporaries such as casts) gets its extent filled with the
/// placeholder, the entries scattered, and the extent reset after the load:
/// O(tensor), like the loader's own transform.
///
/// Threads (`receiver_options::apply_threads`): `apply_items` (and so
/// `apply_staged`) applies a payload's items on a pool of threads. Items are
/// grouped by the storage they write (`storage_groups`: tensors fused into a
/// common parameter are one group, items of one tensor are one group); a
/// group's items run in item order on one thread, different groups run
/// concurrently and write disjoint storage. Each thread has its own scratch
/// (allocated zeroed on first use, touched only for tensors with unmapped
/// copies) and capture buffers, and sums its sinks' digest changes into its
/// own partial digest, added to the store after the threads joined (a
/// lane-wise sum: exact in any order). Memory beyond one thread: one scratch
/// of the largest canonical tensor per extra thread, and the transformed
/// copies that thread captures. Results are the same bits for every thread
/// count (see `apply_items` for failures).

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "dcr/codec/item.hpp"
#include "dcr/codec/payload.hpp"
#include "dcr/core/dtype.hpp"
#include "dcr/core/error.hpp"
#include "dcr/core/hash.hpp"
#include "dcr/core/set_digest.hpp"
#include "dcr/core/tensor.hpp"
#include "dcr/pipeline/dispatch.hpp"
#include "dcr/pipeline/parallel.hpp"
#include "dcr/receiver/loader.hpp"
#include "dcr/receiver/plan.hpp"
#include "dcr/receiver/sinks.hpp"
#include "dcr/receiver/stages.hpp"
#include "dcr/receiver/storage.hpp"

namespace dcr {

/// How `receiver::stage` admits a payload.
struct stage_policy {
  /// Decode and check every byte at `stage`, so that an invalid payload is
  /// refused there and changes nothing (what `protocol::receiver_role`
  /// requires); otherwise `stage` checks the header and digest only and
  /// `apply_staged` decodes, which keeps staging cheap while the rank serves.
  bool decode_now = false;
  /// Only `begin_attempt` starts an attempt: a payload of a newer attempt is
  /// `stale_attempt` like one of an older attempt. Otherwise a newer payload
  /// starts its attempt (a receiver fed straight from the transport).
  bool exact_attempt = false;
};

/// Receiver settings fixed at construction (`set_apply_threads` changes the
/// thread count later).
struct receiver_options {
  /// Threads that apply a payload's items (`apply_items`, `apply_staged`):
  /// 1 = the calling thread only; 0 = every hardware thread. Other than 1
  /// requires a loader that declares `concurrent_load` (receiver/loader.hpp);
  /// the result is the same storage bits and digest for every count.
  std::size_t apply_threads = 1;
  /// Work (item entries; elements for a tensor with unmapped copies) that
  /// each apply thread beyond the first must get: smaller calls use fewer
  /// threads, since starting and joining one costs ~50 us. 0: every call
  /// with two or more storage groups uses up to `apply_threads`.
  std::uint64_t apply_min_work = 1u << 15;
  /// Job key every payload's digest must be keyed with (empty: unkeyed, the
  /// default); a payload sealed otherwise is refused (`digest_mismatch`).
  seal_key key{};
};

/// One serving rank. `L` is the native loader (held by value).
///
/// Attempts: payloads carry the attempt that produced them. The receiver
/// holds one current attempt; a payload of an older attempt is stale, a
/// payload of a newer attempt (or `begin_attempt`) starts that attempt and
/// drops everything staged for older ones. Within an attempt, payloads are
/// deduplicated by (attempt, owner, sequence): applying an XOR payload twice
/// would revert it. A failed apply fails the attempt; its remaining payloads
/// are refused (`errc::aborted`) until a newer attempt begins (typically an
/// all-overwrite retry, which repairs any partial state).
template <native_loader L, storage_sink Sink = host_sink>
class receiver {
public:
  using sink_type = Sink;

  /// Prewarm. Throws `dcr::error(unsupported_loader)` when a loader path
  /// cannot satisfy the loader conditions, and the sink's error when it
  /// cannot hold the rank's storage.
  receiver(L loader, std::vector<tensor_meta> canonical, receiver_options options = {},
           Sink sink = Sink{})
      : loader_(std::move(loader)), canonical_(std::move(canonical)), sink_(std::move(sink)) {
    plan_ = prewarm(loader_, store_, canonical_);
    if constexpr (handle_loader<L>) {
      // Names resolved once: applying an item looks up no name in the loader.
      handles_.reserve(plan_.tensors.size());
      for (const auto& tp : plan_.tensors) handles_.push_back(loader_.handle(tp.meta.name));
    }
    throw_if_failed(sink_.attach(store_));
    scratch_.assign(scratch_words(), 0);
    group_ = storage_groups(plan_, store_.size());
    for (auto g : group_) groups_ = std::max(groups_, g + 1);
    set_apply_threads(options.apply_threads);
    min_work_ = options.apply_min_work;
    key_ = options.key;
  }

  /// Set the job key payloads must be sealed with (see `receiver_options::key`).
  void set_seal_key(const seal_key& key) { key_ = key; }

  /// Threads for `apply_items` (see `receiver_options::apply_threads`).
  /// Throws `invalid_argument` for a count other than 1 when the loader does
  /// not declare `concurrent_load`.
  void set_apply_threads(std::size_t threads) {
    if (threads != 1 && !concurrent_load_v<L>)
      throw error(errc::invalid_argument,
                  "apply_threads " + std::to_string(threads) +
                      ": the loader does not declare concurrent_load (receiver/loader.hpp)");
    if (threads != 1 && !Sink::concurrent)
      throw error(errc::invalid_argument, "apply_threads " + std::to_string(threads) +
                                              ": the storage sink applies on one thread only");
    apply_threads_ = pipeline::resolve_threads(threads);
  }
  /// Threads `apply_items` uses at most (0 resolved to the hardware threads).
  std::size_t apply_threads() const noexcept { return apply_threads_; }
  /// `apply_items` calls that ran on more than one thread.
  std::uint64_t threaded_applies() const noexcept { return threaded_applies_; }
  /// Storage group of every canonical tensor, in plan order (`storage_groups`).
  const std::vector<std::size_t>& storage_group() const noexcept { return group_; }

  const copy_plan& plan() const noexcept { return plan_; }
  const std::vector<tensor_meta>& canonical() const noexcept { return canonical_; }
  const parameter_store& storage() const noexcept { return store_; }
  L& loader() noexcept { return loader_; }
  /// The storage sink (for a mirroring one: its copy of every parameter).
  Sink& sink() noexcept { return sink_; }
  const Sink& sink() const noexcept { return sink_; }
  /// Bytes of the one scratch buffer (the largest canonical tensor).
  std::uint64_t scratch_bytes() const noexcept { return plan_.scratch_bytes; }

  /// Whether XOR (and add) items for `name` can be applied here (representation
  /// preserving path, destinations written once); false for unknown names.
  bool xor_allowed(std::string_view name) const {
    auto* t = plan_.find(name);
    return t && (t->xor_allowed || t->skipped);
  }
  /// Whether this rank stores anything of `name`.
  bool holds(std::string_view name) const {
    auto* t = plan_.find(name);
    return t && !t->skipped;
  }
  /// Whether a payload item of `name` must reach this rank: unless its plan
  /// skips the tensor (it stores nothing of it). An unknown name must reach
  /// it too, so that `stage` refuses it as it refuses any unknown tensor.
  /// The item filter `decode` applies, asked before a payload is fetched.
  bool needs(std::string_view name) const {
    auto* t = plan_.find(name);
    return !t || !t->skipped;
  }

  /// Load full canonical tensors from `src` through the loader. Throws
  /// `not_found`, `bad_dtype` or `shape_mismatch` for a missing or different
  /// tensor and `loader_condition` when the loader leaves its planned path.
  /// The state digest is recomputed from all storage afterwards (also when
  /// it throws part way), the one O(storage) digest of a receiver's life.
  template <canonical_source S>
  void dense_refit(const S& src) {
    struct recompute_on_exit {
      parameter_store& s;
      ~recompute_on_exit() { s.recompute_digest(); }
    } guard{store_};
    struct mirror_on_exit { // the sink holds what the store holds, also after a throw
      receiver& r;
      ~mirror_on_exit() { r.sink_failure_ = r.sink_.attach(r.store_); }
    } mirror{*this};
    for (auto& tp : plan_.tensors) {
      tensor_view v = source_view(src, tp.meta);
      dense_sink sink(store_, tp, v);
      throw_if_failed(run(tp, v, sink));
    }
  }

  /// The sink's failure to mirror the store (at the last dense refit, or
  /// when it re-uploaded the parameters of a failed item); success for a
  /// sink that mirrors nothing. While it is set, every apply returns it
  /// without running; the next successful dense refit clears it.
  const status& sink_failure() const noexcept { return sink_failure_; }

  /// Apply one decoded item (XOR, add or overwrite) through scratch -> loader ->
  /// sink: one table lookup selects scatter<D> -> apply<E> for the item's
  /// dtype and encoding.
  status apply_item(const item& it) {
    const tensor_plan* tp = nullptr;
    apply_ptr f = nullptr;
    DCR_TRY(resolve(it, nullptr, tp, f));
    return f(*this, main_context(), *tp, it);
  }

  /// Apply one decoded item through the statically composed pipeline `P` (a
  /// `stages::receive_pipeline`) only: an item of another dtype is
  /// `bad_dtype`, of another encoding `bad_encoding`. Otherwise the same
  /// checks and the same effect as `apply_item(it)`.
  template <class P>
  status apply_item(const item& it) {
    using D = typename P::dtype;
    using E = typename P::encoding;
    const tensor_plan* tp = nullptr;
    DCR_TRY(admit(it, nullptr, tp));
    DCR_RETURN_ERROR_IF(tp->meta.dtype != dtype_traits<D>::id, bad_dtype,
                        "item for " + tp->meta.name + ": " + std::string(name_of(tp->meta.dtype)) +
                            ", pipeline for " + std::string(name_of(dtype_traits<D>::id)));
    DCR_RETURN_ERROR_IF(it.encoding != E::id, bad_encoding,
                        "item for " + tp->meta.name + ": " + std::string(to_string(it.encoding)) +
                            ", pipeline applies " + std::string(to_string(E::id)));
    return apply_as<D, E>(main_context(), *tp, it);
  }

  /// Apply items: on `apply_threads()` threads, groups that write common
  /// storage serialised in item order (see the file comment). Every item is
  /// admitted first, in order (the checks of `apply_item` that need no
  /// loader run: tensor, dtype, shape, indices, encoding): when item k is
  /// refused, only items before k are applied and k's error is returned, as
  /// an in-order loop would. When an item fails while applying (the loader
  /// leaves its planned path or throws), the later items of its storage
  /// group are not applied, items of other groups are, and the error of the
  /// failing item earliest in item order is returned. So storage, digest and
  /// error are the same for every thread count, failures included; the
  /// state digest always counts every write made.
  status apply_items(std::span<const item> items) { return apply_items(items, {}); }

  /// Post-apply check: stored bits equal what a dense refit of `expected`
  /// stores, at every `stride`-th element of each copy (1 = all). Returns
  /// `errc::verification` naming the first differing element.
  template <canonical_source S>
  status verify(const S& expected, std::uint64_t stride = 1) {
    for (auto& tp : plan_.tensors) {
      if (tp.skipped) continue;
      tensor_view v;
      try {
        v = source_view(expected, tp.meta);
      } catch (const error& e) {
        return fail(e.code(), e.what());
      }
      compare_sink sink(store_, tp, v, stride);
      DCR_TRY(run(tp, v, sink));
      DCR_RETURN_ERROR_IF(!sink.mismatch().empty(), verification, sink.mismatch());
    }
    return status::success();
  }

  /// Start attempt `attempt`: staged payloads of older attempts are dropped
  /// and their late arrivals become stale. An older or equal id is ignored.
  void begin_attempt(std::uint64_t attempt) {
    if (attempt <= attempt_ && started_) return;
    started_ = true;
    attempt_ = attempt;
    staged_.clear();
    seen_.clear();
    failure_ = {};
  }
  /// The current attempt.
  std::uint64_t attempt() const noexcept { return attempt_; }
  /// Why the current attempt failed (ok while it has not).
  const status& attempt_failure() const noexcept { return failure_; }
  /// Payloads staged and not yet applied.
  std::size_t staged_count() const noexcept { return staged_.size(); }

  /// Validate a payload's header and digest, fence stale attempts
  /// (`stale_attempt`), suppress duplicates (`duplicate`; nothing changes)
  /// and keep its bytes for `apply_staged` (with `policy.decode_now`, every
  /// byte is decoded and checked here, and the newest payload's items are
  /// kept decoded). Errors of the payload decoder pass through unchanged; a
  /// refused payload is not marked as seen.
  status stage(std::span<const std::byte> payload, const stage_policy& policy = {}) {
    payload_id id;
    DCR_TRY(read_payload_id(payload, id, key_));
    DCR_RETURN_ERROR_IF((started_ && id.attempt < attempt_) ||
                            (policy.exact_attempt && id.attempt != attempt_),
                        stale_attempt,
                        "payload of attempt " + std::to_string(id.attempt) + " (owner " +
                            std::to_string(id.owner) + ", sequence " + std::to_string(id.sequence) +
                            "), current attempt " + std::to_string(attempt_));
    begin_attempt(id.attempt);
    DCR_RETURN_ERROR_IF(!failure_.ok(), aborted,
                        "attempt " + std::to_string(attempt_) + " failed: " + failure_.message);
    const std::pair key{id.owner, id.sequence};
    DCR_RETURN_ERROR_IF(seen_.count(key), duplicate,
                        "payload (attempt " + std::to_string(id.attempt) + ", owner " +
                            std::to_string(id.owner) + ", sequence " + std::to_string(id.sequence) +
                            ") seen before");
    staged_payload p{id, {}, {}};
    if (policy.decode_now) {
      DCR_TRY(decode(payload, p.items.emplace()));
      // Expanded items take ~5x the bytes of the payload (8-byte indices), so
      // only the newest staged payload keeps them: a rank that stages a whole
      // attempt while serving holds compressed bytes, and decodes again at
      // apply; one that applies each payload right away decodes it once.
      if (!staged_.empty()) staged_.back().items.reset();
    }
    p.bytes.assign(payload.begin(), payload.end());
    seen_.insert(key);
    staged_.push_back(std::move(p));
    return status::success();
  }

  /// Decode (validating every byte) payloads staged as bytes, and apply
  /// every staged payload of the current attempt in staging order. The first
  /// failure fails the attempt.
  status apply_staged() {
    DCR_RETURN_ERROR_IF(!failure_.ok(), aborted,
                        "attempt " + std::to_string(attempt_) + " failed: " + failure_.message);
    auto staged = std::move(staged_);
    staged_.clear();
    for (auto& p : staged) {
      status s = status::success();
      const decoded_payload* items = p.items ? &*p.items : nullptr;
      std::span<const tensor_plan* const> plans;
      if (!items) {
        // One decode buffer for every payload (its items keep their buffers),
        // and each kept item's plan found once, by the decoder's filter.
        s = decode_staged(p.bytes);
        if (s.ok() && !(decoded_.id == p.id))
          s = fail(errc::bad_format, "decoded payload id differs from its header");
        items = &decoded_;
        plans = row_plans_;
      }
      if (s.ok()) s = apply_items(items->items, plans);
      if (!s.ok()) {
        s.message = "payload (owner " + std::to_string(p.id.owner) + ", sequence " +
                    std::to_string(p.id.sequence) + "): " + s.message;
        failure_ = s;
        return s;
      }
      ++applied_payloads_;
    }
    return status::success();
  }

  /// Payloads applied completely since construction (all attempts).
  std::uint64_t applied_payloads() const noexcept { return applied_payloads_; }

  /// Decode and validate every byte of `payload` (`codec::decode_payload_if`:
  /// refused exactly when `decode_payload` refuses it), expanding only the
  /// items of tensors this rank stores something of. An item of a tensor the
  /// plan skips comes back with no entries: `apply_item` still checks its
  /// dtype, shape and encoding and reruns the loader, which must repeat its
  /// skip, but none of its indices or values is copied or scanned. This is
  /// how `stage` and `apply_staged` decode.
  status decode(std::span<const std::byte> payload, decoded_payload& out) const {
    return decode<stages::decode<pipeline::dispatched_locations>>(payload, out);
  }
  /// As above with the location codings of decode stage `Dec` (a
  /// `stages::decode<L>`) only: other codings are `bad_location`.
  template <class Dec>
  status decode(std::span<const std::byte> payload, decoded_payload& out) const {
    codec::decode_limits limits;
    limits.key = key_;
    return stages::decode<typename Dec::locations>{}(
        payload, out, [this](const codec::item_row& row) { return needs(row.tensor.name); },
        limits);
  }

private:
  /// `decode` into the receiver's reused buffer `decoded_`, recording every
  /// row's plan (null for a tensor it does not know) in `row_plans_`.
  status decode_staged(std::span<const std::byte> payload) {
    codec::decode_limits limits;
    limits.key = key_;
    row_plans_.clear();
    status s = stages::decode<pipeline::dispatched_locations>{}(
        payload, decoded_,
        [this](const codec::item_row& row) {
          const tensor_plan* t = plan_.find(row.tensor.name);
          row_plans_.push_back(t);
          return !t || !t->skipped; // `needs`
        },
        limits, &decode_ws_);
    if (s.ok() && row_plans_.size() != decoded_.items.size())
      s = fail(errc::bad_format, "decoder filtered " + std::to_string(row_plans_.size()) +
                                     " rows of " + std::to_string(decoded_.items.size()));
    return s;
  }

public:
  /// Digest of all rank storage, kept incrementally by the sinks: O(1) here,
  /// O(changes) per refit (see `parameter_store::digest`).
  digest128 state_digest() const { return store_.digest(); }
  /// The same digest recomputed from every stored byte (O(storage)).
  digest128 full_state_digest() const { return store_.full_digest(); }
  /// `verification` when the incremental digest differs from the full
  /// recomputation (storage written outside the sinks, or a lost update).
  status check_state_digest() const {
    DCR_RETURN_ERROR_IF(store_.full_digest() != store_.digest(), verification,
                        "state digest: incremental " + to_hex(store_.digest()) +
                            " differs from the recomputation " + to_hex(store_.full_digest()));
    return status::success();
  }

private:
  /// What one applying thread works with: its scratch (of `scratch_words()`
  /// words, zero outside an apply), its capture buffers and where its sinks
  /// add their digest changes (null: the store).
  struct apply_context {
    std::byte* scratch;
    std::vector<std::vector<std::byte>>* captures;
    set_digest* digest;
  };
  /// An extra apply thread's buffers, kept across calls.
  struct worker_buffers {
    struct free_deleter {
      void operator()(std::uint64_t* p) const noexcept { std::free(p); }
    };
    std::unique_ptr<std::uint64_t, free_deleter> scratch;
    std::vector<std::vector<std::byte>> captures;
  };
  using apply_ptr = status (*)(receiver&, const apply_context&, const tensor_plan&, const item&);
  /// An item that failed to apply: its index in the call and its status.
  struct failure {
    std::size_t index;
    status st;
  };

  std::size_t scratch_words() const noexcept { return (plan_.scratch_bytes + 7) / 8 + 1; }
  apply_context main_context() noexcept {
    return {reinterpret_cast<std::byte*>(scratch_.data()), &captures_, nullptr};
  }
  /// Context of extra thread `t` (>= 1); its scratch is allocated here by
  /// calloc (zero pages: untouched unless a tensor with unmapped copies runs).
  apply_context worker_context(std::size_t t, set_digest* digest) {
    auto& w = workers_[t - 1];
    if (!w.scratch) {
      w.scratch.reset(static_cast<std::uint64_t*>(std::calloc(scratch_words(), 8)));
      if (!w.scratch) throw std::bad_alloc();
    }
    return {reinterpret_cast<std::byte*>(w.scratch.get()), &w.captures, digest};
  }

  /// `apply_items(items)`; `plans[k]`, when given, is item k's tensor plan,
  /// found when the item was decoded (`decode_staged`): no name is looked
  /// up again.
  status apply_items(std::span<const item> items, std::span<const tensor_plan* const> plans) {
    tps_.assign(items.size(), nullptr);
    fns_.assign(items.size(), nullptr);
    std::size_t n = items.size();
    status refused = status::success();
    for (std::size_t k = 0; k < items.size(); ++k) {
      refused = resolve(items[k], plans.empty() ? nullptr : plans[k], tps_[k], fns_[k]);
      if (!refused.ok()) {
        n = k;
        break;
      }
    }
    failure first{n, status::success()};
    if (apply_threads_ <= 1 || n < 2)
      apply_in_order(items, tps_, fns_, n, first);
    else
      apply_grouped(items, tps_, fns_, n, first);
    return first.index < n ? first.st : refused;
  }

  /// Admission of one item and its pipeline from the dtype x encoding table
  /// (`known`: the item's plan when already found, else null).
  status resolve(const item& it, const tensor_plan* known, const tensor_plan*& tp,
                 apply_ptr& f) const {
    DCR_TRY(admit(it, known, tp));
    static constexpr pipeline::dispatch_table<
        apply_fn, status(receiver&, const apply_context&, const tensor_plan&, const item&),
        pipeline::dtype_list, pipeline::encoding_list>
        table{};
    f = table(pipeline::position_of<pipeline::dtype_list>(tp->meta.dtype),
              pipeline::position_of<pipeline::encoding_list>(it.encoding));
    DCR_RETURN_ERROR_IF(!f, bad_encoding,
                        "item for " + tp->meta.name + ": no pipeline for its dtype and encoding");
    return status::success();
  }
  std::size_t group_of(const tensor_plan* tp) const noexcept {
    return group_[static_cast<std::size_t>(tp - plan_.tensors.data())];
  }

  /// `apply_items` on the calling thread: items [0, n) in order, skipping
  /// the rest of a group after one of its items failed.
  void apply_in_order(std::span<const item> items, const std::vector<const tensor_plan*>& tps,
                      const std::vector<apply_ptr>& fns, std::size_t n, failure& first) {
    std::vector<bool> failed(groups_, false);
    for (std::size_t k = 0; k < n; ++k) {
      const auto g = group_of(tps[k]);
      if (failed[g]) continue;
      status s = fns[k](*this, main_context(), *tps[k], items[k]);
      if (s.ok()) continue;
      failed[g] = true;
      if (k < first.index) first = {k, std::move(s)};
    }
  }

  /// `apply_items` on a pool: one task per storage group (its items in
  /// order), costliest first so that a large group does not start last.
  void apply_grouped(std::span<const item> items, const std::vector<const tensor_plan*>& tps,
                     const std::vector<apply_ptr>& fns, std::size_t n, failure& first) {
    std::vector<std::size_t> slot(groups_, static_cast<std::size_t>(-1));
    std::vector<std::vector<std::size_t>> tasks;
    std::vector<std::uint64_t> cost;
    for (std::size_t k = 0; k < n; ++k) {
      auto& s = slot[group_of(tps[k])];
      if (s == static_cast<std::size_t>(-1)) {
        s = tasks.size();
        tasks.emplace_back();
        cost.push_back(0);
      }
      tasks[s].push_back(k);
      // Mapped copies cost O(entries); unmapped ones O(tensor).
      cost[s] +=
          tps[k]->direct || tps[k]->skipped ? items[k].indices.size() + 1 : tps[k]->meta.numel();
    }
    if (tasks.size() < 2) {
      apply_in_order(items, tps, fns, n, first);
      return;
    }
    std::vector<std::size_t> order(tasks.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return cost[a] > cost[b]; });

    // A thread costs ~50 us to start and join: each one gets at least
    // `receiver_options::apply_min_work`.
    std::uint64_t total = 0;
    for (auto c : cost) total += c;
    const std::size_t threads =
        std::min({apply_threads_, tasks.size(),
                  min_work_ == 0 ? tasks.size() : static_cast<std::size_t>(total / min_work_) + 1});
    if (threads < 2) {
      apply_in_order(items, tps, fns, n, first);
      return;
    }
    ++threaded_applies_;
    if (workers_.size() < threads - 1) workers_.resize(threads - 1);
    std::vector<set_digest> partial(threads);
    std::vector<failure> fails(threads, failure{n, status::success()});
    std::vector<std::exception_ptr> thrown(threads);
    std::atomic<std::size_t> next{0};
    std::atomic<bool> stop{false};
    auto work = [&](std::size_t t) {
      try {
        const apply_context ctx =
            t == 0 ? apply_context{main_context().scratch, &captures_, &partial[0]}
                   : worker_context(t, &partial[t]);
        while (!stop.load(std::memory_order_relaxed)) {
          const std::size_t i = next.fetch_add(1, std::memory_order_relaxed);
          if (i >= order.size()) return;
          for (std::size_t k : tasks[order[i]]) {
            status s = fns[k](*this, ctx, *tps[k], items[k]);
            if (s.ok()) continue;
            if (k < fails[t].index) fails[t] = {k, std::move(s)};
            break;
          }
        }
      } catch (...) {
        thrown[t] = std::current_exception();
        stop.store(true, std::memory_order_relaxed);
      }
    };
    std::vector<std::thread> pool;
    pool.reserve(threads - 1);
    try {
      for (std::size_t t = 1; t < threads; ++t) pool.emplace_back(work, t);
    } catch (...) {
      stop.store(true);
      for (auto& th : pool) th.join();
      for (auto& d : partial) store_.add_digest(d);
      throw;
    }
    work(0);
    for (auto& th : pool) th.join();
    for (auto& d : partial) store_.add_digest(d);
    for (auto& e : thrown)
      if (e) std::rethrow_exception(e);
    for (auto& f : fails)
      if (f.index < first.index) first = std::move(f);
  }

  template <canonical_source S>
  static tensor_view source_view(const S& src, const tensor_meta& m) {
    auto v = src.find(m.name);
    if (!v) throw error(errc::not_found, "source has no tensor " + m.name);
    if (v->dtype != m.dtype)
      throw error(errc::bad_dtype, "source tensor " + m.name + " has another dtype");
    if (!(v->layout == strided_layout::row_major(m.shape)))
      throw error(errc::shape_mismatch,
                  "source tensor " + m.name + " is not row-major of the canonical shape");
    return *v;
  }

  /// The item's tensor plan, after every check that does not depend on the pipeline.
  status admit(const item& it, const tensor_plan* known, const tensor_plan*& tp) const {
    tp = known ? known : plan_.find(it.tensor.name);
    DCR_RETURN_ERROR_IF(!tp, not_found, "item for unknown tensor " + it.tensor.name);
    DCR_TRY(codec::validate_item(it, tp->meta));
    // XOR and add read the resident word: both need every copy to preserve
    // the stored representation and to write each destination once.
    DCR_RETURN_ERROR_IF(
        codec::is_relative(it.encoding) && !tp->xor_allowed && !tp->skipped, unsupported_loader,
        std::string(it.encoding == value_encoding::add ? "add" : "XOR") + " item for " +
            tp->meta.name + ", whose loader path is not representation preserving");
    return status::success();
  }

  /// A dispatch table entry: the pipeline for dtype `D` and encoding `E`.
  struct apply_fn {
    template <class D, class E>
    static status call(receiver& r, const apply_context& ctx, const tensor_plan& tp,
                       const item& it) {
      return r.template apply_as<D, E>(ctx, tp, it);
    }
  };

  /// scatter<D> -> loader -> apply<E, Sink> of one admitted item.
  template <class D, class E>
  status apply_as(const apply_context& ctx, const tensor_plan& tp, const item& it) {
    DCR_TRY(sink_failure_);
    status st = apply_stages<D, E>(ctx, tp, it);
    if constexpr (Sink::mirrors) {
      // A failed load may have written part of a copy outside the apply
      // stage's view of it: the sink copies the item's parameters whole.
      if (!st.ok())
        for (const auto& c : tp.copies) {
          status r = sink_.refresh(store_, c.param);
          if (!r.ok()) {
            sink_failure_ = r;
            break;
          }
        }
    }
    return st;
  }

  template <class D, class E>
  status apply_stages(const apply_context& ctx, const tensor_plan& tp, const item& it) {
    using W = word_t<D>;
    using sink_t = delta_sink<E, W, Sink>;
    constexpr stages::scatter<D> scatter{};
    std::byte* s = ctx.scratch;
    W* scratch = reinterpret_cast<W*>(s);
    tensor_view input{s, tp.meta.dtype, strided_layout::row_major(tp.meta.shape)};
    const active_entries active{it.indices, it.values};
    const std::span<const W> values(reinterpret_cast<const W*>(it.values.data()),
                                    it.indices.size());
    const std::span<W> extent(scratch, static_cast<std::size_t>(tp.meta.numel()));
    if (tp.skipped || tp.direct) {
      // Every copy aliases the scratch through a unique view: the sinks read
      // the item's words directly (see `active_entries`), so the scratch is
      // neither written nor reset and the work is O(entries).
      sink_t sink(store_, tp, input, active, overwrite_pass::placeholder, nullptr, ctx.digest,
                  &sink_);
      return finish(sink, run(tp, input, sink));
    }
    if constexpr (E::relative) {
      // `xor_allowed` implies `direct`; `admit` refused this item already.
      return fail(errc::unsupported_loader, std::string(to_string(E::id)) + " item for " +
                                                tp.meta.name + " through unmapped copies");
    } else {
      // Unmapped copies read whole (transformed) tensors: inactive positions
      // must hold a placeholder distinct from every value.
      const std::size_t nbytes = tp.meta.nbytes();
      status st;
      // 1-byte codes (FP8) always take the two-fill path: its activity test
      // compares transformed bits of two fills and never asks whether a word
      // is NaN, which for 256 codes depends on the format a transform writes
      // (E4M3fn and E4M3fnuz name different NaNs).
      if (sizeof(W) > 1 && !scatter.any_nan(values)) {
        scatter.fill_placeholder(extent);
        scatter(it.indices, values, scratch);
        sink_t sink(store_, tp, input, active, overwrite_pass::placeholder, nullptr, ctx.digest,
                    &sink_);
        st = finish(sink, run(tp, input, sink));
      } else {
        auto& captures = *ctx.captures;
        captures.clear();
        std::memset(s, 0, nbytes);
        scatter(it.indices, values, scratch);
        sink_t first(store_, tp, input, active, overwrite_pass::capture, &captures, ctx.digest,
                     &sink_);
        st = finish(first, run(tp, input, first));
        if (st.ok()) {
          scatter.fill_placeholder(extent);
          scatter(it.indices, values, scratch);
          sink_t second(store_, tp, input, active, overwrite_pass::compare, &captures, ctx.digest,
                        &sink_);
          st = finish(second, run(tp, input, second));
        }
        captures.clear();
      }
      std::memset(s, 0, nbytes);
      return st;
    }
  }

  /// After a load: the sink mirrors what the load wrote outside the apply
  /// stage, and reports its own failure when the load succeeded.
  template <class S>
  status finish(const S& sink, status st) {
    if constexpr (Sink::mirrors) {
      auto params = sink.unmirrored();
      std::sort(params.begin(), params.end());
      params.erase(std::unique(params.begin(), params.end()), params.end());
      for (auto p : params) {
        status r = sink_.refresh(store_, p);
        if (!r.ok() && st.ok()) st = std::move(r);
      }
      if (st.ok() && !sink.sink_status().ok()) st = sink.sink_status();
    }
    return st;
  }

  /// Run the loader on one tensor; a loader that throws fails the apply.
  template <class CopySink>
  status run(const tensor_plan& tp, const tensor_view& input, CopySink& sink) {
    load_report rep;
    try {
      if constexpr (handle_loader<L>)
        rep = loader_.load_handle(handles_[static_cast<std::size_t>(&tp - plan_.tensors.data())],
                                  tp.meta.name, input, store_, sink);
      else
        rep = loader_.load(tp.meta.name, input, store_, sink);
    } catch (const std::exception& e) {
      return fail(errc::loader_condition, "tensor " + tp.meta.name + ": loader threw: " + e.what());
    }
    return sink.finish(rep);
  }

  L loader_;
  std::vector<tensor_meta> canonical_;
  Sink sink_;
  status sink_failure_;
  parameter_store store_;
  copy_plan plan_;
  std::vector<std::uint64_t> scratch_;
  std::vector<std::vector<std::byte>> captures_;
  std::vector<std::size_t> group_; ///< storage group of each plan tensor
  std::size_t groups_ = 0;
  std::size_t apply_threads_ = 1;
  std::uint64_t min_work_ = 0;
  seal_key key_{}; ///< job key of the payload digests (empty: unkeyed)
  std::uint64_t threaded_applies_ = 0;
  std::vector<worker_buffers> workers_; ///< buffers of apply threads 1, 2, ...
  std::vector<std::size_t> handles_;    ///< loader handle of each plan tensor (`handle_loader`)
  decoded_payload decoded_;             ///< `apply_staged`'s decode buffer, reused
  codec::payload_info decode_ws_;       ///< and the decoder's body and table buffers
  std::vector<const tensor_plan*> row_plans_; ///< plan of each row of `decoded_`
  std::vector<const tensor_plan*> tps_;       ///< `apply_items`' per-item plans, reused
  std::vector<apply_ptr> fns_;                ///< and pipelines
  /// A staged payload: its bytes and, for the newest one staged with
  /// `decode_now`, its validated items.
  struct staged_payload {
    payload_id id;
    std::vector<std::byte> bytes;
    std::optional<decoded_payload> items;
  };
  bool started_ = false;
  std::uint64_t attempt_ = 0;
  std::vector<staged_payload> staged_;
  std::set<std::pair<std::uint32_t, std::uint32_t>>
      seen_; ///< (owner, sequence) of the current attempt
  status failure_;
  std::uint64_t applied_payloads_ = 0;
};

} // namespace dcr
