// FP8 rollout from BF16 training, bit-exact. Random real-shaped models
// (Llama GQA, Qwen2 biases, Qwen3 q/k norms, Qwen3-MoE with mixed dense/MoE
// stacks) with a block-FP8 quantization_config (random tile shapes, some
// modules left unconverted), random Megatron layouts, random vLLM
// deployments (TP, PP, DP, expert parallelism). The trainer takes AdamW
// steps in BF16; each step is refitted by quantize-then-diff into every FP8
// receiver, and every receiver's storage must equal a dense FP8 refit: the
// full BF16 candidate quantized whole by the same reference quantizer and
// loaded through the same FP8 loader. Some attempts fail part-way on some
// receivers and are repaired by an overwrite_all retry. The same payloads
// also go through the host twin of the device scatter (1-byte FP8 codes,
// 4-byte scales, 2-byte BF16) into a canonical FP8 copy, which must equal the
// dense FP8 checkpoint. Fixed seeds.
#include <doctest/doctest.h>

#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "dcr/loaders/vllm_style.hpp"
#include "dcr/model/trainer_layout.hpp"
#include "dcr/receiver/receiver.hpp"
#include "dcr/receiver/tensor_set.hpp"
#include "dcr/source/builder.hpp"
#include "dcr/source/fp8_plan.hpp"
#include "dcr/source/state.hpp"
#include "dcr/twin/scatter.hpp"
#include "examples/common/simulator.hpp"
#include "examples/common/training_side.hpp"

using namespace dcr;

