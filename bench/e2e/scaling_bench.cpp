// dcr-bench-scaling: cost of each refit stage vs model size at a fixed number
// of changed elements. Models 1x, 4x and 16x (a Llama-style dense model whose
// MLP and vocabulary widen with the factor, so the tensor count stays the
// same), Megatron-style owners (TP2 x DP2), vLLM-style receivers (TP 2),
// payloads through an in-memory object store. Per refit, the same number of
// elements changes (RNE of x·(1 + 0.01 z) at exact per-shard counts), spread
// over every shard. Stages as the coordinator runs them:
//   detect     owners' change detection (`training_round::set_candidate`)
//   construct  owners' build from the changed set + payload coding
//   transport  put + get of every payload (memory store)
//   apply      every receiver stages (decodes, validates) and applies
//   digest     receivers' ACK digests + owners' baseline/candidate digests
//   commit     owners' baseline update
// and, as the reference for what the digest stage cost before it was kept
// incrementally, `full digest`: the same digests recomputed from every byte.
// Only detect and full digest may grow with the model.
#include <algorithm>
#include <map>
#include <memory>

#include "bench_common.hpp"
#include "dcr/assembly/adapters.hpp"
#include "dcr/loaders/vllm_style.hpp"
#include "dcr/model/trainer_layout.hpp"
#include "dcr/receiver/receiver.hpp"
#include "dcr/receiver/tensor_set.hpp"
#include "dcr/source/state.hpp"
#include "dcr/transport/object_store.hpp"
#include "examples/common/simulator.hpp"

using namespace dcr;
using namespace dcr::protocol;
using clk = std::chrono::steady_clock;

