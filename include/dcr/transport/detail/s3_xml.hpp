#pragma once
/// \file
/// The little XML the S3 object store reads: ListObjectsV2 results and error
/// bodies. Not a general XML parser: it walks elements, keeps the text of
/// leaf elements and decodes the five predefined entities, numeric character
/// references and CDATA sections. It rejects what it does not understand
/// (DOCTYPE, hence entity definitions; mismatched tags; unknown entities)
/// with `errc::bad_format` rather than guessing. Internal to
/// `s3_object_store.hpp`; a header of its own for its tests.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dcr/core/error.hpp"

namespace dcr::transport::detail {

/// Append the UTF-8 encoding of code point `cp` (false if not a scalar value).
inline bool append_utf8(std::uint32_t cp, std::string& out) {
  if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF) || cp == 0) return false;
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return true;
}

/// Decode character data: &amp; &lt; &gt; &quot; &apos; &#N; &#xH;, appended to `out`.
inline status xml_unescape(std::string_view raw, std::string& out) {
  for (std::size_t i = 0; i < raw.size();) {
    if (raw[i] != '&') {
      out.push_back(raw[i++]);
      continue;
    }
    const auto semi = raw.find(';', i);
    DCR_RETURN_ERROR_IF(semi == std::string_view::npos || semi - i > 12, bad_format,
                        "XML: unterminated entity at byte " + std::to_string(i));
    const auto ent = raw.substr(i + 1, semi - i - 1);
    if (ent == "amp")
      out.push_back('&');
    else if (ent == "lt")
      out.push_back('<');
    else if (ent == "gt")
      out.push_back('>');
    else if (ent == "quot")
      out.push_back('"');
    else if (ent == "apos")
      out.push_back('\'');
    else if (ent.size() >= 2 && ent[0] == '#') {
      const bool hex = ent[1] == 'x';
      const auto digits = ent.substr(hex ? 2 : 1);
      DCR_RETURN_ERROR_IF(digits.empty(), bad_format,
                          "XML: empty character reference at byte " + std::to_string(i));
      std::uint32_t cp = 0;
      for (char c : digits) {
        int d = -1;
        if (c >= '0' && c <= '9')
          d = c - '0';
        else if (hex && c >= 'a' && c <= 'f')
          d = c - 'a' + 10;
        else if (hex && c >= 'A' && c <= 'F')
          d = c - 'A' + 10;
        DCR_RETURN_ERROR_IF(d < 0, bad_format,
                            "XML: bad character reference '&" + std::string(ent) + ";'");
        cp = cp * (hex ? 16 : 10) + static_cast<std::uint32_t>(d);
        DCR_RETURN_ERROR_IF(cp > 0x10FFFF, bad_format, "XML: character reference out of range");
      }
      DCR_RETURN_ERROR_IF(!append_utf8(cp, out), bad_format,
                          "XML: character reference '&" + std::string(ent) +
                              ";' is not a character");
    } else {
      return fail(errc::bad_format, "XML: unknown entity '&" + std::string(ent) + ";'");
    }
    i = semi + 1;
  }
  return status::success();
}

