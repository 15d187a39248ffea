// dcr-bench-fp8-rollout: the same BF16 training steps refitted to a BF16
// rollout and to a block-FP8 rollout (quantize-then-diff).
//
// Input: a Llama-style model (8 layers, hidden 1024, head_dim 128, GQA 8/2,
// ffn 2816, vocab 32000: 0.31 GB of BF16 weights, and 12 bytes per weight of
// AdamW state; --quick: 2 layers, hidden 256, head_dim 64) on a Megatron layout (TP 4, 4 owners).
// Version 0 is N(0, 0.02²); each step is one AdamW step of every tensor in BF16
// (`sim::adamw_trainer`, lr 1e-6, the RL fine-tuning default; the last step
// restarts the optimiser state at lr 1e-5, a larger update). The FP8 checkpoint is the
// block-quantised form (e4m3, weight_block_size [128, 128], every projection quantised; embedding,
// norms and lm_head BF16), as `megatron_fp8_plan` / `quantize_fp8_checkpoint` define it.
//
// Per step, both rollouts from the same committed baseline and candidate:
//  changed    canonical elements whose stored bits changed (the records the
//             builder emits: BF16 words; FP8 codes + scales + BF16 tensors);
//  re-scaled  FP8 tiles whose scale_inv changed (each re-encodes its codes);
//  payload    bytes of all owners' payloads (default encoding, zstd level 1),
//             as % of the FP8 checkpoint and of the BF16 one; FP8 items are
//             XOR masks (residual_xor), as the vLLM block-FP8 paths allow;
//  construct  all owners' build time on one core (sum over owners), against
//             memcpy of the source bytes measured in the same run.
// Baseline memory per rollout is printed below the table.

#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "dcr/source/builder.hpp"
#include "dcr/source/fp8_plan.hpp"
#include "examples/common/simulator.hpp"
#include "examples/common/training_side.hpp"

namespace {

using namespace dcr;

model_config bench_model(bool quick) {
  model_config c;
  c.family = "llama";
  c.hidden = quick ? 256 : 1024;
  c.layers = quick ? 2 : 8;
  c.heads = quick ? 16 : 8;
  c.kv_heads = quick ? 4 : 2;
  c.head_dim = quick ? 64 : 128;
  c.ffn = quick ? 704 : 2816;
  c.vocab = quick ? 1000 : 32000;
  c.fp8 = fp8_block_quantization{128, 128, {}};
  return c;
}

struct measured {
  std::uint64_t changed = 0, rescaled = 0, payload = 0;
  double construct_s = 0;
};

/// Builds every owner's payloads of one step (timed: item construction, one
/// owner at a time on one core; payload encoding untimed) and counts records.
measured refit(const training_side& side, const source_view& candidate, bool residual_xor) {
  measured m;
  const auto req = side.required(candidate);
  builder_options opt;
  opt.residual_xor = residual_xor;
  const auto& plan = side.plan();
  for (auto& o : side.owners()) {
    std::vector<delta_bucket> buckets;
    m.construct_s += bench::best_seconds(1, [&] {
      buckets.clear();
      o.build_buckets(candidate, req, opt,
                      [&](delta_bucket&& b) { buckets.push_back(std::move(b)); });
    });
    for (auto& b : buckets) {
      for (auto& it : b.items) {
        m.changed += it.size();
        const auto& name = it.tensor.name;
        if (name.size() > 10 && name.compare(name.size() - 10, 10, "_scale_inv") == 0)
          m.rescaled += it.size();
      }
      std::vector<std::byte> out;
      throw_if_failed(
          codec::encode_payload_with({1, 0, o.id(), b.sequence}, b.items, opt.encoding,
                                     pipeline::dispatched_locations{opt.encoding.locations}, out));
      m.payload += out.size();
    }
  }
  (void)plan;
  return m;
}

} // namespace

