// libFuzzer target: `codec::decode_payload_if`, the decoder a receiver uses
// when it keeps only the items it holds. The first byte is a mask of which
// rows to keep (row i kept when bit i % 8 is set); the rest is the payload.
// A rejected row still has its locations checked, so decode_payload_if may
// refuse a payload only for a reason decode_payload would refuse it too:
// where the full decode succeeds, the selective one must succeed and give
// every kept item equal to the full decode's, and every rejected item with
// its tensor and encoding but no indices or values. With every row kept the
// two must agree in status code and in result. No input may crash, hang or
// read out of bounds.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "dcr/codec/payload.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace dcr;
  if (size < 1) return 0;
  const std::uint8_t mask = data[0];
  const auto bytes = std::as_bytes(std::span(data + 1, size - 1));
  codec::decode_limits limits;
  limits.max_raw_body = 1u << 24;
  std::size_t row = 0;
  auto keep = [&](const codec::item_row&) { return ((mask >> (row++ % 8)) & 1) != 0; };
  decoded_payload sel;
  const status s = codec::decode_payload_if(bytes, sel, keep, limits);
  decoded_payload full;
  const status f = codec::decode_payload(bytes, full, limits);
  if (mask == 0xff && (s.code != f.code || (f.ok() && !(sel == full)))) std::abort();
  if (!f.ok()) return 0;
  if (!s.ok() || sel.id != full.id || sel.items.size() != full.items.size()) std::abort();
  for (std::size_t i = 0; i < full.items.size(); ++i) {
    const auto& a = sel.items[i];
    const auto& b = full.items[i];
    if ((mask >> (i % 8)) & 1) {
      if (!(a == b)) std::abort();
    } else if (!(a.tensor == b.tensor) || a.encoding != b.encoding || !a.indices.empty() ||
               !a.values.empty()) {
      std::abort();
    }
  }
  return 0;
}
