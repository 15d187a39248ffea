#pragma once
/// \file
/// Location codings: how an item's strictly increasing flat indices travel.
///
/// The first index is stored in the item's table row, never in the location
/// buffer. Each following index is `prev + gap + 1`, so a gap is the number
/// of unchanged elements skipped. A coding turns the `count - 1` gaps into
/// bytes and back; `run` (all gaps zero) stores nothing at all.
///
/// Every coding is a policy modelling `location_coding`, named on the wire by
/// its `location_id`. This header avoids Boost so that host twins of device
/// code may include it.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dcr/core/config.hpp"
#include "dcr/core/endian.hpp"
#include "dcr/core/error.hpp"

namespace dcr::codec {

/// Wire id of a location coding (item table field). Values are wire format.
enum class location_id : std::uint8_t {
  run = 1,        ///< contiguous: indices first .. first+count-1, no bytes
  gap_u8 = 2,     ///< gaps as little-endian u8 words
  gap_u16 = 3,    ///< gaps as little-endian u16 words
  gap_u32 = 4,    ///< gaps as little-endian u32 words
  gap_u64 = 5,    ///< gaps as little-endian u64 words
  planes_u16 = 6, ///< u16 gap words split into byte planes, high plane first
  planes_u32 = 7, ///< u32 gap words split into byte planes, high plane first
  planes_u64 = 8, ///< u64 gap words split into byte planes, high plane first
  varint = 9,     ///< gaps as minimal unsigned LEB128
  escape_u8 = 10, ///< a byte per gap < 255; 255 escapes to LEB128(gap - 255)
};

/// Short stable name, e.g. "gap_u16".
constexpr std::string_view to_string(location_id id) noexcept {
  switch (id) {
  case location_id::run:
    return "run";
  case location_id::gap_u8:
    return "gap_u8";
  case location_id::gap_u16:
    return "gap_u16";
  case location_id::gap_u32:
    return "gap_u32";
  case location_id::gap_u64:
    return "gap_u64";
  case location_id::planes_u16:
    return "planes_u16";
  case location_id::planes_u32:
    return "planes_u32";
  case location_id::planes_u64:
    return "planes_u64";
  case location_id::varint:
    return "varint";
  case location_id::escape_u8:
    return "escape_u8";
  }
  return "unknown";
}

/// True when `raw` names a location coding this build knows.
constexpr bool is_known_location(std::uint8_t raw) noexcept { return raw >= 1 && raw <= 10; }

/// A location coding policy. Minimal complete definition:
/// - `C::id` (its `location_id`) and `C::name`;
/// - `C::encode(indices, out)`: appends the bytes of `indices[1..]` relative to
///   their predecessors. Precondition: strictly increasing, non-empty,
///   `C::can_encode(indices)`.
/// - `C::decode(in, first, numel, out)`: with `out.size() >= 1`, sets
///   `out[0] = first` and fills the rest from `in`; fails with a typed status
///   unless `in` is exactly the coding of `out.size() - 1` gaps and every index
///   is `< numel`. Never reads or writes outside the spans.
/// Law: for every valid `indices`, `decode(encode(indices), indices[0], numel)`
/// gives `indices` back, and the decoded indices are strictly increasing.
template <class C>
concept location_coding = requires(std::span<const std::uint64_t> idx, std::vector<std::byte>& out,
                                   std::span<const std::byte> in, std::uint64_t v,
                                   std::span<std::uint64_t> dst) {
  { C::id } -> std::convertible_to<location_id>;
  { C::name } -> std::convertible_to<std::string_view>;
  { C::can_encode(idx) } -> std::same_as<bool>;
  C::encode(idx, out);
  { C::decode(in, v, v, dst) } -> std::same_as<status>;
};

namespace detail {

/// Largest gap of strictly increasing indices (0 for fewer than two).
inline std::uint64_t max_gap(std::span<const std::uint64_t> idx) noexcept {
  std::uint64_t m = 0;
  for (std::size_t i = 1; i < idx.size(); ++i) {
    const std::uint64_t g = idx[i] - idx[i - 1] - 1;
    m = g > m ? g : m;
  }
  return m;
}

/// Message for a decode that produced indices outside [0, numel) or
/// wrapped: names the first offending position.
inline status range_error(std::span<const std::uint64_t> out, std::uint64_t numel,
                          bool wrapped_any) {
  for (std::size_t k = 0; k < out.size(); ++k) {
    if (k > 0 && out[k] <= out[k - 1])
      return fail(errc::index_out_of_range, "location " + std::to_string(k) +
                                                " overflows 64 bits after index " +
                                                std::to_string(out[k - 1]));
    if (out[k] >= numel)
      return fail(errc::index_out_of_range, "location " + std::to_string(k) + ": index " +
                                                std::to_string(out[k]) + " >= numel " +
                                                std::to_string(numel));
  }
  return fail(errc::index_out_of_range, wrapped_any ? "index overflow" : "index out of range");
}

/// Decoders need room for the first index; a caller passing none is a bug, reported not crashed.
inline status empty_output() {
  return fail(errc::invalid_argument, "location decode needs at least one output index");
}

/// Prefix-sum gaps into indices; branch-light (wrap and range checked once).
template <class Gap>
inline status finish(std::span<std::uint64_t> out, std::uint64_t first, std::uint64_t numel,
                     Gap&& gap) {
  if (out.empty()) return empty_output();
  out[0] = first;
  std::uint64_t prev = first;
  bool wrapped = false;
  for (std::size_t k = 1; k < out.size(); ++k) {
    const std::uint64_t next = prev + gap(k - 1) + 1;
    wrapped |= next <= prev;
    out[k] = next;
    prev = next;
  }
  if (DCR_UNLIKELY(wrapped || prev >= numel)) return range_error(out, numel, wrapped);
  return status::success();
}

inline status length_error(std::string_view coding, std::size_t have, std::uint64_t want) {
  return fail(errc::bad_location, std::string(coding) + " locations hold " + std::to_string(have) +
                                      " bytes, expected " + std::to_string(want));
}

/// Bytes of minimal LEB128 for `v`.
inline std::size_t varint_size(std::uint64_t v) noexcept {
  return v < 128 ? 1 : static_cast<std::size_t>((64 - std::countl_zero(v) + 6) / 7);
}
inline void put_varint(std::vector<std::byte>& out, std::uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<std::byte>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<std::byte>(v));
}
/// Read one minimal LEB128 value at `pos`; false on truncation, more than 64
/// bits or a non-minimal form (a last byte of zero after the first).
inline bool get_varint(std::span<const std::byte> in, std::size_t& pos, std::uint64_t& v) noexcept {
  v = 0;
  for (unsigned shift = 0, n = 0; pos < in.size(); shift += 7, ++n) {
    const auto b = static_cast<std::uint8_t>(in[pos++]);
    if (n == 9 && b > 1) return false; // bits beyond 64
    v |= static_cast<std::uint64_t>(b & 0x7F) << shift;
    if (b < 0x80) return n == 0 || b != 0;
  }
  return false;
}

} // namespace detail

