// Device scatter (decoded, run, fused gap decode; XOR, add and overwrite) against
// its host twin dcr/twin/scatter.hpp, byte for byte over the whole
// storage, across word types, densities, lengths and strided layouts.

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "dcr/gpu/item.cuh"
#include "dcr/gpu/scatter.cuh"
#include "dcr/twin/scatter.hpp"
#include "test_common.cuh"

using namespace dcr;
using namespace dcr::gpu::test;
using twin::scatter_op;

namespace {

/// A destination: storage of `storage` elements and a layout over it at `base`.
struct dst_case {
  std::string name;
  std::size_t storage;
  std::int64_t base;
  twin::layout shape;
};

std::vector<dst_case> destinations() {
  std::vector<dst_case> out;
  for (std::uint64_t n : {0ull, 1ull, 7ull, 1000003ull})
    out.push_back(
        {"linear " + std::to_string(n), n, 0, twin::linear(static_cast<std::int64_t>(n))});
  {
    auto l = strided_layout::row_major({3, 5}).transposed(0, 1);
    out.push_back({"3x5 transposed", 15, 0, twin::to_device(l)});
  }
  {
    auto l = strided_layout::row_major({517, 1001}).transposed(0, 1);
    out.push_back({"517x1001 transposed", 517 * 1001, 0, twin::to_device(l)});
  }
  {
    std::int64_t base = 0;
    auto l = strided_layout::row_major({6, 40, 33}).slice(1, 5, 30, base).transposed(0, 2);
    out.push_back({"6x40x33 sliced+transposed", 6 * 40 * 33, base, twin::to_device(l)});
  }
  return out;
}

/// Gap words of `width` bytes for sorted locations.
std::vector<std::uint8_t> gaps_of(const std::vector<std::uint64_t>& loc, unsigned width) {
  std::vector<std::uint8_t> g;
  for (std::size_t k = 1; k < loc.size(); ++k) {
    const std::uint64_t gap = loc[k] - loc[k - 1] - 1;
    for (unsigned b = 0; b < width; ++b) g.push_back(static_cast<std::uint8_t>(gap >> (8 * b)));
  }
  return g;
}

unsigned max_gap_width(const std::vector<std::uint64_t>& loc) {
  std::uint64_t m = 0;
  for (std::size_t k = 1; k < loc.size(); ++k) m = std::max(m, loc[k] - loc[k - 1] - 1);
  return twin::gap_width_for(m);
}

// Checks answered before any device work, identical to the twin's.
template <twin::word W>
void host_side_checks() {
  std::vector<W> store(64, 0);
  std::vector<std::uint64_t> loc = {1, 2, 3};
  std::vector<W> val = {1, 2, 3};
  const twin::view<W> ok{store.data(), twin::linear(64)};

  twin::view<W> alias{store.data(), twin::linear(8)};
  alias.shape.strides[0] = 0;
  alias.shape.contiguous = false;
  DCR_EXPECT_CODE(dcr::gpu::scatter(alias, loc.data(), val.data(), 3), invalid_argument,
                  "aliasing destination");
  DCR_EXPECT_CODE(twin::xor_scatter<W>(alias, loc, val), invalid_argument,
                  "twin: aliasing destination");

  twin::view<W> neg{store.data(), twin::linear(8)};
  neg.shape.strides[0] = -1;
  neg.shape.contiguous = false;
  DCR_EXPECT_CODE(dcr::gpu::scatter(neg, loc.data(), val.data(), 3), invalid_argument,
                  "negative stride");
  DCR_EXPECT_CODE(twin::xor_scatter<W>(neg, loc, val), invalid_argument, "twin: negative stride");

  const twin::view<W> null_data{nullptr, twin::linear(4)};
  DCR_EXPECT_CODE(dcr::gpu::scatter(null_data, loc.data(), val.data(), 3), invalid_argument,
                  "null destination");
  DCR_EXPECT_CODE(dcr::gpu::scatter(ok, nullptr, val.data(), 3), invalid_argument,
                  "null locations");
  DCR_EXPECT_CODE(dcr::gpu::scatter(ok, loc.data(), static_cast<const W*>(nullptr), 3),
                  invalid_argument, "null values");
  DCR_EXPECT_CODE(twin::xor_scatter<W>(ok, loc, std::span<const W>(val).first(2)), invalid_argument,
                  "twin: counts differ");

  dcr::gpu::workspace ws;
  std::vector<std::uint8_t> gaps = {0, 0};
  DCR_EXPECT_CODE(
      dcr::gpu::scatter_gaps(ok, 0, 3, gaps.data(), 2, val.data(), 3, scatter_op::xor_mask, ws),
      bad_location, "gap width 3");
  DCR_EXPECT_CODE(twin::scatter_gaps<W>(ok, 0, 3, gaps, val), bad_location, "twin: gap width 3");
  DCR_EXPECT_CODE(
      dcr::gpu::scatter_gaps(ok, 0, 2, gaps.data(), 2, val.data(), 3, scatter_op::xor_mask, ws),
      offset_out_of_range, "gap buffer too short");
  DCR_EXPECT_CODE(twin::scatter_gaps<W>(ok, 0, 2, gaps, val), offset_out_of_range,
                  "twin: gap buffer too short");
  std::uint64_t out[3];
  DCR_EXPECT_CODE(dcr::gpu::decode_gaps(0, 1, gaps.data(), 3, 3, out, ws), offset_out_of_range,
                  "decode: long buffer");

  DCR_EXPECT_CODE(dcr::gpu::scatter_run(ok, 62, val.data(), 3), index_out_of_range,
                  "run past the end");
  DCR_EXPECT_CODE(twin::scatter_run<W>(ok, 62, val), index_out_of_range, "twin: run past the end");
  DCR_EXPECT_CODE(dcr::gpu::scatter_run(ok, ~0ull, val.data(), 3), index_out_of_range,
                  "run start wraps");

  if (dcr::gpu::device_count() == 0) {
    // Valid arguments and no device: a typed device error, never a crash or a pass.
    DCR_EXPECT_CODE(dcr::gpu::scatter(ok, loc.data(), val.data(), 3), device, "no device: scatter");
    DCR_EXPECT_CODE(dcr::gpu::scatter_run(ok, 0, val.data(), 3), device, "no device: run");
    DCR_EXPECT_CODE(
        dcr::gpu::scatter_gaps(ok, 1, 1, gaps.data(), 2, val.data(), 3, scatter_op::overwrite, ws),
        device, "no device: gaps");
    // The twin still works and is checked against a naive loop.
    std::vector<W> ref = store;
    for (std::size_t k = 0; k < loc.size(); ++k) ref[loc[k]] = static_cast<W>(ref[loc[k]] ^ val[k]);
    DCR_EXPECT(twin::xor_scatter<W>(ok, loc, val).ok() && same_bytes(store, ref),
               "twin xor_scatter");
  }
}

template <twin::word W>
void run_case(const dst_case& c, double density, scatter_op op, std::uint64_t seed,
              dcr::gpu::workspace& ws) {
  const auto size = static_cast<std::uint64_t>(c.shape.size());
  const auto init = random_words<W>(c.storage, seed);
  const auto loc = random_locations(size, density, seed + 1);
  const auto val = random_words<W>(loc.size(), seed + 2);
  const std::string what = c.name + " W=" + std::to_string(sizeof(W)) +
                           " density=" + std::to_string(density) +
                           (op == scatter_op::xor_mask ? " xor"
                            : op == scatter_op::add    ? " add"
                                                       : " overwrite");

  dbuf<W> d_store(init);
  dbuf<std::uint64_t> d_loc(loc);
  dbuf<W> d_val(val);
  const twin::view<W> dv{d_store.get() + c.base, c.shape};

  // Decoded locations.
  {
    auto host = init;
    const twin::view<W> hv{host.data() + c.base, c.shape};
    const status hs = twin::scatter<W>(hv, loc, val, op);
    const status ds = dcr::gpu::scatter(dv, d_loc.get(), d_val.get(), loc.size(), op, ws);
    DCR_EXPECT(hs.ok() && ds.ok(), what + ": decoded status " + hs.message + ds.message);
    DCR_EXPECT(dcr::gpu::synchronize().ok(), what + ": sync");
    DCR_EXPECT(same_bytes(d_store.download(), host), what + ": decoded bytes");
  }
  // The named add scatter: device and twin, and the twin adds the zigzag
  // differences modulo 2^w (checked against plain arithmetic here).
  if (op == scatter_op::add) {
    d_store.upload(init);
    auto host = init;
    const twin::view<W> hv{host.data() + c.base, c.shape};
    const status hs = twin::add_scatter<W>(hv, loc, val);
    const status ds = dcr::gpu::add_scatter(dv, d_loc.get(), d_val.get(), loc.size(), ws);
    DCR_EXPECT(hs.ok() && ds.ok(), what + ": add_scatter status " + hs.message + ds.message);
    DCR_EXPECT(dcr::gpu::synchronize().ok() && same_bytes(d_store.download(), host),
               what + ": add_scatter bytes");
    for (std::size_t k = 0; k < loc.size(); ++k) {
      const W before =
          twin::view<const W>{init.data() + c.base, c.shape}.at(static_cast<std::int64_t>(loc[k]));
      const W v = val[k];
      const W d = static_cast<W>((v >> 1) ^ static_cast<W>(0u - (v & 1u)));
      if (hv.at(static_cast<std::int64_t>(loc[k])) != static_cast<W>(before + d)) {
        DCR_EXPECT(false, what + ": add_scatter is not resident + unzigzag(value)");
        break;
      }
    }
  }
  // Fused gap decode, minimal width and the widest width.
  for (unsigned width : {max_gap_width(loc), 8u}) {
    d_store.upload(init);
    auto host = init;
    const twin::view<W> hv{host.data() + c.base, c.shape};
    const auto gaps = gaps_of(loc, width);
    dbuf<std::uint8_t> d_gaps(gaps);
    const std::uint64_t first = loc.empty() ? 0 : loc[0];
    const status hs = twin::scatter_gaps<W>(hv, first, width, gaps, val, op);
    const status ds = dcr::gpu::scatter_gaps(dv, first, width, d_gaps.get(), gaps.size(),
                                             d_val.get(), loc.size(), op, ws);
    DCR_EXPECT(hs.ok() && ds.ok(), what + ": gaps status " + hs.message + ds.message);
    DCR_EXPECT(same_bytes(d_store.download(), host),
               what + ": gaps bytes, width " + std::to_string(width));
    // The decoded locations equal the input list.
    dbuf<std::uint64_t> d_dec(loc.size());
    DCR_EXPECT(
        dcr::gpu::decode_gaps(first, width, d_gaps.get(), gaps.size(), loc.size(), d_dec.get(), ws)
                .ok() &&
            dcr::gpu::synchronize().ok() && d_dec.download() == loc,
        what + ": decode_gaps");
  }
  // A run covering `density` of the view from a third of the way in.
  {
    d_store.upload(init);
    auto host = init;
    const twin::view<W> hv{host.data() + c.base, c.shape};
    const std::uint64_t start = size / 3;
    const std::uint64_t count = std::min<std::uint64_t>(
        size - start, static_cast<std::uint64_t>(density * static_cast<double>(size) + 0.5));
    const auto rv = random_words<W>(count, seed + 3);
    dbuf<W> d_rv(rv);
    const status hs = twin::scatter_run<W>(hv, start, rv, op);
    const status ds = dcr::gpu::scatter_run(dv, start, d_rv.get(), count, op);
    DCR_EXPECT(hs.ok() && ds.ok(), what + ": run status " + hs.message + ds.message);
    DCR_EXPECT(dcr::gpu::synchronize().ok() && same_bytes(d_store.download(), host),
               what + ": run bytes");
  }
}

// Bad location lists fail with the twin's code and message; nothing is written.
template <twin::word W>
void device_failure_checks(dcr::gpu::workspace& ws) {
  const std::uint64_t n = 1000;
  const auto init = random_words<W>(n, 99);
  dbuf<W> d_store(init);
  const twin::view<W> dv{d_store.get(), twin::linear(n)};
  std::vector<W> host = init;
  const twin::view<W> hv{host.data(), twin::linear(n)};
  auto loc = random_locations(n, 0.05, 5);
  const auto val = random_words<W>(loc.size(), 6);
  dbuf<W> d_val(val);

  auto expect_same_failure = [&](const std::vector<std::uint64_t>& bad, errc code,
                                 const char* what) {
    dbuf<std::uint64_t> d_bad(bad);
    const status hs = twin::scatter<W>(hv, bad, val, scatter_op::xor_mask);
    const status ds =
        dcr::gpu::scatter(dv, d_bad.get(), d_val.get(), bad.size(), scatter_op::xor_mask, ws);
    DCR_EXPECT(hs.code == code && ds.code == code && hs.message == ds.message,
               std::string(what) + ": twin '" + hs.message + "' device '" + ds.message + "'");
    DCR_EXPECT(same_bytes(d_store.download(), init) && same_bytes(host, init),
               std::string(what) + ": untouched");
  };
  auto bad = loc;
  bad[5] = n + 3;
  expect_same_failure(bad, errc::index_out_of_range, "out of range");
  bad = loc;
  bad[7] = bad[6];
  bad[30] = bad[29] - 1;
  expect_same_failure(bad, errc::not_increasing, "duplicate then decrease");

  // Gap words that wrap the 64-bit sum, or step past the end.
  for (std::uint64_t gap : {~0ull, ~0ull - 1, 2000ull}) {
    std::vector<std::uint64_t> l3 = {1, 2, 3};
    auto gaps = gaps_of(l3, 8);
    for (unsigned b = 0; b < 8; ++b) gaps[8 + b] = static_cast<std::uint8_t>(gap >> (8 * b));
    dbuf<std::uint8_t> d_gaps(gaps);
    const std::vector<W> v3 = {1, 2, 3};
    dbuf<W> d_v3(v3);
    const status hs = twin::scatter_gaps<W>(hv, 1, 8, gaps, v3, scatter_op::xor_mask);
    const status ds = dcr::gpu::scatter_gaps(dv, 1, 8, d_gaps.get(), gaps.size(), d_v3.get(), 3,
                                             scatter_op::xor_mask, ws);
    const errc want = gap == 2000 ? errc::index_out_of_range : errc::not_increasing;
    DCR_EXPECT(hs.code == want && ds.code == want && hs.message == ds.message,
               "gap " + std::to_string(gap) + ": twin '" + hs.message + "' device '" + ds.message +
                   "'");
    DCR_EXPECT(same_bytes(d_store.download(), init), "gap failure leaves the view untouched");
  }
  // Host memory is refused as a destination.
  DCR_EXPECT_CODE(
      dcr::gpu::scatter(hv, loc.data(), d_val.get(), loc.size(), scatter_op::xor_mask, ws),
      invalid_argument, "host destination");
}

// Whole items (indices + little-endian values) through the upload path.
void item_checks(dcr::gpu::workspace& ws) {
  for (auto enc : {value_encoding::xor_mask, value_encoding::overwrite}) {
    item it;
    it.tensor = {"model.layers.0.self_attn.q_proj.weight", {300, 77}, dtype_id::bf16};
    it.encoding = enc;
    it.indices = random_locations(300 * 77, 0.05, 41);
    const auto w = random_words<std::uint16_t>(it.indices.size(), 42);
    for (auto x : w)
      it.values.push_back(std::byte(x & 0xFF)), it.values.push_back(std::byte(x >> 8));
    const auto init = random_words<std::uint16_t>(300 * 77, 43);
    auto host = init;
    // A transposed storage view with the canonical extents.
    const auto l = twin::to_device(strided_layout::row_major({77, 300}).transposed(0, 1));
    DCR_EXPECT(twin::scatter_item<std::uint16_t>({host.data(), l}, it).ok(), "item twin");
    dbuf<std::uint16_t> d(init);
    const status s = dcr::gpu::scatter_item<std::uint16_t>({d.get(), l}, it, ws);
    DCR_EXPECT(s.ok() && same_bytes(d.download(), host), "item bytes: " + s.message);
    item bad = it;
    bad.tensor.dtype = dtype_id::f32;
    DCR_EXPECT_CODE(dcr::gpu::scatter_item<std::uint16_t>({d.get(), l}, bad, ws), bad_dtype,
                    "item dtype");
  }
}

// More than 2^31 elements: 64-bit locations and grid-stride indices.
void large_case(dcr::gpu::workspace& ws) {
  const std::uint64_t n = (1ull << 31) + 13;
  const std::size_t need = 2 * n + (64ull << 20) + (1ull << 30);
  if (free_device_bytes() < need) {
    std::printf("large case (2^31+13 u8 elements) not run: %zu bytes free, %zu needed\n",
                free_device_bytes(), need);
    return;
  }
  const auto init = random_words<std::uint8_t>(n, 7);
  const auto loc = random_locations(n, 0.001, 8);
  const auto val = random_words<std::uint8_t>(loc.size(), 9);
  auto host = init;
  const twin::view<std::uint8_t> hv{host.data(), twin::linear(static_cast<std::int64_t>(n))};
  DCR_EXPECT(twin::xor_scatter<std::uint8_t>(hv, loc, val).ok(), "large: twin");
  {
    dbuf<std::uint8_t> d_store(init);
    dbuf<std::uint8_t> d_val(val);
    const auto gaps = gaps_of(loc, max_gap_width(loc));
    dbuf<std::uint8_t> d_gaps(gaps);
    const twin::view<std::uint8_t> dv{d_store.get(), hv.shape};
    DCR_EXPECT(dcr::gpu::scatter_gaps(dv, loc[0], max_gap_width(loc), d_gaps.get(), gaps.size(),
                                      d_val.get(), loc.size(), scatter_op::xor_mask, ws)
                       .ok() &&
                   dcr::gpu::synchronize().ok(),
               "large: fused gaps");
    DCR_EXPECT(same_bytes(d_store.download(), host), "large: fused gap bytes");
  }
  {
    // A run over the whole view: k passes 2^31 inside one launch.
    const auto rv = random_words<std::uint8_t>(n, 10);
    auto h2 = init;
    DCR_EXPECT(
        twin::scatter_run<std::uint8_t>({h2.data(), hv.shape}, 0, rv, scatter_op::xor_mask).ok(),
        "large run twin");
    dbuf<std::uint8_t> d_store(init);
    dbuf<std::uint8_t> d_rv(rv);
    DCR_EXPECT(
        dcr::gpu::scatter_run<std::uint8_t>({d_store.get(), hv.shape}, 0, d_rv.get(), n).ok() &&
            dcr::gpu::synchronize().ok() && same_bytes(d_store.download(), h2),
        "large: run bytes");
  }
}

} // namespace

int main() {
  host_side_checks<std::uint8_t>();
  host_side_checks<std::uint16_t>();
  host_side_checks<std::uint32_t>();
  skip_without_device("test_scatter");

  dcr::gpu::workspace ws;
  std::uint64_t seed = 1;
  for (const auto& c : destinations())
    for (double d : densities)
      for (auto op : {scatter_op::xor_mask, scatter_op::overwrite, scatter_op::add}) {
        run_case<std::uint8_t>(c, d, op, seed++, ws);
        run_case<std::uint16_t>(c, d, op, seed++, ws);
        run_case<std::uint32_t>(c, d, op, seed++, ws);
      }
  device_failure_checks<std::uint8_t>(ws);
  device_failure_checks<std::uint16_t>(ws);
  device_failure_checks<std::uint32_t>(ws);
  item_checks(ws);
  large_case(ws);
  return finish("test_scatter");
}
