// Receiver apply on a pool of threads (`receiver_options::apply_threads`):
// over random layouts, loaders, payload splits and thread counts, applying
// the delta v -> v1 on N threads stores the same bytes and the same state
// digest as 1 thread and as a dense refit of v1; an overwrite retry after a
// partial attempt repairs the same way; a refused item and an item whose
// loader fails part way leave the same storage, digest and error with 1 and
// N threads, and exactly the writes the documented rule names.
#include <doctest/doctest.h>

#include <algorithm>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "dcr/codec/payload.hpp"
#include "dcr/loaders/cast_transpose.hpp"
#include "dcr/loaders/row_split.hpp"
#include "dcr/loaders/vllm_style.hpp"
#include "dcr/receiver/receiver.hpp"
#include "receiver/refit_check.hpp"
#include "receiver/workload.hpp"

using namespace dcr;
using dcr::test::delta_mode;

namespace {

/// Shuffled items cut into random consecutive batches (one `apply_items` call each, as payloads).
std::vector<std::vector<item>> random_batches(std::vector<item> items, std::mt19937_64& rng) {
  std::shuffle(items.begin(), items.end(), rng);
  std::vector<std::vector<item>> out;
  for (std::size_t k = 0; k < items.size();) {
    const std::size_t n = 1 + rng() % std::max<std::size_t>(1, items.size() / 2);
    out.emplace_back(items.begin() + static_cast<std::ptrdiff_t>(k),
                     items.begin() + static_cast<std::ptrdiff_t>(std::min(items.size(), k + n)));
    k += n;
  }
  return out;
}

template <class L>
void require_same(const receiver<L>& a, const receiver<L>& b) {
  REQUIRE(first_difference(a.storage(), b.storage()) == "");
  REQUIRE(a.state_digest() == b.state_digest());
}

/// One random case: `threads` against 1 thread against the dense refit of v1, for every loader.
template <class L>
void check_case(const std::vector<L>& loaders, const std::vector<tensor_meta>& metas,
                const tensor_set& v, const tensor_set& v1, delta_mode mode, int owners,
                std::size_t threads, std::mt19937_64& rng, std::uint64_t& changed) {
  for (auto& l : loaders) {
    receiver<L> one(l, metas), many(l, metas, {threads, 0}), ref(l, metas);
    CHECK(many.apply_threads() == threads);
    auto items = test::diff_items(
        v, v1, mode, [&](const std::string& n) { return one.xor_allowed(n); }, owners);
    changed += test::changed_count(items);
    one.dense_refit(v);
    many.dense_refit(v);
    ref.dense_refit(v1);
    for (auto& b : random_batches(items, rng)) {
      auto s1 = one.apply_items(b);
      auto sn = many.apply_items(b);
      REQUIRE_MESSAGE(s1.ok(), s1.message);
      REQUIRE_MESSAGE(sn.ok(), sn.message);
    }
    require_same(one, many);
    require_same(one, ref);
    CHECK(many.threaded_applies() > 0);
    CHECK(one.threaded_applies() == 0);
    auto cd = many.check_state_digest();
    CHECK_MESSAGE(cd.ok(), cd.message);
    // Retry: a partial relative attempt (the first half of the items), then
    // every change as an overwrite, on a fresh copy of v.
    if (mode == delta_mode::overwrite_only) continue;
    one.dense_refit(v);
    many.dense_refit(v);
    const std::vector<item> half(items.begin(),
                                 items.begin() + static_cast<std::ptrdiff_t>(items.size() / 2));
    REQUIRE(one.apply_items(half).ok());
    REQUIRE(many.apply_items(half).ok());
    require_same(one, many);
    auto ows = test::diff_items(
        v, v1, delta_mode::overwrite_only, [](const std::string&) { return false; }, owners);
    for (auto& b : random_batches(ows, rng)) {
      REQUIRE(one.apply_items(b).ok());
      REQUIRE(many.apply_items(b).ok());
    }
    require_same(one, many);
    require_same(many, ref);
    CHECK(many.check_state_digest().ok());
  }
}

/// A vLLM-style loader whose load of a named tensor throws after making
/// its copies (a loader failing part way: the writes are made, the item
/// fails), declared concurrent like the loader it wraps.
struct failing_loader {
  static constexpr bool concurrent_load = true;
  loaders::vllm_style_loader inner;
  std::set<std::string> fail_on;

