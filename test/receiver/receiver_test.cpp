// Receiver: view maps, prewarm plans and rejections, dense refit, item
// apply (XOR / overwrite / NaN values), apply-time loader violations,
// post-apply checks and digests.
#include <doctest/doctest.h>

#include <cstring>
#include <random>
#include <set>

#include "dcr/loaders/cast_transpose.hpp"
#include "dcr/loaders/vllm_style.hpp"
#include "dcr/receiver/receiver.hpp"
#include "dcr/receiver/view_map.hpp"
#include "dcr/twin/device_sink.hpp"
#include "receiver/refit_check.hpp"
#include "receiver/workload.hpp"

using namespace dcr;
using dcr::test::delta_mode;

namespace {

// Small random views over a row-major parent: slices along random dims and
// random transposes.
struct random_view {
  strided_layout parent;
  strided_layout view;
  std::int64_t base = 0;
};

random_view make_random_view(std::mt19937_64& rng) {
  const std::size_t rank = 1 + rng() % 3;
  std::vector<std::uint64_t> shape;
  for (std::size_t i = 0; i < rank; ++i) shape.push_back(1 + rng() % 5);
  random_view v;
  v.parent = strided_layout::row_major(shape);
  v.view = v.parent;
  for (std::size_t d = 0; d < rank; ++d) {
    const auto e = v.view.extents[d];
    const auto start = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(e));
    const auto count = 1 + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(e - start));
    v.view = v.view.slice(d, start, count, v.base);
  }
  if (rank > 1 && rng() % 2) v.view = v.view.transposed(0, rank - 1);
  return v;
}

} // namespace

TEST_CASE("view_inverse maps exactly the offsets a unique view reaches") {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 400; ++trial) {
    auto v = make_random_view(rng);
    REQUIRE(v.view.is_unique());
    // Destination: a row-major buffer of the view's extents, shifted by 3.
    strided_layout dst = v.view;
    std::int64_t s = 1;
    for (std::size_t i = dst.rank; i-- > 0;) {
      dst.strides[i] = s;
      s *= dst.extents[i];
    }
    auto inv = view_inverse::make(v.view, v.base, dst, 3);
    std::vector<std::int64_t> expect(static_cast<std::size_t>(v.parent.size()), -1);
    for_each_offset_pair(dst, v.view, [&](std::int64_t d, std::int64_t o) {
      expect[static_cast<std::size_t>(v.base + o)] = 3 + d;
    });
    for (std::int64_t o = -2; o < v.parent.size() + 2; ++o) {
      const auto want = (o >= 0 && o < v.parent.size()) ? expect[static_cast<std::size_t>(o)] : -1;
      REQUIRE(inv.map(o) == want);
    }
  }
}

TEST_CASE("view_inverse::for_each_sorted and map_sorted agree with map on sorted offsets") {
  std::mt19937_64 rng(17);
  for (int trial = 0; trial < 400; ++trial) {
    auto v = make_random_view(rng);
    strided_layout dst = v.view;
    if (dst.rank > 1 && rng() % 2) { // a transposed destination
      dst = strided_layout::row_major({static_cast<std::uint64_t>(v.view.extents[1]),
                                       static_cast<std::uint64_t>(v.view.extents[0])});
      dst = dst.transposed(0, 1);
      if (dst.rank > 2) dst = v.view;
    }
    if (!same_extents(dst, v.view)) dst = v.view;
    auto inv = view_inverse::make(v.view, v.base, dst, 5);
    std::vector<std::uint64_t> idx;
    for (std::int64_t o = 0; o < v.parent.size(); ++o)
      if (rng() % 3 == 0) idx.push_back(static_cast<std::uint64_t>(o));
    std::vector<std::pair<std::size_t, std::int64_t>> got, want;
    inv.for_each_sorted(idx.data(), idx.size(),
                        [&](std::size_t j, std::int64_t e) { got.emplace_back(j, e); });
    for (std::size_t j = 0; j < idx.size(); ++j)
      if (auto e = inv.map(static_cast<std::int64_t>(idx[j])); e >= 0) want.emplace_back(j, e);
    REQUIRE(got == want);
    // The blocks of map_sorted, at small capacities: resuming at block
    // boundaries visits the same entries.
    const std::size_t cap = 1 + rng() % 5;
    std::vector<std::size_t> js(cap);
    std::vector<std::int64_t> es(cap);
    std::vector<std::pair<std::size_t, std::int64_t>> blocks;
    for (std::size_t from = 0; from < idx.size();) {
      const auto before = from;
      const auto m = inv.map_sorted(idx.data(), idx.size(), from, js.data(), es.data(), cap);
      REQUIRE(m <= cap);
      REQUIRE(from > before);
      REQUIRE((m > 0 || from == idx.size()));
      for (std::size_t k = 0; k < m; ++k) blocks.emplace_back(js[k], es[k]);
    }
    REQUIRE(blocks == want);
  }
}

