#pragma once
/// \file
/// Rank-local parameter storage: the named, typed, contiguous buffers a native
/// loader places canonical tensors into (what a serving runtime holds as its
/// registered parameters). Storage is zero-initialised, so padding that no
/// copy writes stays zero, and every byte takes part in the state digest.
///
/// State digest: a set digest (core/set_digest.hpp) of the (parameter,
/// element, stored word) triples, kept incrementally: every write of the
/// post-prewarm sinks passes the word before and after it to
/// `set_digest::replace` and the sink adds its sum here (`add_digest`), so
/// `digest()` costs O(1) and a refit O(changes). `full_digest()` recomputes
/// it from every stored byte (the check, and what `recompute_digest` installs
/// after a dense refit). Writes that bypass the sinks are not seen: the full
/// recomputation is what detects them.

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "dcr/core/error.hpp"
#include "dcr/core/hash.hpp"
#include "dcr/core/set_digest.hpp"
#include "dcr/core/tensor.hpp"

namespace dcr {

/// One rank-local parameter: its own name, shape and dtype, contiguous bytes.
struct parameter {
  tensor_meta meta;
  std::vector<std::byte> bytes;

  /// Row-major view of the whole parameter.
  tensor_view view() { return {bytes.data(), meta.dtype, strided_layout::row_major(meta.shape)}; }
};

namespace detail {
/// Hash of names that looks up by `std::string_view` without building a
/// `std::string` (no allocation on the per-item path).
struct name_hash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept {
    return std::hash<std::string_view>{}(s);
  }
};
/// A map from names that looks up by `std::string_view`.
template <class T>
using name_map = std::unordered_map<std::string, T, name_hash, std::equal_to<>>;

/// The parameter list shared by `parameter_store` and the planning store
/// (`plan_store`, receiver/plan.hpp): entries in declaration order, each
/// owning an address range that never moves, found by name and by address.
/// `Entry` has `meta`; its range is given when it is added.
template <class Entry>
class parameter_registry {
public:
  /// Throws `invalid_argument` on a duplicate name, `bad_dtype` on an
  /// unknown dtype: the checks before an entry is built.
  void check_new(const std::string& name, dtype_id dtype) const {
    if (by_name_.count(name))
      throw error(errc::invalid_argument, "parameter declared twice: " + name);
    if (!info(dtype)) throw error(errc::bad_dtype, "parameter " + name + ": unknown dtype");
  }
  /// Append `e`, whose bytes are `[data, data + size)`; returns it.
  Entry& push(std::unique_ptr<Entry> e, const std::byte* data, std::size_t size) {
    const auto idx = entries_.size();
    by_name_.emplace(e->meta.name, idx);
    if (size > 0) by_address_.emplace(data, range{idx, size});
    entries_.push_back(std::move(e));
    return *entries_.back();
  }

  std::size_t size() const noexcept { return entries_.size(); }
  Entry& operator[](std::size_t i) { return *entries_[i]; }
  const Entry& operator[](std::size_t i) const { return *entries_[i]; }

  std::optional<std::size_t> index_of(std::string_view name) const {
    auto it = by_name_.find(name);
    if (it == by_name_.end()) return std::nullopt;
    return it->second;
  }
  /// Index of the entry whose range contains `[lo, hi)`, if any.
  std::optional<std::size_t> locate(const std::byte* lo, const std::byte* hi) const {
    auto it = by_address_.upper_bound(lo);
    if (it == by_address_.begin()) return std::nullopt;
    --it;
    const std::byte* begin = it->first;
    const std::byte* end = begin + it->second.size;
    if (lo >= begin && hi <= end && lo <= hi) return it->second.index;
    return std::nullopt;
  }

