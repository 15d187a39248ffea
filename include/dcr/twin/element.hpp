#pragma once
/// \file
/// Vocabulary: `twin/` (namespace `dcr::twin`) holds the host twins of the GPU
/// kernels in `cuda/dcr/gpu/` (namespace `dcr::gpu`) and the element-level code
/// both share; a twin has its kernel's semantics, checks and errors, runs in
/// CI, and the GPU tests compare the two.
///
/// Element-level pieces shared by the CUDA kernels (`cuda/dcr/gpu/*.cuh`) and
/// their host twins (`dcr/twin/*.hpp`): a plain layout with C arrays (usable
/// in kernels without relaxed-constexpr), the word operations, and the gap
/// location decode. Everything here is `constexpr DCR_HOST_DEVICE`,
/// allocation-free and exception-free, so a kernel and its twin run the same
/// code per element. Includes only core headers (config, dtype, endian,
/// word_delta).

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "dcr/codec/locations.hpp"
#include "dcr/core/config.hpp"
#include "dcr/core/dtype.hpp"
#include "dcr/core/endian.hpp"
#include "dcr/core/word_delta.hpp"

namespace dcr::twin {

/// Largest rank of a device layout; equals `dcr::max_rank` (checked in view.hpp).
inline constexpr int layout_max_rank = 6;

/// Extents and strides in elements, like `dcr::strided_layout`, but trivially
/// copyable with C arrays so it can be a kernel parameter. `contiguous` caches
/// the row-major-contiguous test so that the common case maps `k -> k` without
/// 64-bit divisions.
struct layout {
  int rank = 0;
  bool contiguous = true;
  std::int64_t extents[layout_max_rank] = {};
  std::int64_t strides[layout_max_rank] = {};

  /// Number of coordinates (1 for rank 0).
  constexpr DCR_HOST_DEVICE std::int64_t size() const noexcept {
    std::int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= extents[i];
    return n;
  }
  /// Element offset of the `k`-th coordinate in row-major order of the
  /// layout's own extents (0 <= k < size()). The contract is the one of
  /// `strided_layout::offset_of_linear`.
  constexpr DCR_HOST_DEVICE std::int64_t offset_of_linear(std::int64_t k) const noexcept {
    if (contiguous) return k;
    std::int64_t o = 0;
    for (int i = rank; i-- > 0;) {
      const std::int64_t e = extents[i];
      const std::int64_t q = k / e;
      o += (k - q * e) * strides[i];
      k = q;
    }
    return o;
  }
  /// Smallest number of elements the storage must hold (0 when empty).
  constexpr DCR_HOST_DEVICE std::int64_t required_span_size() const noexcept {
    std::int64_t hi = 0;
    for (int i = 0; i < rank; ++i) {
      if (extents[i] == 0) return 0;
      hi += (extents[i] - 1) * strides[i];
    }
    return hi + 1;
  }
  /// True when every extent is >= 0 and every stride >= 0.
  constexpr DCR_HOST_DEVICE bool is_non_negative() const noexcept {
    if (rank < 0 || rank > layout_max_rank) return false;
    for (int i = 0; i < rank; ++i)
      if (extents[i] < 0 || strides[i] < 0) return false;
    return true;
  }
  /// True when distinct coordinates have distinct offsets (same sufficient
  /// test as `strided_layout::is_unique`). Required of every destination:
  /// XOR through an aliasing view cancels itself, and racing writes are
  /// unordered.
  constexpr DCR_HOST_DEVICE bool is_unique() const noexcept {
    int order[layout_max_rank] = {};
    int n = 0;
    for (int i = 0; i < rank; ++i) {
      if (extents[i] == 0) return true;
      if (strides[i] < 0) return false;
      if (extents[i] > 1) order[n++] = i;
    }
    for (int a = 1; a < n; ++a)
      for (int b = a; b > 0 && strides[order[b]] < strides[order[b - 1]]; --b) {
        const int t = order[b];
        order[b] = order[b - 1];
        order[b - 1] = t;
      }
    std::int64_t span = 1;
    for (int a = 0; a < n; ++a) {
      const int d = order[a];
      if (strides[d] < span) return false;
      span = strides[d] * (extents[d] - 1) + span;
    }
    return true;
  }
  /// True when the strides are exactly row-major for the extents.
  constexpr DCR_HOST_DEVICE bool is_row_major() const noexcept {
    std::int64_t s = 1;
    for (int i = rank; i-- > 0;) {
      if (extents[i] != 1 && strides[i] != s) return false;
      s *= extents[i];
    }
    return true;
  }
  /// True when both layouts have the same rank and extents (strides may differ).
  constexpr DCR_HOST_DEVICE bool same_extents(const layout& o) const noexcept {
    if (rank != o.rank) return false;
    for (int i = 0; i < rank; ++i)
      if (extents[i] != o.extents[i]) return false;
    return true;
  }
};

/// Row-major layout of `extents[0..rank)`; `rank` must be <= layout_max_rank.
constexpr DCR_HOST_DEVICE layout row_major(const std::int64_t* extents, int rank) noexcept {
  layout l;
  l.rank = rank;
  std::int64_t s = 1;
  for (int i = rank; i-- > 0;) {
    l.extents[i] = extents[i];
    l.strides[i] = s;
    s *= extents[i];
  }
  l.contiguous = true;
  return l;
}

/// Layout with the given extents and strides; `contiguous` is computed.
constexpr DCR_HOST_DEVICE layout strided(const std::int64_t* extents, const std::int64_t* strides,
                                         int rank) noexcept {
  layout l;
  l.rank = rank;
  for (int i = 0; i < rank; ++i) {
    l.extents[i] = extents[i];
    l.strides[i] = strides[i];
  }
  l.contiguous = l.is_row_major();
  return l;
}

/// One-dimensional contiguous layout of `n` elements.
constexpr DCR_HOST_DEVICE layout linear(std::int64_t n) noexcept {
  layout l;
  l.rank = 1;
  l.extents[0] = n;
  l.strides[0] = 1;
  l.contiguous = true;
  return l;
}

/// Words plus a layout; the memory may be host or device memory.
template <class W>
struct view {
  W* data = nullptr;
  layout shape;