TEST_CASE("for_each_offset_pair enumerates coordinates in row-major order") {
  std::mt19937_64 rng(8);
  for (int trial = 0; trial < 200; ++trial) {
    auto v = make_random_view(rng);
    std::vector<std::int64_t> seen;
    for_each_offset_pair(v.view, v.view, [&](std::int64_t d, std::int64_t s) {
      CHECK(d == s);
      seen.push_back(d);
    });
    REQUIRE(static_cast<std::int64_t>(seen.size()) == v.view.size());
    for (std::int64_t k = 0; k < v.view.size(); ++k)
      CHECK(seen[static_cast<std::size_t>(k)] == v.view.offset_of_linear(k));
  }
}

TEST_CASE("strided_copy equals an elementwise copy for every width") {
  std::mt19937_64 rng(9);
  for (auto dt : {dtype_id::bf16, dtype_id::f32, dtype_id::f8e4m3fn}) {
    for (int trial = 0; trial < 100; ++trial) {
      auto v = make_random_view(rng);
      const auto w = width_of(dt);
      std::vector<std::byte> src(static_cast<std::size_t>(v.parent.size()) * w), a(src.size()),
          b(src.size());
      for (auto& x : src) x = static_cast<std::byte>(rng());
      auto dstl = rng() % 2 ? v.view : v.parent; // parent only when extents agree
      if (!same_extents(dstl, v.view)) dstl = v.view;
      tensor_view S{src.data() + v.base * static_cast<std::int64_t>(w), dt, v.view};
      tensor_view D{a.data() + v.base * static_cast<std::int64_t>(w), dt, dstl};
      strided_copy(D, S);
      for (std::int64_t k = 0; k < v.view.size(); ++k) {
        const auto so = (v.base + v.view.offset_of_linear(k)) * static_cast<std::int64_t>(w);
        const auto dof = (v.base + dstl.offset_of_linear(k)) * static_cast<std::int64_t>(w);
        std::memcpy(b.data() + dof, src.data() + so, w);
      }
      REQUIRE(a == b);
    }
  }
}

TEST_CASE("prewarm of the vLLM-style loader: direct, XOR-allowed plans and explicit skips") {
  auto c = tiny_qwen3_moe();
  auto metas = canonical_tensors(c);
  // TP 2, DP 2, expert parallel: 4 EP ranks of 2 experts each; rank (dp 1, tp 1) is EP rank 3.
  loaders::vllm_style_loader l(
      c, loaders::vllm_layout::of_rank(test::vllm_deployment(2, 1, 2, true), 3));
  receiver<loaders::vllm_style_loader> r(l, metas);
  std::size_t skipped = 0;
  for (auto& tp : r.plan().tensors) {
    if (tp.skipped) {
      ++skipped;
      CHECK(tp.meta.name.find(".experts.") != std::string::npos);
      continue;
    }
    CHECK(tp.direct);
    CHECK(tp.xor_allowed);
    CHECK(!tp.self_overlap);
  }
  CHECK(l.moe_parallel().ep_size == 4);
  CHECK(l.moe_parallel().ep_rank == 3);
  CHECK(skipped ==
        c.layers * (c.experts - c.experts / 4) * 3); // three quarters live on other EP ranks
  std::uint64_t largest = 0;
  for (auto& m : metas) largest = std::max(largest, m.nbytes());
  CHECK(r.scratch_bytes() == largest);
}

