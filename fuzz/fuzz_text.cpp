// libFuzzer target: the text and metadata decoders other than the payload's.
// The first byte picks one; the rest is its input. Manifests and commit
// records are sealed with a digest line, so random bytes would never get past
// it: here the input is the sealed part, and the target appends a correct
// digest line (a wrong one is the decoders' first check, tested elsewhere).
// Whatever parses must serialise back to something that parses to the same
// value; no input may crash, hang or read out of bounds.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "dcr/core/hash.hpp"
#include "dcr/core/json.hpp"
#include "dcr/io/safetensors_format.hpp"
#include "dcr/protocol/commit_store.hpp"
#include "dcr/transport/attempt_objects.hpp"
#include "dcr/transport/detail/s3_xml.hpp"

namespace {

void manifest(std::string_view text) {
  dcr::transport::manifest m;
  if (!dcr::transport::parse_manifest(dcr::seal_text(std::string(text)), m).ok()) return;
  dcr::transport::manifest again;
  if (!dcr::transport::parse_manifest(dcr::transport::serialize_manifest(m), again).ok() ||
      !(again == m))
    std::abort();
}

void commit_record(std::string_view text) {
  dcr::protocol::stored_record r;
  if (!dcr::protocol::parse_commit_record(dcr::seal_text(std::string(text)), r).ok()) return;
  dcr::protocol::stored_record again;
  if (!dcr::protocol::parse_commit_record(dcr::protocol::serialize_commit_record(r), again).ok() ||
      !(again == r))
    std::abort();
}

void json(std::string_view text) {
  dcr::json_value v;
  (void)dcr::parse_json(text, v);
}

void s3_xml(std::string_view text) {
  dcr::transport::detail::s3_list_page page;
  if (dcr::transport::detail::parse_s3_list_page(text, page).ok() && page.truncated &&
      page.next_token.empty())
    std::abort(); // a truncated page must say where to go on
  (void)dcr::transport::detail::parse_s3_error(text);
}

void safetensors(std::string_view bytes) {
  // The image is the header followed by `extra` bytes of data.
  if (bytes.empty()) return;
  const std::uint64_t extra = static_cast<std::uint8_t>(bytes[0]) * 97u;
  bytes.remove_prefix(1);
  const auto head = std::as_bytes(std::span(bytes.data(), bytes.size()));
  dcr::io::safetensors_index idx;
  if (!dcr::io::parse_safetensors_header(head, bytes.size() + extra, idx).ok()) return;
  const std::uint64_t data_size = bytes.size() + extra - idx.data_offset;
  for (auto& e : idx.entries)
    if (e.begin > e.end || e.end > data_size || e.end - e.begin != e.meta.nbytes()) std::abort();
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (data[0] % 5) {
  case 0:
    manifest(rest);
    break;
  case 1:
    commit_record(rest);
    break;
  case 2:
    json(rest);
    break;
  case 3:
    s3_xml(rest);
    break;
  default:
    safetensors(rest);
    break;
  }
  return 0;
}
