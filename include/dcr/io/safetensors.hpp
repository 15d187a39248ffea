#pragma once
/// \file
/// safetensors checkpoints: read (mmap, zero-copy views) and write.
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
/// The header is parsed by a small JSON reader for exactly this subset
/// (objects, arrays, strings with escapes, integers, and literals/floats that
/// are skipped): a header-only library cannot compile Boost.JSON's sources
/// into one translation unit, and this reader costs far less to compile.

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fcntl.h>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <unordered_map>
#include <utility>
#include <vector>

#include "dcr/core/dtype.hpp"
#include "dcr/core/endian.hpp"
#include "dcr/core/error.hpp"
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

/// Minimal JSON reader over the header bytes.
class json_reader {
public:
  explicit json_reader(std::string_view s) : s_(s) {}

  status fail_here(const std::string& what) const {
    return fail(errc::bad_format, "safetensors header JSON: " + what + " at byte " + std::to_string(pos_));
  }
  void ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }
  bool eat(char c) {
    ws();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool peek(char c) {
    ws();
    return pos_ < s_.size() && s_[pos_] == c;
  }
  bool at_end() {
    ws();
    return pos_ == s_.size();
  }

  status string(std::string& out) {
    out.clear();
    if (!eat('"')) return fail_here("expected a string");
    while (pos_ < s_.size()) {
      const char c = s_[pos_++];
      if (c == '"') return status::success();
      if (static_cast<unsigned char>(c) < 0x20) return fail_here("control character in string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= s_.size()) break;
      const char e = s_[pos_++];
      switch (e) {
      case '"': out += '"'; break;
      case '\\': out += '\\'; break;
      case '/': out += '/'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case 'u': {
        std::uint32_t cp = 0;
        DCR_TRY(hex4(cp));
        if (cp >= 0xD800 && cp < 0xDC00) { // surrogate pair
          std::uint32_t lo = 0;
          if (!(pos_ + 1 < s_.size() && s_[pos_] == '\\' && s_[pos_ + 1] == 'u')) return fail_here("lone surrogate");
          pos_ += 2;
          DCR_TRY(hex4(lo));
          if (lo < 0xDC00 || lo >= 0xE000) return fail_here("bad surrogate pair");
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        } else if (cp >= 0xDC00 && cp < 0xE000) {
          return fail_here("lone surrogate");
        }
        utf8(cp, out);
        break;
      }
      default: return fail_here("bad escape");
      }
    }
    return fail_here("unterminated string");
  }

  /// A non-negative integer that fits in 64 bits.
  status uint(std::uint64_t& v) {
    ws();
    const std::size_t start = pos_;
    v = 0;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
      const std::uint64_t d = static_cast<std::uint64_t>(s_[pos_] - '0');
      if (v > (UINT64_MAX - d) / 10) return fail_here("integer overflow");
      v = v * 10 + d;
      ++pos_;
    }
    if (pos_ == start) return fail_here("expected a non-negative integer");
    if (pos_ - start > 1 && s_[start] == '0') return fail_here("leading zero");
    if (pos_ < s_.size() && (s_[pos_] == '.' || s_[pos_] == 'e' || s_[pos_] == 'E'))
      return fail_here("expected an integer");
    return status::success();
  }

  /// Array of non-negative integers.
  status uint_array(std::vector<std::uint64_t>& out) {
    out.clear();
    if (!eat('[')) return fail_here("expected an array");
    if (eat(']')) return status::success();
    for (;;) {
      std::uint64_t v = 0;
      DCR_TRY(uint(v));
      out.push_back(v);
      if (eat(']')) return status::success();
      if (!eat(',')) return fail_here("expected ',' or ']'");
    }
  }

  /// Skip any JSON value (depth-limited).
  status skip(int depth = 0) {
    if (depth > 64) return fail_here("nesting too deep");
    ws();
    if (pos_ >= s_.size()) return fail_here("unexpected end");
    const char c = s_[pos_];
    if (c == '"') {
      std::string tmp;
      return string(tmp);
    }
    if (c == '{' || c == '[') {
      const char close = c == '{' ? '}' : ']';
      ++pos_;
      if (eat(close)) return status::success();
      for (;;) {
        if (c == '{') {
          std::string k;
          DCR_TRY(string(k));
          if (!eat(':')) return fail_here("expected ':'");
        }
        DCR_TRY(skip(depth + 1));
        if (eat(close)) return status::success();
        if (!eat(',')) return fail_here("expected ',' or closing bracket");
      }
    }
    for (std::string_view lit : {"true", "false", "null"})
      if (s_.substr(pos_, lit.size()) == lit) {
        pos_ += lit.size();
        return status::success();
      }
    const std::size_t start = pos_;
    if (s_[pos_] == '-') ++pos_;
    while (pos_ < s_.size() && std::strchr("0123456789.eE+-", s_[pos_]) && s_[pos_] != '\0') ++pos_;
    if (pos_ == start) return fail_here("unexpected character");
    return status::success();
  }

private:
  status hex4(std::uint32_t& v) {
    if (pos_ + 4 > s_.size()) return fail_here("short \\u escape");
    v = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = s_[pos_++];
      v <<= 4;
      if (h >= '0' && h <= '9') v |= static_cast<std::uint32_t>(h - '0');
      else if (h >= 'a' && h <= 'f') v |= static_cast<std::uint32_t>(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F') v |= static_cast<std::uint32_t>(h - 'A' + 10);
      else return fail_here("bad hex digit");
    }
    return status::success();
  }
  static void utf8(std::uint32_t cp, std::string& out) {
    if (cp < 0x80) out += static_cast<char>(cp);
    else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  std::string_view s_;
  std::size_t pos_ = 0;
};

inline void json_escape(std::string_view s, std::string& out) {
  out += '"';
  for (char ch : s) {
    const auto u = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (u < 0x20) {
      static constexpr char hex[] = "0123456789abcdef";
      out += "\\u00";
      out += hex[u >> 4];
      out += hex[u & 15];
    } else {
      out += ch;
    }
  }
  out += '"';
}


/// Parse one tensor entry object.
inline status parse_entry(json_reader& j, const std::string& name, safetensors_entry& e) {
  auto bad = [&](const std::string& why) { return fail(errc::bad_format, "safetensors tensor " + name + ": " + why); };
  if (!j.eat('{')) return bad("entry is not an object");
  bool have_dtype = false, have_shape = false, have_offsets = false;
  e.meta.name = name;
  if (!j.eat('}'))
    for (;;) {
      std::string key;
      DCR_TRY(j.string(key));
      if (!j.eat(':')) return j.fail_here("expected ':'");
      if (key == "dtype") {
        std::string d;
        DCR_TRY(j.string(d));
        auto id = from_safetensors_name(d);
        if (!id) return bad("unsupported dtype '" + d + "'");
        e.meta.dtype = *id;
        have_dtype = true;
      } else if (key == "shape") {
        DCR_TRY(j.uint_array(e.meta.shape));
        have_shape = true;
      } else if (key == "data_offsets") {
        std::vector<std::uint64_t> o;
        DCR_TRY(j.uint_array(o));
        if (o.size() != 2) return bad("data_offsets must hold two integers");
        e.begin = o[0];
        e.end = o[1];
        have_offsets = true;
      } else {
        DCR_TRY(j.skip());
      }
      if (j.eat('}')) break;
      if (!j.eat(',')) return j.fail_here("expected ',' or '}'");
    }
  if (!have_dtype || !have_shape || !have_offsets) return bad("entry lacks dtype, shape or data_offsets");
  if (e.meta.shape.size() > max_rank) return bad("rank " + std::to_string(e.meta.shape.size()) + " too large");
  return status::success();
}

} // namespace detail

