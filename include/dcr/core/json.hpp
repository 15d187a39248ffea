#pragma once
/// \file
/// The one JSON reader of dcr: small, strict (RFC 8259), producing a tree.
/// It reads the answers of HTTP control-plane services (etcd's JSON
/// gateway), safetensors headers and Hugging Face config files; `json_escape`
/// is the writer's string quoting.
///
/// Why not Boost.JSON: its parser lives in compiled sources that a program
/// must build exactly once (`boost/json/src.hpp` in one translation unit, or
/// the separately built library). A header-only library cannot do either for
/// its users without ODR violations when two of their translation units
/// include it, and Boost 1.81 has no inline-only mode. The answers read here
/// are small and use a handful of fields, so a reader of a few hundred lines
/// whose functions are all `inline` is the ODR-safe choice.
///
/// Numbers are kept as their literal text (validated against the grammar):
/// etcd encodes 64-bit integers as strings anyway, and `as_u64` accepts both
/// forms. Errors are `errc::bad_format` with the byte offset.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "dcr/core/error.hpp"

namespace dcr {

struct json_member;

/// One JSON value; objects keep their members in document order.
struct json_value {
  enum class kind : std::uint8_t { null, boolean, number, string, array, object };
  kind type = kind::null;
  bool boolean = false;
  std::string text; ///< string contents (unescaped), or a number's literal
  std::vector<json_value> items;
  std::vector<json_member> members; ///< (a pair would need json_value complete here)

  bool is_object() const noexcept { return type == kind::object; }
  bool is_array() const noexcept { return type == kind::array; }
  bool is_string() const noexcept { return type == kind::string; }

  /// Member `key` of an object (the first, if repeated); null when absent or
  /// when this is not an object.
  const json_value* get(std::string_view key) const noexcept;

  /// A non-negative integer given as a JSON number or as a decimal string
  /// (protobuf's JSON mapping of 64-bit integers). False if neither or out of range.
  bool as_u64(std::uint64_t& out) const noexcept {
    if (type != kind::number && type != kind::string) return false;
    if (text.empty() || text.size() > 20) return false;
    if (text.size() > 1 && text[0] == '0') return false;
    std::uint64_t v = 0;
    for (char c : text) {
      if (c < '0' || c > '9') return false;
      const auto d = static_cast<std::uint64_t>(c - '0');
      if (v > (UINT64_MAX - d) / 10) return false;
      v = v * 10 + d;
    }
    out = v;
    return true;
  }
};

/// One member of an object.
struct json_member {
  std::string key;
  json_value value;
};

inline const json_value* json_value::get(std::string_view key) const noexcept {
  if (type != kind::object) return nullptr;
  for (auto& [k, v] : members)
    if (k == key) return &v;
  return nullptr;
}

namespace detail {

class json_parser {
public:
  json_parser(std::string_view s, std::string_view what) : s_(s), what_(what) {}

  status document(json_value& out) {
    DCR_TRY(value(out, 0));
    ws();
    if (pos_ != s_.size()) return bad("trailing characters after the value");
    return status::success();
  }

private:
  static constexpr int max_depth = 64;

