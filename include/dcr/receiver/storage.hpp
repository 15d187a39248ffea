#pragma once
/// \file
/// Rank-local parameter storage: the named, typed, contiguous buffers a native
/// loader places canonical tensors into (what a serving runtime holds as its
/// registered parameters). Storage is zero-initialised, so padding that no
/// copy writes stays zero, and every byte takes part in the state digest.

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "dcr/core/error.hpp"
#include "dcr/core/hash.hpp"
#include "dcr/core/tensor.hpp"

namespace dcr {

/// One rank-local parameter: its own name, shape and dtype, contiguous bytes.
struct parameter {
  tensor_meta meta;
  std::vector<std::byte> bytes;

  /// Row-major view of the whole parameter.
  tensor_view view() { return {bytes.data(), meta.dtype, strided_layout::row_major(meta.shape)}; }
};

/// Named parameters in declaration order. Buffers never move once added, so
/// views stay valid for the store's lifetime.
class parameter_store {
public:
  parameter_store() = default;
  parameter_store(const parameter_store&) = delete;
  parameter_store& operator=(const parameter_store&) = delete;
  parameter_store(parameter_store&&) noexcept = default;
  parameter_store& operator=(parameter_store&&) noexcept = default;

  /// Add a zeroed parameter; throws `invalid_argument` on a duplicate name or unknown dtype.
  tensor_view add(std::string name, std::vector<std::uint64_t> shape, dtype_id dtype) {
    if (by_name_.count(name))
      throw error(errc::invalid_argument, "parameter declared twice: " + name);
    if (!info(dtype)) throw error(errc::bad_dtype, "parameter " + name + ": unknown dtype");
    auto p = std::make_unique<parameter>();
    p->meta = {std::move(name), std::move(shape), dtype};
    p->bytes.assign(p->meta.nbytes(), std::byte{0});
    const auto idx = params_.size();
    by_name_.emplace(p->meta.name, idx);
    if (!p->bytes.empty()) by_address_.emplace(p->bytes.data(), idx);
    params_.push_back(std::move(p));
    return params_.back()->view();
  }

  std::size_t size() const noexcept { return params_.size(); }
  parameter& operator[](std::size_t i) { return *params_[i]; }
  const parameter& operator[](std::size_t i) const { return *params_[i]; }

  /// Index of a parameter by name.
  std::optional<std::size_t> index_of(std::string_view name) const {
    auto it = by_name_.find(std::string(name));
    if (it == by_name_.end()) return std::nullopt;
    return it->second;
  }
  /// Whole-parameter view by name; throws `not_found`.
  tensor_view view(std::string_view name) {
    auto i = index_of(name);
    if (!i) throw error(errc::not_found, "no parameter named " + std::string(name));
    return params_[*i]->view();
  }

  /// Index of the parameter whose bytes contain `[lo, hi)`, if any.
  std::optional<std::size_t> locate(const std::byte* lo, const std::byte* hi) const {
    auto it = by_address_.upper_bound(lo);
    if (it == by_address_.begin()) return std::nullopt;
    --it;
    const auto& p = *params_[it->second];
    const std::byte* end = p.bytes.data() + p.bytes.size();
    if (lo >= p.bytes.data() && hi <= end && lo <= hi) return it->second;
    return std::nullopt;
  }

  /// Total bytes of storage.
  std::uint64_t nbytes() const noexcept {
    std::uint64_t n = 0;
    for (auto& p : params_) n += p->bytes.size();
    return n;
  }

  /// BLAKE2b-128 over the bytes of every parameter, concatenated in
  /// declaration order (equals `b2sum -l 128` of that concatenation).
  digest128 digest() const {
    blake2b_128 h;
    for (auto& p : params_) h.update(p->bytes);
    return h.final();
  }

  /// True when both stores hold the same parameters with the same bytes.
  friend bool operator==(const parameter_store& a, const parameter_store& b) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i)
      if (a[i].meta != b[i].meta || a[i].bytes != b[i].bytes) return false;
    return true;
  }

private:
  std::vector<std::unique_ptr<parameter>> params_;
  std::unordered_map<std::string, std::size_t> by_name_;
  std::map<const std::byte*, std::size_t> by_address_;
};

/// Where two stores first differ ("" when equal): parameter, byte offset.
inline std::string first_difference(const parameter_store& a, const parameter_store& b) {
  if (a.size() != b.size())
    return "parameter count " + std::to_string(a.size()) + " vs " + std::to_string(b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].meta != b[i].meta) return "parameter " + a[i].meta.name + ": meta differs";
    const auto& x = a[i].bytes;
    const auto& y = b[i].bytes;
    for (std::size_t k = 0; k < x.size(); ++k)
      if (x[k] != y[k]) return "parameter " + a[i].meta.name + ": byte " + std::to_string(k);
  }
  return {};
}

} // namespace dcr