/// Contiguous indices: no bytes, count comes from the table row.
struct run {
  static constexpr location_id id = location_id::run;
  static constexpr std::string_view name = "run";
  static bool can_encode(std::span<const std::uint64_t> idx) noexcept {
    return idx.empty() || idx.back() - idx.front() == idx.size() - 1;
  }
  static void encode(std::span<const std::uint64_t>, std::vector<std::byte>&) {}
  static status decode(std::span<const std::byte> in, std::uint64_t first, std::uint64_t numel,
                       std::span<std::uint64_t> out) {
    if (out.empty()) return detail::empty_output();
    if (!in.empty()) return detail::length_error(name, in.size(), 0);
    const std::uint64_t n = out.size();
    DCR_RETURN_ERROR_IF(first >= numel || n > numel - first, index_out_of_range,
                        "run [" + std::to_string(first) + ", +" + std::to_string(n) +
                            ") exceeds numel " + std::to_string(numel));
    for (std::uint64_t k = 0; k < n; ++k) out[k] = first + k;
    return status::success();
  }
};
static_assert(location_coding<run>);

/// Gaps as little-endian words of `W` (u8/u16/u32/u64).
template <class W>
struct gap_words {
  static constexpr location_id id = sizeof(W) == 1   ? location_id::gap_u8
                                    : sizeof(W) == 2 ? location_id::gap_u16
                                    : sizeof(W) == 4 ? location_id::gap_u32
                                                     : location_id::gap_u64;
  static constexpr std::string_view name = to_string(id);
  static bool can_encode(std::span<const std::uint64_t> idx) noexcept {
    return detail::max_gap(idx) <= static_cast<std::uint64_t>(static_cast<W>(~W{0}));
  }
  static void encode(std::span<const std::uint64_t> idx, std::vector<std::byte>& out) {
    if (idx.size() < 2) return;
    const std::size_t base = out.size();
    out.resize(base + (idx.size() - 1) * sizeof(W));
    std::byte* p = out.data() + base;
    for (std::size_t i = 1; i < idx.size(); ++i, p += sizeof(W))
      store_le<W>(p, static_cast<W>(idx[i] - idx[i - 1] - 1));
  }
  static status decode(std::span<const std::byte> in, std::uint64_t first, std::uint64_t numel,
                       std::span<std::uint64_t> out) {
    if (out.empty()) return detail::empty_output();
    const std::uint64_t gaps = out.size() - 1;
    if (in.size() / sizeof(W) != gaps || in.size() % sizeof(W) != 0)
      return detail::length_error(name, in.size(), gaps * sizeof(W));
    const std::byte* p = in.data();
    return detail::finish(out, first, numel, [p](std::size_t k) {
      return std::uint64_t{load_le<W>(p + k * sizeof(W))};
    });
  }
};
using gap_u8 = gap_words<std::uint8_t>;
using gap_u16 = gap_words<std::uint16_t>;
using gap_u32 = gap_words<std::uint32_t>;
using gap_u64 = gap_words<std::uint64_t>;
static_assert(location_coding<gap_u8> && location_coding<gap_u16> && location_coding<gap_u32> &&
              location_coding<gap_u64>);

