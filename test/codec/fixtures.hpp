#pragma once
// Random items and hand-sealed payloads for the codec tests.

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "dcr/codec/payload.hpp"

namespace dcr::test {

/// Strictly increasing indices in [0, numel): each element kept with
/// probability `density`, or one run when `run` is set.
inline std::vector<std::uint64_t> random_indices(std::mt19937_64& rng, std::uint64_t numel,
                                                 double density, bool as_run = false) {
  std::vector<std::uint64_t> idx;
  if (numel == 0) return idx;
  if (as_run) {
    std::uniform_int_distribution<std::uint64_t> d(0, numel - 1);
    const auto a = d(rng);
    const auto n = 1 + d(rng) % (numel - a);
    for (std::uint64_t k = 0; k < n; ++k) idx.push_back(a + k);
    return idx;
  }
  std::bernoulli_distribution keep(density);
  for (std::uint64_t k = 0; k < numel; ++k)
    if (keep(rng)) idx.push_back(k);
  return idx;
}

/// Random value words for `n` elements of `dtype`.
inline std::vector<std::byte> random_values(std::mt19937_64& rng, std::size_t n, dtype_id dtype) {
  std::vector<std::byte> v(n * width_of(dtype));
  for (auto& b : v) b = static_cast<std::byte>(rng());
  return v;
}

inline item make_item(std::string name, std::vector<std::uint64_t> shape, dtype_id dtype,
                      value_encoding enc, std::vector<std::uint64_t> idx, std::mt19937_64& rng) {
  item it;
  it.tensor = {std::move(name), std::move(shape), dtype};
  it.encoding = enc;
  it.values = random_values(rng, idx.size(), dtype);
  it.indices = std::move(idx);
  return it;
}

/// A payload around an arbitrary raw body: header fields as given, the body
/// compressed with zstd-1 and the digest computed, so table-level checks can
/// be reached past the digest.
struct sealed_fields {
  payload_id id{7, 8, 9, 10};
  std::uint32_t item_count = 0;
  std::uint64_t table_length = 0, location_length = 0, value_length = 0;
  std::uint16_t version = codec::payload_version;
};

inline std::vector<std::byte> seal(const sealed_fields& f, std::span<const std::byte> body) {
  auto frame = codec::zstd_compress_or_throw(body, 1);
  std::vector<std::byte> out;
  codec::detail::writer h{out};
  h.put(codec::payload_magic.data(), 4);
  h.u16(f.version);
  h.u16(96);
  h.u64(f.id.attempt);
  h.u64(f.id.source_version);
  h.u32(f.id.owner);
  h.u32(f.id.sequence);
  h.u32(f.item_count);
  h.u8(1);
  h.u8(0);
  h.u16(0);
  h.u64(f.table_length);
  h.u64(f.location_length);
  h.u64(f.value_length);
  h.u64(f.table_length + f.location_length + f.value_length);
  h.u64(frame.size());
  auto d = codec::payload_digest(f.version, out, frame);
  h.put(d.data(), 16);
  h.put(frame.data(), frame.size());
  return out;
}

/// Header and body of a valid payload, unsealed for editing.
struct opened {
  sealed_fields fields;
  std::vector<std::byte> body;
};
inline opened open_payload(std::span<const std::byte> payload) {
  codec::payload_info pi;
  throw_if_failed(codec::inspect_payload(payload, pi));
  return {{pi.header.id, pi.header.item_count, pi.header.table_length, pi.header.location_length,
           pi.header.value_length, pi.header.version},
          pi.body};
}

/// Little-endian store into a byte vector at `off`.
template <class W>
inline void poke(std::vector<std::byte>& b, std::size_t off, W v) {
  for (std::size_t i = 0; i < sizeof(W); ++i)
    b[off + i] = static_cast<std::byte>((std::uint64_t(v) >> (8 * i)) & 0xFF);
}

} // namespace dcr::test
