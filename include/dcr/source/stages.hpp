#pragma once
/// \file
/// The training side's refit stages. Each stage is a small object whose call
/// operator works over spans; the policy that changes its code path is a
/// template parameter, the data it works on stays runtime:
///
///   compare<Dtype>  `(old, new, lo, len, f)`: the changed words of a local
///                   range, as 64-word blocks with change masks (`f(first,
///                   mask)`; dtypes of one word width share the scan);
///   project<Map>    `(f)`: the shard's local indices through its mapping
///                   class `Map` (any `maps::affine_map`: the box of a
///                   replicated tensor, row / column splits, the piecewise
///                   fused QKV and gate-up maps, per-expert slices, the two
///                   maps of a blockwise FP8 shard), as runs of constant
///                   shift (`canonical = local + shift` inside a run);
///   encode<Encoding, Locations>
///                   `(old, new)`: the value of a changed element
///                   (`Encoding::make`, a `codec::delta_encoding`), and the
///                   policy coding an item's locations (`Locations`, a
///                   `codec::location_policy`, run by the payload encoder);
///   encode_either<Encoding, Alternative, Locations>
///                   as encode, recording a second encoding's values too so
///                   that the item can take whichever codes smaller
///                   (`choose_smaller`: XOR or add where both are exact);
///   residual<Rule>  `(inputs, baseline, emit)`: a residual task's rule
///                   (a `maps::residual_rule`) assembles / converts canonical
///                   outputs from the candidate's inputs, and each output
///                   runs compare -> identity project -> encode against its
///                   residual baseline.
///
/// `delta<Compare, Project, Encode>` composes the first three over one shard
/// and appends records (canonical index, value) to `record_buffer`s: it is
/// the one hot loop of the training side. The owner's delta builder
/// (delta_builder.hpp) runs exactly this, selecting the instantiation for
/// each shard's runtime dtype and encoding from a table built at compile time
/// (pipeline/dispatch.hpp); an application that knows its configuration
/// composes one instantiation itself and compiles nothing else:
///
/// ```cpp
/// using bf16_xor = refit_pipeline<compare<bf16>, project<row_parallel_map>,
///                                 encode<codec::xor_mask, codec::run_or<codec::gap_u16>>>;
/// stages::shard_records<bf16_xor>(map, old_words, new_words, target);
/// ```

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <numeric>
#include <span>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "dcr/codec/item.hpp"
#include "dcr/codec/locations.hpp"
#include "dcr/codec/values.hpp"
#include "dcr/core/detect.hpp"
#include "dcr/core/dtype.hpp"
#include "dcr/map/index_map.hpp"
#include "dcr/map/residual.hpp"

