// Plans without bytes: `plan_copies` over a `plan_store` (metadata and
// address ranges, no parameter or input bytes) must give exactly the plan
// the receiver's `prewarm` makes over real, zeroed storage, copy by copy
// (parameter, offsets, layouts, aliasing, inverse maps) and flag by flag, on
// every rank of dense, pipelined, expert-parallel, TP-sharded-expert, tied,
// biased and block-FP8 deployments; and refuse the same loader paths with
// the same errors.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dcr/loaders/vllm_style.hpp"
#include "dcr/model/config.hpp"
#include "dcr/model/hf_config.hpp"
#include "dcr/receiver/plan.hpp"

using namespace dcr;

namespace {

bool same_inverse(const view_inverse& a, const view_inverse& b) {
  if (a.n != b.n || a.src_base != b.src_base || a.span != b.span || a.dst_base != b.dst_base ||
      a.shift_only != b.shift_only)
    return false;
  for (std::size_t k = 0; k < a.n; ++k)
    if (a.src_stride[k] != b.src_stride[k] || a.extent[k] != b.extent[k] ||
        a.dst_stride[k] != b.dst_stride[k])
      return false;
  return true;
}

bool same_copy(const planned_copy& a, const planned_copy& b) {
  return a.same_path(b) && a.src_offset == b.src_offset && a.mapped == b.mapped &&
         (!a.mapped || same_inverse(a.inverse, b.inverse));
}

/// Compare the two plans and stores field by field; every difference is a
/// CHECK failure. Returns the number of copies compared.
std::size_t check_same(const copy_plan& real, const parameter_store& rs, const copy_plan& meta,
                       const plan_store& ms) {
  REQUIRE(rs.size() == ms.size());
  for (std::size_t i = 0; i < rs.size(); ++i) CHECK(rs[i].meta == ms[i].meta);
  CHECK(rs.nbytes() == ms.nbytes());
  CHECK(real.scratch_bytes == meta.scratch_bytes);
  CHECK(real.index == meta.index);
  REQUIRE(real.tensors.size() == meta.tensors.size());
  std::size_t copies = 0;
  for (std::size_t t = 0; t < real.tensors.size(); ++t) {
    const auto &a = real.tensors[t], &b = meta.tensors[t];
    INFO("tensor " << a.meta.name);
    CHECK(a.meta == b.meta);
    CHECK(a.reported == b.reported);
    CHECK(a.skipped == b.skipped);
    CHECK(a.direct == b.direct);
    CHECK(a.xor_allowed == b.xor_allowed);
    CHECK(a.self_overlap == b.self_overlap);
    REQUIRE(a.copies.size() == b.copies.size());
    for (std::size_t k = 0; k < a.copies.size(); ++k) CHECK(same_copy(a.copies[k], b.copies[k]));
    copies += a.copies.size();
  }
  return copies;
}

void check_deployment(const model_config& c, const loaders::vllm_parallel_config& p) {
  INFO("family " << c.family << " tp " << p.tensor_parallel_size << " pp "
                 << p.pipeline_parallel_size << " dp " << p.data_parallel_size << " ep "
                 << p.enable_expert_parallel << " fp8 " << c.fp8.has_value());
  const auto metas = fp8_checkpoint_tensors(c);
  std::size_t copies = 0; // a stage without layers may hold nothing: count over the deployment
  for (std::uint64_t r = 0; r < p.world_size(); ++r) {
    INFO("rank " << r);
    const auto lay = loaders::vllm_layout::of_rank(p, r);
    loaders::vllm_style_loader a(c, lay), b(c, lay);
    parameter_store rs;
    const auto real = prewarm(a, rs, metas);
    plan_store ms;
    const auto meta = plan_copies(b, ms, metas);
    copies += check_same(real, rs, meta, ms);
  }
  CHECK(copies >= metas.size());
}

loaders::vllm_parallel_config deployment(std::uint64_t tp, std::uint64_t pp = 1,
                                         std::uint64_t dp = 1, bool ep = false) {
  loaders::vllm_parallel_config p;
  p.tensor_parallel_size = tp;
  p.pipeline_parallel_size = pp;
  p.data_parallel_size = dp;
  p.enable_expert_parallel = ep;
  return p;
}

/// A loader whose one copy changes dtype: both dry runs must refuse it alike.
struct casting_loader {
  template <class Store>
  void declare(Store& s, std::span<const tensor_meta> canonical) const {
    for (auto& m : canonical) s.add(m.name, m.shape, dtype_id::f32);
  }
  template <class Store>
  load_report load(std::string_view name, const tensor_view& src, Store& s, copy_sink& sink) const {
    sink.copy(s.view(name), src); // bf16 source into an f32 parameter
    return {{std::string(name)}};
  }
};
static_assert(plannable_loader<casting_loader>);
static_assert(plannable_loader<loaders::vllm_style_loader>);

} // namespace

