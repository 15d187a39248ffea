// dcr-inspect FILE [--json] [--extract-body OUT]
//
// Prints a payload's header and item table (aligned text, or JSON), verifies
// the digest and decodes every item. `--extract-body OUT` writes the
// compressed body (a plain zstd frame) to OUT. Bad input: one line on stderr
// naming the error, exit status 1 (2 for usage errors).
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "dcr/codec/payload.hpp"

namespace {

using namespace dcr;

std::string json_str(std::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c >= 0x7F) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      out += b;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

/// Names may hold any bytes: show them escaped in text output too.
std::string printable(std::string_view s) {
  auto j = json_str(s);
  return j.substr(1, j.size() - 2);
}

std::string shape_str(const std::vector<std::uint64_t>& s, bool json) {
  std::string out = json ? "[" : "(";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? "," : "") + std::to_string(s[i]);
  return out + (json ? "]" : ")");
}

int fail_line(const std::string& file, const status& s) {
  std::cerr << "dcr-inspect: " << file << ": " << to_string(s.code) << ": " << s.message << "\n";
  return 1;
}

void print_json(const codec::payload_info& pi) {
  const auto& h = pi.header;
  std::cout << "{\"header\":{\"magic\":\"DCRP\",\"version\":" << h.version
            << ",\"header_size\":" << codec::payload_header_size << ",\"attempt\":" << h.id.attempt
            << ",\"source_version\":" << h.id.source_version << ",\"owner\":" << h.id.owner
            << ",\"sequence\":" << h.id.sequence << ",\"item_count\":" << h.item_count
            << ",\"compression\":\"zstd\",\"table_length\":" << h.table_length
            << ",\"location_length\":" << h.location_length
            << ",\"value_length\":" << h.value_length << ",\"raw_length\":" << h.raw_length
            << ",\"compressed_length\":" << h.compressed_length << ",\"digest\":\""
            << to_hex(h.digest) << "\",\"digest_covers\":\""
            << (h.version >= 2 ? "header_and_body" : "body")
            << "\",\"digest_ok\":true},\"items\":[";
  for (std::size_t i = 0; i < pi.rows.size(); ++i) {
    const auto& r = pi.rows[i];
    std::cout << (i ? "," : "") << "{\"name\":" << json_str(r.tensor.name)
              << ",\"shape\":" << shape_str(r.tensor.shape, true) << ",\"dtype\":\""
              << name_of(r.tensor.dtype) << "\",\"encoding\":\"" << to_string(r.encoding)
              << "\",\"location\":\"" << codec::to_string(r.location) << "\",\"filter\":\""
              << codec::to_string(r.filter) << "\",\"count\":" << r.count
              << ",\"first\":" << r.first << ",\"location_offset\":" << r.location_offset
              << ",\"location_length\":" << r.location_length
              << ",\"value_offset\":" << r.value_offset << ",\"value_length\":" << r.value_length
              << "}";
  }
  std::cout << "]}\n";
}

void print_text(const std::string& file, std::size_t size, const codec::payload_info& pi) {
  const auto& h = pi.header;
  std::cout << "payload " << file << " (" << size << " bytes)\n";
  const std::pair<const char*, std::string> fields[] = {
      {"magic", "DCRP"},
      {"version", std::to_string(h.version) + (h.version >= 2 ? " (digest covers header and body)"
                                                              : " (digest covers the body)")},
      {"attempt", std::to_string(h.id.attempt)},
      {"source version", std::to_string(h.id.source_version)},
      {"owner", std::to_string(h.id.owner)},
      {"sequence", std::to_string(h.id.sequence)},
      {"items", std::to_string(h.item_count)},
      {"compression", "zstd"},
      {"table bytes", std::to_string(h.table_length)},
      {"location bytes", std::to_string(h.location_length)},
      {"value bytes", std::to_string(h.value_length)},
      {"raw body bytes", std::to_string(h.raw_length)},
      {"compressed bytes", std::to_string(h.compressed_length)},
      {"digest", to_hex(h.digest) + " (ok)"},
  };
  for (const auto& [k, v] : fields)
    std::cout << "  " << std::left << std::setw(17) << k << v << "\n";
  std::vector<std::vector<std::string>> rows = {{"#", "name", "shape", "dtype", "encoding",
                                                 "location", "filter", "count", "first", "loc off",
                                                 "loc len", "val off", "val len"}};
  for (std::size_t i = 0; i < pi.rows.size(); ++i) {
    const auto& r = pi.rows[i];
    rows.push_back({std::to_string(i), printable(r.tensor.name), shape_str(r.tensor.shape, false),
                    std::string(name_of(r.tensor.dtype)), std::string(to_string(r.encoding)),
                    std::string(codec::to_string(r.location)),
                    std::string(codec::to_string(r.filter)), std::to_string(r.count),
                    std::to_string(r.first), std::to_string(r.location_offset),
                    std::to_string(r.location_length), std::to_string(r.value_offset),
                    std::to_string(r.value_length)});
  }
  std::vector<std::size_t> w(rows[0].size(), 0);
  for (const auto& r : rows)
    for (std::size_t c = 0; c < r.size(); ++c) w[c] = std::max(w[c], r[c].size());
  std::cout << "\n";
  for (const auto& r : rows) {
    for (std::size_t c = 0; c < r.size(); ++c) {
      const bool left = c == 1 || (c >= 2 && c <= 6);
      std::cout << (left ? std::left : std::right) << std::setw(static_cast<int>(w[c])) << r[c]
                << "  ";
    }
    std::cout << "\n";
  }
}

} // namespace

int main(int argc, char** argv) {
  std::string file, extract;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json")
      json = true;
    else if (a == "--extract-body" && i + 1 < argc)
      extract = argv[++i];
    else if (!a.empty() && a[0] != '-' && file.empty())
      file = a;
    else {
      std::cerr << "usage: dcr-inspect FILE [--json] [--extract-body OUT]\n";
      return 2;
    }
  }
  if (file.empty()) {
    std::cerr << "usage: dcr-inspect FILE [--json] [--extract-body OUT]\n";
    return 2;
  }
  std::ifstream in(file, std::ios::binary);
  if (!in) return fail_line(file, fail(errc::io, "cannot open"));
  std::vector<char> raw((std::istreambuf_iterator<char>(in)), {});
  const auto bytes = std::as_bytes(std::span(raw));

  codec::payload_header h;
  if (auto s = codec::parse_header(bytes, h); !s) return fail_line(file, s);
  if (!extract.empty()) {
    // Written before the digest check, so a corrupt body can still be examined.
    std::ofstream out(extract, std::ios::binary);
    const auto body = codec::compressed_body(bytes);
    out.write(reinterpret_cast<const char*>(body.data()),
              static_cast<std::streamsize>(body.size()));
    if (!out) return fail_line(extract, fail(errc::io, "cannot write body"));
  }
  codec::payload_info pi;
  if (auto s = codec::inspect_payload(bytes, pi); !s) return fail_line(file, s);
  for (std::size_t i = 0; i < pi.rows.size(); ++i) {
    item it;
    if (auto s = codec::decode_row(pi.body, pi.header, pi.rows[i], i, it); !s)
      return fail_line(file, s);
  }
  if (json)
    print_json(pi);
  else
    print_text(file, bytes.size(), pi);
  return 0;
}
