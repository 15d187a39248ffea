#pragma once
/// \file
/// The safetensors format: parse and validate a header, serialise tensors
/// into an image. Pure functions over bytes (no files, no mmap); the mapped
/// file and the atomic writer are `io/safetensors.hpp`.
///
/// Format: an 8-byte little-endian header length N, N bytes of a UTF-8 JSON
/// object mapping tensor names to {"dtype", "shape", "data_offsets": [b, e]}
/// (offsets relative to the data section after the header) plus an optional
/// "__metadata__" object of strings, then the data section. Validation
/// follows the reference implementation: offsets must tile the data section
/// exactly (no overlap, no hole, no trailing bytes), each tensor's byte count
/// must equal numel × width. Every violation is `errc::bad_format` naming
/// the tensor; `errc::io` reports operating-system failures.
///
/// The header is parsed by dcr's one JSON reader (`core/json.hpp`, strict
/// RFC 8259), then walked; unknown members of an entry are ignored.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "dcr/core/dtype.hpp"
#include "dcr/core/endian.hpp"
#include "dcr/core/error.hpp"
#include "dcr/core/json.hpp"
#include "dcr/core/tensor.hpp"

namespace dcr::io {

/// Largest header accepted (the reference implementation's limit).
inline constexpr std::uint64_t safetensors_max_header = 100u << 20;

/// One tensor of a safetensors file: meta and byte range in the data section.
struct safetensors_entry {
  tensor_meta meta;
  std::uint64_t begin = 0, end = 0;
};

/// Parsed header: entries in header order, and the metadata strings.
struct safetensors_index {
  std::vector<safetensors_entry> entries;
  std::map<std::string, std::string> metadata;
  std::uint64_t data_offset = 0; ///< bytes before the data section (8 + N)
};

namespace detail {

/// A JSON array of non-negative integers (shape, data_offsets).
inline status uint_array(const json_value& v, const std::string& where,
                         std::vector<std::uint64_t>& out) {
  DCR_RETURN_ERROR_IF(!v.is_array(), bad_format, where + ": expected an array of integers");
  out.clear();
  for (auto& x : v.items) {
    std::uint64_t u = 0;
    if (x.type != json_value::kind::number || !x.as_u64(u)) {
      const bool negative = x.type == json_value::kind::number && !x.text.empty() &&
                            x.text[0] == '-' && x.text.find_first_of(".eE") == std::string::npos;
      return fail(errc::bad_format,
                  where + ": " +
                      (negative ? std::string("a non-negative integer is required, got ")
                                : std::string("expected an integer, got ")) +
                      (x.type == json_value::kind::number ? x.text : std::string("a non-number")));
    }
    out.push_back(u);
  }
  return status::success();
}

/// Parse one tensor entry object.
inline status parse_entry(const json_value& v, const std::string& name, safetensors_entry& e) {
  auto bad = [&](const std::string& why) {
    return fail(errc::bad_format, "safetensors tensor " + name + ": " + why);
  };
  if (!v.is_object()) return bad("entry is not an object");
  e.meta.name = name;
  const json_value* dtype = v.get("dtype");
  const json_value* shape = v.get("shape");
  const json_value* offsets = v.get("data_offsets");
  if (!dtype || !shape || !offsets) return bad("entry lacks dtype, shape or data_offsets");
  if (!dtype->is_string()) return bad("dtype is not a string");
  auto id = from_safetensors_name(dtype->text);
  if (!id) return bad("unsupported dtype '" + dtype->text + "'");
  e.meta.dtype = *id;
  DCR_TRY(uint_array(*shape, "safetensors tensor " + name + " shape", e.meta.shape));
  std::vector<std::uint64_t> o;
  DCR_TRY(uint_array(*offsets, "safetensors tensor " + name + " data_offsets", o));
  if (o.size() != 2) return bad("data_offsets must hold two integers");
  e.begin = o[0];
  e.end = o[1];
  if (e.meta.shape.size() > max_rank)
    return bad("rank " + std::to_string(e.meta.shape.size()) + " too large");
  return status::success();
}

} // namespace detail

/// Parse and validate the header of a safetensors image of `file_size` bytes
/// whose first bytes are `head` (at least the 8-byte length and the header).
inline status parse_safetensors_header(std::span<const std::byte> head, std::uint64_t file_size,
                                       safetensors_index& out) {
  out = {};
  DCR_RETURN_ERROR_IF(head.size() < 8 || file_size < 8, bad_format,
                      "safetensors: shorter than the 8-byte header length");
  const std::uint64_t n = load_le<std::uint64_t>(head.data());
  DCR_RETURN_ERROR_IF(n > safetensors_max_header, bad_format,
                      "safetensors: header length " + std::to_string(n) + " exceeds the limit");
  DCR_RETURN_ERROR_IF(n > file_size - 8 || n > head.size() - 8, bad_format,
                      "safetensors: header length " + std::to_string(n) + " exceeds the file");
  DCR_RETURN_ERROR_IF(n == 0, bad_format, "safetensors: empty header");
  std::string_view text(reinterpret_cast<const char*>(head.data() + 8),
                        static_cast<std::size_t>(n));
  DCR_RETURN_ERROR_IF(text[0] != '{', bad_format, "safetensors: header does not start with '{'");
  out.data_offset = 8 + n;
  const std::uint64_t data_size = file_size - out.data_offset;
  json_value doc;
  if (auto st = parse_json(text, doc, "safetensors: header JSON"); !st) {
    // The reader's own wording for a value followed by more bytes.
    if (st.message.find("trailing characters") != std::string::npos)
      st.message = "safetensors: bytes after the header object (" + st.message + ")";
    return st;
  }
  DCR_RETURN_ERROR_IF(!doc.is_object(), bad_format, "safetensors: header is not a JSON object");
  std::unordered_map<std::string_view, std::size_t> seen;
  bool have_meta = false;
  for (auto& [key, value] : doc.members) {
    if (key == "__metadata__") {
      DCR_RETURN_ERROR_IF(have_meta, bad_format, "safetensors: __metadata__ given twice");
      have_meta = true;
      DCR_RETURN_ERROR_IF(!value.is_object(), bad_format,
                          "safetensors: __metadata__ is not an object");
      for (auto& [k, v] : value.members) {
        DCR_RETURN_ERROR_IF(!v.is_string(), bad_format,
                            "safetensors: __metadata__ value is not a string (key '" + k + "')");
        out.metadata[k] = v.text;
      }
      continue;
    }
    DCR_RETURN_ERROR_IF(!seen.emplace(key, out.entries.size()).second, bad_format,
                        "safetensors tensor " + key + ": listed twice");
    safetensors_entry e;
    DCR_TRY(detail::parse_entry(value, key, e));
    out.entries.push_back(std::move(e));
  }
  // Byte counts, then the tiling of the data section.
  for (auto& e : out.entries) {
    std::uint64_t numel = 1;
    for (auto d : e.meta.shape) {
      DCR_RETURN_ERROR_IF(d != 0 && numel > UINT64_MAX / d, bad_format,
                          "safetensors tensor " + e.meta.name + ": shape overflows");
      numel *= d;
    }
    const auto w = width_of(e.meta.dtype);
    DCR_RETURN_ERROR_IF(numel > UINT64_MAX / w, bad_format,
                        "safetensors tensor " + e.meta.name + ": shape overflows");
    DCR_RETURN_ERROR_IF(e.begin > e.end, bad_format,
                        "safetensors tensor " + e.meta.name +
                            ": data_offsets end before they begin");
    DCR_RETURN_ERROR_IF(e.end > data_size, bad_format,
                        "safetensors tensor " + e.meta.name + ": data_offsets end " +
                            std::to_string(e.end) + " beyond the data section of " +
                            std::to_string(data_size) + " bytes");
    DCR_RETURN_ERROR_IF(e.end - e.begin != numel * w, bad_format,
                        "safetensors tensor " + e.meta.name + ": shape needs " +
                            std::to_string(numel * w) + " bytes, data_offsets give " +
                            std::to_string(e.end - e.begin));
  }
  std::vector<std::size_t> order(out.entries.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    auto& x = out.entries[a];
    auto& y = out.entries[b];
    return x.begin != y.begin ? x.begin < y.begin : x.end < y.end;
  });
  std::uint64_t at = 0;
  const safetensors_entry* prev = nullptr;
  for (auto i : order) {
    auto& e = out.entries[i];
    DCR_RETURN_ERROR_IF(e.begin < at, bad_format,
                        "safetensors tensors " + (prev ? prev->meta.name : std::string("?")) +
                            " and " + e.meta.name + " overlap");
    DCR_RETURN_ERROR_IF(e.begin > at, bad_format,
                        "safetensors tensor " + e.meta.name + ": hole of " +
                            std::to_string(e.begin - at) + " bytes before it");
    at = e.end;
    prev = &e;
  }
  DCR_RETURN_ERROR_IF(at != data_size, bad_format,
                      "safetensors: " + std::to_string(data_size - at) +
                          " bytes after the last tensor");
  return status::success();
}

