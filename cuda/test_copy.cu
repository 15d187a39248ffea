// Device copy modes (dense, XOR, add, masked overwrite with placeholder or
// explicit mask) and the device copy sink against the host twin
// dcr/twin/copy.hpp, byte for byte over the whole destination storage.

#include <cstdint>
#include <string>
#include <vector>

#include "dcr/gpu/copy.cuh"
#include "dcr/gpu/loader_sink.cuh"
#include "dcr/twin/copy.hpp"
#include "test_common.cuh"

using namespace dcr;
using namespace dcr::gpu::test;
using twin::copy_mode;

namespace {

/// Source and destination layouts with equal extents over their own storage.
struct pair_case {
  std::string name;
  std::size_t dst_storage, src_storage;
  std::int64_t dst_base, src_base;
  twin::layout dst, src;
};

std::vector<pair_case> pairs() {
  std::vector<pair_case> out;
  for (std::uint64_t n : {0ull, 1ull, 7ull, 1000003ull, 1000000ull}) {
    const auto l = twin::linear(static_cast<std::int64_t>(n));
    out.push_back({"linear " + std::to_string(n), n, n, 0, 0, l, l});
  }
  // Contiguous but misaligned for 16-byte chunks: the strided path must agree.
  out.push_back({"linear 4099 offset 1", 4100, 4100, 1, 1, twin::linear(4099), twin::linear(4099)});
  {
    const auto t = twin::to_device(strided_layout::row_major({517, 1001}).transposed(0, 1));
    out.push_back({"dst transposed", 517 * 1001, 517 * 1001, 0, 0, t,
                   twin::to_device(strided_layout::row_major({1001, 517}))});
  }
  {
    std::int64_t db = 0;
    const auto d = strided_layout::row_major({6, 40, 33}).slice(1, 5, 30, db);
    const auto s = strided_layout::row_major({33, 30, 6}).transposed(0, 2);
    out.push_back({"sliced dst, transposed src", 6 * 40 * 33, 33 * 30 * 6, db, 0,
                   twin::to_device(d), twin::to_device(s)});
  }
  return out;
}

/// Source words: `density` of them are values, the rest the placeholder.
template <class W>
std::vector<W> scratch_words(std::size_t n, double density, W placeholder, std::uint64_t seed) {
  auto v = random_words<W>(n, seed);
  for (auto& w : v)
    if (w == placeholder) w = static_cast<W>(w ^ 1);
  std::vector<W> s(n, placeholder);
  for (auto i : random_locations(n, density, seed + 1)) s[i] = v[i];
  return s;
}

/// Dtype whose NaN patterns the NaN mode uses for words of W.
template <class W>
dtype_id nan_dtype_for() {
  if constexpr (sizeof(W) == 1)
    return dtype_id::f8e4m3fn;
  else if constexpr (sizeof(W) == 2)
    return dtype_id::bf16;
  else
    return dtype_id::f32;
}

/// Source for the NaN mode: active words are not NaN, inactive ones are NaN
/// patterns with random sign and payload.
template <class W>
std::vector<W> nan_scratch(std::size_t n, double density, std::uint64_t seed) {
  const auto r = twin::nan_rule_of(nan_dtype_for<W>());
  auto v = random_words<W>(n, seed);
  std::vector<bool> act(n);
  for (auto i : random_locations(n, density, seed + 1)) act[i] = true;
  for (std::size_t i = 0; i < n; ++i) {
    if (act[i]) {
      while (twin::is_nan_by(v[i], r)) v[i] = static_cast<W>(v[i] + 1);
    } else {
      std::uint64_t w = v[i] | r.exponent;
      if ((w & r.mantissa) == 0) w |= 1;
      v[i] = static_cast<W>(w);
    }
  }
  return v;
}

template <twin::word W>
void host_side_checks() {
  std::vector<W> a(64), b(64);
  const twin::view<W> da{a.data(), twin::linear(64)};
  const twin::view<const W> sb{b.data(), twin::linear(64)};
  const twin::view<const W> s32{b.data(), twin::linear(32)};
  DCR_EXPECT_CODE(dcr::gpu::copy<W>(da, s32, copy_mode::dense), shape_mismatch, "extents differ");
  DCR_EXPECT_CODE(twin::copy<W>(da, s32, copy_mode::dense), shape_mismatch, "twin: extents differ");
  const twin::view<const W> overlap{a.data() + 10, twin::linear(64)};
  DCR_EXPECT_CODE(dcr::gpu::copy<W>(da, overlap, copy_mode::xor_mask), invalid_argument, "overlap");
  DCR_EXPECT_CODE(twin::copy<W>(da, overlap, copy_mode::xor_mask), invalid_argument,
                  "twin: overlap");
  DCR_EXPECT_CODE(dcr::gpu::copy<W>(da, sb, static_cast<copy_mode>(9)), invalid_argument,
                  "bad mode");
  DCR_EXPECT_CODE(twin::copy<W>(da, sb, static_cast<copy_mode>(9)), invalid_argument,
                  "twin: bad mode");
  std::vector<std::uint8_t> m(32);
  const twin::view<const std::uint8_t> m32{m.data(), twin::linear(32)};
  DCR_EXPECT_CODE(dcr::gpu::masked_overwrite<W>(da, sb, m32), shape_mismatch, "mask extents");
  DCR_EXPECT_CODE(twin::masked_overwrite<W>(da, sb, m32), shape_mismatch, "twin: mask extents");
  DCR_EXPECT_CODE(dcr::gpu::masked_overwrite<W>(
                      da, sb, twin::view<const std::uint8_t>{nullptr, twin::linear(64)}),
                  invalid_argument, "null mask");
  dcr::gpu::device_copy_sink sink(copy_mode::overwrite, 0x1FF);
  const dcr::gpu::device_tensor t1{a.data(), 1, twin::linear(64)},
      t2{b.data(), 2, twin::linear(32)};
  DCR_EXPECT_CODE(sink.copy(t2, t1), bad_dtype, "sink: widths differ");
  DCR_EXPECT_CODE(sink.copy({a.data(), 3, twin::linear(1)}, {b.data(), 3, twin::linear(1)}),
                  bad_dtype, "sink: width 3");
  DCR_EXPECT_CODE(sink.copy(t1, {b.data(), 1, twin::linear(64)}), invalid_argument,
                  "sink: placeholder too wide");
  DCR_EXPECT(sink.copies() == 0, "failed copies are not counted");
  DCR_EXPECT_CODE(
      dcr::gpu::copy<W>(da, sb, copy_mode::overwrite_nan, W{0}, {},
                        dtype_id::f32 == nan_dtype_for<W>() ? dtype_id::bf16 : dtype_id::f32),
      bad_dtype, "NaN mode with a dtype of another width");
  DCR_EXPECT_CODE(
      twin::masked_overwrite_nan<W>(da, sb, sizeof(W) == 4 ? dtype_id::bf16 : dtype_id::f32),
      bad_dtype, "twin: NaN mode with a dtype of another width");

  // The loader-facing sink: dtype mismatch is a loader condition; it never throws from copy.
  {
    dcr::gpu::device_loader_sink ls(copy_mode::xor_mask, dtype_id::bf16);
    std::vector<std::byte> p(64), q(64);
    const tensor_view tb{p.data(), dtype_id::bf16, strided_layout::row_major({8})};
    const tensor_view tf{q.data(), dtype_id::f16, strided_layout::row_major({8})};
    ls.copy(tb, tf);
    ls.copy(tb, tb); // not applied after a failure
    ls.skip("model.layers.0.mlp.experts.3.up_proj.weight");
    DCR_EXPECT_CODE(ls.finish(), loader_condition, "loader sink: dtype mismatch");
    DCR_EXPECT(ls.copies() == 0 && ls.skipped().size() == 1, "loader sink counts");
    bool threw = false;
    try {
      dcr::gpu::device_loader_sink bad(copy_mode::overwrite_mask, dtype_id::bf16);
    } catch (const error& e) {
      threw = e.code() == errc::invalid_argument;
    }
    DCR_EXPECT(threw, "loader sink refuses the per-copy mask mode");
    if (dcr::gpu::device_count() == 0) {
      dcr::gpu::device_loader_sink nd(copy_mode::dense, dtype_id::f16);
      nd.copy(tf, {q.data() + 32, dtype_id::f16, strided_layout::row_major({8})});
      DCR_EXPECT_CODE(nd.finish(), device, "no device: loader sink");
    }
  }
  if (dcr::gpu::device_count() == 0) {
    DCR_EXPECT_CODE(dcr::gpu::copy<W>(da, sb, copy_mode::dense), device, "no device: copy");
    DCR_EXPECT_CODE(dcr::gpu::masked_overwrite<W>(da, sb, W{0}), device,
                    "no device: masked overwrite");
  }
}

template <twin::word W>
void run_case(const pair_case& c, double density, std::uint64_t seed) {
  const W ph =
      static_cast<W>(dtype_traits<bf16>::placeholder); // truncated for u8: still a fixed word
  const auto init = random_words<W>(c.dst_storage, seed);
  const auto src = scratch_words<W>(c.src_storage, density, ph, seed + 2);
  std::vector<std::uint8_t> mask(c.src_storage);
  for (auto i : random_locations(c.src_storage, density, seed + 3))
    mask[i] = static_cast<std::uint8_t>(1 + i % 255);
  dbuf<W> d_dst(init);
  dbuf<W> d_src(src);
  dbuf<std::uint8_t> d_mask(mask);
  const std::string what =
      c.name + " W=" + std::to_string(sizeof(W)) + " density=" + std::to_string(density);
  for (auto mode : {copy_mode::dense, copy_mode::xor_mask, copy_mode::overwrite,
                    copy_mode::overwrite_mask, copy_mode::add}) {
    d_dst.upload(init);
    auto host = init;
    const twin::view<W> hd{host.data() + c.dst_base, c.dst};
    const twin::view<const W> hs{src.data() + c.src_base, c.src};
    const twin::view<const std::uint8_t> hm{mask.data() + c.src_base, c.src};
    const twin::view<W> dd{d_dst.get() + c.dst_base, c.dst};
    const twin::view<const W> ds{d_src.get() + c.src_base, c.src};
    const twin::view<const std::uint8_t> dm{d_mask.get() + c.src_base, c.src};
    const status h = twin::copy<W>(hd, hs, mode, ph, hm, nan_dtype_for<W>());
    const status d = dcr::gpu::copy<W>(dd, ds, mode, ph, dm, nan_dtype_for<W>());
    const std::string m = what + " mode " + std::to_string(static_cast<int>(mode));
    DCR_EXPECT(h.ok() && d.ok(), m + ": status " + h.message + d.message);
    DCR_EXPECT(dcr::gpu::synchronize().ok() && same_bytes(d_dst.download(), host), m + ": bytes");
  }
  // NaN mode over a source whose inactive words are NaN patterns.
  {
    const auto ns = nan_scratch<W>(c.src_storage, density, seed + 4);
    dbuf<W> d_ns(ns);
    d_dst.upload(init);
    auto host = init;
    const status h = twin::masked_overwrite_nan<W>(
        {host.data() + c.dst_base, c.dst}, {ns.data() + c.src_base, c.src}, nan_dtype_for<W>());
    const status d = dcr::gpu::masked_overwrite_nan<W>(
        {d_dst.get() + c.dst_base, c.dst}, {d_ns.get() + c.src_base, c.src}, nan_dtype_for<W>());
    DCR_EXPECT(h.ok() && d.ok() && dcr::gpu::synchronize().ok() &&
                   same_bytes(d_dst.download(), host),
               what + ": NaN mode " + h.message + d.message);
  }
  // The sink in overwrite mode does what masked_overwrite does.
  {
    d_dst.upload(init);
    auto host = init;
    DCR_EXPECT(twin::masked_overwrite<W>({host.data() + c.dst_base, c.dst},
                                         {src.data() + c.src_base, c.src}, ph)
                   .ok(),
               what + ": twin masked_overwrite");
    dcr::gpu::device_copy_sink sink(copy_mode::overwrite, ph);
    const status s = sink.copy({d_dst.get() + c.dst_base, sizeof(W), c.dst},
                               {d_src.get() + c.src_base, sizeof(W), c.src});
    DCR_EXPECT(s.ok() && sink.synchronize().ok() && same_bytes(d_dst.download(), host),
               what + ": sink " + s.message);
    DCR_EXPECT(sink.copies() == 1 && sink.elements() == static_cast<std::uint64_t>(c.dst.size()),
               what + ": sink counts");
  }
}

// A loader's copies through the loader-facing sink: two canonical tensors
// fused row-wise into one device parameter, one of them transposed.
void loader_sink_case() {
  const std::uint64_t rows = 300, cols = 257;
  const auto init = random_words<std::uint16_t>(2 * rows * cols, 31);
  const auto a = random_words<std::uint16_t>(rows * cols, 32);
  const auto b = random_words<std::uint16_t>(rows * cols, 33);
  for (auto mode : {copy_mode::dense, copy_mode::xor_mask, copy_mode::overwrite,
                    copy_mode::overwrite_nan, copy_mode::add}) {
    dbuf<std::uint16_t> d_param(init), d_a(a), d_b(b);
    auto host = init;
    auto as_bytes = [](std::uint16_t* p) { return reinterpret_cast<std::byte*>(p); };
    const tensor_view pd{as_bytes(d_param.get()), dtype_id::bf16,
                         strided_layout::row_major({2 * rows, cols})};
    const tensor_view ph{as_bytes(host.data()), dtype_id::bf16,
                         strided_layout::row_major({2 * rows, cols})};
    const tensor_view ad{as_bytes(d_a.get()), dtype_id::bf16,
                         strided_layout::row_major({rows, cols})};
    const tensor_view bd{as_bytes(d_b.get()), dtype_id::bf16,
                         strided_layout::row_major({cols, rows}).transposed(0, 1)};
    dcr::gpu::device_loader_sink sink(mode, dtype_id::bf16);
    sink.copy(pd.slice(0, 0, static_cast<std::int64_t>(rows)), ad);
    sink.copy(pd.slice(0, static_cast<std::int64_t>(rows), static_cast<std::int64_t>(rows)), bd);
    const status s = sink.finish();
    DCR_EXPECT(s.ok() && sink.copies() == 2 && sink.elements() == 2 * rows * cols,
               "loader sink: " + s.message);
    const std::uint16_t phw = dtype_traits<bf16>::placeholder;
    auto twin = [&](const tensor_view& dst, const std::vector<std::uint16_t>& src,
                    const strided_layout& sl) {
      return twin::copy<std::uint16_t>(twin::to_device_as<std::uint16_t>(dst),
                                       {src.data(), twin::to_device(sl)}, mode, phw, {},
                                       dtype_id::bf16);
    };
    DCR_EXPECT(
        twin(ph.slice(0, 0, static_cast<std::int64_t>(rows)), a, ad.layout).ok() &&
            twin(ph.slice(0, static_cast<std::int64_t>(rows), static_cast<std::int64_t>(rows)), b,
                 bd.layout)
                .ok(),
        "loader sink twin");
    DCR_EXPECT(same_bytes(d_param.download(), host),
               "loader sink bytes, mode " + std::to_string(static_cast<int>(mode)));
  }
}

void large_case() {
  const std::uint64_t n = (1ull << 31) + 13;
  const std::size_t need = 2 * n + (1ull << 30);
  if (free_device_bytes() < need) {
    std::printf("large case (2^31+13 u8 elements) not run: %zu bytes free, %zu needed\n",
                free_device_bytes(), need);
    return;
  }
  const auto init = random_words<std::uint8_t>(n, 21);
  const auto src = scratch_words<std::uint8_t>(n, 0.01, 0xC0, 22);
  auto host = init;
  const auto l = twin::linear(static_cast<std::int64_t>(n));
  DCR_EXPECT(twin::masked_overwrite<std::uint8_t>({host.data(), l}, {src.data(), l}, 0xC0).ok(),
             "large twin");
  dbuf<std::uint8_t> d_dst(init);
  dbuf<std::uint8_t> d_src(src);
  DCR_EXPECT(
      dcr::gpu::masked_overwrite<std::uint8_t>({d_dst.get(), l}, {d_src.get(), l}, 0xC0).ok() &&
          dcr::gpu::synchronize().ok() && same_bytes(d_dst.download(), host),
      "large: masked overwrite bytes");
  // The strided kernel with offsets up to 2^31: a padded 2D view over the same buffers.
  const std::int64_t rows = 1 << 16, cols = static_cast<std::int64_t>(n / (1 << 16)) - 1;
  const std::int64_t ext[2] = {rows, cols}, str[2] = {cols + 1, 1};
  const auto sl = twin::strided(ext, str, 2);
  d_dst.upload(init);
  host = init;
  DCR_EXPECT(twin::masked_overwrite<std::uint8_t>(
                 {host.data(), sl}, {src.data() + n - sl.required_span_size(), sl}, 0xC0)
                 .ok(),
             "large strided twin");
  DCR_EXPECT(dcr::gpu::masked_overwrite<std::uint8_t>(
                 {d_dst.get(), sl}, {d_src.get() + n - sl.required_span_size(), sl}, 0xC0)
                     .ok() &&
                 dcr::gpu::synchronize().ok() && same_bytes(d_dst.download(), host),
             "large: strided masked overwrite bytes");
}

} // namespace

int main() {
  host_side_checks<std::uint8_t>();
  host_side_checks<std::uint16_t>();
  host_side_checks<std::uint32_t>();
  skip_without_device("test_copy");
  std::uint64_t seed = 100;
  for (const auto& c : pairs())
    for (double d : densities) {
      run_case<std::uint8_t>(c, d, seed++);
      run_case<std::uint16_t>(c, d, seed++);
      run_case<std::uint32_t>(c, d, seed++);
    }
  loader_sink_case();
  large_case();
  return finish("test_copy");
}