TEST_CASE("plan_copies equals prewarm: dense Llama / Qwen3 over TP, PP and DP") {
  auto c = tiny_llama();
  for (std::uint64_t t : {1, 2, 4, 8}) check_deployment(c, deployment(t));
  c.layers = 5;
  check_deployment(c, deployment(2, 3));
  auto p = deployment(2, 3);
  p.pp_layer_partition = "3,0,2";
  check_deployment(c, p);
  c.tied_embeddings = true;
  c.vocab = 777;
  check_deployment(c, deployment(1, 4, 2));
  c.family = "qwen3";
  c.qk_norm = true;
  check_deployment(c, deployment(4, 2));
}

TEST_CASE("plan_copies equals prewarm: Llama with attention biases (o_proj too), Qwen2") {
  auto c = tiny_llama();
  c.attention_bias = true;
  c.o_proj_bias = true;
  for (std::uint64_t t : {1, 2, 8}) check_deployment(c, deployment(t));
  c.family = "qwen2";
  c.o_proj_bias = false;
  check_deployment(c, deployment(2, 2));
}

TEST_CASE("plan_copies equals prewarm: Qwen3-MoE with and without expert parallelism") {
  auto c = tiny_qwen3_moe();
  c.layers = 3;
  check_deployment(c, deployment(2));             // experts TP-sharded
  check_deployment(c, deployment(4, 1, 1, true)); // EP 4
  check_deployment(c, deployment(2, 1, 2, true)); // EP over dp x tp
  check_deployment(c, deployment(2, 3, 1, true)); // PP: every stage holds embed / norm / head
  c.experts = 6;                                  // uneven homes
  c.ffn = 96;
  c.decoder_sparse_step = 2; // dense layers among MoE layers
  check_deployment(c, deployment(4, 1, 1, true));
}

TEST_CASE("plan_copies equals prewarm: block-FP8 codes and scales") {
  model_config c;
  c.family = "qwen3";
  c.hidden = 64;
  c.layers = 2;
  c.heads = 8;
  c.kv_heads = 2;
  c.head_dim = 16;
  c.ffn = 64;
  c.vocab = 128;
  c.qk_norm = true;
  c.fp8 = fp8_block_quantization{16, 16, {}};
  for (std::uint64_t t : {1, 2, 4}) check_deployment(c, deployment(t));
  auto m = tiny_qwen3_moe();
  m.layers = 1;
  m.fp8 = fp8_block_quantization{16, 16, {}};
  check_deployment(m, deployment(2, 1, 1, true));
  check_deployment(m, deployment(2));
}

TEST_CASE("plan_copies refuses what prewarm refuses, with the same message") {
  const std::vector<tensor_meta> metas{{"w", {4, 8}, dtype_id::bf16}};
  casting_loader a, b;
  parameter_store rs;
  plan_store ms;
  std::string real, meta;
  try {
    (void)prewarm(a, rs, metas);
  } catch (const error& e) {
    CHECK(e.code() == errc::unsupported_loader);
    real = e.what();
  }
  try {
    (void)plan_copies(b, ms, metas);
  } catch (const error& e) {
    CHECK(e.code() == errc::unsupported_loader);
    meta = e.what();
  }
  CHECK(real.find("changes dtype") != std::string::npos);
  CHECK(real == meta);
}

TEST_CASE("plan_store: declares like parameter_store and holds no bytes") {
  plan_store s;
  auto v = s.add("a", {1024, 1024, 1024}, dtype_id::bf16); // 2 GiB of address space, no memory
  s.add("b", {3}, dtype_id::f32);
  CHECK(s.nbytes() == 2ull * 1024 * 1024 * 1024 + 12);
  CHECK(v.size() == 1024ll * 1024 * 1024);
  CHECK(s.locate(v.data, v.data + 16) == std::optional<std::size_t>{0});
  const auto b = s.view("b");
  CHECK(s.locate(b.data, b.data + 12) == std::optional<std::size_t>{1});
  CHECK_FALSE(s.locate(b.data, b.data + 13));
  CHECK(s.index_of("b") == std::optional<std::size_t>{1});
  CHECK_FALSE(s.index_of("c"));
  CHECK(std::to_integer<int>(v.data[12345]) == 0); // reads see zero
  try {
    s.add("b", {1}, dtype_id::f32);
    FAIL("duplicate accepted");
  } catch (const error& e) {
    CHECK(e.code() == errc::invalid_argument);
  }
  CHECK_THROWS_AS(s.view("nope"), error);
}

TEST_CASE("hf config: Llama's attention_bias biases o_proj too; Qwen2's does not") {
  const char* llama = R"({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
    "vocab_size": 100, "attention_bias": true})";
  auto c = model_config_from_hf_json(llama);
  CHECK(c.attention_bias);
  CHECK(c.o_proj_bias);
  const auto metas = canonical_tensors(c);
  std::size_t biases = 0;
  for (auto& m : metas)
    if (m.name.find("o_proj.bias") != std::string::npos) {
      ++biases;
      CHECK(m.shape == std::vector<std::uint64_t>{64});
    }
  CHECK(biases == 2);
  const char* qwen2 = R"({"model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
    "vocab_size": 100})";
  auto q = model_config_from_hf_json(qwen2);
  CHECK(q.attention_bias);
  CHECK_FALSE(q.o_proj_bias);
}