  void declare(parameter_store& s, std::span<const tensor_meta> c) { inner.declare(s, c); }
  load_report load(std::string_view name, const tensor_view& src, parameter_store& s,
                   copy_sink& sink) {
    auto r = inner.load(name, src, s, sink);
    if (fail_on.count(std::string(name))) throw std::runtime_error("injected loader failure");
    return r;
  }
};
static_assert(native_loader<failing_loader>);

struct not_concurrent_loader {
  void declare(parameter_store& s, std::span<const tensor_meta>) {
    s.add("p", {4}, dtype_id::bf16);
  }
  load_report load(std::string_view, const tensor_view& src, parameter_store& s, copy_sink& sink) {
    sink.copy(s.view("p"), src);
    return {{"p"}};
  }
};

} // namespace

TEST_CASE("parallel apply equals 1-thread apply and a dense refit over random configurations") {
  auto llama = tiny_llama();
  auto odd = tiny_llama();
  odd.tied_embeddings = true;
  odd.vocab = 777;
  odd.attention_bias = true;
  auto moe = tiny_qwen3_moe();
  moe.layers = 2;
  const std::vector<std::pair<model_config, loaders::vllm_parallel_config>> vllm = {
      {llama, test::vllm_deployment(1)},
      {llama, test::vllm_deployment(2, 2)},
      {odd, test::vllm_deployment(8)},
      {moe, test::vllm_deployment(2, 1, 2, true)},
      {moe, test::vllm_deployment(2, 1, 2, false)}};
  std::mt19937_64 rng(4242);
  const std::size_t thread_counts[] = {2, 3, 4, 8};
  const delta_mode modes[] = {delta_mode::mixed, delta_mode::xor_only, delta_mode::add_only,
                              delta_mode::overwrite_only};
  std::uint64_t changed = 0, cases = 0;
  for (int round = 0; round < 2; ++round) {
    for (std::size_t li = 0; li < vllm.size(); ++li) {
      const auto& [c, p] = vllm[li];
      const auto metas = canonical_tensors(c);
      const auto seed = rng();
      auto v = test::random_model(metas, seed);
      if (rng() % 3 == 0) test::inject_nans(v, 3, seed + 1);
      auto v1 = test::clone(v);
      test::stress(v1, 0.005 + 0.05 * static_cast<double>(rng() % 100) / 100.0, 0.1, seed + 2);
      if (rng() % 3 == 0) test::inject_nans(v1, 4, seed + 3);
      const auto mode = modes[rng() % std::size(modes)];
      const int owners = 1 + static_cast<int>(rng() % 3);
      const auto threads = thread_counts[rng() % std::size(thread_counts)];
      INFO("round " << round << " layout " << li << " mode " << static_cast<int>(mode) << " owners "
                    << owners << " threads " << threads);
      auto all = test::all_ranks(c, p);
      // Two ranks of each deployment keep the case short.
      std::vector<loaders::vllm_style_loader> ranks{all.front(), all.back()};
      check_case(ranks, metas, v, v1, mode, owners, threads, rng, changed);
      // Cast/transpose: fused transposed qkv, FP32 casts (overwrite through a transform).
      if (li == 0 || li == 3)
        check_case(std::vector{loaders::cast_transpose_loader(c)}, metas, v, v1, mode, owners,
                   threads, rng, changed);
      if (li == 1)
        check_case(std::vector{loaders::row_split_loader(2, 1, metas)}, metas, v, v1, mode, owners,
                   threads, rng, changed);
      ++cases;
    }
  }
  CHECK(cases == 10);
  CHECK(changed > 10000);
}

