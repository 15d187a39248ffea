// The receiver's device path on the CPU: `receiver<L, twin::device_sink>`
// (the host twin of `cuda::device_sink`, same scatter semantics as its
// kernels) runs the refit checks of receiver_test.cpp; after every delta the
// host store AND the sink's own copy of every parameter must equal a dense
// refit of the new version, byte for byte.
#include <doctest/doctest.h>

#include "dcr/loaders/cast_transpose.hpp"
#include "dcr/loaders/vllm_style.hpp"
#include "dcr/receiver/receiver.hpp"
#include "dcr/twin/device_sink.hpp"
#include "receiver/refit_check.hpp"
#include "receiver/workload.hpp"

using namespace dcr;
using dcr::test::delta_mode;
using twin_sink = twin::device_sink;

TEST_CASE("device sink twin: delta apply equals dense refit, vLLM layouts x modes") {
  struct lay {
    model_config c;
    loaders::vllm_parallel_config p;
  };
  auto tied = tiny_llama();
  tied.tied_embeddings = true;
  tied.vocab = 777;
  tied.attention_bias = true;
  std::vector<lay> lays = {{tiny_llama(), test::vllm_deployment(1)},
                           {tiny_llama(), test::vllm_deployment(8)},
                           {tied, test::vllm_deployment(8)},
                           {tiny_qwen3_moe(), test::vllm_deployment(2, 1, 2, true)}};
  std::uint64_t seed = 300;
  for (auto& L : lays) {
    auto metas = canonical_tensors(L.c);
    auto v = test::random_model(metas, seed);
    auto v1 = test::clone(v);
    test::stress(v1, 0.03, 0.05, seed + 1);
    for (auto mode : {delta_mode::mixed, delta_mode::xor_only, delta_mode::overwrite_only,
                      delta_mode::add_only}) {
      INFO("tp " << L.p.tensor_parallel_size << " mode " << static_cast<int>(mode));
      auto st = test::check_delta_equals_dense<loaders::vllm_style_loader, twin_sink>(
          test::all_ranks(L.c, L.p), metas, v, v1, mode, seed + 2);
      CHECK(st.changed > 0);
      // The changes reached the sink through its scatter, not a refresh.
      CHECK(st.mirrored_entries > 0);
    }
    ++seed;
  }
}

TEST_CASE("device sink twin: casts (refresh after unmapped copies) and NaN values") {
  auto c = tiny_llama();
  auto metas = canonical_tensors(c);
  auto v = test::random_model(metas, 5);
  test::inject_nans(v, 5, 6);
  auto v1 = test::clone(v);
  test::stress(v1, 0.02, 0.1, 7);
  test::inject_nans(v1, 7, 8);
  for (auto mode : {delta_mode::mixed, delta_mode::overwrite_only}) {
    test::check_delta_equals_dense<loaders::vllm_style_loader, twin_sink>(
        test::all_ranks(c, test::vllm_deployment(4)), metas, v, v1, mode, 9);
    auto st = test::check_delta_equals_dense<loaders::cast_transpose_loader, twin_sink>(
        std::vector{loaders::cast_transpose_loader(c)}, metas, v, v1, mode, 10);
    CHECK(st.changed > 0);
  }
}

TEST_CASE("device sink twin: a failed item leaves the sink equal to the store") {
  auto c = tiny_llama();
  auto metas = canonical_tensors(c);
  auto v = test::random_model(metas, 21);
  receiver<loaders::vllm_style_loader, twin_sink> r(
      loaders::vllm_style_loader(c, loaders::vllm_tp_rank(2, 0)), metas);
  r.dense_refit(v);
  CHECK(r.sink().attaches() == 2); // prewarm, then the dense refit
  CHECK(twin::mirror_difference(r.sink(), r.storage()) == "");
  // An item whose index is out of range is refused before anything is written.
  item it;
  it.tensor = metas.front();
  it.encoding = value_encoding::xor_mask;
  it.indices = {it.tensor.numel()};
  it.values.resize(2);
  CHECK_FALSE(r.apply_item(it).ok());
  CHECK(twin::mirror_difference(r.sink(), r.storage()) == "");
  // Threads other than 1 are refused: the device sink applies on one thread.
  CHECK_THROWS_AS(r.set_apply_threads(2), dcr::error);
}
