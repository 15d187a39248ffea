// libFuzzer target: arbitrary bytes into decode_payload. Whatever decodes
// must satisfy the item invariants and re-encode to a payload that decodes
// to the same items.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "dcr/codec/payload.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace dcr;
  const auto bytes = std::as_bytes(std::span(data, size));
  codec::decode_limits limits;
  limits.max_raw_body = 1u << 24;
  decoded_payload out;
  if (!codec::decode_payload(bytes, out, limits).ok()) return 0;
  for (std::size_t i = 0; i < out.items.size(); ++i)
    if (!codec::validate_item(out.items[i], i).ok()) std::abort();
  const auto again = decode_payload_or_throw(encode_payload(out.id, out.items));
  if (!(again == out)) std::abort();
  return 0;
}
