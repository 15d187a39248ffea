#pragma once
/// \file
/// The training side's refit stages, as compile-time policies:
///
///   compare<Dtype>  which stored words changed (64-word change masks);
///   project<Map>    local shard index -> canonical (tensor, index), in runs of
///                   constant shift (`index_map::map_run`);
///   encode<Encoding, Locations>
///                   the value of a changed element (`Encoding::make(old, new)`,
///                   a `codec::delta_encoding`) and how an item's locations
///                   travel (a `codec::location_policy`);
///   encode_either<Encoding, Alternative, Locations>
///                   as encode, recording the values of a second encoding
///                   too, so the item can take whichever codes smaller
///                   (`choose_smaller`: XOR or add where both are exact).
///
/// `changes_to_records` composes the three over one shard; the owner's
/// builder (builder.hpp) runs exactly this, selecting the instantiation for
/// each shard's runtime dtype and encoding from a table built at compile time
/// (pipeline/dispatch.hpp), and an application that knows its configuration
/// composes one instantiation itself and compiles nothing else:
///
/// ```cpp
/// using bf16_xor = refit_pipeline<compare<bf16>, project<piecewise_map>,
///                                 encode<codec::xor_mask, codec::run_or<codec::escape_u8>>>;
/// owner.build<bf16_xor>(candidate, required, base_id, options);
/// ```

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <span>
#include <type_traits>
#include <vector>

