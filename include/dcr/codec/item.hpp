#pragma once
/// \file
/// The unit the codec moves: an item holds one owner's entries for one
/// canonical tensor. This decoded form is the contract between the training
/// side (which builds items), the codec (which packs them into payloads) and
/// the rollout side (which applies them through the native loader).

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "dcr/core/tensor.hpp"

namespace dcr {

/// How an item's values relate to the stored bits. Numeric values are wire format.
enum class value_encoding : std::uint8_t {
  xor_mask = 1,  ///< value = old ^ new; applied by XOR into resident storage
  overwrite = 2, ///< value = new; applied by writing, repairs any earlier state
  add = 3,       ///< value = zigzag(new - old mod 2^w); applied by adding (format v2)
};

constexpr std::string_view to_string(value_encoding e) noexcept {
  switch (e) {
  case value_encoding::xor_mask:
    return "xor";
  case value_encoding::overwrite:
    return "overwrite";
  case value_encoding::add:
    return "add";
  }
  return "unknown";
}

/// How an attempt encodes its records (the builder's option and the
/// coordinator's build request).
enum class refit_mode : std::uint8_t {
  mixed, ///< XOR or add where representation-preserving, overwrite elsewhere (first attempt)
  overwrite_all, ///< every record an absolute overwrite (retries: repairs any partial writes)
};

constexpr const char* to_string(refit_mode m) noexcept {
  return m == refit_mode::mixed ? "mixed" : "overwrite_all";
}

/// One owner's changed entries of one canonical tensor.
///
/// Invariants (checked by the encoder, guaranteed by the decoder):
/// `indices` are canonical row-major flat indices, strictly increasing, each
/// `< tensor.numel()`; `values.size() == indices.size() * width_of(tensor.dtype)`,
/// little-endian stored words in index order.
struct item {
  tensor_meta tensor;
  value_encoding encoding = value_encoding::xor_mask;
  std::vector<std::uint64_t> indices;
  std::vector<std::byte> values;

  std::size_t size() const noexcept { return indices.size(); }
  friend bool operator==(const item&, const item&) = default;
};

} // namespace dcr