/// Serialise tensors (and optional metadata) into a safetensors image. The
/// header is padded with spaces to a multiple of 8 bytes, as the reference
/// writer does, so data starts 8-aligned. Throws `invalid_argument` for a
/// duplicate name or a view that is not row-major contiguous.
inline std::vector<std::byte>
encode_safetensors(std::span<const tensor_meta> metas,
                   std::span<const std::span<const std::byte>> data,
                   const std::map<std::string, std::string>& metadata = {}) {
  if (metas.size() != data.size())
    throw error(errc::invalid_argument, "encode_safetensors: metas/data size differ");
  std::string h = "{";
  bool first = true;
  if (!metadata.empty()) {
    h += "\"__metadata__\":{";
    bool f2 = true;
    for (auto& [k, v] : metadata) {
      if (!f2) h += ',';
      f2 = false;
      json_escape(k, h);
      h += ':';
      json_escape(v, h);
    }
    h += '}';
    first = false;
  }
  std::uint64_t off = 0;
  std::unordered_map<std::string, int> names;
  for (std::size_t i = 0; i < metas.size(); ++i) {
    auto& m = metas[i];
    if (!names.emplace(m.name, 0).second)
      throw error(errc::invalid_argument, "encode_safetensors: duplicate " + m.name);
    if (m.name == "__metadata__")
      throw error(errc::invalid_argument, "encode_safetensors: reserved name");
    if (data[i].size() != m.nbytes())
      throw error(errc::invalid_argument, "encode_safetensors: " + m.name + " has " +
                                              std::to_string(data[i].size()) +
                                              " bytes, shape needs " + std::to_string(m.nbytes()));
    if (!first) h += ',';
    first = false;
    json_escape(m.name, h);
    h += ":{\"dtype\":\"" + std::string(info(m.dtype)->safetensors_name) + "\",\"shape\":[";
    for (std::size_t d = 0; d < m.shape.size(); ++d)
      h += (d ? "," : "") + std::to_string(m.shape[d]);
    h += "],\"data_offsets\":[" + std::to_string(off) + "," + std::to_string(off + m.nbytes()) +
         "]}";
    off += m.nbytes();
  }
  h += '}';
  while ((8 + h.size()) % 8 != 0) h += ' ';
  std::vector<std::byte> out(8 + h.size() + off);
  const std::uint64_t n = h.size();
  for (int i = 0; i < 8; ++i)
    out[static_cast<std::size_t>(i)] = static_cast<std::byte>((n >> (8 * i)) & 0xFF);
  std::memcpy(out.data() + 8, h.data(), h.size());
  std::size_t at = 8 + h.size();
  for (auto& d : data) {
    if (!d.empty()) std::memcpy(out.data() + at, d.data(), d.size());
    at += d.size();
  }
  return out;
}

} // namespace dcr::io