namespace dcr::stages {

/// The compare stage of a word type (what `compare<D>` runs: dtypes with the
/// same word share one instantiation).
template <class W>
struct compare_words {
  using word = W;
  /// `f(first, mask)` for every block of `[lo, lo + len)` (bit b of `mask`:
  /// word `first + b` changed; blocks without changes may be skipped or
  /// passed with mask 0).
  template <class F>
  void operator()(std::span<const W> old_w, std::span<const W> new_w, std::uint64_t lo,
                  std::uint64_t len, F&& f) const {
    for_each_change_mask<W>(old_w.subspan(lo, len), new_w.subspan(lo, len), lo, f);
  }
};

/// compare<D>: the changed words of a range, as 64-word blocks with change masks.
template <storage_dtype D>
struct compare : compare_words<word_t<D>> {
  using dtype = D;
};

/// The identity map onto one canonical tensor of `n` elements (residual
/// outputs are canonical already).
struct identity_map {
  std::uint32_t tensor = 0;
  std::uint64_t n = 0;
  std::uint64_t domain_size() const noexcept { return n; }
  destination operator()(std::uint64_t j) const noexcept { return {tensor, j}; }
  bool is_unique() const noexcept { return true; }
  template <class Out>
  void map_run(std::uint64_t s, std::uint64_t count, Out&& out) const {
    if (count) out(canonical_run{s, count, tensor, s});
  }
};
static_assert(maps::affine_map<identity_map>);

/// project<M>: a shard's local indices through its mapping class, in runs of
/// constant shift (`canonical = local + shift` inside a run).
template <maps::affine_map M>
struct project {
  using map_type = M;
  const M& map;
  /// `f(run)` for every run covering the mapped elements, in local order.
  template <class F>
  void operator()(F&& f) const {
    map.map_run(0, map.domain_size(), f);
  }
  /// Relative records (XOR, add) through this map are exact only when no two
  /// local elements share a destination.
  bool unique() const { return map.is_unique(); }
};

/// encode<E, L>: values `E::make(old, new)` and locations by policy `L`.
template <codec::delta_encoding E, codec::location_policy L>
struct encode {
  using encoding = E;
  using alternative = void; ///< no second encoding recorded
  using locations = L;
  static constexpr value_encoding id = E::id;
  template <class W>
  constexpr W operator()(W old_w, W new_w) const noexcept {
    return E::make(old_w, new_w);
  }
};

/// encode_either<E, A, L>: values of both `E` and `A` for every record (the
/// second set in `record_buffer::alt_values`); `choose_smaller` keeps one.
template <codec::delta_encoding E, codec::delta_encoding A, codec::location_policy L>
struct encode_either : encode<E, L> {
  using alternative = A;
};

/// A statically composed training-side pipeline.
template <class Compare, class Project, class Encode>
struct refit_pipeline {
  using compare_stage = Compare;
  using project_stage = Project;
  using encode_stage = Encode;
  using dtype = typename Compare::dtype;
  using map_type = typename Project::map_type;
  using encoding = typename Encode::encoding;
  using locations = typename Encode::locations;
};

/// Records of one (tensor, encoding) under construction: canonical indices
/// and little-endian value words, in the order they were found; with an
/// `encode_either` stage also the alternative encoding's words (else empty).
/// `sorted`: known to be sorted by index (set by the stages' writer, which
/// fills a buffer run by run: true from its first run until a run starts at
/// or below the last record, as a map that is not monotone per tensor makes
/// it); false, the default, leaves the check to `sort_records`.
struct record_buffer {
  std::vector<std::uint64_t> indices;
  std::vector<std::byte> values;
  std::vector<std::byte> alt_values;
  bool sorted = false;
};

/// A `record_buffer` with its tensor and encoding: what a chunk of the
/// delta builder yields, one per (tensor, encoding) it found records of.
struct tensor_records : record_buffer {
  std::uint32_t tensor = 0;
  value_encoding enc = value_encoding::xor_mask;
};

/// Record memory kept between builds: the index and value vectors of one
/// build's records, emptied, with their capacity (and the pages written
/// into it) kept, so that the next build of the same owner writes its
/// records into memory that is already mapped instead of faulting, zeroing
/// and unmapping fresh pages every build. Vectors are kept per canonical
/// tensor (a tensor's next records need about the same room), at most
/// `per_tensor` of each kind; what is not taken again stays until `release`.
/// Taken vectors are always empty: no record of an earlier build can reach a
/// later one. Thread-safe (chunks take vectors on worker threads).
class record_pool {
public:
  static constexpr std::size_t per_tensor = 4;

  /// Empty vectors for new records of `tensor` (capacity kept when a vector
  /// was returned before, else none).
  void take(std::uint32_t tensor, record_buffer& b, bool alt) {
    const std::lock_guard lock(m_);
    auto it = kept_.find(tensor);
    if (it == kept_.end()) return;
    pop(it->second.indices, b.indices);
    pop(it->second.bytes, b.values);
    if (alt) pop(it->second.bytes, b.alt_values);
  }
  /// Keeps the capacity of vectors that records of `tensor` no longer use.
  void give(std::uint32_t tensor, std::vector<std::uint64_t>&& indices,
            std::vector<std::byte>&& values, std::vector<std::byte>&& alt = {}) {
    const std::lock_guard lock(m_);
    auto& k = kept_[tensor];
    push(k.indices, std::move(indices));
    push(k.bytes, std::move(values));
    push(k.bytes, std::move(alt));
  }
  /// Bytes of capacity kept (address space; resident are the pages the
  /// records written into it touched).
  std::uint64_t capacity_bytes() const {
    const std::lock_guard lock(m_);
    std::uint64_t n = 0;
    for (auto& [t, k] : kept_) {
      for (auto& v : k.indices) n += v.capacity() * sizeof(std::uint64_t);
      for (auto& v : k.bytes) n += v.capacity();
    }
    return n;
  }
  /// Frees everything kept.
  void release() {
    const std::lock_guard lock(m_);
    kept_.clear();
  }

private:
  template <class V>
  static void pop(std::vector<V>& from, V& to) {
    if (from.empty()) return;
    to = std::move(from.back());
    from.pop_back();
    to.clear();
  }
  template <class V>
  static void push(std::vector<V>& to, V&& v) {
    if (v.capacity() == 0) return;
    v.clear();
    if (to.size() < per_tensor) {
      to.push_back(std::move(v));
      return;
    }
    // Full: keep the larger vectors.
    auto small = std::min_element(
        to.begin(), to.end(), [](const V& a, const V& b) { return a.capacity() < b.capacity(); });
    if (small->capacity() < v.capacity()) *small = std::move(v);
  }
  struct kept {
    std::vector<std::vector<std::uint64_t>> indices;
    std::vector<std::vector<std::byte>> bytes;
  };
  mutable std::mutex m_;
  std::unordered_map<std::uint32_t, kept> kept_;
};

namespace detail {
/// Where records go, without the caller's type (so that instantiations
/// depend on the word type, the map and the encoding only).
struct target_ref {
  void* ctx;
  record_buffer& (*get)(void*, std::uint32_t);
};

/// Appends records of word type `W` (and alternative words when `Either`)
/// to one `record_buffer` at a time. Each run reserves its worst case
/// (every element changed) in the target before its records stream in, so a
/// buffer never reallocates (no copy of the records found so far, no second
/// set of pages touched; reserved pages that are never written are never
/// backed); records pass through a small buffer that stays in L1 and reach
/// the target in blocks.
template <class W, bool Either>
class record_writer {
public:
  record_writer() = default;
  record_writer(const record_writer&) = delete;
  record_writer& operator=(const record_writer&) = delete;
  ~record_writer() { close(); }

