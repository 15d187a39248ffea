#pragma once
/// \file
/// The rollout side's refit stages, as compile-time policies:
///
///   decode<Locations>  payload bytes -> validated items, locations decoded by
///                      a `codec::location_policy` (every coding, or a few);
///   scatter<Dtype>     an item's words into the scratch tensor the loader
///                      reads (only for tensors whose copies are not all
///                      mapped), and the placeholder fill around them;
///   apply<Encoding>    the loader's sink updates storage with
///                      `Encoding::apply(resident, value)` (a
///                      `codec::delta_encoding`; `delta_sink`, sinks.hpp).
///
/// `receiver::apply_item` runs scatter<D> -> apply<E> for an item's runtime
/// dtype and encoding, selected from a table built at compile time
/// (pipeline/dispatch.hpp); `receiver::apply_item<P>` runs one statically
/// composed `receive_pipeline` P and refuses items of any other dtype or
/// encoding; `receiver::decode<P>` decodes with P's location codings only.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include "dcr/codec/item.hpp"
#include "dcr/codec/locations.hpp"
#include "dcr/codec/values.hpp"
#include "dcr/core/dtype.hpp"
#include "dcr/core/tensor.hpp"

namespace dcr::stages {

/// decode<L>: which location codings a payload decoder instantiates.
template <codec::location_policy L>
struct decode {
  using locations = L;
};

/// scatter<D>: an item's entries into the scratch, typed by the item's word.
template <storage_dtype D>
struct scatter {
  using dtype = D;
  using word = word_t<D>;
  /// `scratch[indices[k]] = values[k]` for every entry.
  static void entries(const item& it, std::byte* scratch) noexcept {
    auto* s = reinterpret_cast<word*>(scratch);
    const auto* v = reinterpret_cast<const word*>(it.values.data());
    const std::uint64_t* ix = it.indices.data();
    for (std::size_t k = 0; k < it.indices.size(); ++k) s[ix[k]] = v[k];
  }
  /// The dtype's NaN placeholder at every element of `meta`.
  static void fill_placeholder(const tensor_meta& meta, std::byte* scratch) noexcept {
    std::fill_n(reinterpret_cast<word*>(scratch), meta.numel(),
                static_cast<word>(info(meta.dtype)->placeholder));
  }
  /// True when some value of `it` is a NaN (the placeholder cannot then mark
  /// inactive positions on its own).
  static bool any_nan(const item& it) noexcept {
    const auto* v = reinterpret_cast<const word*>(it.values.data());
    for (std::size_t k = 0; k < it.indices.size(); ++k)
      if (is_nan_word<D>(v[k])) return true;
    return false;
  }
};

/// apply<E>: the sink applies `E::apply(resident, value)`.
template <codec::delta_encoding E>
struct apply {
  using encoding = E;
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

} // namespace dcr::stages
