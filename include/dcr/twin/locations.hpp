#pragma once
/// \file
/// Vocabulary: `twin/` (namespace `dcr::twin`) holds the host twins of the GPU
/// kernels in `cuda/dcr/gpu/` (namespace `dcr::gpu`) and the element-level code
/// both share; a twin has its kernel's semantics, checks and errors, runs in
/// CI, and the GPU tests compare the two.
///
/// Host twin of the device location decode (`cuda/dcr/gpu/locations.cuh`):
/// an item's raw location bytes, in any coding of the wire format
/// (docs/wire-format.md 4.3), become its indices, and `scatter_encoded`
/// lands the item's value bytes at them. The twin runs the kernels' phases
/// in order over the element functions of `element.hpp`; its indices, error
/// codes and messages equal those of the reference decoder
/// `codec::decode_locations` (the unit suite checks this). Like the kernels,
/// the twin is a template on the codec's location type
/// (`decode_locations<codec::gap_u16>`); the runtime-id entries turn an item
/// row's `location_id` into its type once.
///
/// Phases of a variable-length coding (varint, escape_u8):
///  1. escape_u8 only: the reader state before every byte, by a scan over
///     per-byte transition maps (`escape_step`, `escape_then`);
///  2. the bytes that end a value (`ends_value`), numbered by an exclusive
///     scan: `ends[j]` is the last byte of value `j`, `present` the number
///     of values;
///  3. an inclusive scan of `coded_scan_term` gives the indices;
///  4. every location is checked (`coded_fault`) and the smallest
///     `fault_key` names the failure;
///  5. on the host: the failure's message (`describe_fault`, shared with the
///     kernels' entry), or the byte count check.
/// Fixed-width codings skip phases 1 and 2.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "dcr/codec/locations.hpp"
#include "dcr/codec/values.hpp"
#include "dcr/core/error.hpp"
#include "dcr/twin/check.hpp"
#include "dcr/twin/element.hpp"

