// libFuzzer target: the host twin of the device location decoder
// (`twin::decode_locations`) against the reference `codec::decode_locations`.
// Input: byte 0 the coding id, bytes 1-2 the count (below 4096), 3-4 the
// first index, 5-6 the element count (each little endian, small so that the
// index arrays stay small and the runs many), then the coded bytes. The twin promises the
// reference's indices, error code and message; any difference, crash or out-of-bounds read is a
// finding.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "dcr/codec/locations.hpp"
#include "dcr/twin/locations.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace dcr;
  if (size < 7) return 0;
  auto u16 = [&](std::size_t at) {
    return std::uint64_t{data[at]} | std::uint64_t{data[at + 1]} << 8;
  };
  const auto id = static_cast<codec::location_id>(data[0]);
  const std::uint64_t count = u16(1) & 0x0fff, first = u16(3);
  // Elements up to 2^16, or a huge tensor when the top bit is set, so that
  // index overflow near 2^64 is reached too.
  const std::uint64_t numel = (data[6] & 0x80) ? ~std::uint64_t{0} - u16(5) : u16(5);
  const std::span<const std::uint8_t> coded(data + 7, size - 7);
  std::vector<std::uint64_t> twin_out;
  const status t = twin::decode_locations(id, coded, first, numel, count, twin_out);
  // The reference needs a known coding and its output allocated by the caller.
  status r;
  std::vector<std::uint64_t> ref_out(count);
  if (!codec::is_known_location(data[0]))
    r = fail(errc::bad_location, "unknown location coding " + std::to_string(data[0]));
  else
    r = codec::decode_locations(id, std::as_bytes(coded), first, numel, ref_out);
  if (t.code != r.code || (t.ok() && twin_out != ref_out)) std::abort();
  if (!t.ok() && codec::is_known_location(data[0]) && t.message != r.message) std::abort();
  return 0;
}