/// Parse and validate the header of a safetensors image of `file_size` bytes
/// whose first bytes are `head` (at least the 8-byte length and the header).
inline status parse_safetensors_header(std::span<const std::byte> head, std::uint64_t file_size,
                                       safetensors_index& out) {
  out = {};
  DCR_RETURN_ERROR_IF(head.size() < 8 || file_size < 8, bad_format, "safetensors: shorter than the 8-byte header length");
  const std::uint64_t n = load_le<std::uint64_t>(head.data());
  DCR_RETURN_ERROR_IF(n > safetensors_max_header, bad_format,
                      "safetensors: header length " + std::to_string(n) + " exceeds the limit");
  DCR_RETURN_ERROR_IF(n > file_size - 8 || n > head.size() - 8, bad_format,
                      "safetensors: header length " + std::to_string(n) + " exceeds the file");
  DCR_RETURN_ERROR_IF(n == 0, bad_format, "safetensors: empty header");
  std::string_view text(reinterpret_cast<const char*>(head.data() + 8), static_cast<std::size_t>(n));
  DCR_RETURN_ERROR_IF(text[0] != '{', bad_format, "safetensors: header does not start with '{'");
  out.data_offset = 8 + n;
  const std::uint64_t data_size = file_size - out.data_offset;
  detail::json_reader j(text);
  if (!j.eat('{')) return j.fail_here("expected '{'");
  std::unordered_map<std::string, std::size_t> seen;
  bool have_meta = false;
  if (!j.eat('}'))
    for (;;) {
      std::string key;
      DCR_TRY(j.string(key));
      if (!j.eat(':')) return j.fail_here("expected ':'");
      if (key == "__metadata__") {
        DCR_RETURN_ERROR_IF(have_meta, bad_format, "safetensors: __metadata__ given twice");
        have_meta = true;
        if (!j.eat('{')) return j.fail_here("__metadata__ is not an object");
        if (!j.eat('}'))
          for (;;) {
            std::string k, v;
            DCR_TRY(j.string(k));
            if (!j.eat(':')) return j.fail_here("expected ':'");
            if (!j.peek('"')) return j.fail_here("__metadata__ value is not a string");
            DCR_TRY(j.string(v));
            out.metadata[k] = v;
            if (j.eat('}')) break;
            if (!j.eat(',')) return j.fail_here("expected ',' or '}'");
          }
      } else {
        DCR_RETURN_ERROR_IF(!seen.emplace(key, out.entries.size()).second, bad_format,
                            "safetensors tensor " + key + ": listed twice");
        safetensors_entry e;
        DCR_TRY(detail::parse_entry(j, key, e));
        out.entries.push_back(std::move(e));
      }
      if (j.eat('}')) break;
      if (!j.eat(',')) return j.fail_here("expected ',' or '}'");
    }
  if (!j.at_end()) return j.fail_here("bytes after the header object");
  // Byte counts, then the tiling of the data section.
  for (auto& e : out.entries) {
    std::uint64_t numel = 1;
    for (auto d : e.meta.shape) {
      DCR_RETURN_ERROR_IF(d != 0 && numel > UINT64_MAX / d, bad_format,
                          "safetensors tensor " + e.meta.name + ": shape overflows");
      numel *= d;
    }
    const auto w = width_of(e.meta.dtype);
    DCR_RETURN_ERROR_IF(numel > UINT64_MAX / w, bad_format, "safetensors tensor " + e.meta.name + ": shape overflows");
    DCR_RETURN_ERROR_IF(e.begin > e.end, bad_format,
                        "safetensors tensor " + e.meta.name + ": data_offsets end before they begin");
    DCR_RETURN_ERROR_IF(e.end > data_size, bad_format,
                        "safetensors tensor " + e.meta.name + ": data_offsets end " + std::to_string(e.end) +
                            " beyond the data section of " + std::to_string(data_size) + " bytes");
    DCR_RETURN_ERROR_IF(e.end - e.begin != numel * w, bad_format,
                        "safetensors tensor " + e.meta.name + ": shape needs " + std::to_string(numel * w) +
                            " bytes, data_offsets give " + std::to_string(e.end - e.begin));
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
                        "safetensors tensors " + (prev ? prev->meta.name : std::string("?")) + " and " + e.meta.name +
                            " overlap");
    DCR_RETURN_ERROR_IF(e.begin > at, bad_format,
                        "safetensors tensor " + e.meta.name + ": hole of " + std::to_string(e.begin - at) +
                            " bytes before it");
    at = e.end;
    prev = &e;
  }
  DCR_RETURN_ERROR_IF(at != data_size, bad_format,
                      "safetensors: " + std::to_string(data_size - at) + " bytes after the last tensor");
  return status::success();
}