  constexpr DCR_HOST_DEVICE std::int64_t size() const noexcept { return shape.size(); }
  /// Element at row-major linear coordinate `k`.
  constexpr DCR_HOST_DEVICE W& at(std::int64_t k) const noexcept {
    return data[shape.offset_of_linear(k)];
  }
};

/// A stored word of 1, 2, 4 or 8 bytes.
template <class W>
concept word = std::is_same_v<W, std::uint8_t> || std::is_same_v<W, std::uint16_t> ||
    std::is_same_v<W, std::uint32_t> || std::is_same_v<W, std::uint64_t>;

/// How a scattered value lands, as a runtime value for the entry points that
/// take one. Numeric values equal `dcr::value_encoding`; the loops themselves
/// (kernels and twins) are templates on the codec's encoding types
/// (`codec::xor_mask`, `codec::overwrite`, `codec::add`) and run `E::apply`.
enum class scatter_op : std::uint8_t {
  xor_mask = 1,  ///< dst ^= value
  overwrite = 2, ///< dst = value
  add = 3,       ///< dst += unzigzag(value) mod 2^w (`dcr::apply_zigzag_delta`)
};

/// How a copy from a source view into a destination view lands (the three
/// modes of the intercepting copy sink, plus the explicit-mask overwrite).
enum class copy_mode : std::uint8_t {
  dense = 0,          ///< dst = src
  xor_mask = 1,       ///< dst ^= src
  overwrite = 2,      ///< dst = src where src != placeholder
  overwrite_mask = 3, ///< dst = src where mask != 0 (NaN-valued items)
  overwrite_nan = 4, ///< dst = src where src is not a NaN of the dtype (any NaN is the placeholder)
  add = 5,           ///< dst += unzigzag(src) mod 2^w (add items; 0 at inactive positions)
};

/// NaN test of a dtype as two masks: a word is NaN when all `exponent` bits
/// are set and some `mantissa` bit is set. For f8e4m3fn (NaN only at
/// S.1111.111) both masks are 0x7F, which states exactly that.
struct nan_rule {
  std::uint64_t exponent = 0;
  std::uint64_t mantissa = 0;
};

/// NaN rule of a dtype (an unknown id gives a rule that matches nothing).
constexpr DCR_HOST_DEVICE nan_rule nan_rule_of(dtype_id id) noexcept {
  switch (id) {
  case dtype_id::bf16:
    return {dtype_traits<bf16>::exponent_mask, dtype_traits<bf16>::mantissa_mask};
  case dtype_id::f16:
    return {dtype_traits<f16>::exponent_mask, dtype_traits<f16>::mantissa_mask};
  case dtype_id::f32:
    return {dtype_traits<f32>::exponent_mask, dtype_traits<f32>::mantissa_mask};
  case dtype_id::f8e4m3fn:
    return {0x7F, 0x7F};
  case dtype_id::f8e5m2:
    return {dtype_traits<f8e5m2>::exponent_mask, dtype_traits<f8e5m2>::mantissa_mask};
  }
  return {0, 0};
}

/// True when `w` is NaN under `r`.
template <class W>
constexpr DCR_HOST_DEVICE bool is_nan_by(W w, nan_rule r) noexcept {
  const auto v = static_cast<std::uint64_t>(w);
  return r.mantissa != 0 && (v & r.exponent) == r.exponent && (v & r.mantissa) != 0;
}

/// Result of scattering `value` onto resident word `dst` (the runtime form of
/// `E::apply`, for checks that iterate over the ops).
template <word W>
constexpr DCR_HOST_DEVICE W scatter_word(W dst, W value, scatter_op op) noexcept {
  switch (op) {
  case scatter_op::xor_mask:
    return static_cast<W>(dst ^ value);
  case scatter_op::add:
    return apply_zigzag_delta(dst, value);
  default:
    return value;
  }
}

/// Width in bytes of gap words (1, 2, 4 or 8); anything else is not a width.
constexpr DCR_HOST_DEVICE bool is_gap_width(unsigned width) noexcept {
  return width == 1 || width == 2 || width == 4 || width == 8;
}

/// The `j`-th little-endian gap word of `width` bytes. Assembled from bytes:
/// the gap buffer is a slice of the location buffer and carries no alignment.
constexpr DCR_HOST_DEVICE std::uint64_t load_gap(const std::uint8_t* gaps, unsigned width,
                                                 std::uint64_t j) noexcept {
  return load_le_width(gaps + j * width, width);
}

/// Term `k` of the inclusive scan that yields locations from gaps:
/// `first` for k = 0, else `gap_{k-1} + 1`, so that
/// `index_k = index_{k-1} + gap_k + 1` (the shared gap semantics; the k-th
/// record uses the (k-1)-th stored gap word).
constexpr DCR_HOST_DEVICE std::uint64_t gap_scan_term(std::uint64_t first, const std::uint8_t* gaps,
                                                      unsigned width, std::uint64_t k) noexcept {
  return k == 0 ? first : load_gap(gaps, width, k - 1) + 1;
}

/// Smallest gap width (1, 2, 4 or 8) that holds `max_gap`.
constexpr DCR_HOST_DEVICE unsigned gap_width_for(std::uint64_t max_gap) noexcept {
  return max_gap <= 0xFFu ? 1u : max_gap <= 0xFFFFu ? 2u : max_gap <= 0xFFFFFFFFu ? 4u : 8u;
}

/// "No failure" marker of the location checks below.
inline constexpr std::uint64_t no_failure = ~std::uint64_t{0};

/// Check of record `k` of a location list: returns 0 when fine, 1 when
/// `loc[k] >= size` (out of range), 2 when `k > 0 && loc[k] <= loc[k-1]`
/// (not strictly increasing; also catches a wrapped 64-bit sum).
constexpr DCR_HOST_DEVICE int check_location(const std::uint64_t* loc, std::uint64_t k,
                                             std::uint64_t size) noexcept {
  if (k > 0 && loc[k] <= loc[k - 1]) return 2;
  if (loc[k] >= size) return 1;
  return 0;
}

// ---------------------------------------------------------------------------
// Location codings of the wire format (docs/wire-format.md 4.3) read from the
// raw, decompressed location bytes of one item. The reference decoder is
// `codec/locations.hpp`; these pieces let a kernel read every coding in
// parallel phases: find where each value ends, give each end its value
// number by a scan, assemble each value from at most 10 bytes, prefix-sum
// `gap + 1` into indices, and check every index. The twin runs the same
// functions in the same phases.

/// How the gaps of a location coding are laid out (`run` has no bytes).
enum class gap_form : std::uint8_t {
  words = 0,  ///< little-endian gap words of `width` bytes
  planes = 1, ///< gap words split into byte planes, high plane first
  varint = 2, ///< minimal LEB128 per gap
  escape = 3, ///< a byte per gap < 255; the byte 255 then minimal LEB128 of `gap - 255`
};

/// True for the forms whose values have varying byte lengths.
constexpr DCR_HOST_DEVICE bool is_variable(gap_form f) noexcept {
  return f == gap_form::varint || f == gap_form::escape;
}

/// Word `j` of `width` bytes stored as byte planes of `m` words: byte `b`
/// (0 = least significant) of word `j` is at plane `width - 1 - b`, i.e. at
/// `(width - 1 - b) * m + j`. Also the layout of `byte_planes` values.
constexpr DCR_HOST_DEVICE std::uint64_t load_plane_word(const std::uint8_t* planes, unsigned width,
                                                        std::uint64_t m, std::uint64_t j) noexcept {
  std::uint64_t g = 0;
  for (unsigned p = 0; p < width; ++p) g = (g << 8) | planes[p * m + j];
  return g;
}

/// Most bytes of a LEB128 value that holds 64 bits.
inline constexpr std::uint64_t leb128_max_bytes = 10;

/// True when the `len` LEB128 bytes at `p` (continuation bytes, then a
/// terminator below 0x80 at `p[len-1]`) are rejected by the reference
/// reader: more than 10 bytes, a 10th byte other than 0x01 (bits beyond
/// 64), or a trailing 0x00 after the first byte (not minimal).
constexpr DCR_HOST_DEVICE bool leb128_malformed(const std::uint8_t* p, std::uint64_t len) noexcept {
  const std::uint8_t last = p[len - 1];
  return len > leb128_max_bytes || (len == leb128_max_bytes && last != 1) || (len > 1 && last == 0);
}

/// Value of the `len` LEB128 bytes at `p` (only the first 10 are read; a
/// longer value is malformed anyway).
constexpr DCR_HOST_DEVICE std::uint64_t leb128_value(const std::uint8_t* p,
                                                     std::uint64_t len) noexcept {
  std::uint64_t v = 0;
  const std::uint64_t n = len < leb128_max_bytes ? len : leb128_max_bytes;
  for (std::uint64_t i = 0; i < n; ++i) v |= static_cast<std::uint64_t>(p[i] & 0x7F) << (7 * i);
  return v;
}

/// State of the escape_u8 reader before a byte: at the start of a value, or
/// inside the LEB128 that follows an escape byte 0xFF. The role of a byte
/// depends on it (0xFF starts an escape at a value start but is a
/// continuation byte inside one), so a kernel resolves states with a scan
/// over per-byte transition maps.
enum : std::uint8_t { escape_at_start = 0, escape_inside = 1 };

/// A map {start, inside} -> {start, inside}: bit `s` is the image of state `s`.
using escape_map = std::uint8_t;

/// The map that changes nothing (the scan's initial value).
inline constexpr escape_map escape_identity = 0b10;

/// Transition map of byte `b`.
constexpr DCR_HOST_DEVICE escape_map escape_step(std::uint8_t b) noexcept {
  const unsigned from_start = b == 0xFF ? escape_inside : escape_at_start;
  const unsigned from_inside = b >= 0x80 ? escape_inside : escape_at_start;
  return static_cast<escape_map>(from_start | (from_inside << 1));
}

/// Image of state `s` under `m`.
constexpr DCR_HOST_DEVICE std::uint8_t escape_apply(escape_map m, std::uint8_t s) noexcept {
  return static_cast<std::uint8_t>((m >> s) & 1u);
}

/// `a` then `b` (associative: composition of functions), the scan operator.
constexpr DCR_HOST_DEVICE escape_map escape_then(escape_map a, escape_map b) noexcept {
  return static_cast<escape_map>(escape_apply(b, escape_apply(a, 0)) |
                                 (escape_apply(b, escape_apply(a, 1)) << 1));
}

/// True when byte `b`, read in state `state` (ignored by varint), is the last
/// byte of a value of form `f` (`varint` or `escape`).
constexpr DCR_HOST_DEVICE bool ends_value(gap_form f, std::uint8_t b, std::uint8_t state) noexcept {
  if (f == gap_form::varint || state == escape_inside) return b < 0x80;
  return b != 0xFF;
}

/// Gap layout of the codec's location type `Coding` (every coding that has
/// bytes, i.e. all but `codec::run`): the form and the word width of
/// `words` / `planes` (1 for the variable-length forms). The kernels and the
/// twin are templates on the codec's types; this is all they read of them.
template <class Coding>
struct gap_layout;
template <class W>
struct gap_layout<codec::gap_words<W>> {
  static constexpr gap_form form = gap_form::words;
  static constexpr unsigned width = sizeof(W);
};
template <class W>
struct gap_layout<codec::gap_planes<W>> {
  static constexpr gap_form form = gap_form::planes;
  static constexpr unsigned width = sizeof(W);
};
template <>
struct gap_layout<codec::varint_gaps> {
  static constexpr gap_form form = gap_form::varint;
  static constexpr unsigned width = 1;
};
template <>
struct gap_layout<codec::escape_u8> {
  static constexpr gap_form form = gap_form::escape;
  static constexpr unsigned width = 1;
};

/// A location coding of the codec whose gaps are stored as bytes (all but `run`).
template <class Coding>
concept gap_coding = codec::location_coding<Coding> && requires {
  { gap_layout<Coding>::form } -> std::convertible_to<gap_form>;
};
static_assert(gap_coding<codec::gap_u8> && gap_coding<codec::planes_u64> &&
              gap_coding<codec::varint_gaps> && gap_coding<codec::escape_u8> &&
              !gap_coding<codec::run>);

/// The location bytes of one item of coding `Coding`, as the phases read
/// them. `ends[j]` is the byte that ends value `j` (written for
/// `j < values` by the end scan), `*present` the number of values the bytes
/// hold (complete or not; only the first `values` have an entry in `ends`).
/// Fixed-width forms use neither.
template <gap_coding Coding>
struct coded_gaps {
  static constexpr gap_form form = gap_layout<Coding>::form;
  static constexpr unsigned width = gap_layout<Coding>::width; ///< of `words` / `planes`
  static constexpr bool variable = is_variable(form);
  const std::uint8_t* bytes = nullptr; ///< the location bytes
  std::uint64_t size = 0;              ///< their number
  std::uint64_t values = 0;            ///< gaps the item needs: count - 1
  const std::uint64_t* ends = nullptr;
  const std::uint64_t* present = nullptr;
};

/// First byte of variable-length value `j` (requires `j <= *present`).
template <class Coding>
constexpr DCR_HOST_DEVICE std::uint64_t value_start(const coded_gaps<Coding>& c,
                                                    std::uint64_t j) noexcept {
  return j == 0 ? 0 : c.ends[j - 1] + 1;
}

/// True when `j` is a complete value inside the bytes.
template <class Coding>
constexpr DCR_HOST_DEVICE bool value_present(const coded_gaps<Coding>& c,
                                             std::uint64_t j) noexcept {
  if constexpr (coded_gaps<Coding>::variable)
    return j < *c.present;
  else
    return true;
}

/// Gap `j` (0 <= j < values). A missing or malformed value gives an
/// arbitrary gap; the check below reports it before the gap can matter.
template <class Coding>
constexpr DCR_HOST_DEVICE std::uint64_t coded_gap(const coded_gaps<Coding>& c,
                                                  std::uint64_t j) noexcept {
  constexpr gap_form form = coded_gaps<Coding>::form;
  constexpr unsigned width = coded_gaps<Coding>::width;
  if constexpr (form == gap_form::words) {
    return load_gap(c.bytes, width, j);
  } else if constexpr (form == gap_form::planes) {
    return load_plane_word(c.bytes, width, c.values, j);
  } else {
    if (!value_present(c, j)) return 0;
    const std::uint64_t s = value_start(c, j), e = c.ends[j];
    if constexpr (form == gap_form::varint) {
      return leb128_value(c.bytes + s, e - s + 1);
    } else {
      if (c.bytes[s] != 0xFF) return c.bytes[s];
      return 255 + leb128_value(c.bytes + s + 1, e - s);
    }
  }
}

/// Term `k` of the inclusive scan that yields the indices: `first` for
/// k = 0, else `gap_{k-1} + 1` (wrapping; a wrap is reported by the check).
template <class Coding>
constexpr DCR_HOST_DEVICE std::uint64_t
coded_scan_term(const coded_gaps<Coding>& c, std::uint64_t first, std::uint64_t k) noexcept {
  return k == 0 ? first : coded_gap(c, k - 1) + 1;
}

/// Why location `k` of a coded list fails, smallest first (the reference
/// decoder reads values in order and reports the first of these it meets).
enum : unsigned {
  coded_ok = 0,
  coded_malformed = 1, ///< LEB128 or escape rejected, or a varint value cut off
  coded_truncated = 2, ///< escape_u8: the bytes end before the value starts
  coded_range = 3,     ///< index not above its predecessor (64-bit wrap) or >= numel
};

/// Failure of location `k` (1 <= k < values + 1) given the decoded indices
/// `idx` (whose entries up to `k` are the prefix sums of the terms).
template <class Coding>
constexpr DCR_HOST_DEVICE unsigned coded_fault(const coded_gaps<Coding>& c,
                                               const std::uint64_t* idx, std::uint64_t k,
                                               std::uint64_t numel) noexcept {
  constexpr gap_form form = coded_gaps<Coding>::form;
  const std::uint64_t j = k - 1;
  if constexpr (is_variable(form)) {
    if (!value_present(c, j)) {
      // Only the first missing value can be the first failure; later ones
      // have no `ends` entry to start from.
      if (j > *c.present) return coded_malformed;
      if (form == gap_form::escape && value_start(c, j) >= c.size) return coded_truncated;
      return coded_malformed;
    }
    const std::uint64_t s = value_start(c, j), e = c.ends[j];
    if constexpr (form == gap_form::varint) {
      if (leb128_malformed(c.bytes + s, e - s + 1)) return coded_malformed;
    } else if (c.bytes[s] == 0xFF) {
      if (leb128_malformed(c.bytes + s + 1, e - s) ||
          leb128_value(c.bytes + s + 1, e - s) > ~std::uint64_t{0} - 255)
        return coded_malformed;
    }
  }
  if (idx[k] <= idx[k - 1] || idx[k] >= numel) return coded_range;
  return coded_ok;
}

/// Key that orders failures by location, then by reason (`atomicMin` keeps the first).
constexpr DCR_HOST_DEVICE std::uint64_t fault_key(std::uint64_t k, unsigned reason) noexcept {
  return (k << 2) | reason;
}

/// Little-endian value word `k` of `n` words of `W` stored as plain words
/// (`planes` false) or as byte planes; read bytewise (the value buffer is a
/// slice of a body and carries no alignment).
template <word W>
constexpr DCR_HOST_DEVICE W load_value_word(const std::uint8_t* bytes, std::uint64_t n,
                                            std::uint64_t k, bool planes) noexcept {
  if (planes) return static_cast<W>(load_plane_word(bytes, sizeof(W), n, k));
  return static_cast<W>(load_gap(bytes, sizeof(W), k));
}

} // namespace dcr::twin
