#pragma once
/// \file
/// Storage dtypes. dcr never does arithmetic on weights while moving them: it
/// compares, XORs and copies their stored bit patterns (words). Each dtype is a
/// tag type with `dtype_traits`, plus a runtime `dtype_id` for metadata.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "dcr/core/config.hpp"

namespace dcr {

/// Runtime dtype identifier; the numeric values are part of the wire format.
enum class dtype_id : std::uint8_t {
  bf16 = 1,
  f16 = 2,
  f32 = 3,
  f8e4m3fn = 4,
  f8e5m2 = 5,
};

/// Dtype tags (models of `dtype`).
struct bf16 {};
struct f16 {};
struct f32 {};
struct f8e4m3fn {};
struct f8e5m2 {};

/// Per-dtype facts. `word` is the unsigned integer holding one stored value;
/// `placeholder` is the canonical quiet NaN used as the default overwrite
/// placeholder (it survives elementwise casts and scales).
template <class D>
struct dtype_traits;

template <>
struct dtype_traits<bf16> {
  using word = std::uint16_t;
  static constexpr dtype_id id = dtype_id::bf16;
  static constexpr std::string_view safetensors_name = "BF16";
  static constexpr word placeholder = 0x7FC0;
  static constexpr word exponent_mask = 0x7F80, mantissa_mask = 0x007F;
};
template <>
struct dtype_traits<f16> {
  using word = std::uint16_t;
  static constexpr dtype_id id = dtype_id::f16;
  static constexpr std::string_view safetensors_name = "F16";
  static constexpr word placeholder = 0x7E00;
  static constexpr word exponent_mask = 0x7C00, mantissa_mask = 0x03FF;
};
template <>
struct dtype_traits<f32> {
  using word = std::uint32_t;
  static constexpr dtype_id id = dtype_id::f32;
  static constexpr std::string_view safetensors_name = "F32";
  static constexpr word placeholder = 0x7FC00000u;
  static constexpr word exponent_mask = 0x7F800000u, mantissa_mask = 0x007FFFFFu;
};
/// E4M3 "fn": no infinities; only S.1111.111 is NaN.
template <>
struct dtype_traits<f8e4m3fn> {
  using word = std::uint8_t;
  static constexpr dtype_id id = dtype_id::f8e4m3fn;
  static constexpr std::string_view safetensors_name = "F8_E4M3";
  static constexpr word placeholder = 0x7F;
  static constexpr word exponent_mask = 0x78, mantissa_mask = 0x07;
};
template <>
struct dtype_traits<f8e5m2> {
  using word = std::uint8_t;
  static constexpr dtype_id id = dtype_id::f8e5m2;
  static constexpr std::string_view safetensors_name = "F8_E5M2";
  static constexpr word placeholder = 0x7E;
  static constexpr word exponent_mask = 0x7C, mantissa_mask = 0x03;
};

/// A storage dtype: has traits with an unsigned word type and an id.
template <class D>
concept storage_dtype = requires {
  typename dtype_traits<D>::word;
  { dtype_traits<D>::id } -> std::convertible_to<dtype_id>;
  { dtype_traits<D>::placeholder } -> std::convertible_to<typename dtype_traits<D>::word>;
}
&&std::is_unsigned_v<typename dtype_traits<D>::word>;

static_assert(storage_dtype<bf16> && storage_dtype<f16> && storage_dtype<f32> &&
              storage_dtype<f8e4m3fn> && storage_dtype<f8e5m2>);

/// Word type of dtype `D`.
template <storage_dtype D>
using word_t = typename dtype_traits<D>::word;

/// True when `w` is a NaN pattern of dtype `D` (any sign, any payload).
template <storage_dtype D>
constexpr DCR_HOST_DEVICE bool is_nan_word(word_t<D> w) noexcept {
  using T = dtype_traits<D>;
  if constexpr (std::is_same_v<D, f8e4m3fn>) {
    return (w & 0x7F) == 0x7F;
  } else {
    return (w & T::exponent_mask) == T::exponent_mask && (w & T::mantissa_mask) != 0;
  }
}

/// Runtime facts of a dtype id.
struct dtype_info {
  dtype_id id;
  std::uint8_t width; ///< bytes per stored value
  std::string_view safetensors_name;
  std::uint32_t placeholder; ///< default placeholder word, zero-extended
};

/// Facts for a dtype id, or nullopt for an id this build does not know.
constexpr std::optional<dtype_info> info(dtype_id id) noexcept {
  switch (id) {
#define DCR_DTYPE_INFO_CASE(tag)                                                                   \
  case dtype_traits<tag>::id:                                                                      \
    return dtype_info{dtype_traits<tag>::id, sizeof(word_t<tag>),                                  \
                      dtype_traits<tag>::safetensors_name, dtype_traits<tag>::placeholder};
    DCR_DTYPE_INFO_CASE(bf16)
    DCR_DTYPE_INFO_CASE(f16)
    DCR_DTYPE_INFO_CASE(f32)
    DCR_DTYPE_INFO_CASE(f8e4m3fn)
    DCR_DTYPE_INFO_CASE(f8e5m2)
#undef DCR_DTYPE_INFO_CASE
  }
  return std::nullopt;
}

/// True when `raw` is a dtype id this build knows.
constexpr bool is_known_dtype(std::uint8_t raw) noexcept {
  return info(static_cast<dtype_id>(raw)).has_value();
}

/// Bytes per value of a known dtype (0 for an unknown id).
constexpr std::size_t width_of(dtype_id id) noexcept {
  auto i = info(id);
  return i ? i->width : 0;
}

/// Short name, e.g. "bf16".
constexpr std::string_view name_of(dtype_id id) noexcept {
  switch (id) {
  case dtype_id::bf16:
    return "bf16";
  case dtype_id::f16:
    return "f16";
  case dtype_id::f32:
    return "f32";
  case dtype_id::f8e4m3fn:
    return "f8e4m3fn";
  case dtype_id::f8e5m2:
    return "f8e5m2";
  }
  return "unknown";
}

/// Dtype id from a safetensors dtype string ("BF16", "F32", ...).
constexpr std::optional<dtype_id> from_safetensors_name(std::string_view s) noexcept {
  for (auto id :
       {dtype_id::bf16, dtype_id::f16, dtype_id::f32, dtype_id::f8e4m3fn, dtype_id::f8e5m2})
    if (info(id)->safetensors_name == s) return id;
  return std::nullopt;
}

/// True when `width` is the byte width of a stored word (1, 2, 4 or 8).
constexpr DCR_HOST_DEVICE bool is_word_width(std::size_t width) noexcept {
  return width == 1 || width == 2 || width == 4 || width == 8;
}

/// Call `f(W{})` with the unsigned word type `W` of `width` bytes; returns
/// what `f` returns. The one switch from a runtime word width to a word type
/// (sinks, copies, digests, device copies). Precondition: `is_word_width(width)`
/// (any other width is treated as 8).
template <class F>
constexpr decltype(auto) visit_word(std::size_t width, F&& f) {
  switch (width) {
  case 1:
    return f(std::uint8_t{});
  case 2:
    return f(std::uint16_t{});
  case 4:
    return f(std::uint32_t{});
  default:
    return f(std::uint64_t{});
  }
}

/// Call `f(tag{})` with the dtype tag for a runtime id; returns what `f` returns.
/// Precondition: `id` is known (check with `info`).
template <class F>
constexpr decltype(auto) visit_dtype(dtype_id id, F&& f) {
  switch (id) {
  case dtype_id::bf16:
    return f(bf16{});
  case dtype_id::f16:
    return f(f16{});
  case dtype_id::f32:
    return f(f32{});
  case dtype_id::f8e4m3fn:
    return f(f8e4m3fn{});
  case dtype_id::f8e5m2:
    return f(f8e5m2{});
  }
  DCR_UNREACHABLE();
  return f(bf16{});
}

/// True when word `w` (zero-extended) of runtime dtype `d` is a NaN; false
/// for an unknown id.
constexpr bool is_nan_bits(dtype_id d, std::uint64_t w) noexcept {
  if (!info(d)) return false;
  return visit_dtype(d, [w](auto tag) {
    using D = decltype(tag);
    return is_nan_word<D>(static_cast<word_t<D>>(w));
  });
}

} // namespace dcr
