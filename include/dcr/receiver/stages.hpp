#pragma once
/// \file
/// The rollout side's refit stages: small objects whose call operators over
/// spans do the work, composed by `receiver<Loader, Sink>`:
///
///   decode<Locations>     payload bytes -> validated items, locations decoded
///                         by a `codec::location_policy` (every coding, or a few);
///   scatter<Dtype>        an item's words into the scratch tensor the loader
///                         reads (only for tensors whose copies are not all
///                         mapped), and the placeholder fill around them;
///   apply<Encoding, Sink> at every destination of a mapped copy, the
///                         resident word becomes `Encoding::apply(resident,
///                         value)` (a `codec::delta_encoding`), in host
///                         storage, and in the `Sink`'s storage when it keeps
///                         its own (a device copy: `cuda::device_sink`).
///
/// `receiver::apply_item` runs scatter<D> -> loader -> apply<E, Sink> for an
/// item's runtime dtype and encoding, selected from a table built at compile
/// time (pipeline/dispatch.hpp); `receiver::apply_item<P>` runs one
/// statically composed `receive_pipeline` P and refuses items of any other
/// dtype or encoding; `receiver::decode<P>` decodes with P's location
/// codings only. The loader-facing sink that calls apply<E, Sink> for each
/// copy is `delta_sink` (sinks.hpp).

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "dcr/codec/item.hpp"
#include "dcr/codec/locations.hpp"
#include "dcr/codec/payload_decode.hpp"
#include "dcr/codec/values.hpp"
#include "dcr/core/dtype.hpp"
#include "dcr/core/error.hpp"
#include "dcr/core/set_digest.hpp"
#include "dcr/core/tensor.hpp"
#include "dcr/receiver/storage.hpp"
#include "dcr/receiver/storage_sink.hpp"
#include "dcr/receiver/view_map.hpp"

namespace dcr {

namespace stages {

/// decode<L>: payload bytes -> validated items, with location policy `L`.
template <codec::location_policy L>
struct decode {
  using locations = L;
  /// `codec::decode_payload_if<L>`: every byte checked; items of tensors
  /// `keep` rejects come back without entries.
  /// `ws`: buffers kept across calls (see `codec::decode_payload_if`).
  template <class Keep>
  status operator()(std::span<const std::byte> payload, decoded_payload& out, Keep&& keep,
                    const codec::decode_limits& limits, codec::payload_info* ws = nullptr) const {
    return codec::decode_payload_if<L>(payload, out, std::forward<Keep>(keep), limits, ws);
  }
};

/// scatter<D>: an item's entries into the scratch, typed by the item's word.
template <storage_dtype D>
struct scatter {
  using dtype = D;
  using word = word_t<D>;
  /// `scratch[indices[k]] = values[k]` for every entry.
  void operator()(std::span<const std::uint64_t> indices, std::span<const word> values,
                  word* scratch) const noexcept {
    const std::uint64_t* ix = indices.data();
    const word* v = values.data();
    for (std::size_t k = 0; k < indices.size(); ++k) scratch[ix[k]] = v[k];
  }
  /// The dtype's NaN placeholder at every word of `scratch`.
  void fill_placeholder(std::span<word> scratch) const noexcept {
    std::fill(scratch.begin(), scratch.end(), dtype_traits<D>::placeholder);
  }
  /// True when some value is a NaN (the placeholder cannot then mark
  /// inactive positions on its own).
  bool any_nan(std::span<const word> values) const noexcept {
    for (const word v : values)
      if (is_nan_word<D>(v)) return true;
    return false;
  }
};

/// How many entries the mapped-copy write loop runs ahead of its writes.
/// At ~1-5 % change the destinations of consecutive entries lie on different
/// 64-byte lines, so each write waits on a cache miss; prefetching the line
/// of the entry this many places ahead keeps that many misses in flight
/// (about what a core's fill buffers and L2 queue hold) instead of the one
/// or two that an in-order read-modify-write loop gets. `dcr-bench-apply`
/// measures it.
inline constexpr std::size_t apply_write_lag = 64;

/// Changed words the write loop collects before it folds them into the
/// state digest. No more than `apply_write_lag`: while a batch is hashed
/// (compute bound: eight AES rounds a write), the lines of the next `apply_write_lag`
/// entries, prefetched before, arrive; with longer batches the hashing
/// outlasts the fetches and the writes after it wait on memory again, so
/// memory time and hashing time would add up instead of overlapping.
inline constexpr std::size_t apply_digest_batch = 32;

/// apply<E, Sink>: `E` at the destinations of one mapped copy.
///
/// The call operator is the receiver's one write loop (used by every host
/// apply: host sink, device sink, its twin): for the active entries
/// (`indices`, strictly increasing canonical indices, and their `values`)
/// that the copy's `view_inverse` reaches, element `e` of the parameter's
/// words `D` becomes `E::apply(D[e], value)`, in entry order, each
/// `apply_write_lag` entries after its line was prefetched; words whose bits
/// do not change are not written. Changed words are folded into `digest`
/// under `key` in batches (`set_digest::replace_batch`), so that the loop's
/// state stays in registers. The destinations come a block at a time from
/// `view_inverse::map_sorted`. A mirroring `Sink` then gets the same
/// (element, value) pairs, sorted by element, through `Sink::scatter<E>`.
/// For copies whose destinations never overlap (`tensor_plan::self_overlap`
/// false).
template <codec::delta_encoding E, storage_sink Sink = host_sink>
class apply {
public:
  using encoding = E;
  using sink_type = Sink;