/// Gap words of `W` split into byte planes: the most significant byte of
/// every gap, then the next, down to the least significant. High planes of
/// small gaps are nearly all zero, which zstd removes almost for free.
template <class W>
struct gap_planes {
  static_assert(sizeof(W) > 1);
  static constexpr location_id id = sizeof(W) == 2   ? location_id::planes_u16
                                    : sizeof(W) == 4 ? location_id::planes_u32
                                                     : location_id::planes_u64;
  static constexpr std::string_view name = to_string(id);
  static bool can_encode(std::span<const std::uint64_t> idx) noexcept {
    return gap_words<W>::can_encode(idx);
  }
  static void encode(std::span<const std::uint64_t> idx, std::vector<std::byte>& out) {
    if (idx.size() < 2) return;
    const std::size_t n = idx.size() - 1, base = out.size();
    out.resize(base + n * sizeof(W));
    std::byte* p = out.data() + base;
    for (std::size_t i = 0; i < n; ++i) {
      const W g = static_cast<W>(idx[i + 1] - idx[i] - 1);
      for (std::size_t b = 0; b < sizeof(W); ++b)
        p[(sizeof(W) - 1 - b) * n + i] = static_cast<std::byte>((g >> (8 * b)) & 0xFF);
    }
  }
  static status decode(std::span<const std::byte> in, std::uint64_t first, std::uint64_t numel,
                       std::span<std::uint64_t> out) {
    if (out.empty()) return detail::empty_output();
    const std::uint64_t n = out.size() - 1;
    if (in.size() / sizeof(W) != n || in.size() % sizeof(W) != 0)
      return detail::length_error(name, in.size(), n * sizeof(W));
    const auto* p = reinterpret_cast<const std::uint8_t*>(in.data());
    return detail::finish(out, first, numel, [p, n](std::size_t k) {
      std::uint64_t g = 0;
      for (std::size_t b = 0; b < sizeof(W); ++b) g = (g << 8) | p[b * n + k];
      return g;
    });
  }
};
using planes_u16 = gap_planes<std::uint16_t>;
using planes_u32 = gap_planes<std::uint32_t>;
using planes_u64 = gap_planes<std::uint64_t>;
static_assert(location_coding<planes_u16> && location_coding<planes_u32> &&
              location_coding<planes_u64>);