#include "dcr/codec/item.hpp"
#include "dcr/codec/locations.hpp"
#include "dcr/codec/values.hpp"
#include "dcr/core/dtype.hpp"
#include "dcr/map/index_map.hpp"
#include "dcr/source/detect.hpp"

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
  static void blocks(std::span<const W> old_w, std::span<const W> new_w, std::uint64_t lo,
                     std::uint64_t len, F&& f) {
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
static_assert(index_map<identity_map>);

/// project<M>: a shard's local indices through its index map, in runs of
/// constant shift (`canonical = local + shift` inside a run).
template <index_map M>
struct project {
  using map_type = M;
  const M& map;
  /// `f(run)` for every run covering the mapped elements, in local order.
  template <class F>
  void runs(F&& f) const {
    map.map_run(0, map.domain_size(), f);
  }
  /// XOR records through this map are exact only when no two local elements
  /// share a destination.
  bool unique() const { return map.is_unique(); }
};

/// encode<E, L>: values `E::make(old, new)` and locations by policy `L`.
template <codec::delta_encoding E, codec::location_policy L>
struct encode {
  using encoding = E;
  using locations = L;
  static constexpr value_encoding id = E::id;
  template <class W>
  static constexpr W value(W old_w, W new_w) noexcept {
    return E::make(old_w, new_w);
  }
};

/// encode_either<E, A, L>: values of both `E` and `A` for every record (the
/// second set in `record_buffer::alt_values`); `choose_smaller` keeps one.
template <codec::delta_encoding E, codec::delta_encoding A, codec::location_policy L>
struct encode_either : encode<E, L> {
  using alternative = A;
};

/// The alternative encoding of an encode stage, or void.
template <class Encode>
struct alternative_of {
  using type = void;
};
template <class Encode>
requires requires { typename Encode::alternative; }
struct alternative_of<Encode> {
  using type = typename Encode::alternative;
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
struct record_buffer {
  std::vector<std::uint64_t> indices;
  std::vector<std::byte> values;
  std::vector<std::byte> alt_values;
};

namespace detail {
/// Where records go, without the caller's type (so that instantiations
/// depend on the word type, the map and the encoding only).
struct target_ref {
  void* ctx;
  record_buffer& (*get)(void*, std::uint32_t);
};

/// `changed`: null to find the changed words by comparing (the compare
/// stage), or the sorted changed local indices found before (by the same
/// comparison), so that the work is O(changes + runs) instead of O(shard).
template <class W, class Project, class E, class A = void>
void changes_to_records(const Project& proj, std::span<const W> old_w, std::span<const W> new_w,
                        target_ref target,
                        const std::span<const std::uint64_t>* changed = nullptr) {
  constexpr bool either = !std::is_void_v<A>;
  constexpr std::size_t cap = 1024;
  std::uint64_t ib[cap];
  W vb[cap];
  W ab[either ? cap : 1];
  std::size_t k = 0;
  record_buffer* b = nullptr;
  const W* o = old_w.data();
  const W* c = new_w.data();
  auto flush = [&] {
    b->indices.insert(b->indices.end(), ib, ib + k);
    const auto* vp = reinterpret_cast<const std::byte*>(vb);
    b->values.insert(b->values.end(), vp, vp + k * sizeof(W));
    if constexpr (either) {
      const auto* ap = reinterpret_cast<const std::byte*>(ab);
      b->alt_values.insert(b->alt_values.end(), ap, ap + k * sizeof(W));
    }
    k = 0;
  };
  proj.runs([&](const canonical_run& r) {
    b = &target.get(target.ctx, r.tensor);
    const std::uint64_t shift =
        r.canonical_start - r.local_start; // modular: canonical = local + shift
    if (changed) {
      auto lo = std::lower_bound(changed->begin(), changed->end(), r.local_start);
      auto hi = std::lower_bound(lo, changed->end(), r.local_start + r.count);
      for (; lo != hi; ++lo) {
        if (k == cap) flush();
        const std::uint64_t j = *lo;
        ib[k] = j + shift;
        vb[k] = E::make(o[j], c[j]);
        if constexpr (either) ab[k] = A::make(o[j], c[j]);
        ++k;
      }
      if (k) flush();
      return;
    }
    compare_words<W>::blocks(
        old_w, new_w, r.local_start, r.count, [&](std::uint64_t first, std::uint64_t mask) {
          if (mask == 0) return;
          if (k > cap - change_block_words) flush();
          while (mask) {
            const std::uint64_t j = first + static_cast<std::uint64_t>(std::countr_zero(mask));
            mask &= mask - 1;
            ib[k] = j + shift;
            vb[k] = E::make(o[j], c[j]);
            if constexpr (either) ab[k] = A::make(o[j], c[j]);
            ++k;
          }
        });
    if (k) flush();
  });
}
} // namespace detail

/// compare -> project -> encode over one shard: every changed local word of
/// `old_w`/`new_w` whose map sends it somewhere becomes a record (canonical
/// index, `Encoding::make(old, new)`) appended to `target(tensor)` (a
/// `record_buffer&`; called once per run, before the run's records, so the
/// caller sees every tensor the shard maps into, in map order). Each run is
/// scanned with a constant local -> canonical shift, and a changed word's
/// record is written while its cache line is still hot from the compare.
template <class Compare, class Project, class Encode, class Target>
void changes_to_records(const Project& proj, std::span<const typename Compare::word> old_w,
                        std::span<const typename Compare::word> new_w, Target&& target) {
  using T = std::remove_reference_t<Target>;
  detail::changes_to_records<typename Compare::word, Project, typename Encode::encoding,
                             typename alternative_of<Encode>::type>(
      proj, old_w, new_w,
      detail::target_ref{
          const_cast<void*>(static_cast<const void*>(&target)),
          [](void* ctx, std::uint32_t t) -> record_buffer& { return (*static_cast<T*>(ctx))(t); }});
}
/// As above for a shard whose changed words were found already: `changed`
/// holds exactly the local indices where `old_w` and `new_w` differ, sorted
/// (what `detect_changes` returns). The records are the same, in the same
/// order; the work is O(changes + map runs).
template <class Compare, class Project, class Encode, class Target>
void changes_to_records(const Project& proj, std::span<const typename Compare::word> old_w,
                        std::span<const typename Compare::word> new_w,
                        std::span<const std::uint64_t> changed, Target&& target) {
  using T = std::remove_reference_t<Target>;
  detail::changes_to_records<typename Compare::word, Project, typename Encode::encoding,
                             typename alternative_of<Encode>::type>(
      proj, old_w, new_w,
      detail::target_ref{
          const_cast<void*>(static_cast<const void*>(&target)),
          [](void* ctx, std::uint32_t t) -> record_buffer& { return (*static_cast<T*>(ctx))(t); }},
      &changed);
}

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
inline void choose_smaller(item& it, std::vector<std::byte>& alt, value_encoding alt_id,
                           codec::value_filter filter) {
  if (alt.size() == it.values.size() && !alt.empty()) {
    const std::size_t w = width_of(it.tensor.dtype);
    const std::size_t n = it.values.size() / w;
    const std::size_t stride = (n + choice_sample_words - 1) / choice_sample_words;
    if (codec::estimate_value_bytes(alt, w, filter, stride) <
        codec::estimate_value_bytes(it.values, w, filter, stride)) {
      it.values.swap(alt);
      it.encoding = alt_id;
    }
  }
  alt.clear();
}

/// Sorts `b`'s records (words of type `W`) by canonical index when a map
/// emitted them out of order (maps that are not monotone per tensor).
template <class W>
void sort_records(record_buffer& b) {
  if (std::is_sorted(b.indices.begin(), b.indices.end())) return;
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
  if constexpr (requires { typename P::encode_stage::alternative; })
    choose_smaller(it, b.alt_values, P::encode_stage::alternative::id, filter);
  return it;
}

/// compare -> project -> encode of pipeline `P` over one shard (see
/// `changes_to_records`).
template <class P, class Target>
void shard_records(const typename P::map_type& map,
                   std::span<const word_t<typename P::dtype>> old_w,
                   std::span<const word_t<typename P::dtype>> new_w, Target&& target) {
  changes_to_records<typename P::compare_stage, typename P::project_stage,
                     typename P::encode_stage>(typename P::project_stage{map}, old_w, new_w,
                                               target);
}

} // namespace dcr::stages