namespace {
using loader_t = loaders::vllm_style_loader;
using rank_t = receiver<loader_t>;

double since(clk::time_point t) { return std::chrono::duration<double>(clk::now() - t).count(); }

const char* const stage_names[] = {"detect", "construct", "transport",  "apply",
                                   "digest", "commit",    "full digest"};
constexpr std::size_t n_stages = std::size(stage_names);

model_config scaled_model(std::uint64_t factor, bool quick) {
  model_config c;
  c.family = "llama";
  c.hidden = quick ? 128 : 256;
  c.heads = 4, c.kv_heads = 2, c.head_dim = c.hidden / 4;
  c.layers = 4;
  c.ffn = (quick ? 256 : 1024) * factor;
  c.vocab = (quick ? 1024 : 8192) * factor;
  return c;
}

struct result {
  std::uint64_t factor = 0, model_bytes = 0, changed = 0, payload_bytes = 0;
  std::vector<double> seconds[n_stages]; // per refit
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}
double spread_pct(const std::vector<double>& v) { // (max - min) / median
  if (v.empty()) return 0;
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  const double m = median(v);
  return m > 0 ? 100.0 * (*hi - *lo) / m : 0;
}

result run_factor(std::uint64_t factor, std::uint64_t target_changes, int refits, bool quick,
                  bool reference) {
  const auto cfg = scaled_model(factor, quick);
  const trainer_layout tl{2, 1, 1, 1, 2};
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
  tensor_set committed;
  for (auto& t : init) committed.add(std::move(t));
  training_round round(plan, state.view());
  auto members = round.members();
  loaders::vllm_parallel_config vp;
  vp.tensor_parallel_size = 2;
  std::vector<std::unique_ptr<rank_t>> ranks;
  for (std::uint64_t k = 0; k < vp.world_size(); ++k) {
    ranks.push_back(
        std::make_unique<rank_t>(loader_t(cfg, loaders::vllm_layout::of_rank(vp, k)), metas));
    ranks.back()->dense_refit(committed);
  }
  committed = tensor_set{};

  result res;
  res.factor = factor;
  res.model_bytes = plan->checkpoint_bytes();
  const double fraction = static_cast<double>(target_changes) / static_cast<double>(elems);
  transport::memory_object_store objects;
  for (int step = 0; step < refits; ++step) {
    for (std::size_t s = 0; s < state.shards.size(); ++s) {
      auto& b = state.shards[s];
      std::span<std::uint16_t> w(reinterpret_cast<std::uint16_t*>(b.data()), b.size() / 2);
      sim::stress_update(w, fraction, 0.01, 7000 + 131 * static_cast<std::uint64_t>(step) + s);
    }
    const std::uint64_t attempt = static_cast<std::uint64_t>(step) + 1;
    double t[n_stages] = {};
    auto t0 = clk::now();
    round.set_candidate(state.view());
    t[0] = since(t0);
    std::uint64_t changed = 0;
    for (std::uint32_t r = 0; r < round.size(); ++r) changed += round.changes(r).count();

    std::vector<std::vector<std::byte>> payloads;
    t0 = clk::now();
    for (auto& m : members)
      throw_if_failed(
          m.build({attempt, attempt, refit_mode::mixed}, [&](std::vector<std::byte>&& p) {
            payloads.push_back(std::move(p));
            return status::success();
          }));
    t[1] = since(t0);

    std::uint64_t bytes = 0;
    t0 = clk::now();
    for (std::size_t i = 0; i < payloads.size(); ++i) {
      bytes += payloads[i].size();
      throw_if_failed(objects.put("p/" + std::to_string(i), payloads[i]));
    }
    std::vector<std::vector<std::byte>> fetched(payloads.size());
    for (std::size_t i = 0; i < payloads.size(); ++i)
      throw_if_failed(objects.get("p/" + std::to_string(i), fetched[i]));
    t[2] = since(t0);
    for (std::size_t i = 0; i < payloads.size(); ++i)
      throw_if_failed(objects.remove("p/" + std::to_string(i)));

    t0 = clk::now();
    for (auto& r : ranks) {
      r->begin_attempt(attempt);
      for (auto& p : fetched)
        throw_if_failed(r->stage(p, {.decode_now = true, .exact_attempt = true}));
      throw_if_failed(r->apply_staged());
    }
    t[3] = since(t0);

    t0 = clk::now();
    std::vector<digest128> acks, base, cand;
    for (auto& r : ranks) acks.push_back(r->state_digest());
    for (auto& m : members) {
      base.push_back(m.baseline_digest());
      cand.push_back(m.candidate_digest());
    }
    bench::do_not_optimize(combine(base));
    bench::do_not_optimize(combine(cand));
    t[4] = since(t0);

    t0 = clk::now();
    for (auto& m : members) m.commit_baseline();
    t[5] = since(t0);

    // Reference: what the digest stage cost when it hashed every byte.
    if (!reference) {
      for (std::size_t k = 0; k < n_stages; ++k) res.seconds[k].push_back(t[k]);
      continue;
    }
    t0 = clk::now();
    std::vector<digest128> full;
    for (auto& r : ranks) full.push_back(r->full_state_digest());
    for (std::uint32_t r = 0; r < round.size(); ++r) full.push_back(round.full_baseline_digest(r));
    t[6] = since(t0);
    // The kept digests are the recomputed ones (the bench measures a correct refit).
    for (std::size_t k = 0; k < ranks.size(); ++k)
      if (full[k] != acks[k]) throw error(errc::verification, "receiver digest differs");
    for (std::uint32_t r = 0; r < round.size(); ++r)
      if (full[ranks.size() + r] != cand[r])
        throw error(errc::verification, "owner digest differs");

    for (std::size_t k = 0; k < n_stages; ++k) res.seconds[k].push_back(t[k]);
    res.changed += changed;
    res.payload_bytes += bytes;
  }
  res.changed /= static_cast<std::uint64_t>(refits);
  res.payload_bytes /= static_cast<std::uint64_t>(refits);
  return res;
}
} // namespace