TEST_CASE("storage groups: fused parameters serialise their tensors, layers are independent") {
  auto c = tiny_llama();
  const auto metas = canonical_tensors(c);
  receiver<loaders::vllm_style_loader> r(loaders::vllm_style_loader(c, loaders::vllm_tp_rank(2, 0)),
                                         metas);
  auto group = [&](const std::string& n) {
    const auto* tp = r.plan().find(n);
    REQUIRE(tp);
    return r.storage_group()[static_cast<std::size_t>(tp - r.plan().tensors.data())];
  };
  const std::string l0 = "model.layers.0.", l1 = "model.layers.1.";
  CHECK(group(l0 + "self_attn.q_proj.weight") == group(l0 + "self_attn.k_proj.weight"));
  CHECK(group(l0 + "self_attn.q_proj.weight") == group(l0 + "self_attn.v_proj.weight"));
  CHECK(group(l0 + "mlp.gate_proj.weight") == group(l0 + "mlp.up_proj.weight"));
  CHECK(group(l0 + "self_attn.q_proj.weight") != group(l1 + "self_attn.q_proj.weight"));
  CHECK(group(l0 + "self_attn.q_proj.weight") != group(l0 + "mlp.gate_proj.weight"));
  CHECK(group(l0 + "mlp.down_proj.weight") != group(l0 + "mlp.gate_proj.weight"));
  // Groups write disjoint parameters.
  std::vector<std::size_t> owner(r.storage().size(), static_cast<std::size_t>(-1));
  for (std::size_t t = 0; t < r.plan().tensors.size(); ++t)
    for (auto& cp : r.plan().tensors[t].copies) {
      auto& o = owner[cp.param];
      if (o == static_cast<std::size_t>(-1)) o = r.storage_group()[t];
      CHECK(o == r.storage_group()[t]);
    }
}

TEST_CASE("a refused item: the same error, storage and digest with 1 and N threads") {
  auto c = tiny_llama();
  const auto metas = canonical_tensors(c);
  const loaders::vllm_style_loader l(c, loaders::vllm_tp_rank(2, 1));
  auto v = test::random_model(metas, 71);
  auto v1 = test::clone(v);
  test::stress(v1, 0.04, 0.1, 72);
  auto items = test::diff_items(
      v, v1, delta_mode::mixed, [](const std::string&) { return true; }, 2);
  std::mt19937_64 rng(73);
  std::shuffle(items.begin(), items.end(), rng);
  REQUIRE(items.size() > 8);
  for (int corruption = 0; corruption < 4; ++corruption) {
    auto bad = items;
    const std::size_t k = 3 + rng() % (items.size() - 6);
    auto& it = bad[k];
    std::string needle;
    switch (corruption) {
    case 0: // an index past the tensor
      it.indices.back() = it.tensor.numel() + 5;
      break;
    case 1: // a shape that is not the canonical one
      it.tensor.shape.back() += 1;
      break;
    case 2: // an unknown tensor
      it.tensor.name += ".nope";
      break;
    case 3: // values of the wrong width
      it.values.pop_back();
      break;
    }
    INFO("corruption " << corruption << " at item " << k);
    receiver<loaders::vllm_style_loader> one(l, metas), many(l, metas, {4, 0}), prefix(l, metas);
    for (auto* r : {&one, &many, &prefix}) r->dense_refit(v);
    const auto s1 = one.apply_items(bad);
    const auto sn = many.apply_items(bad);
    CHECK_FALSE(s1.ok());
    CHECK(s1.code == sn.code);
    CHECK(s1.message == sn.message);
    CHECK(many.threaded_applies() == 1);
    CHECK(s1.code == prefix.apply_item(bad[k]).code);
    // Exactly the items before the refused one are applied.
    REQUIRE(prefix.apply_items(std::span<const item>(bad.data(), k)).ok());
    require_same(one, many);
    require_same(one, prefix);
    CHECK(many.check_state_digest().ok());
  }
}