namespace {

template <class T>
T pick(std::mt19937_64& rng, std::initializer_list<T> v) {
  return *(v.begin() + rng() % v.size());
}

model_config random_fp8_config(std::mt19937_64& rng, int index) {
  static const char* families[] = {"llama", "qwen2", "qwen3", "qwen3_moe", "qwen3_moe"};
  model_config c;
  c.family = families[index % 5];
  c.kv_heads = pick<std::uint64_t>(rng, {1, 2, 4});
  c.heads = c.kv_heads * pick<std::uint64_t>(rng, {1, 2, 4});
  c.head_dim = pick<std::uint64_t>(rng, {8, 16});
  c.hidden = c.family == "qwen3" || c.family == "qwen3_moe" ? pick<std::uint64_t>(rng, {32, 48})
                                                            : c.heads * c.head_dim;
  c.layers = pick<std::uint64_t>(rng, {1, 2, 3});
  c.ffn = pick<std::uint64_t>(rng, {32, 48, 64});
  c.vocab = pick<std::uint64_t>(rng, {96, 130});
  c.tied_embeddings = rng() % 3 == 0;
  c.attention_bias = c.family == "qwen2";
  c.qk_norm = c.family == "qwen3" || c.family == "qwen3_moe";
  if (c.family == "qwen3_moe") {
    c.experts = pick<std::uint64_t>(rng, {4, 6});
    c.moe_ffn = pick<std::uint64_t>(rng, {16, 32});
    c.decoder_sparse_step = pick<std::uint64_t>(rng, {1, 2});
    if (!c.has_dense_layer()) c.ffn = 0;
  }
  fp8_block_quantization q;
  q.block_n = pick<std::uint64_t>(rng, {8, 16});
  q.block_k = pick<std::uint64_t>(rng, {8, 16, 32});
  switch (rng() % 4) {
  case 0:
    q.modules_to_not_convert = {"lm_head"};
    break;
  case 1:
    q.modules_to_not_convert = {"model.layers.0.self_attn.o_proj"};
    break;
  case 2:
    q.modules_to_not_convert = {"mlp.down_proj"};
    break;
  default:
    break;
  }
  c.fp8 = q;
  return c;
}

std::optional<trainer_layout> random_trainer(std::mt19937_64& rng, const model_config& c) {
  for (int tries = 0; tries < 200; ++tries) {
    trainer_layout l;
    l.tp = pick<std::uint64_t>(rng, {1, 2, 4});
    l.pp = pick<std::uint64_t>(rng, {1, 2});
    l.dp = pick<std::uint64_t>(rng, {1, 2});
    l.vocab_block = pick<std::uint64_t>(rng, {0, 0, 8});
    if (c.is_moe()) {
      l.ep = pick<std::uint64_t>(rng, {1, 2});
      l.etp = pick<std::uint64_t>(rng, {1, 2});
    }
    if (validate(c, l).ok()) return l;
  }
  return std::nullopt;
}

struct vllm_pick {
  loaders::vllm_parallel_config p;
  int rejected = 0; ///< deployments vLLM would start in BF16 but refuses in block FP8
};

std::optional<vllm_pick> random_vllm(std::mt19937_64& rng, const model_config& c) {
  vllm_pick out;
  for (int tries = 0; tries < 200; ++tries) {
    loaders::vllm_parallel_config p;
    p.tensor_parallel_size = pick<std::uint64_t>(rng, {1, 2, 4});
    p.pipeline_parallel_size = pick<std::uint64_t>(rng, {1, 2});
    p.data_parallel_size = pick<std::uint64_t>(rng, {1, 2});
    p.enable_expert_parallel = c.is_moe() && rng() % 3 != 0;
    try {
      bool ok = true;
      for (std::uint64_t r = 0; r < p.world_size() && ok; ++r)
        ok = loaders::vllm_style_loader(c, loaders::vllm_layout::of_rank(p, r))
                 .fp8_unsupported()
                 .empty();
      if (!ok) {
        ++out.rejected;
        continue;
      }
      out.p = p;
      return out;
    } catch (const error&) {
    }
  }
  return std::nullopt;
}

tensor_set as_set(std::vector<host_tensor> tensors) {
  tensor_set set;
  for (auto& t : tensors) set.add(std::move(t));
  return set;
}

/// The dense FP8 reference: BF16 canonical tensors of the training state,
/// quantized whole.
tensor_set dense_fp8(const model_config& c, const source_plan& train, const source_state& st) {
  std::vector<host_tensor> bf16;
  throw_if_failed(export_canonical(train, st.view(), bf16));
  return as_set(quantize_fp8_checkpoint(c, bf16));
}

std::string describe(const model_config& c, const trainer_layout& t,
                     const loaders::vllm_parallel_config& p) {
  std::ostringstream o;
  o << c.family << " L" << c.layers << " h" << c.hidden << " nh" << c.heads << " nkv" << c.kv_heads
    << " d" << c.head_dim << " ffn" << c.ffn << " E" << c.experts << " moe_ffn" << c.moe_ffn
    << " block [" << c.fp8->block_n << "," << c.fp8->block_k << "] skip "
    << (c.fp8->modules_to_not_convert.empty() ? "-" : c.fp8->modules_to_not_convert[0])
    << " | megatron tp" << t.tp << " pp" << t.pp << " ep" << t.ep << " etp" << t.etp << " dp"
    << t.dp << " | vllm tp" << p.tensor_parallel_size << " pp" << p.pipeline_parallel_size << " dp"
    << p.data_parallel_size << (p.enable_expert_parallel ? " ep" : "");
  return o.str();
}

struct sweep_stats {
  int cases = 0, rejected_layouts = 0, retries = 0;
  std::uint64_t receivers = 0, scale_entries = 0, code_entries = 0, xor_items = 0;
  std::uint64_t twin_code_items = 0, blockwise_shards = 0;
  bool mixed_paths = false; ///< a plan with shard-local and assembled weights
  bool tp_gt1 = false, pp_gt1 = false, ep = false, unconverted = false;
};

/// Counts entries of FP8 codes and of scales in payloads (what the bench reports too).
void count_entries(const source_plan& plan, std::span<const std::vector<std::byte>> payloads,
                   sweep_stats& st) {
  for (auto& p : payloads) {
    decoded_payload d;
    REQUIRE(codec::decode_payload(p, d).ok());
    for (auto& it : d.items) {
      const auto& m = plan.canonical[plan.tensor_id(it.tensor.name)];
      if (m.dtype == dtype_id::f8e4m3fn) st.code_entries += it.indices.size();
      if (m.name.size() > 10 && m.name.ends_with("_scale_inv"))
        st.scale_entries += it.indices.size();
      st.xor_items += it.encoding == value_encoding::xor_mask;
    }
  }
}

/// Applies every item of `payloads` to `canon` through the host twin of the
/// device scatter, with the tensor's own word width.
void twin_apply(tensor_set& canon, std::span<const std::vector<std::byte>> payloads,
                sweep_stats& st) {
  for (auto& p : payloads) {
    decoded_payload d;
    REQUIRE(codec::decode_payload(p, d).ok());
    for (auto& it : d.items) {
      auto v = canon.find(it.tensor.name);
      REQUIRE(v);
      status s;
      switch (width_of(it.tensor.dtype)) {
      case 1:
        s = twin::scatter_item<std::uint8_t>(twin::to_device_as<std::uint8_t>(*v), it);
        ++st.twin_code_items;
        break;
      case 2:
        s = twin::scatter_item<std::uint16_t>(twin::to_device_as<std::uint16_t>(*v), it);
        break;
      default:
        s = twin::scatter_item<std::uint32_t>(twin::to_device_as<std::uint32_t>(*v), it);
        break;
      }
      REQUIRE_MESSAGE(s.ok(), s.message);
    }
  }
}

/// First tensor of `a` whose bytes differ from `b`'s, or "".
std::string first_tensor_difference(const tensor_set& a, const tensor_set& b) {
  for (auto& t : a.tensors()) {
    auto v = b.find(t.meta.name);
    if (!v || std::memcmp(v->data, t.bytes.data(), t.bytes.size()) != 0) return t.meta.name;
  }
  return "";
}

sweep_stats sweep(int n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  sweep_stats st;
  while (st.cases < n) {
    const auto c = random_fp8_config(rng, st.cases);
    auto tl = random_trainer(rng, c);
    if (!tl) continue;
    auto vp = random_vllm(rng, c);
    if (!vp) continue;
    st.rejected_layouts += vp->rejected;
    INFO(describe(c, *tl, vp->p));
    const source_plan train = megatron_plan(c, *tl);
    fp8_plan_options po;
    po.shard_local = rng() % 4 != 0;
    auto plan = std::make_shared<const source_plan>(megatron_fp8_plan(c, *tl, po));
    std::size_t local_shards = 0;
    for (auto& sh : plan->shards) local_shards += sh.blockwise.has_value();
    if (!po.shard_local) REQUIRE(local_shards == 0);
    st.blockwise_shards += local_shards;
    st.mixed_paths = st.mixed_paths || (local_shards > 0 && !plan->tasks.empty());

    REQUIRE(plan->shards.size() == train.shards.size());
    for (std::size_t s = 0; s < train.shards.size(); ++s) {
      REQUIRE(plan->shards[s].key == train.shards[s].key);
      REQUIRE(plan->shards[s].owner == train.shards[s].owner);
    }
    CHECK(plan->canonical == fp8_checkpoint_tensors(c));

    // AdamW in BF16 over the canonical tensors; shards follow by the simulator inverse.
    sim::adamw_options ao;
    ao.lr = pick<float>(rng, {1e-6f, 1e-5f, 1e-4f});
    std::vector<sim::adamw_trainer> opt;
    std::vector<host_tensor> canon;
    for (auto& m : train.canonical) {
      host_tensor t(m);
      auto w = sim::normal_bf16(m.numel(), 0.02f, rng());
      std::memcpy(t.bytes.data(), w.data(), t.bytes.size());
      opt.emplace_back(std::span<const std::uint16_t>(w), rng(), ao);
      canon.push_back(std::move(t));
    }
    source_state state = source_from_canonical(train, canon);
    { // full conversion of the FP8 plan (shard-local and assembled weights) = the dense checkpoint
      std::vector<host_tensor> got;
      throw_if_failed(export_canonical(*plan, state.view(), got));
      CHECK(first_tensor_difference(as_set(std::move(got)), dense_fp8(c, train, state)) == "");
    }
    training_side trainer(plan, state.view());
    const auto lds = loaders::vllm_style_loaders(c, vp->p);
    std::vector<receiver<loaders::vllm_style_loader>> rs;
    tensor_set twin_canon = dense_fp8(c, train, state);
    {
      const tensor_set v0 = dense_fp8(c, train, state);
      for (auto& l : lds) {
        rs.emplace_back(l, plan->canonical);
        rs.back().dense_refit(v0);
        for (auto& m : plan->canonical) REQUIRE(rs.back().xor_allowed(m.name));
      }
    }
    builder_options bo;
    bo.residual_xor = rng() % 2 == 0;
    bo.chunk_bytes = pick<std::size_t>(rng, {1, 4096, std::size_t{64} << 20});
    bo.bucket_bytes = pick<std::size_t>(rng, {1, 16384, std::size_t{512} << 20});
    std::uint64_t attempt = 0;
    for (std::uint64_t step = 1; step <= 3; ++step) {
      for (std::size_t i = 0; i < canon.size(); ++i) {
        opt[i].step();
        std::memcpy(canon[i].bytes.data(), opt[i].words().data(), canon[i].bytes.size());
      }
      state = source_from_canonical(train, canon);
      payload_id id;
      id.attempt = ++attempt;
      id.source_version = step - 1;
      const bool inject = rng() % 3 == 0;
      std::vector<std::vector<std::byte>> all;
      for (auto& op : trainer.build(state.view(), id, bo))
        for (auto& p : op) all.push_back(std::move(p));
      count_entries(*plan, all, st);
      twin_apply(twin_canon, all, st);
      for (std::size_t k = 0; k < rs.size(); ++k) {
        // An injected failure: this receiver gets only a prefix of the
        // payloads and applies them (partial state), then the attempt fails.
        const std::size_t upto = inject && k % 2 == 0 ? all.size() / 2 : all.size();
        for (std::size_t j = 0; j < upto; ++j) REQUIRE(rs[k].stage(all[j]).ok());
        auto s = rs[k].apply_staged();
        REQUIRE_MESSAGE(s.ok(), s.message);
      }
      if (inject) {
        ++st.retries;
        builder_options retry = bo;
        retry.mode = refit_mode::overwrite_all;
        id.attempt = ++attempt;
        std::vector<std::vector<std::byte>> again;
        for (auto& op : trainer.build(state.view(), id, retry))
          for (auto& p : op) again.push_back(std::move(p));
        twin_apply(twin_canon, again, st); // overwrites repeat what is already right
        for (auto& p : again)
          for (auto& r : rs) REQUIRE(r.stage(p).ok());
        for (auto& r : rs) {
          auto s = r.apply_staged();
          REQUIRE_MESSAGE(s.ok(), s.message);
        }
      }
      trainer.commit(state.view());
      const tensor_set next = dense_fp8(c, train, state);
      CHECK(first_tensor_difference(next, twin_canon) == "");
      for (std::size_t k = 0; k < rs.size(); ++k) {
        receiver<loaders::vllm_style_loader> dense(lds[k], plan->canonical);
        dense.dense_refit(next);
        INFO("step " << step << " receiver " << k);
        CHECK(first_difference(rs[k].storage(), dense.storage()) == "");
        ++st.receivers;
      }
    }
    st.tp_gt1 = st.tp_gt1 || vp->p.tensor_parallel_size > 1;
    st.pp_gt1 = st.pp_gt1 || vp->p.pipeline_parallel_size > 1;
    st.ep = st.ep || (c.is_moe() && vp->p.enable_expert_parallel);
    for (auto& m : canonical_tensors(c))
      st.unconverted = st.unconverted || (m.name.find("_proj.weight") != std::string::npos &&
                                          !fp8_quantized(c, m.name));
    ++st.cases;
  }
  return st;
}

} // namespace

TEST_CASE("fp8 rollout sweep: AdamW in BF16, refit to block-FP8 vLLM receivers equals a dense "
          "FP8 refit") {
  auto st = sweep(24, 20261204);
  MESSAGE("cases " << st.cases << ", receivers compared " << st.receivers << ", shard-local shards "
                   << st.blockwise_shards << ", code entries " << st.code_entries
                   << ", scale entries " << st.scale_entries << ", retries " << st.retries
                   << ", layouts rejected " << st.rejected_layouts);
  CHECK(st.tp_gt1);
  CHECK(st.pp_gt1);
  CHECK(st.ep);
  CHECK(st.unconverted);
  CHECK(st.retries > 0);
  CHECK(st.scale_entries > 0); // tiles re-scaled, so whole tiles were re-encoded
  CHECK(st.xor_items > 0);
  CHECK(st.rejected_layouts > 0);
  CHECK(st.twin_code_items > 0);
  CHECK(st.blockwise_shards > 0);
  CHECK(st.mixed_paths);
}

TEST_CASE("fp8 rollout sweep: 120 random cases" * doctest::test_suite("slow")) {
  auto st = sweep(120, 99);
  MESSAGE("cases " << st.cases << ", receivers compared " << st.receivers);
}