int main(int argc, char** argv) try {
  const auto o = bench::options::parse(argc, argv);
  const std::uint64_t changes = o.quick ? 20000 : 200000;
  const int refits = o.quick ? 2 : 5;
  // `--factor N`: only that model factor (profiling one size).
  std::vector<std::uint64_t> factors{1, 4, 16};
  // `--no-reference`: skip the full recomputation (and the check of the kept digests).
  bool reference = true;
  for (std::size_t i = 0; i < o.rest.size(); ++i) {
    if (o.rest[i] == "--factor" && i + 1 < o.rest.size()) factors = {std::stoull(o.rest[i + 1])};
    if (o.rest[i] == "--no-reference") reference = false;
  }
  std::vector<result> rs;
  for (std::uint64_t f : factors) rs.push_back(run_factor(f, changes, refits, o.quick, reference));

  if (o.json) {
    std::cout << "{\"bench\":\"scaling\",\"machine\":"
              << bench::json_string(bench::machine_description())
              << ",\"changed_elements\":" << changes << ",\"refits\":" << refits << ",\"rows\":[";
    bool first = true;
    for (auto& r : rs)
      for (std::size_t k = 0; k < n_stages; ++k) {
        std::cout << (first ? "" : ",") << "{\"model_factor\":" << r.factor
                  << ",\"model_bytes\":" << r.model_bytes
                  << ",\"stage\":" << bench::json_string(stage_names[k])
                  << ",\"seconds\":" << bench::fmt(median(r.seconds[k]), 6)
                  << ",\"spread_pct\":" << bench::fmt(spread_pct(r.seconds[k]), 1)
                  << ",\"vs_1x\":" << bench::fmt(median(r.seconds[k]) / median(rs[0].seconds[k]), 3)
                  << "}";
        first = false;
      }
    std::cout << "]}\n";
    return 0;
  }
  if (o.markdown) std::cout << "\n## Refit cost vs model size (`dcr-bench-scaling`)\n\n";
  std::cout << (o.markdown ? "" : "dcr-bench-scaling: ")
            << "Llama-style dense BF16 model (4 layers, hidden " << scaled_model(1, o.quick).hidden
            << ", MLP and vocabulary x factor); owners Megatron TP2 x DP2, receivers vLLM-style "
               "TP 2 (2), memory object store; about "
            << changes << " changed elements per refit at every size; median of " << refits
            << " refits (spread = (max - min) / median); " << bench::machine_description()
            << (o.markdown ? ".\n\n" : "\n\n");
  bench::table info({"model factor", "model MB", "changed elements", "payload MB"});
  for (auto& r : rs)
    info.add({std::to_string(r.factor) + "x", bench::fmt(r.model_bytes / 1e6, 1),
              std::to_string(r.changed), bench::fmt(r.payload_bytes / 1e6, 3)});
  info.print(std::cout, o.markdown);
  std::cout << "\n";
  std::vector<std::string> head{"stage"};
  for (auto& r : rs) head.push_back(std::to_string(r.factor) + "x ms");
  for (auto& r : rs) head.push_back(std::to_string(r.factor) + "x spread %");
  for (std::size_t i = 1; i < rs.size(); ++i)
    head.push_back(std::to_string(rs[i].factor) + "x / 1x");
  bench::table t(head);
  for (std::size_t k = 0; k < n_stages; ++k) {
    std::vector<std::string> row{stage_names[k]};
    for (auto& r : rs) row.push_back(bench::fmt(1e3 * median(r.seconds[k]), 3));
    for (auto& r : rs) row.push_back(bench::fmt(spread_pct(r.seconds[k]), 0));
    for (std::size_t i = 1; i < rs.size(); ++i)
      row.push_back(bench::fmt(median(rs[i].seconds[k]) / median(rs[0].seconds[k]), 2));
    t.add(row);
  }
  t.print(std::cout, o.markdown);
  return 0;
} catch (const std::exception& e) {
  std::cerr << "dcr-bench-scaling: " << e.what() << "\n";
  return 1;
}
