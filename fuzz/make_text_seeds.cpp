// Writes seeds for fuzz_text into a directory: one valid input per decoder
// (first byte = decoder, as fuzz_text reads it), so the fuzzer starts from
// inputs that parse and mutates them into the interesting invalid ones.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "dcr/core/hash.hpp"
#include "dcr/core/json.hpp"
#include "dcr/io/safetensors_format.hpp"
#include "dcr/protocol/commit_store.hpp"
#include "dcr/transport/attempt_objects.hpp"
#include "dcr/transport/detail/s3_xml.hpp"

namespace {
/// The part of a sealed text before its digest line.
std::string unsealed(const std::string& text) { return text.substr(0, text.rfind("digest ")); }

void put(const std::string& dir, const std::string& name, char which, const std::string& body) {
  std::ofstream(dir + "/" + name, std::ios::binary) << which << body;
}

/// A seed that its decoder refuses would start the fuzzer nowhere useful.
void require(const dcr::status& s, const char* what) {
  if (s.ok()) return;
  std::fprintf(stderr, "seed %s does not parse: %s\n", what, s.message.c_str());
  std::exit(1);
}
} // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  using namespace dcr;
  transport::manifest m;
  m.incarnation = "0123456789abcdef0123456789abcdef";
  m.attempt = 7;
  m.owner = 3;
  const std::string pl = "p1";
  for (std::uint32_t s = 0; s < 3; ++s)
    m.payloads.push_back(
        {transport::payload_name(7, 3, s), 1000u + s, digest(std::as_bytes(std::span(pl)))});
  put(dir, "manifest", 0, unsealed(transport::serialize_manifest(m)));
  transport::manifest m2;
  require(transport::parse_manifest(transport::serialize_manifest(m), m2), "manifest");
  // Version 3: a tensor index (front-coded names), one entry without an index.
  m.payloads[0].tensors = std::vector<std::string>{"model.layers.0.mlp.experts.1.down_proj.weight",
                                                   "model.layers.0.mlp.experts.1.up_proj.weight",
                                                   "model.layers.1.mlp.experts.1.up_proj.weight"};
  m.payloads[1].tensors = std::vector<std::string>{"model.embed_tokens.weight"};
  put(dir, "manifest-indexed", 0, unsealed(transport::serialize_manifest(m)));
  require(transport::parse_manifest(transport::serialize_manifest(m), m2), "manifest-indexed");

  protocol::stored_record r;
  r.revision = 4;
  r.epoch = 2;
  r.attempt = 9;
  r.record.version = 3;
  r.record.attempt = 8;
  r.record.time_unix_ns = 1700000000000000000ull;
  r.record.receivers = {{"tp0", {}}, {"tp1", {}}};
  r.record.incarnation = "0123456789abcdef0123456789abcdef";
  put(dir, "commit", 1, unsealed(protocol::serialize_commit_record(r)));
  protocol::stored_record r2;
  require(protocol::parse_commit_record(protocol::serialize_commit_record(r), r2), "commit");

  const std::string json =
      R"({"header":{"cluster_id":"1","revision":"12"},"succeeded":true,"responses":[{"response_range":)"
      R"({"kvs":[{"key":"ZGNy","value":"MQ==","version":"3"}],"count":"1"}}],"s":"\u00e9\ud83d\ude00"})";
  put(dir, "json", 2, json);
  json_value jv;
  require(parse_json(json, jv), "json");
  const std::string list =
      "<?xml version=\"1.0\" "
      "encoding=\"UTF-8\"?><ListBucketResult><Name>b</Name><IsTruncated>true</IsTruncated>"
      "<Contents><Key>attempt/1/payload/a&amp;b</Key></Contents><NextContinuationToken>t1</"
      "NextContinuationToken>"
      "</ListBucketResult>";
  put(dir, "s3list", 3, list);
  transport::detail::s3_list_page page;
  require(transport::detail::parse_s3_list_page(list, page), "s3list");
  put(dir, "s3error", 3,
      "<Error><Code>NoSuchKey</Code><Message>gone</Message><RequestId>r</RequestId></Error>");

  const std::string header =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]},)"
      R"("b":{"dtype":"F32","shape":[],"data_offsets":[12,16]}})";
  std::string st(8, '\0');
  for (int i = 0; i < 8; ++i) st[i] = static_cast<char>((header.size() >> (8 * i)) & 0xFF);
  // fuzz_text's first body byte sets the data size: 0 here, the data follows.
  const std::string image = st + header + std::string(16, '\x11');
  put(dir, "safetensors", 4, std::string(1, '\0') + image);
  io::safetensors_index idx;
  require(io::parse_safetensors_header(std::as_bytes(std::span(image.data(), image.size())),
                                       image.size(), idx),
          "safetensors");
  return 0;
}