/// Gaps as minimal unsigned LEB128 (7 bits per byte, high bit = more).
struct varint_gaps {
  static constexpr location_id id = location_id::varint;
  static constexpr std::string_view name = "varint";
  static bool can_encode(std::span<const std::uint64_t>) noexcept { return true; }
  static void encode(std::span<const std::uint64_t> idx, std::vector<std::byte>& out) {
    for (std::size_t i = 1; i < idx.size(); ++i) detail::put_varint(out, idx[i] - idx[i - 1] - 1);
  }
  static status decode(std::span<const std::byte> in, std::uint64_t first, std::uint64_t numel,
                       std::span<std::uint64_t> out) {
    if (out.empty()) return detail::empty_output();
    std::size_t pos = 0;
    out[0] = first;
    std::uint64_t prev = first;
    for (std::size_t k = 1; k < out.size(); ++k) {
      std::uint64_t g;
      const std::size_t at = pos;
      DCR_RETURN_ERROR_IF(!detail::get_varint(in, pos, g), bad_location,
                          "malformed varint for location " + std::to_string(k) + " at byte " +
                              std::to_string(at));
      const std::uint64_t next = prev + g + 1;
      DCR_RETURN_ERROR_IF(next <= prev || next >= numel, index_out_of_range,
                          "location " + std::to_string(k) + " (byte " + std::to_string(at) +
                              ") leaves [0, " + std::to_string(numel) + ")");
      out[k] = prev = next;
    }
    if (pos != in.size()) return detail::length_error(name, in.size(), pos);
    DCR_RETURN_ERROR_IF(first >= numel, index_out_of_range,
                        "first index " + std::to_string(first) + " >= numel " +
                            std::to_string(numel));
    return status::success();
  }
};
static_assert(location_coding<varint_gaps>);