  explicit apply(Sink& sink) noexcept : sink_(&sink) {}

  template <class W>
  status operator()(W* DCR_RESTRICT D, std::size_t param, const view_inverse& inv,
                    std::span<const std::uint64_t> indices, std::span<const W> values,
                    set_digest& digest, const set_digest_key& key) {
    constexpr std::size_t lag = apply_write_lag, block = 1024, batch = apply_digest_batch;
    // Only the entries inside the copy's source span can map.
    const auto lo = static_cast<std::uint64_t>(inv.src_base);
    const auto hi = lo + static_cast<std::uint64_t>(inv.span);
    const auto b = std::lower_bound(indices.begin(), indices.end(), lo);
    const auto e = std::lower_bound(b, indices.end(), hi);
    const std::uint64_t* sub = indices.data() + (b - indices.begin());
    const std::size_t count = static_cast<std::size_t>(e - b);
    const W* DCR_RESTRICT V = values.data() + (b - indices.begin());
    if constexpr (Sink::mirrors) {
      at_.clear();
      words_.clear();
    }
    std::size_t bj[block];
    std::int64_t be[block];
    std::uint64_t pos[batch], before[batch], after[batch];
    std::size_t pending = 0;
    for (std::size_t from = 0; from < count;) {
      const std::size_t n = inv.map_sorted(sub, count, from, bj, be, block);
      for (std::size_t k = 0; k < std::min(lag, n); ++k) __builtin_prefetch(D + be[k], 1, 3);
      for (std::size_t k = 0; k < n; ++k) {
        if (k + lag < n) __builtin_prefetch(D + be[k + lag], 1, 3);
        const std::int64_t el = be[k];
        const W v = V[bj[k]];
        const W old = D[el];
        const W now = E::apply(old, v);
        if constexpr (Sink::mirrors) {
          at_.push_back(static_cast<std::uint64_t>(el));
          words_.push_back(v);
        }
        if (old == now) continue;
        D[el] = now;
        pos[pending] = static_cast<std::uint64_t>(el);
        before[pending] = old;
        after[pending] = now;
        if (++pending == batch) {
          digest.replace_batch(key, pos, before, after, batch);
          pending = 0;
        }
      }
    }
    if (pending) digest.replace_batch(key, pos, before, after, pending);
    if constexpr (Sink::mirrors) return mirror<W>(param);
    return status::success();
  }

private:
  /// Hand the pairs to the sink, sorted by element (a transposing view
  /// reaches destinations out of order; each element appears once).
  template <class W>
  status mirror(std::size_t param) {
    if (at_.empty()) return status::success();
    if (!std::is_sorted(at_.begin(), at_.end())) {
      std::vector<std::size_t> order(at_.size());
      for (std::size_t k = 0; k < order.size(); ++k) order[k] = k;
      std::sort(order.begin(), order.end(),
                [&](std::size_t a, std::size_t b) { return at_[a] < at_[b]; });
      std::vector<std::uint64_t> at(at_.size());
      std::vector<std::uint64_t> w(at_.size());
      for (std::size_t k = 0; k < order.size(); ++k) {
        at[k] = at_[order[k]];
        w[k] = words_[order[k]];
      }
      at_.swap(at);
      words_.swap(w);
    }
    std::vector<W> typed(words_.size());
    for (std::size_t k = 0; k < typed.size(); ++k) typed[k] = static_cast<W>(words_[k]);
    return sink_->template scatter<E, W>(param, at_, std::span<const W>(typed));
  }

  Sink* sink_;
  std::vector<std::uint64_t> at_, words_; ///< mirrored pairs of the current copy
};

/// A statically composed rollout-side pipeline.
template <class Decode, class Scatter, class Apply>
struct receive_pipeline {
  using decode_stage = Decode;
  using scatter_stage = Scatter;
  using apply_stage = Apply;
  using locations = typename Decode::locations;
  using dtype = typename Scatter::dtype;
  using encoding = typename Apply::encoding;
};

} // namespace stages
} // namespace dcr
