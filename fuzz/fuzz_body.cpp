// libFuzzer target past the digest: the input is a raw body preceded by
// 16 bytes giving the table and location lengths (the value length is the
// rest) and 4 bytes of item count (bit 31: seal as format v1, else v2). The
// target compresses it, seals a valid header with the right digest of that
// version, and decodes; so every fuzz input reaches the item table and
// location checks of both versions.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "dcr/codec/payload.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace dcr;
  if (size < 20) return 0;
  std::uint64_t table, locs;
  std::uint32_t count;
  std::memcpy(&table, data, 8);
  std::memcpy(&locs, data + 8, 8);
  std::memcpy(&count, data + 16, 4);
  const std::uint16_t version = (count >> 31) ? 1 : 2;
  count &= 0x7FFFFFFFu;
  const auto body = std::as_bytes(std::span(data + 20, size - 20));
  table %= body.size() + 1;
  locs %= body.size() - table + 1;
  const std::uint64_t vals = body.size() - table - locs;
  std::vector<std::byte> frame;
  if (!codec::zstd_compress(body, 1, frame).ok()) std::abort();
  std::vector<std::byte> p;
  codec::detail::writer h{p};
  h.put(codec::payload_magic.data(), 4);
  h.u16(version);
  h.u16(96);
  h.u64(1);
  h.u64(2);
  h.u32(3);
  h.u32(4);
  h.u32(count);
  h.u8(1);
  h.u8(0);
  h.u16(0);
  h.u64(table);
  h.u64(locs);
  h.u64(vals);
  h.u64(body.size());
  h.u64(frame.size());
  const auto d = codec::payload_digest(version, p, frame);
  h.put(d.data(), d.size());
  h.put(frame.data(), frame.size());
  decoded_payload out;
  if (!decode_payload(p, out).ok()) return 0;
  for (std::size_t i = 0; i < out.items.size(); ++i)
    if (!codec::validate_item(out.items[i], i).ok()) std::abort();
  const auto again = decode_payload_or_throw(encode_payload(out.id, out.items));
  if (!(again == out)) std::abort();
  return 0;
}
