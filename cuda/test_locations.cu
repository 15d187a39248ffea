// Device location decode (every wire coding), scatter_encoded and
// scatter_row against their host twins dcr/twin/locations.hpp and
// dcr/twin/row.hpp: equal indices, equal error codes and messages, equal
// destination bytes, and an untouched destination on failure. The twins
// themselves are checked against the reference decoder in the unit suite
// (test/device/location_decode_test.cpp).

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "dcr/codec/locations.hpp"
#include "dcr/codec/payload.hpp"
#include "dcr/gpu/locations.cuh"
#include "dcr/gpu/row.cuh"
#include "dcr/twin/locations.hpp"
#include "dcr/twin/row.hpp"
#include "test_common.cuh"

using namespace dcr;
using namespace dcr::gpu::test;
using codec::location_id;
using twin::scatter_op;

namespace {

const location_id all_ids[] = {
    location_id::run,     location_id::gap_u8,     location_id::gap_u16,    location_id::gap_u32,
    location_id::gap_u64, location_id::planes_u16, location_id::planes_u32, location_id::planes_u64,
    location_id::varint,  location_id::escape_u8};

std::vector<std::uint8_t> encode(location_id id, const std::vector<std::uint64_t>& idx) {
  std::vector<std::byte> b;
  if (!idx.empty()) codec::encode_locations(id, idx, b);
  std::vector<std::uint8_t> v(b.size());
  if (!b.empty()) std::memcpy(v.data(), b.data(), b.size());
  return v;
}

bool can_encode(location_id id, const std::vector<std::uint64_t>& idx) {
  bool can = false;
  codec::visit_location(id, [&](auto c) { can = idx.empty() || decltype(c)::can_encode(idx); });
  return can;
}

/// Sorted locations whose gaps mix small, escape-sized and huge values.
std::vector<std::uint64_t> mixed_locations(std::size_t n, std::uint64_t max_gap,
                                           std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::uint64_t> v;
  std::uint64_t at = rng() % 50;
  for (std::size_t i = 0; i < n; ++i) {
    v.push_back(at);
    const unsigned r = rng() % 100;
    const std::uint64_t gap = r < 85   ? rng() % 200
                              : r < 98 ? 200 + rng() % 1000
                                       : rng() % (max_gap + 1);
    at += gap + 1;
  }
  return v;
}

/// Kernel and twin decode agree on one input.
void agree(location_id id, const std::vector<std::uint8_t>& bytes, std::uint64_t first,
           std::uint64_t numel, std::uint64_t count, dcr::gpu::workspace& ws,
           const std::string& what) {
  std::vector<std::uint64_t> want;
  const status t = twin::decode_locations(id, bytes, first, numel, count, want);
  dbuf<std::uint8_t> d_bytes(bytes);
  dbuf<std::uint64_t> d_out(count == 0 ? 1 : count);
  const status s = dcr::gpu::decode_locations(id, d_bytes.get(), bytes.size(), first, numel, count,
                                              d_out.get(), ws);
  const std::string tag =
      what + " " + std::string(codec::to_string(id)) + " count " + std::to_string(count);
  DCR_EXPECT(s.code == t.code, tag + ": code " + std::string(to_string(s.code)) + " (" + s.message +
                                   ") vs twin " + std::string(to_string(t.code)) + " (" +
                                   t.message + ")");
  DCR_EXPECT(s.message == t.message,
             tag + ": message '" + s.message + "' vs twin '" + t.message + "'");
  if (s && t) DCR_EXPECT(d_out.download_prefix(count) == want, tag + ": indices");
  if (!codec::is_known_location(static_cast<std::uint8_t>(id))) return;
  // The typed entry (the kernels of that coding, no runtime id) decodes the same.
  codec::visit_location(id, [&](auto c) {
    using Coding = decltype(c);
    dbuf<std::uint64_t> d_typed(count == 0 ? 1 : count);
    const status u = dcr::gpu::decode_locations<Coding>(d_bytes.get(), bytes.size(), first, numel,
                                                        count, d_typed.get(), ws);
    DCR_EXPECT(u.code == t.code && u.message == t.message,
               tag + ": typed entry '" + u.message + "' vs twin '" + t.message + "'");
    if (u && t) DCR_EXPECT(d_typed.download_prefix(count) == want, tag + ": typed indices");
  });
}

/// Checks answered before any device work, identical to the twin's; valid
/// arguments without a device give errc::device.
void host_side_checks() {
  dcr::gpu::workspace ws;
  std::vector<std::uint64_t> out;
  std::uint64_t dummy = 0;
  const std::vector<std::uint8_t> three = {1, 2, 3};
  struct bad_case {
    location_id id;
    std::vector<std::uint8_t> bytes;
    std::uint64_t first, numel, count;
  };
  const bad_case cases[] = {
      {location_id::gap_u16, three, 0, 100, 2},      // odd length
      {location_id::planes_u32, three, 0, 100, 2},   // short planes
      {location_id::run, three, 0, 100, 4},          // a run has no bytes
      {location_id::run, {}, 98, 100, 4},            // run past numel
      {location_id::escape_u8, three, 100, 100, 4},  // first past numel, checked first
      {location_id::varint, three, 0, 100, 1},       // a single index needs no bytes
      {location_id::gap_u8, {}, 0, 100, 0},          // no output index
      {static_cast<location_id>(12), {}, 0, 100, 1}, // unknown coding
  };
  for (const auto& c : cases) {
    const status t = twin::decode_locations(c.id, c.bytes, c.first, c.numel, c.count, out);
    const status s = dcr::gpu::decode_locations(c.id, c.bytes.data(), c.bytes.size(), c.first,
                                                c.numel, c.count, &dummy, ws);
    DCR_EXPECT(!t && s.code == t.code && s.message == t.message,
               "host-side decode check: '" + s.message + "' vs twin '" + t.message + "'");
    if (!codec::is_known_location(static_cast<std::uint8_t>(c.id))) continue;
    codec::visit_location(c.id, [&](auto coding) {
      using Coding = decltype(coding);
      const status u = dcr::gpu::decode_locations<Coding>(c.bytes.data(), c.bytes.size(), c.first,
                                                          c.numel, c.count, &dummy, ws);
      DCR_EXPECT(u.code == t.code && u.message == t.message,
                 "host-side typed decode check: '" + u.message + "' vs twin '" + t.message + "'");
    });
  }
  std::vector<std::uint16_t> store(16, 0);
  const twin::view<std::uint16_t> dst{store.data(), twin::linear(16)};
  twin::view<std::uint16_t> alias = dst;
  alias.shape.strides[0] = 0;
  alias.shape.contiguous = false;
  const std::vector<std::uint8_t> vals(6, 0);
  const status a = dcr::gpu::scatter_encoded(alias, 0, 3, location_id::gap_u8, three.data(), 2,
                                             vals.data(), 6, false, scatter_op::xor_mask, ws);
  const status at = twin::scatter_encoded<std::uint16_t>(alias, 0, 3, location_id::gap_u8,
                                                         std::span(three).first(2), vals, false);
  DCR_EXPECT_CODE(a, invalid_argument, "aliasing destination");
  DCR_EXPECT(a.message == at.message, "aliasing destination: same message as the twin");
  DCR_EXPECT_CODE(dcr::gpu::scatter_encoded(dst, 0, 3, location_id::gap_u8, three.data(), 2,
                                            vals.data(), 5, false, scatter_op::xor_mask, ws),
                  length_overflow, "short value bytes");
  DCR_EXPECT_CODE(dcr::gpu::scatter_encoded(dst, 0, 3, location_id::gap_u16, three.data(), 3,
                                            vals.data(), 6, false, scatter_op::xor_mask, ws),
                  bad_location, "odd gap_u16 length");
  if (dcr::gpu::device_count() == 0) {
    DCR_EXPECT_CODE(
        dcr::gpu::decode_locations(location_id::gap_u8, three.data(), 2, 0, 100, 3, &dummy, ws),
        device, "valid decode without a device");
    DCR_EXPECT_CODE(dcr::gpu::scatter_encoded(dst, 0, 3, location_id::gap_u8, three.data(), 2,
                                              vals.data(), 6, false, scatter_op::xor_mask, ws),
                    device, "valid scatter without a device");
  }
}

void decode_sweep() {
  dcr::gpu::workspace ws;
  std::mt19937_64 rng(5);
  std::uint64_t seed = 1;
  for (const std::size_t n : {std::size_t{1}, std::size_t{2}, std::size_t{3}, std::size_t{9},
                              std::size_t{17}, std::size_t{1000}, std::size_t{100003}})
    for (const std::uint64_t max_gap : {std::uint64_t{0}, std::uint64_t{254}, std::uint64_t{70000},
                                        std::uint64_t{1} << 40, std::uint64_t{1} << 62}) {
      const auto idx = mixed_locations(n, max_gap, seed++);
      const std::uint64_t numel = idx.back() + 1;
      for (const location_id id : all_ids) {
        if (!can_encode(id, idx)) continue;
        const auto bytes = encode(id, idx);
        agree(id, bytes, idx[0], numel, n, ws, "intact");
        agree(id, bytes, idx[0], idx.back(), n, ws, "numel = last");
        agree(id, bytes, idx[0], numel, n + 1, ws, "one more");
        if (bytes.empty()) continue;
        agree(id, std::vector<std::uint8_t>(bytes.begin(), bytes.end() - 1), idx[0], numel, n, ws,
              "truncated");
        for (int t = 0; t < 4; ++t) {
          auto bad = bytes;
          bad[rng() % bad.size()] = static_cast<std::uint8_t>(t == 0   ? 0xFF
                                                              : t == 1 ? 0x80
                                                                       : rng());
          agree(id, bad, idx[0], numel, n, ws, "corrupted");
          agree(id, bad, idx[0], ~std::uint64_t{0}, n, ws, "corrupted, numel max");
        }
        auto more = bytes;
        more.push_back(0x80);
        agree(id, more, idx[0], numel, n, ws, "appended");
      }
    }
  // Adversarial variable-length bytes: escape runs, 0xFF continuations,
  // 10-byte forms, plain runs around 8-byte blocks.
  for (int t = 0; t < 400; ++t) {
    std::vector<std::uint8_t> v;
    const std::size_t n = 1 + rng() % 48;
    for (std::size_t i = 0; i < n; ++i) {
      const unsigned r = rng() % 12;
      if (r == 0)
        v.insert(v.end(), {0xFF, static_cast<std::uint8_t>(rng() % 0x80)});
      else if (r == 1)
        v.insert(v.end(), {0xFF, 0xFF, static_cast<std::uint8_t>(rng() % 3)});
      else if (r == 2)
        v.insert(v.end(), 9, 0xFF);
      else if (r == 3)
        v.push_back(static_cast<std::uint8_t>(0x80 | rng()));
      else
        v.push_back(static_cast<std::uint8_t>(rng() % 0xFF));
    }
    for (const location_id id : {location_id::varint, location_id::escape_u8})
      for (const std::uint64_t count :
           {std::uint64_t{2}, std::uint64_t{9}, static_cast<std::uint64_t>(n),
            static_cast<std::uint64_t>(v.size() + 1)})
        for (const std::uint64_t numel :
             {std::uint64_t{500}, std::uint64_t{4000}, ~std::uint64_t{0}})
          agree(id, v, rng() % 3, numel, count, ws, "adversarial");
  }
  // Large: default coding and varint over 20 M locations.
  const auto big = mixed_locations(20'000'000, std::uint64_t{1} << 20, 99);
  for (const location_id id :
       {location_id::escape_u8, location_id::varint, location_id::planes_u32})
    agree(id, encode(id, big), big[0], big.back() + 1, big.size(), ws, "20M");
}

template <twin::word W>
void scatter_sweep() {
  dcr::gpu::workspace ws;
  std::mt19937_64 rng(sizeof(W));
  const std::int64_t ext[] = {517, 1001};
  twin::layout trans = twin::row_major(ext, 2);
  std::swap(trans.extents[0], trans.extents[1]);
  std::swap(trans.strides[0], trans.strides[1]);
  trans.contiguous = trans.is_row_major();
  const twin::layout shapes[] = {twin::linear(517 * 1001), trans};
  const auto numel = static_cast<std::uint64_t>(517 * 1001);
  const auto host = random_words<W>(static_cast<std::size_t>(numel), 7);
  for (const auto& shape : shapes)
    for (const double density : densities) {
      const auto idx = random_locations(numel, density, rng());
      for (const location_id id : all_ids) {
        if (!can_encode(id, idx) || (id == location_id::run && idx.empty())) continue;
        const auto loc = encode(id, idx);
        const auto vals = random_words<std::uint8_t>(idx.size() * sizeof(W), rng());
        for (const bool planes : {false, true})
          for (const auto op : {scatter_op::xor_mask, scatter_op::overwrite}) {
            auto want = host;
            const std::uint64_t first = idx.empty() ? 0 : idx[0];
            const status t = twin::scatter_encoded<W>({want.data(), shape}, first, idx.size(), id,
                                                      loc, vals, planes, op);
            dbuf<W> d(host);
            dbuf<std::uint8_t> dl(loc), dv(vals);
            const status s =
                dcr::gpu::scatter_encoded<W>({d.get(), shape}, first, idx.size(), id, dl.get(),
                                             loc.size(), dv.get(), vals.size(), planes, op, ws);
            const std::string tag =
                std::string(codec::to_string(id)) + " density " + std::to_string(density);
            DCR_EXPECT(t && s, tag + ": " + s.message);
            DCR_EXPECT_CODE(dcr::gpu::synchronize(), ok, tag + ": sync");
            DCR_EXPECT(same_bytes(d.download(), want), tag + ": destination bytes");
            if (idx.size() < 2 || loc.empty()) continue;
            // A failing decode writes nothing and words the error as the twin.
            const std::vector<std::uint8_t> cut(loc.begin(), loc.end() - 1);
            dbuf<W> d2(host);
            dbuf<std::uint8_t> dc(cut);
            auto twin = host;
            const status tf = twin::scatter_encoded<W>({twin.data(), shape}, first, idx.size(), id,
                                                       cut, vals, planes, op);
            const status sf =
                dcr::gpu::scatter_encoded<W>({d2.get(), shape}, first, idx.size(), id, dc.get(),
                                             cut.size(), dv.get(), vals.size(), planes, op, ws);
            DCR_EXPECT(!tf && sf.code == tf.code && sf.message == tf.message,
                       tag + ": truncated: '" + sf.message + "' vs twin '" + tf.message + "'");
            DCR_EXPECT(same_bytes(d2.download(), host), tag + ": untouched after failure");
          }
      }
    }
}

void row_sweep() {
  dcr::gpu::workspace ws;
  std::mt19937_64 rng(17);
  std::vector<item> items;
  for (int i = 0; i < 6; ++i) {
    item it;
    it.tensor = {"layer." + std::to_string(i) + ".weight",
                 {512, 384},
                 i % 2 ? dtype_id::f32 : dtype_id::bf16};
    it.encoding = i % 3 == 0 ? value_encoding::overwrite : value_encoding::xor_mask;
    it.indices = random_locations(512 * 384, i == 5 ? 1.0 : 0.02 * (i + 1), rng());
    it.values.resize(it.indices.size() * width_of(it.tensor.dtype));
    for (auto& b : it.values) b = static_cast<std::byte>(rng());
    items.push_back(std::move(it));
  }
  const codec::location_scheme schemes[] = {
      codec::location_scheme::escape_u8, codec::location_scheme::varint,
      codec::location_scheme::planes, codec::location_scheme::gaps};
  for (const auto scheme : schemes) {
    encode_options opt;
    opt.locations = scheme;
    const auto bytes = encode_payload(payload_id{1, 1, 0, 0}, items, opt);
    codec::payload_info pi;
    DCR_EXPECT(static_cast<bool>(codec::inspect_payload(bytes, pi)), "inspect payload");
    for (std::size_t i = 0; i < pi.rows.size(); ++i) {
      const auto& row = pi.rows[i];
      const auto n = static_cast<std::int64_t>(row.tensor.numel());
      const auto run = [&](auto word, std::vector<std::byte> body) {
        using W = decltype(word);
        const auto host = random_words<W>(static_cast<std::size_t>(n), i);
        auto want = host;
        const status t =
            twin::scatter_row<W>({want.data(), twin::linear(n)}, body, pi.header, row, i);
        dbuf<W> d(host);
        const status s =
            dcr::gpu::scatter_row<W>({d.get(), twin::linear(n)}, body, pi.header, row, i, ws);
        DCR_EXPECT(s.code == t.code && s.message == t.message,
                   row.tensor.name + ": '" + s.message + "' vs twin '" + t.message + "'");
        DCR_EXPECT(same_bytes(d.download(), t ? want : host),
                   row.tensor.name + ": destination bytes");
      };
      auto corrupt = pi.body;
      if (row.location_length > 0)
        corrupt[pi.header.table_length + row.location_offset + row.location_length / 2] =
            std::byte{0xFF};
      if (width_of(row.tensor.dtype) == 2) {
        run(std::uint16_t{}, pi.body);
        run(std::uint16_t{}, corrupt);
      } else {
        run(std::uint32_t{}, pi.body);
        run(std::uint32_t{}, corrupt);
      }
    }
  }
}

} // namespace

int main() {
  host_side_checks();
  skip_without_device("test_locations");
  decode_sweep();
  scatter_sweep<std::uint8_t>();
  scatter_sweep<std::uint16_t>();
  scatter_sweep<std::uint32_t>();
  scatter_sweep<std::uint64_t>();
  row_sweep();
  return finish("test_locations");
}