TEST_CASE("prewarm of the cast/transpose loader: casts are overwrite-only, transposes stay XOR") {
  auto c = tiny_llama();
  auto metas = canonical_tensors(c);
  receiver<loaders::cast_transpose_loader> r(loaders::cast_transpose_loader(c), metas);
  for (auto& tp : r.plan().tensors) {
    const bool cast =
        tp.meta.name.find("norm") != std::string::npos || tp.meta.name == "lm_head.weight";
    INFO(tp.meta.name);
    CHECK(tp.direct == !cast);
    CHECK(r.xor_allowed(tp.meta.name) == !cast);
  }
  CHECK(r.storage()[*r.storage().index_of("lm_head.weight")].meta.dtype == dtype_id::f32);
}

TEST_CASE("delta apply equals dense refit: vLLM layouts x modes (unit subset)") {
  std::uint64_t seed = 100;
  for (auto& L : test::refit_layouts()) {
    auto metas = canonical_tensors(L.model);
    auto [v, v1] = test::stressed_versions(metas, seed);
    for (auto mode : {delta_mode::mixed, delta_mode::xor_only, delta_mode::overwrite_only,
                      delta_mode::add_only}) {
      INFO("tp " << L.parallel.tensor_parallel_size << " pp " << L.parallel.pipeline_parallel_size
                 << " dp " << L.parallel.data_parallel_size << " ep "
                 << L.parallel.enable_expert_parallel << " mode " << static_cast<int>(mode));
      auto st = test::check_delta_equals_dense(test::all_ranks(L.model, L.parallel), metas, v, v1,
                                               mode, seed + 2);
      CHECK(st.changed > 0);
      if (mode == delta_mode::overwrite_only) CHECK(st.xor_items == 0);
      if (mode == delta_mode::xor_only) CHECK(st.xor_items == st.items);
      if (mode == delta_mode::add_only) CHECK(st.add_items == st.items);
      if (mode == delta_mode::mixed) CHECK(st.add_items > 0);
    }
    ++seed;
  }
}

TEST_CASE("delta apply equals dense refit with NaN values (placeholder pattern included)") {
  auto c = tiny_llama();
  auto metas = canonical_tensors(c);
  auto [v, v1] = test::nan_versions(metas);
  for (auto mode : {delta_mode::mixed, delta_mode::overwrite_only}) {
    test::check_delta_equals_dense(test::all_ranks(c, test::vllm_deployment(4)), metas, v, v1, mode,
                                   9);
    // Cast paths: NaN values force the two-fill active mask.
    auto st = test::check_delta_equals_dense(std::vector{loaders::cast_transpose_loader(c)}, metas,
                                             v, v1, mode, 10);
    CHECK(st.changed > 0);
  }
}

TEST_CASE("an overwrite item of only NaN values on a cast path") {
  auto c = tiny_llama();
  auto metas = canonical_tensors(c);
  auto v = test::random_model(metas, 11);
  auto v1 = test::clone(v);
  auto& lm = v1.at("lm_head.weight");
  auto* w = test::bf16_words(lm);
  w[0] = 0x7FC0; // the default placeholder itself
  w[17] = 0xFFC0;
  w[lm.meta.numel() - 1] = 0x7F81;
  auto st = test::check_delta_equals_dense(std::vector{loaders::cast_transpose_loader(c)}, metas, v,
                                           v1, delta_mode::overwrite_only, 12, 1);
  CHECK(st.changed == 3);
}

TEST_CASE("item errors are typed") {
  auto c = tiny_llama();
  auto metas = canonical_tensors(c);
  receiver<loaders::cast_transpose_loader> r(loaders::cast_transpose_loader(c), metas);
  item it;
  it.tensor = metas[1];
  it.encoding = value_encoding::overwrite;
  it.indices = {1, 5};
  it.values.resize(4);
  CHECK(r.apply_item(it).ok());
  auto bad = it;
  bad.tensor.name = "nope";
  CHECK(r.apply_item(bad).code == errc::not_found);
  bad = it;
  bad.tensor.dtype = dtype_id::f16;
  CHECK(r.apply_item(bad).code == errc::bad_dtype);
  bad = it;
  bad.tensor.shape = {3};
  CHECK(r.apply_item(bad).code == errc::shape_mismatch);
  bad = it;
  bad.indices = {5, 1};
  CHECK(r.apply_item(bad).code == errc::not_increasing);
  bad = it;
  bad.indices = {1, metas[1].numel()};
  CHECK(r.apply_item(bad).code == errc::index_out_of_range);
  bad = it;
  bad.values.resize(3);
  CHECK(r.apply_item(bad).code == errc::invalid_argument);
  bad = it;
  bad.encoding = static_cast<value_encoding>(9);
  CHECK(r.apply_item(bad).code == errc::bad_encoding);
  bad = it; // XOR through a cast path
  bad.encoding = value_encoding::xor_mask;
  CHECK(r.apply_item(bad).code == errc::unsupported_loader);
  bad.encoding = value_encoding::add; // add reads the resident word too
  const auto s = r.apply_item(bad);
  CHECK(s.code == errc::unsupported_loader);
  CHECK(s.message.find("add item") != std::string::npos);
}

