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
  std::uint64_t seed = 300;
  for (auto& L : test::refit_layouts()) {
    auto metas = canonical_tensors(L.model);
    auto [v, v1] = test::stressed_versions(metas, seed);
    for (auto mode : {delta_mode::mixed, delta_mode::xor_only, delta_mode::overwrite_only,
                      delta_mode::add_only}) {
      INFO("tp " << L.parallel.tensor_parallel_size << " pp " << L.parallel.pipeline_parallel_size
                 << " ep " << L.parallel.enable_expert_parallel << " mode "
                 << static_cast<int>(mode));
      auto st = test::check_delta_equals_dense<loaders::vllm_style_loader, twin_sink>(
          test::all_ranks(L.model, L.parallel), metas, v, v1, mode, seed + 2);
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
  auto [v, v1] = test::nan_versions(metas);
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