namespace dcr::twin {

/// Fails with `bad_location` unless `id` is a coding of the wire format (the
/// runtime entries check this before turning `id` into its type).
inline status check_location_id(codec::location_id id) {
  DCR_RETURN_ERROR_IF(!codec::is_known_location(static_cast<std::uint8_t>(id)), bad_location,
                      "unknown location coding " + std::to_string(static_cast<unsigned>(id)));
  return status::success();
}

/// Checks answered from the sizes alone, before any decode work, in the
/// reference decoder's order, for coding `Coding` (a codec location type).
/// Sets `done` when they settle the result (a `run`, or a single index), so
/// that no device work is needed.
template <codec::location_coding Coding>
status precheck_locations(std::uint64_t size, std::uint64_t first, std::uint64_t numel,
                          std::uint64_t count, bool& done) {
  done = true;
  if (count == 0) return codec::detail::empty_output();
  // Indices are 64-bit words of device memory: a count this large cannot
  // be stored, and the fault key needs two spare bits.
  DCR_RETURN_ERROR_IF(count > (std::uint64_t{1} << 60), length_overflow,
                      "location count " + std::to_string(count) + " exceeds 2^60");
  const std::string name(codec::to_string(Coding::id));
  if constexpr (!gap_coding<Coding>) {
    if (size != 0) return codec::detail::length_error(name, size, 0);
    DCR_RETURN_ERROR_IF(first >= numel || count > numel - first, index_out_of_range,
                        "run [" + std::to_string(first) + ", +" + std::to_string(count) +
                            ") exceeds numel " + std::to_string(numel));
    return status::success();
  } else {
    constexpr gap_form form = gap_layout<Coding>::form;
    constexpr unsigned width = gap_layout<Coding>::width;
    const std::uint64_t gaps = count - 1;
    if constexpr (!is_variable(form)) {
      if (size / width != gaps || size % width != 0)
        return codec::detail::length_error(name, size, gaps * width);
      DCR_RETURN_ERROR_IF(first >= numel, index_out_of_range,
                          "location 0: index " + std::to_string(first) + " >= numel " +
                              std::to_string(numel));
    } else if constexpr (form == gap_form::escape) {
      DCR_RETURN_ERROR_IF(first >= numel, index_out_of_range,
                          "first index " + std::to_string(first) + " >= numel " +
                              std::to_string(numel));
    }
    if (gaps == 0) {
      // varint checks the byte count before the first index; the others did above.
      if (size != 0) return codec::detail::length_error(name, size, 0);
      DCR_RETURN_ERROR_IF(first >= numel, index_out_of_range,
                          "first index " + std::to_string(first) + " >= numel " +
                              std::to_string(numel));
      return status::success();
    }
    done = false;
    return status::success();
  }
}

/// `precheck_locations<Coding>` for a runtime id (an unknown id fails first).
inline status precheck_locations(codec::location_id id, std::uint64_t size, std::uint64_t first,
                                 std::uint64_t numel, std::uint64_t count, bool& done) {
  done = true;
  DCR_TRY(check_location_id(id));
  return codec::visit_location(id, [&](auto coding) {
    return precheck_locations<decltype(coding)>(size, first, numel, count, done);
  });
}

/// Message for a failure of the indices of a fixed-width coding, or of a
/// fast-path block of escape_u8 (the reference's `range_error`).
inline status block_range_error(std::uint64_t k, std::uint64_t prev, std::uint64_t cur,
                                std::uint64_t numel) {
  if (cur <= prev)
    return fail(errc::index_out_of_range, "location " + std::to_string(k) +
                                              " overflows 64 bits after index " +
                                              std::to_string(prev));
  return fail(errc::index_out_of_range, "location " + std::to_string(k) + ": index " +
                                            std::to_string(cur) + " >= numel " +
                                            std::to_string(numel));
}

/// Status for `key` (a `fault_key`, not `no_failure`), worded as the
/// reference decoder words it. What the message needs beyond the key is
/// fetched through `probe`, which the twin answers from host arrays and the
/// kernels' entry from device memory:
/// - `probe.index(k)`: decoded index k;
/// - `probe.end(j)`: `ends[j]` (last byte of variable-length value j);
/// - `probe.escapes_before(j)`: 1 + the last escape value before value j,
///   or 0 when none (an escape value is one longer than a byte).
/// The reference escape_u8 decoder reads runs of 8 plain bytes as one block
/// and then words a range failure like the fixed-width codings; the block
/// structure is recomputed here from the values' lengths, so the message
/// is the reference's exactly.
template <class Coding, class Probe>
status describe_fault(const coded_gaps<Coding>& c, std::uint64_t present, std::uint64_t key,
                      std::uint64_t numel, Probe&& probe) {
  constexpr gap_form form = coded_gaps<Coding>::form;
  const std::uint64_t k = key >> 2;
  if constexpr (!is_variable(form)) {
    return block_range_error(k, probe.index(k - 1), probe.index(k), numel);
  } else {
    const unsigned reason = static_cast<unsigned>(key & 3u);
    const std::uint64_t j = k - 1;
    const auto start = [&](std::uint64_t v) -> std::uint64_t {
      return v == 0 ? 0 : probe.end(v - 1) + 1;
    };
    const std::uint64_t at = start(j);
    if (reason == coded_truncated)
      return fail(errc::bad_location,
                  "escape_u8 locations end before location " + std::to_string(k));
    if (reason == coded_malformed)
      return fail(errc::bad_location,
                  std::string(form == gap_form::varint ? "malformed varint" : "malformed escape") +
                      " for location " + std::to_string(k) + " at byte " + std::to_string(at));
    if constexpr (form == gap_form::escape) {
      if (probe.end(j) == at) {
        // A plain value: inside a block of 8 when its run of plain values
        // (from just after the last escape) holds a whole block around it.
        const std::uint64_t a = probe.escapes_before(j);
        const std::uint64_t s = a + (j - a) / 8 * 8;
        const std::uint64_t avail = present < c.values ? present : c.values;
        if (s + 8 <= avail && probe.end(s + 7) - start(s) == 7)
          return block_range_error(k, probe.index(k - 1), probe.index(k), numel);
      }
    }
    return fail(errc::index_out_of_range, "location " + std::to_string(k) + " (byte " +
                                              std::to_string(at) + ") leaves [0, " +
                                              std::to_string(numel) + ")");
  }
}

/// Byte count check after every value decoded (variable-length codings):
/// the bytes must end with the last value.
template <class Coding>
status check_coded_length(const coded_gaps<Coding>& c, std::uint64_t used) {
  if (coded_gaps<Coding>::variable && used != c.size)
    return codec::detail::length_error(codec::to_string(Coding::id), c.size, used);
  return status::success();
}

/// Decode `count` indices of coding `Coding` (a codec location type) from
/// `bytes` with first index `first`, each `< numel`: the twin of
/// `dcr::gpu::decode_locations<Coding>`, equal to `Coding::decode` in
/// result, code and message. `out` is resized to `count`; unspecified on
/// failure.
template <codec::location_coding Coding>
status decode_locations(std::span<const std::uint8_t> bytes, std::uint64_t first,
                        std::uint64_t numel, std::uint64_t count, std::vector<std::uint64_t>& out) {
  bool done = false;
  DCR_TRY(precheck_locations<Coding>(bytes.size(), first, numel, count, done));
  out.resize(count);
  if constexpr (!gap_coding<Coding>) {
    for (std::uint64_t k = 0; k < count; ++k) out[k] = first + k;
    return status::success();
  } else {
    if (done) {
      for (std::uint64_t k = 0; k < count; ++k) out[k] = first + k;
      return status::success();
    }
    coded_gaps<Coding> c;
    c.bytes = bytes.data();
    c.size = bytes.size();
    c.values = count - 1;
    std::vector<std::uint64_t> ends;
    std::uint64_t present = 0, used = 0;
    if constexpr (coded_gaps<Coding>::variable) {
      // Phases 1 and 2: reader state before each byte, then value ends.
      ends.resize(c.values);
      escape_map m = escape_identity;
      for (std::uint64_t i = 0; i < c.size; ++i) {
        const std::uint8_t state = escape_apply(m, escape_at_start);
        m = escape_then(m, escape_step(bytes[i]));
        if (!ends_value(c.form, bytes[i], state)) continue;
        if (present < c.values) ends[present] = i;
        if (present + 1 == c.values) used = i + 1;
        ++present;
      }
      c.ends = ends.data();
      c.present = &present;
    }
    // Phase 3: indices.
    std::uint64_t acc = 0;
    for (std::uint64_t k = 0; k < count; ++k) out[k] = acc += coded_scan_term(c, first, k);
    // Phase 4: the first failing location (ascending k finds the smallest key).
    std::uint64_t key = no_failure;
    for (std::uint64_t k = 1; k < count && key == no_failure; ++k)
      if (const unsigned r = coded_fault(c, out.data(), k, numel); r != coded_ok)
        key = fault_key(k, r);
    if (key != no_failure) {
      struct {
        const std::vector<std::uint64_t>& idx;
        const coded_gaps<Coding>& c;
        std::uint64_t index(std::uint64_t k) const { return idx[k]; }
        std::uint64_t end(std::uint64_t j) const { return c.ends[j]; }
        std::uint64_t escapes_before(std::uint64_t j) const {
          for (std::uint64_t v = j; v-- > 0;)
            if (c.ends[v] != value_start(c, v)) return v + 1;
          return 0;
        }
      } probe{out, c};
      return describe_fault(c, present, key, numel, probe);
    }
    return check_coded_length(c, used);
  }
}

/// `decode_locations<Coding>` for the runtime coding `id` of an item row
/// (turned into its type once; an unknown id fails with `bad_location`).
/// Equal to `codec::decode_locations` in result, code and message.
inline status decode_locations(codec::location_id id, std::span<const std::uint8_t> bytes,
                               std::uint64_t first, std::uint64_t numel, std::uint64_t count,
                               std::vector<std::uint64_t>& out) {
  DCR_TRY(check_location_id(id));
  return codec::visit_location(id, [&](auto coding) {
    return decode_locations<decltype(coding)>(bytes, first, numel, count, out);
  });
}

/// Checks shared by `scatter_encoded` and its kernel entry, before decoding:
/// destination, value buffer and its length (`length_overflow`).
template <word W>
status check_encoded_args(const view<W>& dst, const void* values, std::uint64_t value_bytes,
                          std::uint64_t count) {
  DCR_TRY(check_destination_view(dst.shape, dst.data, "scatter destination"));
  DCR_RETURN_ERROR_IF(count > 0 && values == nullptr, invalid_argument, "scatter: null values");
  DCR_RETURN_ERROR_IF(count > UINT64_MAX / sizeof(W) || value_bytes != count * sizeof(W),
                      length_overflow,
                      std::to_string(value_bytes) + " value bytes for " + std::to_string(count) +
                          " records of " + std::to_string(sizeof(W)) + "-byte words");
  return status::success();
}

/// An item's records in their wire form onto `dst`: `count` locations of
/// coding `id` from `locations` with first index `first` (each checked
/// against `dst.size()` exactly as the reference decoder checks `numel`),
/// and `count` words of `W` in `values`, plain little-endian or byte planes
/// (`planes`). Count 0 is an empty item: success when it has no bytes. On
/// any failure nothing is written.
template <word W>
status scatter_encoded(view<W> dst, std::uint64_t first, std::uint64_t count, codec::location_id id,
                       std::span<const std::uint8_t> locations,
                       std::span<const std::uint8_t> values, bool planes,
                       scatter_op op = scatter_op::xor_mask) {
  DCR_TRY(check_encoded_args(dst, values.data(), values.size(), count));
  if (count == 0) {
    if (!locations.empty())
      return codec::detail::length_error(codec::to_string(id), locations.size(), 0);
    return status::success();
  }
  std::vector<std::uint64_t> loc;
  DCR_TRY(
      decode_locations(id, locations, first, static_cast<std::uint64_t>(dst.size()), count, loc));
  // The encoding becomes its type once; the loop runs `E::apply`, as the kernel does.
  codec::visit_encoding(static_cast<value_encoding>(op), [&](auto e) {
    using E = decltype(e);
    for (std::uint64_t k = 0; k < count; ++k) {
      W& d = dst.at(static_cast<std::int64_t>(loc[k]));
      d = E::apply(d, load_value_word<W>(values.data(), count, k, planes));
    }
  });
  return status::success();
}

} // namespace dcr::twin