TEST_CASE("an add item applied twice moves storage off target; verify sees it; the overwrite "
          "retry repairs it") {
  auto c = tiny_llama();
  auto metas = canonical_tensors(c);
  auto v = test::random_model(metas, 23);
  auto v1 = test::clone(v);
  test::stress(v1, 0.05, 0.05, 24);
  loaders::vllm_style_loader l(c, loaders::vllm_layout::of_rank(test::vllm_deployment(2), 0));
  auto all = [](const std::string&) { return true; };
  auto items = test::diff_items(v, v1, delta_mode::add_only, all);
  receiver<loaders::vllm_style_loader> r(l, metas), ref(l, metas);
  ref.dense_refit(v1);
  r.dense_refit(v);
  CHECK(r.apply_items(items).ok());
  CHECK(r.state_digest() == ref.state_digest());
  CHECK(r.apply_item(items[0]).ok()); // a duplicate add item: the difference lands twice
  CHECK(r.state_digest() != ref.state_digest());
  auto vs = r.verify(v1);
  CHECK(vs.code == errc::verification);
  CHECK(vs.message.find(items[0].tensor.name) != std::string::npos);
  // Unlike XOR, a second duplicate does not revert it: only an overwrite repairs.
  CHECK(r.apply_item(items[0]).ok());
  CHECK(r.state_digest() != ref.state_digest());
  // Partial failure: only some items of the first attempt landed (and one
  // twice); the overwrite-all retry against the same base version writes
  // every changed element absolutely and equals the dense refit.
  receiver<loaders::vllm_style_loader> partial(l, metas);
  partial.dense_refit(v);
  for (std::size_t i = 0; i < items.size(); i += 2) CHECK(partial.apply_item(items[i]).ok());
  CHECK(partial.apply_item(items[0]).ok());
  CHECK(partial.state_digest() != ref.state_digest());
  for (auto& it : test::diff_items(v, v1, delta_mode::overwrite_only, all))
    CHECK(partial.apply_item(it).ok());
  CHECK(first_difference(partial.storage(), ref.storage()) == "");
  CHECK(partial.state_digest() == ref.state_digest());
  CHECK(partial.verify(v1).ok());
}

TEST_CASE("applying an XOR item twice reverts it; verify and digest see it") {
  auto c = tiny_llama();
  auto metas = canonical_tensors(c);
  auto v = test::random_model(metas, 21);
  auto v1 = test::clone(v);
  test::stress(v1, 0.05, 0.05, 22);
  loaders::vllm_style_loader l(c, loaders::vllm_layout::of_rank(test::vllm_deployment(2), 0));
  auto items =
      test::diff_items(v, v1, delta_mode::xor_only, [](const std::string&) { return true; });
  receiver<loaders::vllm_style_loader> r(l, metas), ref(l, metas);
  ref.dense_refit(v1);
  r.dense_refit(v);
  const auto d0 = r.state_digest();
  CHECK(r.verify(v1).code == errc::verification);
  CHECK(r.apply_items(items).ok());
  CHECK(r.state_digest() == ref.state_digest());
  CHECK(r.verify(v1).ok());
  CHECK(r.verify(v1, 7).ok());
  CHECK(r.apply_item(items[0]).ok()); // a duplicate XOR item...
  CHECK(r.state_digest() != ref.state_digest());
  auto vs = r.verify(v1);
  CHECK(vs.code == errc::verification); // ...is caught by the full check
  CHECK(vs.message.find(items[0].tensor.name) != std::string::npos);
  CHECK(r.apply_item(items[0]).ok());
  CHECK(r.state_digest() == ref.state_digest());
  CHECK(d0 != ref.state_digest());
}