/// One byte per gap below 255; the byte 255 escapes to a minimal LEB128 of
/// `gap - 255` that follows it.
struct escape_u8 {
  static constexpr location_id id = location_id::escape_u8;
  static constexpr std::string_view name = "escape_u8";
  static bool can_encode(std::span<const std::uint64_t>) noexcept { return true; }
  static void encode(std::span<const std::uint64_t> idx, std::vector<std::byte>& out) {
    out.reserve(out.size() + idx.size());
    for (std::size_t i = 1; i < idx.size(); ++i) {
      const std::uint64_t g = idx[i] - idx[i - 1] - 1;
      if (g < 255) {
        out.push_back(static_cast<std::byte>(g));
      } else {
        out.push_back(std::byte{255});
        detail::put_varint(out, g - 255);
      }
    }
  }
  static status decode(std::span<const std::byte> in, std::uint64_t first, std::uint64_t numel,
                       std::span<std::uint64_t> out) {
    if (out.empty()) return detail::empty_output();
    DCR_RETURN_ERROR_IF(first >= numel, index_out_of_range,
                        "first index " + std::to_string(first) + " >= numel " +
                            std::to_string(numel));
    std::size_t pos = 0, k = 1;
    out[0] = first;
    std::uint64_t prev = first;
    const auto* p = reinterpret_cast<const std::uint8_t*>(in.data());
    while (k < out.size()) {
      // Fast path: 8 gaps without an escape byte, range checked once per block.
      if (k + 8 <= out.size() && pos + 8 <= in.size()) {
        const std::uint64_t w = load_le<std::uint64_t>(in.data() + pos);
        const std::uint64_t t = ~w; // an escape byte 0xFF becomes a zero byte
        if (((t - 0x0101010101010101ull) & ~t & 0x8080808080808080ull) == 0) {
          bool wrapped = false;
          for (std::size_t j = 0; j < 8; ++j) {
            const std::uint64_t next = prev + ((w >> (8 * j)) & 0xFF) + 1;
            wrapped |= next <= prev;
            out[k + j] = prev = next;
          }
          if (DCR_UNLIKELY(wrapped || prev >= numel))
            return detail::range_error(out.first(k + 8), numel, wrapped);
          k += 8;
          pos += 8;
          continue;
        }
      }
      const std::size_t at = pos;
      DCR_RETURN_ERROR_IF(pos >= in.size(), bad_location,
                          "escape_u8 locations end before location " + std::to_string(k));
      std::uint64_t g = p[pos++];
      if (g == 255) {
        std::uint64_t extra;
        DCR_RETURN_ERROR_IF(!detail::get_varint(in, pos, extra) || extra > ~std::uint64_t{0} - 255,
                            bad_location,
                            "malformed escape for location " + std::to_string(k) + " at byte " +
                                std::to_string(at));
        g += extra;
      }
      const std::uint64_t next = prev + g + 1;
      DCR_RETURN_ERROR_IF(next <= prev || next >= numel, index_out_of_range,
                          "location " + std::to_string(k) + " (byte " + std::to_string(at) +
                              ") leaves [0, " + std::to_string(numel) + ")");
      out[k++] = prev = next;
    }
    if (pos != in.size()) return detail::length_error(name, in.size(), pos);
    return status::success();
  }
};
static_assert(location_coding<escape_u8>);

/// Call `f(Coding{})` with the policy for a runtime id. Precondition: known id.
template <class F>
decltype(auto) visit_location(location_id id, F&& f) {
  switch (id) {
  case location_id::run:
    return f(run{});
  case location_id::gap_u8:
    return f(gap_u8{});
  case location_id::gap_u16:
    return f(gap_u16{});
  case location_id::gap_u32:
    return f(gap_u32{});
  case location_id::gap_u64:
    return f(gap_u64{});
  case location_id::planes_u16:
    return f(planes_u16{});
  case location_id::planes_u32:
    return f(planes_u32{});
  case location_id::planes_u64:
    return f(planes_u64{});
  case location_id::varint:
    return f(varint_gaps{});
  case location_id::escape_u8:
    return f(escape_u8{});
  }
  DCR_UNREACHABLE();
  return f(run{});
}

/// Family the encoder picks from for scattered items; each item then gets
/// `run` when contiguous, else the family's member for its largest gap.
enum class location_scheme : std::uint8_t {
  gaps,      ///< gap_u8/u16/u32/u64: the smallest word holding the largest gap
  planes,    ///< as `gaps`, byte-plane split when the word is wider than u8
  varint,    ///< LEB128 gaps
  escape_u8, ///< u8 gaps with escapes
};

constexpr std::string_view to_string(location_scheme s) noexcept {
  switch (s) {
  case location_scheme::gaps:
    return "gaps";
  case location_scheme::planes:
    return "planes";
  case location_scheme::varint:
    return "varint";
  case location_scheme::escape_u8:
    return "escape_u8";
  }
  return "unknown";
}

