// libFuzzer round trip: the input describes items (dtype, encoding, shape,
// gaps, values) and options (format v1 or v2); encode -> decode must give
// the items back, except that v1 refuses add items (bad_encoding).
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "dcr/codec/payload.hpp"

namespace {
struct source {
  const std::uint8_t* p;
  std::size_t n, pos = 0;
  std::uint8_t u8() { return pos < n ? p[pos++] : 0; }
  std::uint64_t u64() {
    std::uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v = (v << 8) | u8();
    return v;
  }
  bool more() const { return pos < n; }
};
} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace dcr;
  source s{data, size};
  encode_options opt;
  opt.locations = static_cast<codec::location_scheme>(s.u8() % 4);
  opt.filter = static_cast<codec::value_filter>(s.u8() % 2);
  const std::uint8_t flags = s.u8();
  opt.format_version = (flags & 1) ? 1 : 2;
  bool any_add = false;
  std::vector<item> items;
  const int n = s.u8() % 8;
  for (int i = 0; i < n && s.more(); ++i) {
    item it;
    it.tensor.name = "t" + std::to_string(i);
    it.tensor.dtype = static_cast<dtype_id>(1 + s.u8() % 5);
    it.encoding = static_cast<value_encoding>(1 + s.u8() % 3);
    any_add = any_add || it.encoding == value_encoding::add;
    const int rank = s.u8() % 3; // numel stays below 2^64
    std::uint64_t numel = 1;
    for (int r = 0; r < rank; ++r) {
      const std::uint64_t d = 1 + s.u8() % 4 * (s.u8() % 2 ? 1 : 1000000);
      it.tensor.shape.push_back(d);
      numel *= d;
    }
    const int count = s.u8() % 64;
    std::uint64_t at = s.u8() % 4;
    for (int k = 0; k < count && at < numel; ++k) {
      it.indices.push_back(at);
      const std::uint8_t g = s.u8();
      const std::uint64_t gap = g < 200 ? g % 4 : g < 250 ? s.u8() * 300ull : s.u64() % (numel + 1);
      if (__builtin_add_overflow(at, gap + 1, &at)) break;
    }
    it.values.resize(it.indices.size() * width_of(it.tensor.dtype));
    for (auto& b : it.values) b = static_cast<std::byte>(s.u8());
    items.push_back(std::move(it));
  }
  std::vector<std::byte> bytes;
  const status st = codec::encode_payload({1, 2, 3, 4}, items, opt, bytes);
  if (opt.format_version == 1 && any_add) {
    if (st.code != errc::bad_encoding) std::abort();
    return 0;
  }
  if (!st.ok()) std::abort();
  if (!(decode_payload_or_throw(bytes).items == items)) std::abort();
  return 0;
}
