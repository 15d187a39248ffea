#pragma once
/// \file
/// A generic reference loader for checkpoints of any architecture: every
/// tensor whose first dimension divides by the number of ranks is row-split
/// across them (rank r holds rows [r·n/p, (r+1)·n/p)), every other tensor is
/// replicated. It knows no model: what a serving runtime does for a model
/// class it has no special placement for, and what `dcr-demo --checkpoint`
/// uses for a safetensors file of unknown layout. Every copy is a plain slice
/// of the scratch, so XOR items are allowed everywhere.

#include <cstdint>
#include <set>
#include <span>
#include <string>
#include <string_view>

#include "dcr/core/error.hpp"
#include "dcr/core/tensor.hpp"
#include "dcr/receiver/loader.hpp"
#include "dcr/receiver/storage.hpp"

namespace dcr::loaders {

/// Row-split-or-replicate loader for rank `rank` of `parts` (see file comment).
class row_split_loader {
public:
  /// `load` only reads the loader's split set (receiver/loader.hpp).
  static constexpr bool concurrent_load = true;

  /// `metas`: the canonical tensors. `dcr::error(invalid_argument)` unless
  /// 0 <= rank < parts.
  row_split_loader(std::uint64_t parts, std::uint64_t rank, std::span<const tensor_meta> metas)
      : parts_(parts), rank_(rank) {
    if (parts == 0 || rank >= parts)
      throw error(errc::invalid_argument, "row_split_loader: rank " + std::to_string(rank) +
                                              " of " + std::to_string(parts) + " ranks");
    for (auto& m : metas)
      if (!m.shape.empty() && m.shape[0] >= parts && m.shape[0] % parts == 0) split_.insert(m.name);
  }

  /// Whether `name` is row-split (else replicated).
  bool splits(const std::string& name) const { return split_.count(name) != 0; }

  void declare(parameter_store& s, std::span<const tensor_meta> canonical) const {
    for (auto& m : canonical) {
      auto shape = m.shape;
      if (splits(m.name)) shape[0] /= parts_;
      s.add(m.name, shape, m.dtype);
    }
  }

  load_report load(std::string_view name, const tensor_view& src, parameter_store& s,
                   copy_sink& sink) const {
    const std::string n(name);
    if (!s.index_of(n)) return {};
    if (splits(n)) {
      const auto rows = src.layout.extents[0] / static_cast<std::int64_t>(parts_);
      sink.copy(s.view(n), src.slice(0, static_cast<std::int64_t>(rank_) * rows, rows));
    } else {
      sink.copy(s.view(n), src);
    }
    return {{n}};
  }

private:
  std::uint64_t parts_, rank_;
  std::set<std::string> split_;
};
static_assert(native_loader<row_split_loader>);

} // namespace dcr::loaders
