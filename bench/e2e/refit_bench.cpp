// dcr-bench-refit: delta refit vs dense refit end to end, in one process on
// the embedded defaults: Megatron-style owners (TP2 x EP2 x DP2) → durable
// filesystem object store → vLLM-style receivers (TP 4, DP 2, expert parallel) → joint commit in
// a file commit store. Dense reference, measured in the same run: canonical
// export + upload of every tensor + one download + dense load into every
// receiver through the same native loader. Change rates 1.2 / 3 / 5 % of
// elements (exact counts per shard, RNE of x·(1 + 0.01 z)).
// Verified: after each timed delta refit, outside its timed region, every
// receiver's storage is compared byte for byte with the dense refit of the
// same candidate (the reference's own receivers); any difference fails the
// bench (exit 1), and the committed record must name the candidate's version.
#include <filesystem>
#include <memory>
#include <thread>

#include <unistd.h>

#include "bench_common.hpp"
#include "dcr/assembly/adapters.hpp"
#include "dcr/loaders/vllm_style.hpp"
#include "dcr/model/trainer_layout.hpp"
#include "dcr/protocol/coordinator.hpp"
#include "dcr/receiver/receiver.hpp"
#include "dcr/receiver/tensor_set.hpp"
#include "dcr/source/state.hpp"
#include "examples/common/simulator.hpp"

using namespace dcr;
using namespace dcr::protocol;
using clk = std::chrono::steady_clock;

namespace {
using loader_t = loaders::vllm_style_loader;
using rank_t = receiver<loader_t>;
using staged_t = receiver_role_adapter<rank_t>;
using endpoint_t = receiver_endpoint<staged_t>;
using member_t = training_round::member;
using coord_t = coordinator<member_t, staged_t, transport::fs_object_store, file_commit_store>;

double since(clk::time_point t) { return std::chrono::duration<double>(clk::now() - t).count(); }

model_config bench_model(bool quick) {
  model_config c;
  c.family = "qwen3_moe", c.qk_norm = true, c.ffn = 0;
  if (quick)
    c.hidden = 128, c.heads = 4, c.kv_heads = 2, c.head_dim = 32, c.experts = 8, c.moe_ffn = 64,
    c.vocab = 1000, c.layers = 2;
  else
    c.hidden = 512, c.heads = 8, c.kv_heads = 4, c.head_dim = 64, c.experts = 16, c.moe_ffn = 256,
    c.vocab = 16000, c.layers = 6;
  return c;
}

struct row {
  double rate, change_pct, payload_pct, payload_mb, delta_s, dense_s, construct_s, transport_s,
      apply_s, commit_s;
};
} // namespace