TEST_CASE("dense refit rejects a source that lacks or misshapes a tensor") {
  auto c = tiny_llama();
  auto metas = canonical_tensors(c);
  receiver<loaders::vllm_style_loader> r(loaders::vllm_style_loader(c, {}), metas);
  tensor_set empty;
  CHECK_THROWS_AS(r.dense_refit(empty), error);
  try {
    r.dense_refit(empty);
  } catch (const error& e) {
    CHECK(e.code() == errc::not_found);
  }
  auto v = test::random_model(metas, 1);
  auto m = metas[2];
  m.dtype = dtype_id::f16;
  v.add(host_tensor(m));
  try {
    r.dense_refit(v);
    FAIL("no throw");
  } catch (const error& e) {
    CHECK(e.code() == errc::bad_dtype);
  }
  v.add(host_tensor(metas[2]));
  m = metas[3];
  REQUIRE(m.shape[0] != m.shape[1]);
  m.shape = {m.shape[1], m.shape[0]};
  v.add(host_tensor(m));
  try {
    r.dense_refit(v);
    FAIL("no throw");
  } catch (const error& e) {
    CHECK(e.code() == errc::shape_mismatch);
  }
}

// ---------------------------------------------------------------------------
// Loaders that break loader conditions.

namespace {

std::vector<tensor_meta> two_tensors() {
  return {{"a", {4, 6}, dtype_id::bf16}, {"b", {4, 6}, dtype_id::bf16}};
}

/// Configurable misbehaving loader over two tensors "a" and "b".
struct bad_loader {
  enum what {
    none,
    write_outside,   // writes a parameter directly
    no_copy_no_skip, // forgets "b"
    copy_and_skip,
    wrong_report,
    dtype_change,
    extent_mismatch,
    dst_outside,    // copies into loader memory
    src_in_storage, // copies from a parameter
    cross_overlap,  // a and b write the same parameter elements
    writes_input,
    broadcast_dst,
  } w = none;
  int* apply_mode = nullptr; // changed by tests after prewarm
  std::vector<std::uint16_t> own = std::vector<std::uint16_t>(24);

  void declare(parameter_store& s, std::span<const tensor_meta>) {
    s.add("pa", {4, 6}, dtype_id::bf16);
    s.add("pb", {4, 6}, dtype_id::bf16);
    s.add("pf", {4, 6}, dtype_id::f32);
    s.add("pw", {8, 6}, dtype_id::bf16);
  }
  load_report load(std::string_view name, const tensor_view& src, parameter_store& s,
                   copy_sink& sink) {
    const int m = apply_mode ? *apply_mode : 0;
    const bool is_b = name == "b";
    std::string p = is_b ? "pb" : "pa";
    if (m == 1 && is_b) { // path changes after prewarm: other rows
      sink.copy(s.view(p).slice(0, 0, 2), src.slice(0, 2, 2));
      sink.copy(s.view(p).slice(0, 2, 2), src.slice(0, 0, 2));
      return {{p}};
    }
    if (m == 2 && is_b) { // extra copy
      sink.copy(s.view(p), src);
      sink.copy(s.view(p), src);
      return {{p}};
    }
    if (m == 3 && is_b) { // skips instead
      sink.skip(name);
      return {};
    }
    if (m == 4 && is_b) throw std::runtime_error("loader failure");
    if (m == 5 && is_b) {                 // modifies its input in place
      std::memset(src.data + 6, 0x11, 2); // element 3, an active one in the test item
      sink.copy(s.view(p), src);
      return {{p}};
    }
    if (m == 6 && is_b) { // reports another parameter
      sink.copy(s.view(p), src);
      return {{"pa"}};
    }
    switch (w) {
    case write_outside:
      if (is_b) s.view("pw").data[3] = std::byte{1};
      break;
    case no_copy_no_skip:
      if (is_b) return {};
      break;
    case copy_and_skip:
      if (is_b) sink.skip(name);
      break;
    case wrong_report:
      if (is_b) {
        sink.copy(s.view(p), src);
        return {{"pa"}};
      }
      break;
    case dtype_change:
      if (is_b) {
        sink.copy(s.view("pf"), src);
        return {{"pf"}};
      }
      break;
    case extent_mismatch:
      if (is_b) {
        sink.copy(s.view(p).slice(0, 0, 2), src);
        return {{p}};
      }
      break;
    case dst_outside:
      if (is_b) {
        sink.copy({reinterpret_cast<std::byte*>(own.data()), dtype_id::bf16,
                   strided_layout::row_major({4, 6})},
                  src);
        return {};
      }
      break;
    case src_in_storage:
      if (is_b) {
        sink.copy(s.view(p), s.view("pa"));
        return {{p}};
      }
      break;
    case cross_overlap:
      sink.copy(s.view("pw").slice(0, is_b ? 2 : 0, 4), src);
      return {{"pw"}};
    case writes_input:
      if (is_b) std::memset(src.data, 0x11, 2);
      break;
    case broadcast_dst: {
      if (is_b) {
        auto d = s.view(p);
        d.layout.strides[0] = 0;
        sink.copy(d, src);
        return {{p}};
      }
      break;
    }
    case none:
      break;
    }
    sink.copy(s.view(p), src);
    return {{p}};
  }
};
static_assert(native_loader<bad_loader>);

void expect_rejected(bad_loader::what w, const std::string& needle) {
  INFO("case " << static_cast<int>(w));
  bad_loader l;
  l.w = w;
  try {
    receiver<bad_loader> r(l, two_tensors());
    FAIL("prewarm accepted a bad loader");
  } catch (const error& e) {
    CHECK(e.code() == errc::unsupported_loader);
    CHECK_MESSAGE(std::string(e.what()).find(needle) != std::string::npos, e.what());
  }
}

} // namespace