  /// Makes `b` the target of a run of at most `most` records whose indices
  /// start at `first` or above (until `close`: the target may move when the
  /// caller adds buffers, so a writer holds it for one run only).
  void open(record_buffer& b, std::uint64_t first, std::uint64_t most) {
    close();
    b_ = &b;
    const std::size_t n = b.indices.size();
    if (n == 0)
      b.sorted = true;
    else if (b.sorted && first <= b.indices.back())
      b.sorted = false; // conservative: sort_records checks before sorting
    reserve(b.indices, n + most);
    reserve(b.values, (n + most) * sizeof(W));
    if constexpr (Either) reserve(b.alt_values, (n + most) * sizeof(W));
  }
  /// Appends the buffered records to the target and releases it.
  void close() {
    flush();
    b_ = nullptr;
  }
  /// Appends the records of one 64-word block with change mask `mask`
  /// (bit b: local word `first + b` changed): canonical index `j + shift`,
  /// value `Encode{}(o[j], c[j])` (the encode stage) and, when `Either`, its
  /// alternative's `A::make(o[j], c[j])`.
  /// The count stays in a register through the block (the buffers are
  /// words of the count's type: writing them through the member would
  /// reload it per record).
  template <class Encode>
  void put_block(std::uint64_t first, std::uint64_t mask, std::uint64_t shift, const W* o,
                 const W* c) noexcept {
    if (k_ > cap - change_block_words) flush();
    std::size_t k = k_;
    while (mask) {
      const std::uint64_t j = first + static_cast<std::uint64_t>(std::countr_zero(mask));
      mask &= mask - 1;
      put<Encode>(k++, j + shift, o[j], c[j]);
    }
    k_ = k;
  }
  /// As `put_block` for a whole block (all 64 words of `[first, first + 64)`
  /// inside the spans). The first `eager` records are written whatever the
  /// mask's count: a slot past the count holds a record of word `first`
  /// (`countr_zero` of an empty mask is 64, wrapped to 0), is never counted,
  /// and is overwritten by the next block or never flushed. So a block with
  /// up to `eager` changes (at 5 % change, 78 % of blocks) takes no branch
  /// that depends on its count; the loop's exit, mispredicted about once per
  /// block, cost more than the records it wrote.
  template <class Encode>
  void put_full_block(std::uint64_t first, std::uint64_t mask, std::uint64_t shift, const W* o,
                      const W* c) noexcept {
    if (k_ > cap - change_block_words) flush();
    const std::size_t k = k_;
    const auto cnt = static_cast<std::size_t>(std::popcount(mask));
    const W* ob = o + first;
    const W* cb = c + first;
    const std::uint64_t at = first + shift;
    for (std::size_t e = 0; e < eager; ++e) {
      const auto z = static_cast<unsigned>(std::countr_zero(mask)) & 63u;
      mask &= mask - 1;
      put<Encode>(k + e, at + z, ob[z], cb[z]);
    }
    for (std::size_t e = eager; e < cnt; ++e) {
      const auto z = static_cast<unsigned>(std::countr_zero(mask));
      mask &= mask - 1;
      put<Encode>(k + e, at + z, ob[z], cb[z]);
    }
    k_ = k + cnt;
  }
  /// Appends the records of the sorted changed local words `[lo, hi)`.
  template <class Encode>
  void put_list(const std::uint64_t* lo, const std::uint64_t* hi, std::uint64_t shift, const W* o,
                const W* c) noexcept {
    while (lo != hi) {
      if (k_ == cap) flush();
      const std::size_t n = std::min<std::size_t>(cap - k_, static_cast<std::size_t>(hi - lo));
      std::size_t k = k_;
      for (const auto* end = lo + n; lo != end; ++lo) {
        const std::uint64_t j = *lo;
        put<Encode>(k++, j + shift, o[j], c[j]);
      }
      k_ = k;
    }
  }

private:
  /// Slot `k`: canonical index `at`, the encode stage's value of (`ow`,
  /// `cw`) and, when `Either`, its alternative's (both from the words loaded
  /// once: the buffers are words of `W` too, so a store to them would force
  /// a reload of `o[j]` and `c[j]`).
  template <class Encode>
  void put(std::size_t k, std::uint64_t at, W ow, W cw) noexcept {
    ib_[k] = at;
    vb_[k] = Encode{}(ow, cw);
    if constexpr (Either) ab_[k] = Encode::alternative::make(ow, cw);
  }