TEST_CASE("a loader failing part way: the same error, storage and digest with 1 and N threads") {
  auto c = tiny_llama();
  c.layers = 3;
  const auto metas = canonical_tensors(c);
  auto v = test::random_model(metas, 81);
  auto v1 = test::clone(v);
  test::stress(v1, 0.05, 0.1, 82);
  std::mt19937_64 rng(83);
  // k_proj shares the fused qkv parameter with q_proj and v_proj; gate with up.
  const std::vector<std::set<std::string>> failing = {
      {"model.layers.1.self_attn.k_proj.weight"},
      {"model.layers.0.mlp.up_proj.weight", "model.layers.2.self_attn.q_proj.weight"}};
  for (auto& fail_on : failing) {
    failing_loader l{loaders::vllm_style_loader(c, loaders::vllm_tp_rank(1, 0)), {}};
    auto items = test::diff_items(
        v, v1, delta_mode::mixed, [](const std::string&) { return true; }, 2);
    std::shuffle(items.begin(), items.end(), rng);
    receiver<failing_loader> one(l, metas), many(l, metas, {3, 0}), spec(l, metas);
    for (auto* r : {&one, &many, &spec}) {
      r->dense_refit(v);
      r->loader().fail_on = fail_on;
    }
    const auto s1 = one.apply_items(items);
    const auto sn = many.apply_items(items);
    REQUIRE_FALSE(s1.ok());
    CHECK(s1.code == errc::loader_condition);
    CHECK(s1.code == sn.code);
    CHECK(s1.message == sn.message);
    CHECK(s1.message.find("injected loader failure") != std::string::npos);
    CHECK(many.threaded_applies() == 1);
    // The documented rule, item by item: a failed item ends its storage
    // group; every other item is applied.
    std::set<std::size_t> failed_groups;
    std::string first_error;
    for (auto& it : items) {
      const auto* tp = spec.plan().find(it.tensor.name);
      const auto g =
          spec.storage_group()[static_cast<std::size_t>(tp - spec.plan().tensors.data())];
      if (failed_groups.count(g)) continue;
      auto s = spec.apply_item(it);
      if (!s.ok()) {
        failed_groups.insert(g);
        if (first_error.empty()) first_error = s.message;
      }
    }
    CHECK(failed_groups.size() == fail_on.size());
    CHECK(first_error == s1.message);
    require_same(one, many);
    require_same(one, spec);
    CHECK(many.check_state_digest().ok());
    // The retry repairs: loader fixed, every change as an overwrite.
    for (auto* r : {&one, &many}) r->loader().fail_on.clear();
    auto ows = test::diff_items(v, v1, delta_mode::overwrite_only,
                                [](const std::string&) { return false; });
    REQUIRE(one.apply_items(ows).ok());
    REQUIRE(many.apply_items(ows).ok());
    receiver<failing_loader> ref(l, metas);
    ref.dense_refit(v1);
    require_same(one, many);
    require_same(many, ref);
  }
}

TEST_CASE("staged payloads apply the same on N threads; threads need a concurrent loader") {
  auto c = tiny_qwen3_moe();
  const auto metas = canonical_tensors(c);
  const loaders::vllm_style_loader l(
      c, loaders::vllm_layout::of_rank(test::vllm_deployment(2, 1, 2, true), 1));
  auto v = test::random_model(metas, 91);
  auto v1 = test::clone(v);
  test::stress(v1, 0.03, 0.1, 92);
  receiver<loaders::vllm_style_loader> one(l, metas), many(l, metas, {0, 0}), ref(l, metas);
  CHECK(many.apply_threads() == pipeline::resolve_threads(0));
  many.set_apply_threads(5);
  CHECK(many.apply_threads() == 5);
  auto items = test::diff_items(v, v1, delta_mode::mixed,
                                [&](const std::string& n) { return one.xor_allowed(n); });
  std::vector<std::vector<std::byte>> payloads;
  for (std::size_t k = 0, seq = 0; k < items.size(); k += 16, ++seq)
    payloads.push_back(encode_payload(
        {1, 7, 0, static_cast<std::uint32_t>(seq)},
        std::span<const item>(items.data() + k, std::min<std::size_t>(16, items.size() - k))));
  one.dense_refit(v);
  many.dense_refit(v);
  ref.dense_refit(v1);
  for (auto* r : {&one, &many}) {
    for (auto& p : payloads) REQUIRE(r->stage(p).ok());
    REQUIRE(r->apply_staged().ok());
  }
  require_same(one, many);
  require_same(many, ref);
  CHECK(many.threaded_applies() == payloads.size());

  std::vector<tensor_meta> m1 = {{"t", {4}, dtype_id::bf16}};
  CHECK_NOTHROW(receiver<not_concurrent_loader>(not_concurrent_loader{}, m1));
  try {
    receiver<not_concurrent_loader> r(not_concurrent_loader{}, m1, {2});
    FAIL("a loader without concurrent_load was given 2 apply threads");
  } catch (const error& e) {
    CHECK(e.code() == errc::invalid_argument);
    CHECK(std::string(e.what()).find("concurrent_load") != std::string::npos);
  }
  receiver<not_concurrent_loader> r(not_concurrent_loader{}, m1);
  CHECK_THROWS_AS(r.set_apply_threads(0), error);
  CHECK(r.apply_threads() == 1);
}