/// Serialise tensors (and optional metadata) into a safetensors image. The
/// header is padded with spaces to a multiple of 8 bytes, as the reference
/// writer does, so data starts 8-aligned. Throws `invalid_argument` for a
/// duplicate name or a view that is not row-major contiguous.
inline std::vector<std::byte> encode_safetensors(std::span<const tensor_meta> metas,
                                                 std::span<const std::span<const std::byte>> data,
                                                 const std::map<std::string, std::string>& metadata = {}) {
  if (metas.size() != data.size()) throw error(errc::invalid_argument, "encode_safetensors: metas/data size differ");
  std::string h = "{";
  bool first = true;
  if (!metadata.empty()) {
    h += "\"__metadata__\":{";
    bool f2 = true;
    for (auto& [k, v] : metadata) {
      if (!f2) h += ',';
      f2 = false;
      detail::json_escape(k, h);
      h += ':';
      detail::json_escape(v, h);
    }
    h += '}';
    first = false;
  }
  std::uint64_t off = 0;
  std::unordered_map<std::string, int> names;
  for (std::size_t i = 0; i < metas.size(); ++i) {
    auto& m = metas[i];
    if (!names.emplace(m.name, 0).second) throw error(errc::invalid_argument, "encode_safetensors: duplicate " + m.name);
    if (m.name == "__metadata__") throw error(errc::invalid_argument, "encode_safetensors: reserved name");
    if (data[i].size() != m.nbytes())
      throw error(errc::invalid_argument, "encode_safetensors: " + m.name + " has " + std::to_string(data[i].size()) +
                                              " bytes, shape needs " + std::to_string(m.nbytes()));
    if (!first) h += ',';
    first = false;
    detail::json_escape(m.name, h);
    h += ":{\"dtype\":\"" + std::string(info(m.dtype)->safetensors_name) + "\",\"shape\":[";
    for (std::size_t d = 0; d < m.shape.size(); ++d) h += (d ? "," : "") + std::to_string(m.shape[d]);
    h += "],\"data_offsets\":[" + std::to_string(off) + "," + std::to_string(off + m.nbytes()) + "]}";
    off += m.nbytes();
  }
  h += '}';
  while ((8 + h.size()) % 8 != 0) h += ' ';
  std::vector<std::byte> out(8 + h.size() + off);
  const std::uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<std::byte>((n >> (8 * i)) & 0xFF);
  std::memcpy(out.data() + 8, h.data(), h.size());
  std::size_t at = 8 + h.size();
  for (auto& d : data) {
    if (!d.empty()) std::memcpy(out.data() + at, d.data(), d.size());
    at += d.size();
  }
  return out;
}