TEST_CASE("prewarm rejects loader paths that break the loader conditions") {
  expect_rejected(bad_loader::write_outside, "pw was written outside the copy sink");
  expect_rejected(bad_loader::no_copy_no_skip,
                  "tensor b: loader made no copy and declared no skip");
  expect_rejected(bad_loader::copy_and_skip, "tensor b: loader both copied and skipped");
  expect_rejected(bad_loader::wrong_report, "tensor b: parameters reported as loaded differ");
  expect_rejected(bad_loader::dtype_change, "tensor b: copy 0: copy changes dtype");
  expect_rejected(bad_loader::extent_mismatch, "tensor b: copy 0: copy extents differ");
  expect_rejected(bad_loader::dst_outside,
                  "tensor b: copy 0: destination is not inside one parameter");
  expect_rejected(bad_loader::src_in_storage, "tensor b: copy 0: source lies in rank storage");
  expect_rejected(bad_loader::cross_overlap, "tensors a and b both write element");
  expect_rejected(bad_loader::writes_input, "loader wrote into its input tensor");
  expect_rejected(bad_loader::broadcast_dst, "not unique");
  CHECK_NOTHROW(receiver<bad_loader>(bad_loader{}, two_tensors()));
}

TEST_CASE("a loader that leaves its planned path at apply fails with loader_condition") {
  int mode = 0;
  bad_loader l;
  l.apply_mode = &mode;
  receiver<bad_loader> r(l, two_tensors());
  CHECK(r.plan().find("b")->xor_allowed);
  tensor_set v(two_tensors());
  r.dense_refit(v);
  item it;
  it.tensor = two_tensors()[1];
  it.encoding = value_encoding::xor_mask;
  it.indices = {3, 20};
  it.values = {std::byte{1}, std::byte{0}, std::byte{2}, std::byte{0}};
  CHECK(r.apply_item(it).ok());
  // (A loader that writes its input at apply is caught only by the prewarm
  // dry run: direct tensors never read the scratch back.)
  for (int m : {1, 2, 3, 4, 6}) {
    INFO("mode " << m);
    mode = m;
    auto s = r.apply_item(it);
    CHECK(s.code == errc::loader_condition);
    CHECK(s.message.find("tensor b") != std::string::npos);
    mode = 0;
    // The scratch is clean again: a valid item still applies exactly.
    receiver<bad_loader> fresh(l, two_tensors());
    fresh.dense_refit(v);
    CHECK(fresh.apply_item(it).ok());
  }
  mode = 1;
  CHECK_THROWS_AS(r.dense_refit(v), error);
}