int main(int argc, char** argv) {
  const auto opt = bench::options::parse(argc, argv);
  const auto cfg = bench_model(opt.quick);
  const trainer_layout layout{4, 1, 1, 1, 1};
  auto bf16_plan = std::make_shared<const source_plan>(megatron_plan(cfg, layout));
  auto fp8_plan = std::make_shared<const source_plan>(megatron_fp8_plan(cfg, layout));
  fp8_plan_options assembled_only;
  assembled_only.shard_local = false;
  auto asm_plan =
      std::make_shared<const source_plan>(megatron_fp8_plan(cfg, layout, assembled_only));
  std::size_t local_shards = 0, fp8_shards = 0;
  for (auto& sh : fp8_plan->shards) {
    local_shards += sh.blockwise.has_value();
    fp8_shards += sh.blockwise.has_value() || !sh.feeds.empty();
  }
  const double bf16_ckpt = static_cast<double>(bf16_plan->checkpoint_bytes());
  const double fp8_ckpt = static_cast<double>(fp8_plan->checkpoint_bytes());
  std::uint64_t tiles = 0;
  for (auto& m : fp8_plan->canonical)
    if (m.name.ends_with("_scale_inv")) tiles += m.numel();

  std::vector<sim::adamw_trainer> trainers;
  std::vector<host_tensor> canon;
  for (std::size_t i = 0; i < bf16_plan->canonical.size(); ++i) {
    host_tensor t(bf16_plan->canonical[i]);
    auto w = sim::normal_bf16(t.meta.numel(), 0.02f, 1000 + i);
    std::memcpy(t.bytes.data(), w.data(), t.bytes.size());
    trainers.emplace_back(std::span<const std::uint16_t>(w), 77 + i);
    canon.push_back(std::move(t));
  }
  source_state state = source_from_canonical(*bf16_plan, canon);
  training_side bf16_side(bf16_plan, state.view());
  training_side fp8_side(fp8_plan, state.view());
  training_side asm_side(asm_plan, state.view());
  std::size_t max_shard = 0;
  for (auto& b : state.shards) max_shard = std::max(max_shard, b.size());
  std::vector<std::byte> scratch(max_shard);

  struct row {
    int step;
    float lr;
    measured bf16, fp8, assembled;
    double memcpy_s;
  };
  std::vector<row> rows;
  const std::vector<float> lrs =
      opt.quick ? std::vector<float>{1e-6f, 1e-5f} : std::vector<float>{1e-6f, 1e-6f, 1e-6f, 1e-5f};
  for (std::size_t k = 0; k < lrs.size(); ++k) {
    for (std::size_t i = 0; i < trainers.size(); ++i) {
      if (trainers[i].options().lr != lrs[k]) {
        // Same master state, another learning rate from this step on.
        sim::adamw_options o = trainers[i].options();
        o.lr = lrs[k];
        trainers[i] = sim::adamw_trainer(trainers[i].words(), 77 + i + 1000 * k, o);
      }
      trainers[i].step();
      std::memcpy(canon[i].bytes.data(), trainers[i].words().data(), canon[i].bytes.size());
    }
    state = source_from_canonical(*bf16_plan, canon);
    row r{static_cast<int>(k + 1), lrs[k], {}, {}, {}, 0};
    r.memcpy_s = bench::best_seconds(2, [&] {
      for (auto& b : state.shards) {
        std::memcpy(scratch.data(), b.data(), b.size());
        bench::do_not_optimize(scratch);
      }
    });
    r.bf16 = refit(bf16_side, state.view(), false);
    r.fp8 = refit(fp8_side, state.view(), true);
    r.assembled = refit(asm_side, state.view(), true);
    if (r.assembled.changed != r.fp8.changed || r.assembled.rescaled != r.fp8.rescaled) {
      std::cerr << "dcr-bench-fp8-rollout: the shard-local and assembled paths disagree: "
                << r.fp8.changed << " vs " << r.assembled.changed << " changed\n";
      return 1;
    }
    bf16_side.commit(state.view());
    fp8_side.commit(state.view());
    asm_side.commit(state.view());
    rows.push_back(r);
  }

  auto pct = [](double a, double b) { return 100.0 * a / b; };
  if (opt.json) {
    std::cout << "{\"rows\":[";
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const auto& r = rows[i];
      std::cout << (i ? "," : "") << "{\"step\":" << r.step << ",\"lr\":" << r.lr
                << ",\"bf16_changed\":" << r.bf16.changed << ",\"fp8_changed\":" << r.fp8.changed
                << ",\"blocks_rescaled\":" << r.fp8.rescaled
                << ",\"bf16_payload_bytes\":" << r.bf16.payload
                << ",\"fp8_payload_bytes\":" << r.fp8.payload
                << ",\"fp8_payload_pct_of_fp8\":" << bench::fmt(pct(r.fp8.payload, fp8_ckpt), 4)
                << ",\"fp8_payload_pct_of_bf16\":" << bench::fmt(pct(r.fp8.payload, bf16_ckpt), 4)
                << ",\"bf16_payload_pct\":" << bench::fmt(pct(r.bf16.payload, bf16_ckpt), 4)
                << ",\"bf16_ratio_to_memcpy\":" << bench::fmt(r.bf16.construct_s / r.memcpy_s, 3)
                << ",\"fp8_ratio_to_memcpy\":" << bench::fmt(r.fp8.construct_s / r.memcpy_s, 3)
                << ",\"fp8_assembled_ratio_to_memcpy\":"
                << bench::fmt(r.assembled.construct_s / r.memcpy_s, 3) << "}";
    }
    std::cout << "]}\n";
    return 0;
  }

  bench::table t({"step", "lr", "BF16 changed", "FP8 changed", "tiles re-scaled", "BF16 payload MB",
                  "% of BF16", "FP8 payload MB", "% of FP8", "FP8 % of BF16", "BF16 build s",
                  "FP8 build s", "BF16 / memcpy", "FP8 / memcpy", "FP8 assembled-only / memcpy"});
  for (auto& r : rows)
    t.add({std::to_string(r.step), bench::fmt(r.lr * 1e6, 0) + "e-6",
           std::to_string(r.bf16.changed), std::to_string(r.fp8.changed),
           std::to_string(r.fp8.rescaled) + " (" + bench::fmt(pct(r.fp8.rescaled, tiles), 2) + "%)",
           bench::fmt(r.bf16.payload / 1e6, 2), bench::fmt(pct(r.bf16.payload, bf16_ckpt), 3),
           bench::fmt(r.fp8.payload / 1e6, 2), bench::fmt(pct(r.fp8.payload, fp8_ckpt), 3),
           bench::fmt(pct(r.fp8.payload, bf16_ckpt), 3), bench::fmt(r.bf16.construct_s, 3),
           bench::fmt(r.fp8.construct_s, 3), bench::fmt(r.bf16.construct_s / r.memcpy_s, 2),
           bench::fmt(r.fp8.construct_s / r.memcpy_s, 2),
           bench::fmt(r.assembled.construct_s / r.memcpy_s, 2)});
  if (opt.markdown) std::cout << "## FP8 rollout vs BF16 rollout (`dcr-bench-fp8-rollout`)\n\n";
  std::cout << (opt.markdown ? "" : "dcr-bench-fp8-rollout: ") << "Llama-style model, "
            << cfg.layers << " layers, hidden " << cfg.hidden << ", head_dim " << cfg.head_dim
            << "; BF16 checkpoint " << bench::fmt(bf16_ckpt / 1e9, 3) << " GB, block-FP8 "
            << "checkpoint (e4m3, [128, 128] tiles, " << tiles << " tiles) "
            << bench::fmt(fp8_ckpt / 1e9, 3) << " GB; Megatron TP " << layout.tp << ", "
            << bf16_plan->world << " owners on one core; the same AdamW steps for both. Machine: "
            << bench::machine_description() << (opt.markdown ? "\n\n" : "\n\n");
  t.print(std::cout, opt.markdown);
  const auto mb = bf16_side.memory(), mf = fp8_side.memory(), ma = asm_side.memory();
  std::cout << "\nBaseline memory: BF16 rollout " << bench::fmt(mb.total() / 1e9, 3) << " GB ("
            << bench::fmt(mb.total() / bf16_ckpt, 3) << "x the BF16 checkpoint); FP8 rollout "
            << bench::fmt(mf.total() / 1e9, 3) << " GB (trackers "
            << bench::fmt(mf.tracker_bytes / 1e9, 3) << " GB + residual FP8 baseline "
            << bench::fmt(mf.residual_bytes / 1e9, 3) << " GB; "
            << bench::fmt(mf.total() / bf16_ckpt, 3) << "x the BF16 checkpoint; " << local_shards
            << " of " << fp8_shards << " quantised shards take the shard-local path, whose "
            << "trackers hold converted codes and scales instead of BF16); FP8 with every weight "
            << "assembled " << bench::fmt(ma.total() / 1e9, 3) << " GB ("
            << bench::fmt(ma.total() / bf16_ckpt, 3) << "x).\n";
  if (opt.markdown)
    std::cout
        << "\nchanged = records emitted (BF16: changed words; FP8: changed codes, scales "
           "and BF16 tensors); tiles re-scaled = scale_inv entries that changed (% of all "
           "tiles); payload = all owners' payloads, default encoding, zstd level 1; build "
           "= all owners' item construction on one core, summed, against memcpy of the "
           "source bytes in the same run; FP8 = shard-local path where shards hold whole "
           "tiles, residual assembly elsewhere; assembled-only = residual assembly for every "
           "weight (the same changed elements, checked; payloads group them by other owners).\n";
  return 0;
}