/// The coding the encoder uses for strictly increasing `idx` under `scheme`.
inline location_id choose_location(std::span<const std::uint64_t> idx,
                                   location_scheme scheme) noexcept {
  if (run::can_encode(idx)) return location_id::run;
  if (scheme == location_scheme::varint) return location_id::varint;
  if (scheme == location_scheme::escape_u8) return location_id::escape_u8;
  const std::uint64_t g = detail::max_gap(idx);
  const bool planes = scheme == location_scheme::planes;
  if (g <= 0xFF) return location_id::gap_u8;
  if (g <= 0xFFFF) return planes ? location_id::planes_u16 : location_id::gap_u16;
  if (g <= 0xFFFFFFFFu) return planes ? location_id::planes_u32 : location_id::gap_u32;
  return planes ? location_id::planes_u64 : location_id::gap_u64;
}

/// Append the coding `id` of `idx` to `out`. Precondition: the policy can encode `idx`.
inline void encode_locations(location_id id, std::span<const std::uint64_t> idx,
                             std::vector<std::byte>& out) {
  visit_location(id, [&](auto c) { decltype(c)::encode(idx, out); });
}

/// Decode `out.size() >= 1` indices; validates everything (see `location_coding`).
inline status decode_locations(location_id id, std::span<const std::byte> in, std::uint64_t first,
                               std::uint64_t numel, std::span<std::uint64_t> out) {
  return visit_location(id, [&](auto c) { return decltype(c)::decode(in, first, numel, out); });
}

/// Location policies: which codings an encoder or decoder instantiates.
/// `p(idx, out)` appends the coding of one item's strictly increasing `idx`
/// to `out` and returns its id; `P::decode(id, in, first, numel, out)`
/// decodes an item's locations coded as `id` (see `location_coding`).
///
/// `by_scheme`: the coding `choose_location` picks under a runtime scheme,
/// and every coding on decode (the general path: one switch per item).
struct by_scheme {
  location_scheme scheme = location_scheme::escape_u8;
  location_id operator()(std::span<const std::uint64_t> idx, std::vector<std::byte>& out) const {
    const location_id id = choose_location(idx, scheme);
    encode_locations(id, idx, out);
    return id;
  }
  static status decode(location_id id, std::span<const std::byte> in, std::uint64_t first,
                       std::uint64_t numel, std::span<std::uint64_t> out) {
    return decode_locations(id, in, first, numel, out);
  }
};

/// `run_or<C>`: `run` for a contiguous item, else coding `C`; only these two
/// are instantiated, and decoding refuses any other coding (`bad_location`).
/// `run_or<escape_u8>` and `run_or<varint_gaps>` encode exactly what
/// `by_scheme` does under `escape_u8` and `varint`.
template <location_coding C>
struct run_or {
  location_id operator()(std::span<const std::uint64_t> idx, std::vector<std::byte>& out) const {
    if (run::can_encode(idx)) return location_id::run;
    C::encode(idx, out);
    return C::id;
  }
  static status decode(location_id id, std::span<const std::byte> in, std::uint64_t first,
                       std::uint64_t numel, std::span<std::uint64_t> out) {
    if (id == location_id::run) return run::decode(in, first, numel, out);
    if (id == C::id) return C::decode(in, first, numel, out);
    return fail(errc::bad_location, std::string(to_string(id)) +
                                        " locations, this pipeline decodes run and " +
                                        std::string(C::name) + " only");
  }
};

/// A location policy (see `by_scheme`).
template <class L>
concept location_policy = requires(const L& l, std::span<const std::uint64_t> idx,
                                   std::vector<std::byte>& out, std::span<const std::byte> in,
                                   std::uint64_t v, std::span<std::uint64_t> dst) {
  { l(idx, out) } -> std::same_as<location_id>;
  { L::decode(location_id::run, in, v, v, dst) } -> std::same_as<status>;
};
static_assert(location_policy<by_scheme> && location_policy<run_or<escape_u8>>);

} // namespace dcr::codec