  void flush() {
    if (!k_) return;
    b_->indices.insert(b_->indices.end(), ib_, ib_ + k_);
    const auto* vp = reinterpret_cast<const std::byte*>(vb_);
    b_->values.insert(b_->values.end(), vp, vp + k_ * sizeof(W));
    if constexpr (Either) {
      const auto* ap = reinterpret_cast<const std::byte*>(ab_);
      b_->alt_values.insert(b_->alt_values.end(), ap, ap + k_ * sizeof(W));
    }
    k_ = 0;
  }

  static constexpr std::size_t cap = 1024;
  static constexpr std::size_t eager = 4; ///< records `put_full_block` writes unconditionally
  template <class V>
  static void reserve(V& v, std::size_t n) {
    if (n <= v.capacity()) return;
    v.reserve(std::max(n, 2 * v.capacity()));
  }
  record_buffer* b_ = nullptr;
  std::size_t k_ = 0;
  std::uint64_t ib_[cap];
  W vb_[cap];
  W ab_[Either ? cap : 1];
};

/// compare -> project -> encode over one shard, for word type `W`, encode
/// stage `Encode` (its encoding and alternative) and any project stage.
/// `changed`: null to find the changed words by comparing (the compare
/// stage), or the sorted changed local indices found before (by the same
/// comparison), so that the work is O(changes + runs) instead of O(shard).
template <class W, class Project, class Encode>
void delta_records(const Project& proj, std::span<const W> old_w, std::span<const W> new_w,
                   target_ref target, const std::span<const std::uint64_t>* changed) {
  constexpr bool either = !std::is_void_v<typename Encode::alternative>;
  static_assert(std::is_same_v<W, decltype(Encode{}(W{}, W{}))>);
  const compare_words<W> cmp{};
  const W* o = old_w.data();
  const W* c = new_w.data();
  record_writer<W, either> out;
  // Per tensor, the local words of this shard's runs into it not yet
  // scanned: a buffer's first run reserves them all, so a tensor that many
  // runs reach (a row-parallel shard's rows) never reallocates its records
  // (no copy of those found so far); the reservation is address space until
  // written. Runs of one tensor mostly follow each other: the last entry is
  // tried first.
  std::vector<std::pair<std::uint32_t, std::uint64_t>> left;
  auto left_of = [&left](std::uint32_t t) -> std::uint64_t& {
    if (!left.empty() && left.back().first == t) return left.back().second;
    for (auto& e : left)
      if (e.first == t) return e.second;
    return left.emplace_back(t, 0).second;
  };
  if (!changed) proj([&](const canonical_run& r) { left_of(r.tensor) += r.count; });
  proj([&](const canonical_run& r) {
    record_buffer& b = target.get(target.ctx, r.tensor);
    const std::uint64_t shift =
        r.canonical_start - r.local_start; // modular: canonical = local + shift
    if (changed) {
      auto lo = std::lower_bound(changed->begin(), changed->end(), r.local_start);
      auto hi = std::lower_bound(lo, changed->end(), r.local_start + r.count);
      if (lo == hi) return;
      out.open(b, *lo + shift, static_cast<std::uint64_t>(hi - lo));
      out.template put_list<Encode>(&*lo, &*lo + (hi - lo), shift, o, c);
      out.close();
      return;
    }
    std::uint64_t& most = left_of(r.tensor);
    out.open(b, r.canonical_start, std::max(most, r.count));
    most -= std::min(most, r.count);
    const std::uint64_t run_end = r.local_start + r.count;
    cmp(old_w, new_w, r.local_start, r.count, [&](std::uint64_t first, std::uint64_t mask) {
      if (!mask) return;
      if (first + change_block_words <= run_end)
        out.template put_full_block<Encode>(first, mask, shift, o, c);
      else
        out.template put_block<Encode>(first, mask, shift, o, c);
    });
    out.close();
  });
}

template <class T>
target_ref target_of(T& target) {
  return {const_cast<void*>(static_cast<const void*>(&target)),
          [](void* ctx, std::uint32_t t) -> record_buffer& { return (*static_cast<T*>(ctx))(t); }};
}
} // namespace detail

/// delta<Compare, Project, Encode>: the composition of the three stages over
/// one shard. Every changed local word of `old_w`/`new_w` whose map sends it
/// somewhere becomes a record (canonical index, `Encoding::make(old, new)`)
/// appended to `target(tensor)` (a `record_buffer&`; called once per run,
/// before the run's records, so the caller sees every tensor the shard maps
/// into, in map order). Each run is scanned with a constant local ->
/// canonical shift, and a changed word's record is written while its cache
/// line is still hot from the compare. With `changed` (exactly the sorted
/// local indices where `old_w` and `new_w` differ, what `detect_changes`
/// returns) the compare is skipped: the same records in the same order, in
/// O(changes + map runs).
template <class Compare, class Project, class Encode>
struct delta {
  using word = typename Compare::word;
  Project project;
  template <class Target>
  void operator()(std::span<const word> old_w, std::span<const word> new_w, Target&& target) const {
    detail::delta_records<word, Project, Encode>(project, old_w, new_w, detail::target_of(target),
                                                 nullptr);
  }
  template <class Target>
  void operator()(std::span<const word> old_w, std::span<const word> new_w,
                  std::span<const std::uint64_t> changed, Target&& target) const {
    detail::delta_records<word, Project, Encode>(project, old_w, new_w, detail::target_of(target),
                                                 &changed);
  }
};

/// The functions the library exposed before `delta`: the same composition.
template <class Compare, class Project, class Encode, class Target>
void changes_to_records(const Project& proj, std::span<const typename Compare::word> old_w,
                        std::span<const typename Compare::word> new_w, Target&& target) {
  delta<Compare, Project, Encode>{proj}(old_w, new_w, target);
}
template <class Compare, class Project, class Encode, class Target>
void changes_to_records(const Project& proj, std::span<const typename Compare::word> old_w,
                        std::span<const typename Compare::word> new_w,
                        std::span<const std::uint64_t> changed, Target&& target) {
  delta<Compare, Project, Encode>{proj}(old_w, new_w, changed, target);
}

/// residual<Rule>: one residual task. The rule converts the candidate's
/// inputs into canonical outputs (assemble, cast, quantise); each output is
/// compared with its residual baseline and encoded through the identity map
/// by `Delta`, a callable `(meta, tensor id, baseline bytes, candidate bytes)`
/// (the delta builder passes the dispatched compare -> project -> encode
/// composition of the output's dtype). `produced` is scratch the caller keeps
/// across tasks. Throws `dcr::error` (the rule's failure, `shape_mismatch`
/// for an output or baseline of the wrong size).
template <maps::residual_rule Rule>
struct residual {
  const Rule& rule;
  template <class Delta>
  void operator()(std::span<const residual_input> inputs, std::span<const host_tensor> baseline,
                  std::span<const std::uint32_t> outputs, std::span<const tensor_meta> canonical,
                  std::vector<host_tensor>& produced, Delta&& delta) const {
    throw_if_failed(run_rule(rule, inputs, produced));
    for (std::size_t k = 0; k < produced.size(); ++k) {
      const auto& meta = canonical[outputs[k]];
      if (produced[k].bytes.size() != meta.nbytes() || k >= baseline.size() ||
          baseline[k].bytes.size() != meta.nbytes())
        throw error(errc::shape_mismatch,
                    rule.name + ": output " + meta.name + " has the wrong size");
      delta(meta, outputs[k], std::span<const std::byte>(baseline[k].bytes),
            std::span<const std::byte>(produced[k].bytes));
    }
  }
};

/// Words of each encoding `choose_smaller` estimates (evenly strided sample).
inline constexpr std::size_t choice_sample_words = std::size_t{1} << 16;

/// Keeps the smaller of two exact codings of one item: its values, or the
/// same records' words `alt` of encoding `alt_id` (both relative, so both
/// exact under the same conditions). Smaller by `codec::estimate_value_bytes`
/// under `filter` (zeroth-order entropy of the byte planes: a histogram pass,
/// cheaper than compressing both; dcr-bench-payload measures how close its
/// picks come to compressing each way), over at most `choice_sample_words`
/// words of each, the same evenly strided words of both. Ties keep the
/// item's encoding. `alt` is consumed (left empty).
/// The same choice over one item's parts: `values` of encoding `enc` (words
/// of `w` bytes) against `alt` of `alt_id`.
inline void choose_smaller(std::vector<std::byte>& values, value_encoding& enc,
                           std::vector<std::byte>& alt, value_encoding alt_id, std::size_t w,
                           codec::value_filter filter) {
  if (alt.size() == values.size() && !alt.empty()) {
    const std::size_t n = values.size() / w;
    const std::size_t stride = (n + choice_sample_words - 1) / choice_sample_words;
    if (codec::estimate_value_bytes(alt, w, filter, stride) <
        codec::estimate_value_bytes(values, w, filter, stride)) {
      values.swap(alt);
      enc = alt_id;
    }
  }
  alt.clear();
}
inline void choose_smaller(item& it, std::vector<std::byte>& alt, value_encoding alt_id,
                           codec::value_filter filter) {
  choose_smaller(it.values, it.encoding, alt, alt_id, width_of(it.tensor.dtype), filter);
}

/// Sorts `b`'s records (words of type `W`) by canonical index when a map
/// emitted them out of order (maps that are not monotone per tensor; the
/// writer tracks it, so sorted records cost nothing here).
template <class W>
void sort_records(record_buffer& b) {
  if (b.sorted) return;
  if (std::is_sorted(b.indices.begin(), b.indices.end())) {
    b.sorted = true;
    return;
  }
  b.sorted = true;
  std::vector<std::size_t> order(b.indices.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(),
            [&](std::size_t x, std::size_t y) { return b.indices[x] < b.indices[y]; });
  std::vector<std::uint64_t> ii(order.size());
  std::vector<std::byte> vv(b.values.size()), aa(b.alt_values.size());
  for (std::size_t k = 0; k < order.size(); ++k) {
    ii[k] = b.indices[order[k]];
    std::memcpy(vv.data() + k * sizeof(W), b.values.data() + order[k] * sizeof(W), sizeof(W));
    if (!aa.empty())
      std::memcpy(aa.data() + k * sizeof(W), b.alt_values.data() + order[k] * sizeof(W), sizeof(W));
  }
  b.indices = std::move(ii);
  b.values = std::move(vv);
  b.alt_values = std::move(aa);
}

/// The records of one tensor as an item of pipeline `P`'s encoding, sorted
/// by canonical index (the encoder validates the rest: a map that leaves
/// the tensor or writes an element twice fails `codec::validate_item`).
template <class P>
item to_item(const tensor_meta& meta, record_buffer&& b,
             codec::value_filter filter = codec::value_filter::byte_planes) {
  sort_records<word_t<typename P::dtype>>(b);
  item it{meta, P::encoding::id, std::move(b.indices), std::move(b.values)};
  if constexpr (!std::is_void_v<typename P::encode_stage::alternative>)
    choose_smaller(it, b.alt_values, P::encode_stage::alternative::id, filter);
  return it;
}

/// compare -> project -> encode of pipeline `P` over one shard (`delta`).
template <class P, class Target>
void shard_records(const typename P::map_type& map,
                   std::span<const word_t<typename P::dtype>> old_w,
                   std::span<const word_t<typename P::dtype>> new_w, Target&& target) {
  delta<typename P::compare_stage, typename P::project_stage, typename P::encode_stage>{
      typename P::project_stage{map}}(old_w, new_w, target);
}

} // namespace dcr::stages