int main(int argc, char** argv) try {
  const auto o = bench::options::parse(argc, argv);
  const auto cfg = bench_model(o.quick);
  const trainer_layout tl{2, 1, 2, 1, 2};
  auto plan = std::make_shared<const source_plan>(megatron_plan(cfg, tl));
  const auto& metas = plan->canonical;
  std::uint64_t elems = 0;
  for (auto& m : metas) elems += m.numel();
  std::vector<host_tensor> init;
  for (std::size_t i = 0; i < metas.size(); ++i) {
    host_tensor h(metas[i]);
    auto w = sim::normal_bf16(h.meta.numel(), 0.02f, 42 + i);
    std::memcpy(h.bytes.data(), w.data(), h.bytes.size());
    init.push_back(std::move(h));
  }
  source_state state = source_from_canonical(*plan, init);
  init.clear();

  char tmpl[] = "/tmp/dcr-bench-refit-XXXXXX";
  const std::filesystem::path dir = ::mkdtemp(tmpl);
  transport::fs_object_store objects(dir / "objects");
  file_commit_store commits(dir / "control");
  training_round round(plan, state.view());
  auto members = round.members();
  std::vector<member_t*> op;
  for (auto& m : members) op.push_back(&m);
  std::vector<loader_t> layouts;
  loaders::vllm_parallel_config vp; // "TP 4, DP 2, expert parallel": 8 ranks, EP 8
  vp.tensor_parallel_size = 4;
  vp.data_parallel_size = 2;
  vp.enable_expert_parallel = true;
  for (std::uint64_t k = 0; k < vp.world_size(); ++k)
    layouts.emplace_back(cfg, loaders::vllm_layout::of_rank(vp, k));
  std::vector<std::unique_ptr<endpoint_t>> eps;
  std::vector<endpoint_t*> ep;
  for (std::size_t k = 0; k < layouts.size(); ++k) {
    eps.push_back(std::make_unique<endpoint_t>("rank" + std::to_string(k), nullptr, nullptr));
    ep.push_back(eps.back().get());
  }

  // Dense refit of the current state to fresh receivers (the reference).
  // Unless adopted, the receivers it loaded are left in `reference` for the
  // check of the delta refit.
  std::vector<std::unique_ptr<rank_t>> reference;
  auto dense = [&](bool adopt) {
    const auto t0 = clk::now();
    std::vector<host_tensor> canon;
    throw_if_failed(export_canonical(*plan, state.view(), canon));
    for (auto& t : canon) throw_if_failed(objects.put("dense/" + t.meta.name, t.bytes));
    tensor_set fetched;
    for (auto& m : metas) {
      host_tensor h(m);
      throw_if_failed(objects.get("dense/" + m.name, h.bytes));
      fetched.add(std::move(h));
    }
    std::vector<std::unique_ptr<rank_t>> ranks(layouts.size());
    std::vector<std::thread> ts;
    for (std::size_t w = 0; w < 2; ++w)
      ts.emplace_back([&, w] {
        for (std::size_t k = w; k < layouts.size(); k += 2) {
          ranks[k] = std::make_unique<rank_t>(layouts[k], metas);
          ranks[k]->dense_refit(fetched);
        }
      });
    for (auto& t : ts) t.join();
    const double s = since(t0);
    for (auto& t : canon) (void)objects.remove("dense/" + t.meta.name);
    if (adopt)
      for (std::size_t k = 0; k < ranks.size(); ++k)
        eps[k]->adopt(std::make_unique<staged_t>("rank" + std::to_string(k), std::move(ranks[k])));
    else
      reference = std::move(ranks);
    return s;
  };
  // Every receiver the delta refit updated equals the dense refit of the same
  // candidate byte for byte.
  auto verify = [&](double rate) {
    for (std::size_t k = 0; k < eps.size(); ++k) {
      const auto diff = eps[k]->with_receiver([&](staged_t& r) {
        return bench::storage_difference(r.inner().storage(), reference[k]->storage());
      });
      if (!diff.empty())
        throw error(errc::verification, "delta refit at " + bench::fmt(rate * 100, 1) + " %: rank" +
                                            std::to_string(k) + ": " + diff);
    }
  };
  dense(true);
  coord_t c(commits, objects, op, ep);
  throw_if_failed(c.take_over());
  throw_if_failed(c.bootstrap());

  std::vector<row> rows;
  std::uint64_t step = 0;
  for (double rate : {0.012, 0.03, 0.05}) {
    for (std::size_t s = 0; s < state.shards.size(); ++s) {
      auto& b = state.shards[s];
      std::span<std::uint16_t> w(reinterpret_cast<std::uint16_t*>(b.data()), b.size() / 2);
      sim::stress_update(w, rate, 0.01, 4400 + 31 * step + s);
    }
    ++step;
    round.set_candidate(state.view());
    auto rep = c.transition();
    throw_if_failed(rep.result);
    const auto& a = rep.attempts.back();
    const double dense_s = dense(false);
    verify(rate);
    stored_record committed;
    throw_if_failed(commits.load(committed));
    if (committed.record.version != step) // bootstrap committed version 0
      throw error(errc::verification, "the record names version " +
                                          std::to_string(committed.record.version) + " after " +
                                          std::to_string(step) + " refits");
    rows.push_back({rate * 100, 100.0 * double(round.emitted_records(a.attempt)) / double(elems),
                    100.0 * double(a.payload_bytes) / double(plan->checkpoint_bytes()),
                    a.payload_bytes / 1e6, rep.wall_seconds, dense_s, a.construct_seconds,
                    a.upload_seconds + a.fetch_seconds, a.apply_seconds, rep.commit_seconds});
  }
  std::filesystem::remove_all(dir);

  if (o.json) {
    std::cout << "{\"bench\":\"refit\",\"machine\":"
              << bench::json_string(bench::machine_description())
              << ",\"checkpoint_bytes\":" << plan->checkpoint_bytes()
              << ",\"receivers\":" << layouts.size() << ",\"rows\":[";
    for (std::size_t i = 0; i < rows.size(); ++i) {
      auto& r = rows[i];
      std::cout << (i ? "," : "") << "{\"change_pct\":" << bench::fmt(r.change_pct, 3)
                << ",\"payload_pct\":" << bench::fmt(r.payload_pct, 3)
                << ",\"delta_s\":" << bench::fmt(r.delta_s, 4)
                << ",\"dense_s\":" << bench::fmt(r.dense_s, 4)
                << ",\"speedup_vs_dense\":" << bench::fmt(r.dense_s / r.delta_s, 3) << "}";
    }
    std::cout << "]}\n";
    return 0;
  }
  if (o.markdown)
    std::cout << "\n## Delta refit vs dense refit, end to end (`dcr-bench-refit`)\n\n";
  std::cout << (o.markdown ? "" : "dcr-bench-refit: ") << "Qwen3-MoE-style model, "
            << bench::fmt(plan->checkpoint_bytes() / 1e6, 1) << " MB BF16 (" << metas.size()
            << " tensors); owners Megatron TP2 x EP2 x DP2; receivers vLLM-style TP 4, DP 2, "
               "expert parallel ("
            << layouts.size() << "); durable filesystem object store, file commit store; "
            << bench::machine_description()
            << (o.markdown ? ".\nDense reference in the same run: export + upload + download + "
                             "load into every receiver.\n\n"
                           : "\n\n");
  bench::table t({"change % (target)", "change % (canonical)", "payload MB", "% of ckpt",
                  "construct s", "transport s", "apply s", "commit s", "delta refit s",
                  "dense refit s", "speedup"});
  for (auto& r : rows)
    t.add({bench::fmt(r.rate, 1), bench::fmt(r.change_pct, 2), bench::fmt(r.payload_mb, 2),
           bench::fmt(r.payload_pct, 2), bench::fmt(r.construct_s, 3), bench::fmt(r.transport_s, 3),
           bench::fmt(r.apply_s, 3), bench::fmt(r.commit_s, 3), bench::fmt(r.delta_s, 3),
           bench::fmt(r.dense_s, 3), bench::fmt(r.dense_s / r.delta_s, 1) + "x"});
  t.print(std::cout, o.markdown);
  return 0;
} catch (const std::exception& e) {
  std::cerr << "dcr-bench-refit: " << e.what() << "\n";
  return 1;
}