/// Walk `doc`, calling `leaf(path, text)` for every element without child
/// elements, where `path` is the '/'-joined local names from the root (for
/// example "ListBucketResult/Contents/Key") and `text` its decoded content.
/// Namespace prefixes and attributes are ignored.
template <class Leaf>
status xml_walk(std::string_view doc, Leaf&& leaf) {
  std::vector<std::string> stack;
  std::string path, text;
  bool has_child = false, seen_root = false;
  auto local = [](std::string_view n) {
    const auto c = n.find(':');
    return c == std::string_view::npos ? n : n.substr(c + 1);
  };
  std::size_t i = 0;
  while (i < doc.size()) {
    if (doc[i] != '<') {
      const auto lt = doc.find('<', i);
      const auto chunk =
          doc.substr(i, lt == std::string_view::npos ? std::string_view::npos : lt - i);
      if (stack.empty()) {
        DCR_RETURN_ERROR_IF(chunk.find_first_not_of(" \t\r\n") != std::string_view::npos,
                            bad_format,
                            "XML: text outside the root element at byte " + std::to_string(i));
      } else {
        DCR_TRY(xml_unescape(chunk, text));
      }
      i = lt == std::string_view::npos ? doc.size() : lt;
      continue;
    }
    auto rest = doc.substr(i);
    if (rest.starts_with("<?")) {
      const auto e = doc.find("?>", i);
      DCR_RETURN_ERROR_IF(e == std::string_view::npos, bad_format, "XML: unterminated '<?'");
      i = e + 2;
    } else if (rest.starts_with("<!--")) {
      const auto e = doc.find("-->", i + 4);
      DCR_RETURN_ERROR_IF(e == std::string_view::npos, bad_format, "XML: unterminated comment");
      i = e + 3;
    } else if (rest.starts_with("<![CDATA[")) {
      DCR_RETURN_ERROR_IF(stack.empty(), bad_format, "XML: CDATA outside the root element");
      const auto e = doc.find("]]>", i + 9);
      DCR_RETURN_ERROR_IF(e == std::string_view::npos, bad_format,
                          "XML: unterminated CDATA section");
      text.append(doc.substr(i + 9, e - i - 9));
      i = e + 3;
    } else if (rest.starts_with("<!")) {
      return fail(errc::bad_format, "XML: declarations (DOCTYPE, entities) are not accepted");
    } else {
      // A tag: find its end outside quoted attribute values.
      std::size_t j = i + 1;
      char quote = 0;
      for (; j < doc.size(); ++j) {
        if (quote) {
          if (doc[j] == quote) quote = 0;
        } else if (doc[j] == '"' || doc[j] == '\'') {
          quote = doc[j];
        } else if (doc[j] == '>') {
          break;
        }
      }
      DCR_RETURN_ERROR_IF(j == doc.size(), bad_format,
                          "XML: unterminated tag at byte " + std::to_string(i));
      auto body = doc.substr(i + 1, j - i - 1);
      i = j + 1;
      if (!body.empty() && body[0] == '/') {
        auto name = local(body.substr(1, body.find_last_not_of(" \t\r\n")));
        DCR_RETURN_ERROR_IF(stack.empty() || stack.back() != name, bad_format,
                            "XML: closing tag '" + std::string(name) + "' does not match");
        if (!has_child) leaf(std::string_view(path), std::string_view(text));
        stack.pop_back();
        path.resize(path.size() - name.size() - (stack.empty() ? 0 : 1));
        has_child = true; // the parent has at least this child
        text.clear();
        continue;
      }
      const bool self_closing = !body.empty() && body.back() == '/';
      if (self_closing) body.remove_suffix(1);
      const auto name_end = body.find_first_of(" \t\r\n");
      auto name = local(body.substr(0, name_end));
      DCR_RETURN_ERROR_IF(name.empty(), bad_format,
                          "XML: empty tag name at byte " + std::to_string(i));
      DCR_RETURN_ERROR_IF(stack.empty() && seen_root, bad_format, "XML: a second root element");
      seen_root = true;
      if (!path.empty()) path.push_back('/');
      path += name;
      text.clear();
      if (self_closing) {
        leaf(std::string_view(path), std::string_view());
        path.resize(path.size() - name.size() - (stack.empty() ? 0 : 1));
        has_child = true;
      } else {
        stack.emplace_back(name);
        has_child = false;
      }
    }
  }
  DCR_RETURN_ERROR_IF(!stack.empty(), bad_format,
                      "XML: element '" + stack.back() + "' is not closed");
  DCR_RETURN_ERROR_IF(!seen_root, bad_format, "XML: no element");
  return status::success();
}

/// The fields of an S3 error body (`<Error><Code>..</Code><Message>..</Message>`).
struct s3_error_body {
  std::string code, message, request_id;
};

/// Best effort: an unparsable or empty body leaves the fields empty (the HTTP
/// status still says what happened).
inline s3_error_body parse_s3_error(std::string_view body) {
  s3_error_body e, tmp;
  auto st = xml_walk(body, [&](std::string_view path, std::string_view text) {
    if (path == "Error/Code")
      tmp.code = text;
    else if (path == "Error/Message")
      tmp.message = text;
    else if (path == "Error/RequestId")
      tmp.request_id = text;
  });
  if (st.ok()) e = std::move(tmp);
  return e;
}

/// One page of a ListObjectsV2 answer.
struct s3_list_page {
  std::vector<std::string> keys;
  bool truncated = false;
  std::string next_token;
};

/// Parse a ListObjectsV2 result; `bad_format` if it is not one.
inline status parse_s3_list_page(std::string_view body, s3_list_page& page) {
  page = {};
  bool root_ok = false, truncated_seen = false;
  status bad = status::success();
  DCR_TRY(xml_walk(body, [&](std::string_view path, std::string_view text) {
    root_ok |= path.starts_with("ListBucketResult");
    if (path == "ListBucketResult/Contents/Key") {
      page.keys.emplace_back(text);
    } else if (path == "ListBucketResult/IsTruncated") {
      truncated_seen = true;
      if (text == "true")
        page.truncated = true;
      else if (text != "false")
        bad = fail(errc::bad_format, "ListObjectsV2: IsTruncated is '" + std::string(text) + "'");
    } else if (path == "ListBucketResult/NextContinuationToken") {
      page.next_token = text;
    }
  }));
  DCR_TRY(bad);
  DCR_RETURN_ERROR_IF(!root_ok, bad_format, "ListObjectsV2: the answer is not a ListBucketResult");
  DCR_RETURN_ERROR_IF(!truncated_seen, bad_format, "ListObjectsV2: the answer has no IsTruncated");
  DCR_RETURN_ERROR_IF(page.truncated && page.next_token.empty(), bad_format,
                      "ListObjectsV2: a truncated answer without NextContinuationToken");
  return status::success();
}

} // namespace dcr::transport::detail