namespace {
/// Two copies of one tensor write the same destination row (rows 0 and 1 of
/// the source both into row 0): overwrites must agree, XOR is not allowed.
struct overlap_loader {
  void declare(parameter_store& s, std::span<const tensor_meta>) {
    s.add("p", {1, 6}, dtype_id::bf16);
  }
  load_report load(std::string_view, const tensor_view& src, parameter_store& s, copy_sink& sink) {
    sink.copy(s.view("p"), src.slice(0, 0, 1));
    sink.copy(s.view("p"), src.slice(0, 1, 1));
    return {{"p"}};
  }
};
static_assert(native_loader<overlap_loader>);
} // namespace

TEST_CASE("overlapping overwrites must agree") {
  std::vector<tensor_meta> metas = {{"t", {2, 6}, dtype_id::bf16}};
  receiver<overlap_loader> r(overlap_loader{}, metas);
  auto& tp = *r.plan().find("t");
  CHECK(tp.self_overlap);
  CHECK(tp.direct);
  CHECK(!tp.xor_allowed);
  tensor_set v(metas);
  r.dense_refit(v); // zeros agree
  item it;
  it.tensor = metas[0];
  it.encoding = value_encoding::overwrite;
  it.indices = {2, 8}; // (0,2) and (1,2) carry the same bits
  it.values = {std::byte{5}, std::byte{1}, std::byte{5}, std::byte{1}};
  CHECK(r.apply_item(it).ok());
  CHECK(r.storage()[0].bytes[4] == std::byte{5});
  it.values[2] = std::byte{6}; // now they disagree
  auto s = r.apply_item(it);
  CHECK(s.code == errc::loader_condition);
  CHECK(s.message.find("disagree") != std::string::npos);
  auto* w = test::bf16_words(v.at("t"));
  w[0] = 1;
  CHECK_THROWS_AS(r.dense_refit(v), error);
  it.encoding = value_encoding::xor_mask;
  CHECK(r.apply_item(it).code == errc::unsupported_loader);
}

TEST_CASE(
    "device sink twin: failed loads and overlapping copies leave the sink equal to the store") {
  int mode = 0;
  bad_loader l;
  l.apply_mode = &mode;
  receiver<bad_loader, twin::device_sink> r(l, two_tensors());
  tensor_set v(two_tensors());
  r.dense_refit(v);
  item it;
  it.tensor = two_tensors()[1];
  it.encoding = value_encoding::xor_mask;
  it.indices = {3, 20};
  it.values = {std::byte{1}, std::byte{0}, std::byte{2}, std::byte{0}};
  REQUIRE(r.apply_item(it).ok());
  CHECK(r.sink().entries() == 2); // through the sink's scatter
  CHECK(twin::mirror_difference(r.sink(), r.storage()) == "");
  for (int m : {1, 2, 3, 4, 6}) {
    INFO("mode " << m);
    mode = m;
    CHECK(r.apply_item(it).code == errc::loader_condition);
    mode = 0;
    CHECK(twin::mirror_difference(r.sink(), r.storage()) == "");
  }

  std::vector<tensor_meta> metas = {{"t", {2, 6}, dtype_id::bf16}};
  receiver<overlap_loader, twin::device_sink> o(overlap_loader{}, metas);
  tensor_set z(metas);
  o.dense_refit(z);
  item ow;
  ow.tensor = metas[0];
  ow.encoding = value_encoding::overwrite;
  ow.indices = {2, 8};
  ow.values = {std::byte{5}, std::byte{1}, std::byte{5}, std::byte{1}};
  REQUIRE(o.apply_item(ow).ok());
  CHECK(o.storage()[0].bytes[4] == std::byte{5});
  CHECK(o.sink().refreshes() > 0); // overlapping copies are re-uploaded whole
  CHECK(twin::mirror_difference(o.sink(), o.storage()) == "");
  ow.values[2] = std::byte{6};
  CHECK(o.apply_item(ow).code == errc::loader_condition);
  CHECK(twin::mirror_difference(o.sink(), o.storage()) == "");
}