/// Write a safetensors file atomically (temporary file, fsync, rename).
/// Returns `errc::io` naming the path on failure.
inline status write_safetensors(const std::string& path, std::span<const tensor_meta> metas,
                                std::span<const std::span<const std::byte>> data,
                                const std::map<std::string, std::string>& metadata = {}) {
  std::vector<std::byte> img;
  try {
    img = encode_safetensors(metas, data, metadata);
  } catch (const error& e) {
    return fail(e.code(), e.what());
  }
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  DCR_RETURN_ERROR_IF(fd < 0, io, "open " + tmp + ": " + std::strerror(errno));
  std::size_t done = 0;
  while (done < img.size()) {
    const auto w = ::write(fd, img.data() + done, img.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return fail(errc::io, "write " + tmp + ": " + std::strerror(e));
    }
    done += static_cast<std::size_t>(w);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    ::unlink(tmp.c_str());
    return fail(errc::io, "fsync/close " + tmp + ": " + std::strerror(errno));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    return fail(errc::io, "rename to " + path + ": " + std::strerror(e));
  }
  return status::success();
}

/// A validated, memory-mapped safetensors file. Views point into the
/// read-only mapping (zero copy); a tensor whose offset is not aligned to its
/// element width is copied once into an aligned buffer on first use. Models
/// `canonical_source`.
class safetensors_file {
public:
  safetensors_file() = default;
  safetensors_file(const safetensors_file&) = delete;
  safetensors_file& operator=(const safetensors_file&) = delete;
  safetensors_file(safetensors_file&& o) noexcept { *this = std::move(o); }
  safetensors_file& operator=(safetensors_file&& o) noexcept {
    if (this != &o) {
      unmap();
      base_ = std::exchange(o.base_, nullptr);
      size_ = std::exchange(o.size_, 0);
      index_ = std::move(o.index_);
      by_name_ = std::move(o.by_name_);
      aligned_ = std::move(o.aligned_);
      metas_ = std::move(o.metas_);
    }
    return *this;
  }
  ~safetensors_file() { unmap(); }