  auto begin() const noexcept { return entries_.begin(); }
  auto end() const noexcept { return entries_.end(); }

private:
  struct range {
    std::size_t index, size;
  };
  std::vector<std::unique_ptr<Entry>> entries_;
  name_map<std::size_t> by_name_;
  std::map<const std::byte*, range> by_address_;
};
} // namespace detail

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
    params_.check_new(name, dtype);
    auto p = std::make_unique<parameter>();
    p->meta = {std::move(name), std::move(shape), dtype};
    p->bytes.assign(p->meta.nbytes(), std::byte{0});
    keys_.push_back(region_key(p->meta.name, p->meta.dtype, p->meta.shape));
    const std::byte* data = p->bytes.data();
    const std::size_t size = p->bytes.size();
    return params_.push(std::move(p), data, size).view();
  }

  std::size_t size() const noexcept { return params_.size(); }
  parameter& operator[](std::size_t i) { return params_[i]; }
  const parameter& operator[](std::size_t i) const { return params_[i]; }

  /// Index of a parameter by name.
  std::optional<std::size_t> index_of(std::string_view name) const {
    return params_.index_of(name);
  }
  /// Whole-parameter view by name; throws `not_found`.
  tensor_view view(std::string_view name) {
    auto i = index_of(name);
    if (!i) throw error(errc::not_found, "no parameter named " + std::string(name));
    return params_[*i].view();
  }

  /// Index of the parameter whose bytes contain `[lo, hi)`, if any.
  std::optional<std::size_t> locate(const std::byte* lo, const std::byte* hi) const {
    return params_.locate(lo, hi);
  }

  /// Total bytes of storage.
  std::uint64_t nbytes() const noexcept {
    std::uint64_t n = 0;
    for (auto& p : params_) n += p->bytes.size();
    return n;
  }

  /// The state digest as kept incrementally (see the file comment): the set
  /// digest of every nonzero stored word by (parameter, element), sealed
  /// with the layout (names, dtypes and shapes in declaration order).
  digest128 digest() const { return digest_.seal(layout_bytes()); }
  /// The same recomputed from every stored byte: O(storage), a check of
  /// `digest()` (equal unless storage was written outside the sinks).
  digest128 full_digest() const { return full_set().seal(layout_bytes()); }
  /// Replace the incremental state by the full recomputation (after a dense
  /// refit, which writes every stored word).
  void recompute_digest() { digest_ = full_set(); }
  /// Add the change of a sink's writes (sums of `set_digest::replace`).
  void add_digest(const set_digest& delta) noexcept { digest_ += delta; }
  /// The element-hash key of parameter `i` (what the sinks pass to `replace`).
  const set_digest_key& digest_key(std::size_t i) const noexcept { return keys_[i]; }
  /// The incremental set digest itself (unsealed lanes).
  const set_digest& digest_state() const noexcept { return digest_; }

  /// True when both stores hold the same parameters with the same bytes.
  friend bool operator==(const parameter_store& a, const parameter_store& b) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i)
      if (a[i].meta != b[i].meta || a[i].bytes != b[i].bytes) return false;
    return true;
  }

private:
  set_digest full_set() const {
    set_digest d;
    for (std::size_t i = 0; i < params_.size(); ++i)
      d.add_bytes(keys_[i], params_[i].bytes, width_of(params_[i].meta.dtype));
    return d;
  }
  /// The layout the digest is sealed with: XXH3-128 of every parameter's
  /// name, dtype and shape in declaration order.
  std::array<std::byte, 16> layout_bytes() const {
    XXH3_state_t st;
    XXH3_INITSTATE(&st);
    XXH3_INITSTATE(&st);
    XXH3_128bits_reset(&st);
    for (auto& p : params_) {
      const std::uint64_t n = p->meta.name.size(), r = p->meta.shape.size();
      const auto d = static_cast<std::uint8_t>(p->meta.dtype);
      XXH3_128bits_update(&st, &n, sizeof n);
      XXH3_128bits_update(&st, p->meta.name.data(), n);
      XXH3_128bits_update(&st, &d, 1);
      XXH3_128bits_update(&st, &r, sizeof r);
      XXH3_128bits_update(&st, p->meta.shape.data(), r * sizeof(std::uint64_t));
    }
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(&st));
    std::array<std::byte, 16> out{};
    std::memcpy(out.data(), c.digest, out.size());
    return out;
  }

  detail::parameter_registry<parameter> params_;
  std::vector<set_digest_key> keys_;
  set_digest digest_;
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