  status bad(const std::string& why) const {
    return fail(errc::bad_format,
                std::string(what_) + ": invalid JSON: " + why + " at byte " + std::to_string(pos_));
  }
  void ws() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r'))
      ++pos_;
  }
  bool eat(char c) {
    ws();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  status value(json_value& v, int depth) {
    if (depth > max_depth) return bad("nesting deeper than " + std::to_string(max_depth));
    ws();
    if (pos_ >= s_.size()) return bad("unexpected end");
    const char c = s_[pos_];
    if (c == '{') return object(v, depth);
    if (c == '[') return array(v, depth);
    if (c == '"') {
      v.type = json_value::kind::string;
      return string(v.text);
    }
    for (auto [lit, t, b] :
         {std::tuple{std::string_view("true"), json_value::kind::boolean, true},
          std::tuple{std::string_view("false"), json_value::kind::boolean, false},
          std::tuple{std::string_view("null"), json_value::kind::null, false}})
      if (s_.substr(pos_, lit.size()) == lit) {
        pos_ += lit.size();
        v.type = t;
        v.boolean = b;
        return status::success();
      }
    if (c == '-' || (c >= '0' && c <= '9')) return number(v);
    return bad(std::string("unexpected character '") + c + "'");
  }

  status object(json_value& v, int depth) {
    v.type = json_value::kind::object;
    ++pos_;
    if (eat('}')) return status::success();
    for (;;) {
      ws();
      json_member m;
      DCR_TRY(string(m.key));
      if (!eat(':')) return bad("expected ':'");
      DCR_TRY(value(m.value, depth + 1));
      v.members.push_back(std::move(m));
      if (eat('}')) return status::success();
      if (!eat(',')) return bad("expected ',' or '}'");
    }
  }

  status array(json_value& v, int depth) {
    v.type = json_value::kind::array;
    ++pos_;
    if (eat(']')) return status::success();
    for (;;) {
      json_value item;
      DCR_TRY(value(item, depth + 1));
      v.items.push_back(std::move(item));
      if (eat(']')) return status::success();
      if (!eat(',')) return bad("expected ',' or ']'");
    }
  }

  status number(json_value& v) {
    const std::size_t start = pos_;
    auto digits = [&] {
      const std::size_t b = pos_;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
      return pos_ - b;
    };
    if (s_[pos_] == '-') ++pos_;
    if (pos_ < s_.size() && s_[pos_] == '0')
      ++pos_;
    else if (digits() == 0)
      return bad("expected digits");
    if (pos_ < s_.size() && s_[pos_] == '.') {
      ++pos_;
      if (digits() == 0) return bad("expected digits after '.'");
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      if (digits() == 0) return bad("expected exponent digits");
    }
    v.type = json_value::kind::number;
    v.text = std::string(s_.substr(start, pos_ - start));
    return status::success();
  }

  status string(std::string& out) {
    out.clear();
    if (pos_ >= s_.size() || s_[pos_] != '"') return bad("expected a string");
    ++pos_;
    while (pos_ < s_.size()) {
      const char c = s_[pos_++];
      if (c == '"') return status::success();
      if (static_cast<unsigned char>(c) < 0x20) return bad("control character in string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= s_.size()) break;
      switch (s_[pos_++]) {
      case '"':
        out += '"';
        break;
      case '\\':
        out += '\\';
        break;
      case '/':
        out += '/';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'n':
        out += '\n';
        break;
      case 'r':
        out += '\r';
        break;
      case 't':
        out += '\t';
        break;
      case 'u': {
        std::uint32_t cp = 0;
        DCR_TRY(hex4(cp));
        if (cp >= 0xD800 && cp < 0xDC00) {
          std::uint32_t lo = 0;
          if (s_.substr(pos_, 2) != "\\u") return bad("lone surrogate");
          pos_ += 2;
          DCR_TRY(hex4(lo));
          if (lo < 0xDC00 || lo >= 0xE000) return bad("bad surrogate pair");
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        } else if (cp >= 0xDC00 && cp < 0xE000) {
          return bad("lone surrogate");
        }
        utf8(cp, out);
        break;
      }
      default:
        return bad("bad escape");
      }
    }
    return bad("unterminated string");
  }

  status hex4(std::uint32_t& v) {
    if (pos_ + 4 > s_.size()) return bad("short \\u escape");
    v = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = s_[pos_++];
      v <<= 4;
      if (h >= '0' && h <= '9')
        v |= static_cast<std::uint32_t>(h - '0');
      else if (h >= 'a' && h <= 'f')
        v |= static_cast<std::uint32_t>(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F')
        v |= static_cast<std::uint32_t>(h - 'A' + 10);
      else
        return bad("bad hex digit");
    }
    return status::success();
  }

  static void utf8(std::uint32_t cp, std::string& out) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
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

  std::string_view s_, what_;
  std::size_t pos_ = 0;
};

} // namespace detail

/// Parse one JSON document (surrounding whitespace allowed, nothing else).
/// `what` names the input in error messages.
inline status parse_json(std::string_view text, json_value& out, std::string_view what = "JSON") {
  json_value v;
  DCR_TRY(detail::json_parser(text, what).document(v));
  out = std::move(v);
  return status::success();
}

/// Append `s` to `out` as a JSON string literal: quotes, backslash and control
/// characters escaped (`\u00XX`); other bytes (UTF-8) as they are.
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

} // namespace dcr
