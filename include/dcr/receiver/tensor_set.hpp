#pragma once
/// \file
/// An in-memory set of canonical tensors: a `canonical_source` for dense
/// refit and post-apply checks (tests, benches, a trainer held in process).

#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "dcr/core/error.hpp"
#include "dcr/core/tensor.hpp"
#include "dcr/receiver/loader.hpp"

namespace dcr {

/// Canonical tensors by name, in insertion order.
class tensor_set {
public:
  tensor_set() = default;
  /// Zeroed tensors for every meta.
  explicit tensor_set(const std::vector<tensor_meta>& metas) {
    for (auto& m : metas) add(host_tensor(m));
  }
  /// Add (or replace) a tensor.
  host_tensor& add(host_tensor t) {
    auto [it, fresh] = index_.emplace(t.meta.name, tensors_.size());
    if (fresh)
      tensors_.push_back(std::move(t));
    else
      tensors_[it->second] = std::move(t);
    return tensors_[it->second];
  }
  /// Read-only view by name (the `canonical_source` interface).
  std::optional<tensor_view> find(std::string_view name) const {
    auto it = index_.find(std::string(name));
    if (it == index_.end()) return std::nullopt;
    auto& t = const_cast<host_tensor&>(tensors_[it->second]);
    return t.view();
  }
  /// Mutable tensor by name; throws `not_found`.
  host_tensor& at(std::string_view name) {
    auto it = index_.find(std::string(name));
    if (it == index_.end()) throw error(errc::not_found, "no tensor named " + std::string(name));
    return tensors_[it->second];
  }
  std::vector<host_tensor>& tensors() noexcept { return tensors_; }
  const std::vector<host_tensor>& tensors() const noexcept { return tensors_; }

private:
  std::vector<host_tensor> tensors_;
  std::unordered_map<std::string, std::size_t> index_;
};
static_assert(canonical_source<tensor_set>);

} // namespace dcr