  /// Map and validate `path`.
  static status open(const std::string& path, safetensors_file& out) {
    out = safetensors_file{};
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    DCR_RETURN_ERROR_IF(fd < 0, io, "open " + path + ": " + std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int e = errno;
      ::close(fd);
      return fail(errc::io, "fstat " + path + ": " + std::strerror(e));
    }
    const auto size = static_cast<std::uint64_t>(st.st_size);
    void* p = nullptr;
    if (size > 0) {
      p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        const int e = errno;
        ::close(fd);
        return fail(errc::io, "mmap " + path + ": " + std::strerror(e));
      }
    }
    ::close(fd);
    out.base_ = static_cast<std::byte*>(p);
    out.size_ = size;
    status s = parse_safetensors_header({out.base_, static_cast<std::size_t>(size)}, size, out.index_);
    if (!s.ok()) {
      s.message = path + ": " + s.message;
      out = safetensors_file{};
      return s;
    }
    out.finish_index();
    return status::success();
  }
  /// Throwing form of `open`.
  static safetensors_file open_or_throw(const std::string& path) {
    safetensors_file f;
    throw_if_failed(open(path, f));
    return f;
  }

  const safetensors_index& index() const noexcept { return index_; }
  /// Canonical metas in header order.
  const std::vector<tensor_meta>& tensors() const noexcept { return metas_; }
  const std::map<std::string, std::string>& metadata() const noexcept { return index_.metadata; }

  /// Read-only row-major view of tensor `name` (the `canonical_source` interface).
  std::optional<tensor_view> find(std::string_view name) const {
    auto it = by_name_.find(std::string(name));
    if (it == by_name_.end()) return std::nullopt;
    const auto& e = index_.entries[it->second];
    std::byte* p = base_ + index_.data_offset + e.begin;
    const auto w = width_of(e.meta.dtype);
    if (reinterpret_cast<std::uintptr_t>(p) % w != 0) {
      auto& buf = aligned_[it->second];
      if (buf.empty() && e.end > e.begin) {
        buf.resize((e.end - e.begin + 7) / 8);
        std::memcpy(buf.data(), p, e.end - e.begin);
      }
      p = reinterpret_cast<std::byte*>(buf.data());
    }
    return tensor_view{p, e.meta.dtype, strided_layout::row_major(e.meta.shape)};
  }
  /// Raw bytes of tensor `name` in the mapping (empty span when absent).
  std::span<const std::byte> bytes(std::string_view name) const {
    auto it = by_name_.find(std::string(name));
    if (it == by_name_.end()) return {};
    const auto& e = index_.entries[it->second];
    return {base_ + index_.data_offset + e.begin, static_cast<std::size_t>(e.end - e.begin)};
  }

private:
  void finish_index() {
    for (std::size_t i = 0; i < index_.entries.size(); ++i) {
      by_name_.emplace(index_.entries[i].meta.name, i);
      metas_.push_back(index_.entries[i].meta);
    }
  }
  void unmap() noexcept {
    if (base_ && size_ > 0) ::munmap(base_, size_);
    base_ = nullptr;
    size_ = 0;
  }

  std::byte* base_ = nullptr;
  std::uint64_t size_ = 0;
  safetensors_index index_;
  std::unordered_map<std::string, std::size_t> by_name_;
  mutable std::unordered_map<std::size_t, std::vector<std::uint64_t>> aligned_;
  std::vector<tensor_meta> metas_;
};

} // namespace dcr::io
