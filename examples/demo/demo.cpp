// dcr-demo: delta refits of a synthetic Qwen3-MoE-style model on the embedded
// defaults (no servers). Megatron-style trainer owners (TP2 x EP2 x DP2) train
// with AdamW (lr 1e-6); after every step the changed weights travel as
// compressed payloads through a filesystem object store to vLLM-style
// receivers ("TP 4, DP 2, expert parallel"), which apply them through their native loader; a
// joint commit in a file commit store publishes each version. The run ends by
// checking every receiver byte for byte against a dense refit. A --workdir
// that already holds a committed version (a run killed at any point) resumes
// from that version, or is refused with what to do.
//
//   dcr-demo [--size small|N[KB|MB|GB]] [--steps N] [--checkpoint FILE.safetensors]
//            [--kill-receiver-every K] [--json] [--workdir DIR] [--seed S]
//            [--rollout-dtype bf16|fp8]

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <csignal>
#include <unistd.h>

#ifdef DCR_DEMO_CUDA
#include "dcr/gpu/device_sink.hpp"
#endif
#include "dcr/assembly/adapters.hpp"
#include "dcr/io/safetensors.hpp"
#include "dcr/loaders/row_split.hpp"
#include "dcr/loaders/vllm_style.hpp"
#include "dcr/model/config.hpp"
#include "dcr/model/trainer_layout.hpp"
#include "dcr/protocol/commit_store.hpp"
#include "dcr/protocol/coordinator.hpp"
#include "dcr/receiver/receiver.hpp"
#include "dcr/receiver/tensor_set.hpp"
#include "dcr/source/fp8_plan.hpp"
#include "dcr/source/plan.hpp"
#include "dcr/source/row_split_plan.hpp"
#include "dcr/source/state.hpp"
#include "dcr/transport/object_store.hpp"
#include "examples/common/model_setup.hpp"
#include "examples/common/simulator.hpp"
#include "support/faults.hpp"
#include "support/report.hpp"

using namespace dcr;
using dcr::examples::model_for;
using dcr::examples::parse_size;
using clk = std::chrono::steady_clock;

namespace {

struct options {
  std::string size = "1GB";
  int steps = 3;
  std::string checkpoint;
  int kill_every = 0;
  bool json = false;
  std::string workdir;
  std::string save_checkpoint;
  std::uint64_t seed = 42;
  std::string rollout_dtype = "bf16"; ///< "fp8": the rollout serves block-FP8
  std::string device = "cpu"; ///< "cuda": receivers apply into device storage (cuda::device_sink)
};

[[noreturn]] void usage(const std::string& why) {
  std::cerr
      << "dcr-demo: " << why << "\n"
      << "usage: dcr-demo [--size small|N[KB|MB|GB]] [--steps N] [--checkpoint FILE.safetensors]\n"
      << "                [--kill-receiver-every K] [--json] [--workdir DIR] [--seed S]\n"
      << "                [--save-checkpoint FILE.safetensors]   (write the initial weights and "
         "exit)\n"
      << "                [--rollout-dtype bf16|fp8]   (fp8: train in BF16, serve block-FP8)\n"
      << "                [--device cpu|cuda]   (cuda: receivers apply with the CUDA kernels into "
         "device storage)\n";
  std::exit(2);
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(a + " needs a value");
      return argv[++i];
    };
    auto integer = [&](const std::string& v) {
      char* end = nullptr;
      long x = std::strtol(v.c_str(), &end, 10);
      if (!end || *end || x < 0) usage(a + ": not a non-negative integer: " + v);
      return x;
    };
    if (a == "--size")
      o.size = value();
    else if (a == "--steps")
      o.steps = static_cast<int>(integer(value()));
    else if (a == "--checkpoint")
      o.checkpoint = value();
    else if (a == "--kill-receiver-every")
      o.kill_every = static_cast<int>(integer(value()));
    else if (a == "--json")
      o.json = true;
    else if (a == "--workdir")
      o.workdir = value();
    else if (a == "--save-checkpoint")
      o.save_checkpoint = value();
    else if (a == "--seed")
      o.seed = static_cast<std::uint64_t>(integer(value()));
    else if (a == "--rollout-dtype") {
      o.rollout_dtype = value();
      if (o.rollout_dtype != "bf16" && o.rollout_dtype != "fp8")
        usage("--rollout-dtype: bf16 or fp8, not " + o.rollout_dtype);
    } else if (a == "--device") {
      o.device = value();
      if (o.device != "cpu" && o.device != "cuda") usage("--device: cpu or cuda, not " + o.device);
#ifndef DCR_DEMO_CUDA
      if (o.device == "cuda") usage("--device cuda: this dcr-demo was built without CUDA");
#endif
    } else if (a == "--help" || a == "-h")
      usage("help");
    else
      usage("unknown argument " + a);
  }
  return o;
}

double since(clk::time_point t) { return std::chrono::duration<double>(clk::now() - t).count(); }

struct progress {
  bool quiet_json;
  void operator()(const std::string& s) const { std::cerr << "[dcr-demo] " << s << std::endl; }
};

using member_t = protocol::training_round::member;

struct step_row {
  int step = 0;
  std::size_t attempts = 0;
  double change_pct = 0, payload_pct = 0, payload_mb = 0;
  double construct = 0, transport = 0, apply = 0, commit = 0, refit = 0, speedup = 0;
  double apply_cpu = 0; ///< CPU time of the busiest receiver thread in the apply column
  bool killed = false;
};

std::string fmt_bytes(std::uint64_t b) {
  if (b >= 1'000'000'000) return support::fmt(b / 1e9, 2) + " GB";
  return support::fmt(b / 1e6, 1) + " MB";
}

/// What the rollout side looks like: one loader per rank, ids, a description.
template <class Loader>
struct rollout {
  std::vector<Loader> layouts;
  std::vector<std::string> ids;
  std::string description;
};

/// An FP8 rollout: the model (with its block quantisation) and the BF16
/// training plan whose shards the refit plan shares (same ids).
struct fp8_rollout {
  model_config cfg;
  std::shared_ptr<const source_plan> training;
};

template <class Loader, class Sink>
int run_demo_on(const options& opt, const progress& say, clk::time_point t_start,
                std::shared_ptr<const source_plan> plan, std::vector<host_tensor> initial,
                rollout<Loader> ro, const std::string& model_desc, const std::string& trainer_desc,
                const fp8_rollout* fp8) {
  using rank_receiver = receiver<Loader, Sink>;
  using staged = support::crash_injectable<protocol::receiver_role_adapter<rank_receiver>>;
  using endpoint_t = protocol::receiver_endpoint<staged>;
  // support::crash_at: DCR_DEMO_KILL_AT's hook (default-constructed it never fires).
  using coordinator_t = protocol::coordinator<member_t, staged, transport::fs_object_store,
                                              protocol::file_commit_store, support::crash_at>;
  const auto metas = plan->canonical;
  const std::uint64_t ckpt_bytes = plan->checkpoint_bytes();
  std::uint64_t ckpt_elems = 0;
  for (auto& m : metas) ckpt_elems += m.numel();
  auto& layouts = ro.layouts;

  auto t0 = clk::now();
  // BF16 training state; with an FP8 rollout it comes from the training plan,
  // whose shards are the refit plan's.
  source_state state = source_from_canonical(fp8 ? *fp8->training : *plan, initial);
  initial.clear();
  initial.shrink_to_fit();
  // AdamW on every BF16 shard (other dtypes are carried unchanged).
  std::vector<std::unique_ptr<sim::adamw_trainer>> trainers(plan->shards.size());
  support::parallel_for(plan->shards.size(), [&](std::size_t s) {
    if (plan->shards[s].dtype != dtype_id::bf16) return;
    auto& b = state.shards[s];
    std::span<const std::uint16_t> w(reinterpret_cast<const std::uint16_t*>(b.data()),
                                     b.size() / 2);
    trainers[s] = std::make_unique<sim::adamw_trainer>(w, opt.seed * 104729 + s);
  });
  say("source shards and AdamW state ready (" + support::fmt(since(t0), 1) + " s)");
  auto train_step = [&] {
    support::parallel_for(plan->shards.size(), [&](std::size_t s) {
      if (!trainers[s]) return;
      trainers[s]->step();
      auto w = trainers[s]->bf16();
      std::memcpy(state.shards[s].data(), w.data(), w.size_bytes());
    });
  };

  // ---- embedded infrastructure ----------------------------------------------
  std::filesystem::path work = opt.workdir;
  bool own_work = false;
  if (work.empty()) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "dcr-demo-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) throw error(errc::io, "mkdtemp failed");
    work = tmpl;
    own_work = true;
  }
  transport::fs_object_store objects(work / "objects");
  protocol::file_commit_store commits(work / "control");

  // ---- resume: a workdir that already holds a committed version -------------
  // Training is deterministic in (model, seed), so replaying the committed
  // number of AdamW steps rebuilds the owners' baseline of that version; the
  // record's source-baseline and receiver digests then prove it is the same
  // run (checked after the dense refit below).
  std::uint64_t resumed = 0;
  bool resuming = false;
  {
    protocol::stored_record cur;
    if (auto s = commits.load(cur); !s)
      throw error(s.code, s.message + " (the commit record in " + (work / "control").string() +
                              " cannot be read: restore it, or remove " + work.string() +
                              " to start afresh)");
    if (cur.revision != 0) {
      resuming = true;
      resumed = cur.record.version;
      if (resumed > static_cast<std::uint64_t>(opt.steps))
        throw error(errc::invalid_argument,
                    work.string() + " already holds version " + std::to_string(resumed) +
                        ", past --steps " + std::to_string(opt.steps) + ": pass --steps >= " +
                        std::to_string(resumed) + " to continue it, or another --workdir");
      say("resuming " + work.string() + " from committed version " + std::to_string(resumed) +
          " (replaying " + std::to_string(resumed) + " AdamW steps)");
      for (std::uint64_t k = 0; k < resumed; ++k) train_step();
    }
  }

  protocol::training_round round(plan, state.view());
  auto members = round.members();
  std::vector<member_t*> owner_ptrs;
  for (auto& m : members) owner_ptrs.push_back(&m);

  // The committed canonical tensors: the source of every dense restore. The
  // coordinator may ask for one on any step (a receiver killed mid-refit, or
  // one it stops trusting after a failed attempt), so they are kept for the
  // whole run, refreshed before each training step changes the state.
  tensor_set committed_canon;
  auto export_committed = [&] {
    std::vector<host_tensor> canon;
    throw_if_failed(export_canonical(fp8 ? *fp8->training : *plan, state.view(), canon));
    if (fp8) canon = quantize_fp8_checkpoint(fp8->cfg, canon); // the served FP8 checkpoint
    tensor_set s;
    for (auto& t : canon) s.add(std::move(t));
    return s;
  };
  auto make_rank = [&](std::size_t k) {
    return std::make_unique<rank_receiver>(layouts[k], metas);
  };
  auto rank_id = [&](std::size_t k) { return ro.ids[k]; };

  std::vector<std::unique_ptr<endpoint_t>> endpoints;
  for (std::size_t k = 0; k < layouts.size(); ++k)
    endpoints.push_back(std::make_unique<endpoint_t>(
        rank_id(k), [&, k] { return std::make_unique<staged>(rank_id(k), make_rank(k)); },
        [&](staged& s) {
          s.inner().dense_refit(committed_canon); // dense restore of the committed version
          return status::success();
        }));

  // ---- version 0 (or the resumed one) by dense refit (also the dense reference timing)
  const std::string dense_prefix = "dense/v" + std::to_string(resumed) + "/";
  say("dense refit of version " + std::to_string(resumed) + " to " +
      std::to_string(layouts.size()) + " receivers...");
  t0 = clk::now();
  double dense_seconds = 0;
  {
    auto canon = export_committed();
    const double t_export = since(t0);
    // The dense path ships every tensor through the same object store once
    // per rollout node, then loads it into every rank.
    for (auto& t : canon.tensors())
      throw_if_failed(objects.put(dense_prefix + t.meta.name, t.bytes));
    const double t_put = since(t0);
    tensor_set fetched;
    for (auto& m : metas) {
      host_tensor h(m);
      throw_if_failed(objects.get(dense_prefix + m.name, h.bytes));
      fetched.add(std::move(h));
    }
    std::vector<std::unique_ptr<staged>> ranks(layouts.size());
    support::parallel_for(layouts.size(), [&](std::size_t k) {
      auto r = make_rank(k);
      r->dense_refit(fetched);
      ranks[k] = std::make_unique<staged>(rank_id(k), std::move(r));
    });
    dense_seconds = since(t0);
    say("dense refit: export " + support::fmt(t_export, 2) + " s, upload " +
        support::fmt(t_put - t_export, 2) + " s, total with fetch and load " +
        support::fmt(dense_seconds, 2) + " s");
    for (std::size_t k = 0; k < ranks.size(); ++k) endpoints[k]->adopt(std::move(ranks[k]));
    std::vector<std::string> names;
    throw_if_failed(objects.list("dense/", names));
    for (auto& n : names) (void)objects.remove(n);
  }
  std::vector<endpoint_t*> ep_ptrs;
  for (auto& e : endpoints) ep_ptrs.push_back(e.get());
  support::crash_at kill_at;
  int current_step = 0;
  // DCR_DEMO_KILL_AT=<point>:<step> (point: after_prepare, after_first_ack,
  // after_commit) makes the process SIGKILL itself at that crash point of
  // that step's transition: a hard stop at a named moment, for resume tests.
  if (const char* k = std::getenv("DCR_DEMO_KILL_AT")) {
    const std::string spec = k;
    const auto colon = spec.find(':');
    const std::string point = spec.substr(0, colon);
    const int at = colon == std::string::npos ? 1 : std::atoi(spec.c_str() + colon + 1);
    protocol::crash_point p{};
    if (point == "after_prepare")
      p = protocol::crash_point::after_prepare;
    else if (point == "after_first_ack")
      p = protocol::crash_point::after_first_ack;
    else if (point == "after_commit")
      p = protocol::crash_point::after_commit;
    else
      usage("DCR_DEMO_KILL_AT: unknown crash point " + point);
    kill_at = support::crash_at([p, at, &current_step](protocol::crash_point q) {
      if (q == p && current_step == at) ::kill(::getpid(), SIGKILL);
      return false;
    });
  }
  coordinator_t coord(commits, objects, owner_ptrs, ep_ptrs, {}, std::move(kill_at));
  throw_if_failed(coord.take_over());
  throw_if_failed(coord.bootstrap());
  if (resuming) {
    // Same run? The replayed baseline and the dense receivers must be what
    // the record committed; otherwise refuse rather than publish a mix.
    protocol::stored_record cur;
    throw_if_failed(commits.load(cur));
    std::vector<digest128> base;
    for (auto& m : members) base.push_back(m.baseline_digest());
    const std::string what_to_do = ": re-run with the --size/--checkpoint/--seed that created " +
                                   work.string() + ", or remove it to start afresh";
    if (cur.record.version != resumed || cur.record.source_baseline != protocol::combine(base))
      throw error(errc::verification,
                  work.string() + " holds version " + std::to_string(cur.record.version) +
                      " of another run (its source baseline differs from the replayed one)" +
                      what_to_do);
    for (auto* e : ep_ptrs) {
      auto it =
          std::find_if(cur.record.receivers.begin(), cur.record.receivers.end(),
                       [&](const protocol::receiver_ack& a) { return a.receiver == e->id(); });
      const bool same = it != cur.record.receivers.end() &&
                        e->with_receiver([&](staged& s) { return s.state_digest() == it->state; });
      if (!same)
        throw error(errc::verification, work.string() + ": receiver " + e->id() + " of version " +
                                            std::to_string(resumed) +
                                            " differs from the committed digest" + what_to_do);
    }
    say("version " + std::to_string(resumed) + " resumed (dense refit " +
        support::fmt(dense_seconds, 2) + " s matches the committed digests)");
  } else {
    say("version 0 committed (dense refit " + support::fmt(dense_seconds, 2) + " s)");
  }

  // ---- training steps, each followed by a delta refit ------------------------
  // DCR_DEMO_DROP_AT=<step>: drop receiver 0's storage before that step's
  // transition, so the coordinator restores it densely on a step that kills
  // nothing (the recovery path, for tests).
  int drop_at = 0;
  if (const char* d = std::getenv("DCR_DEMO_DROP_AT")) drop_at = std::atoi(d);
  std::vector<step_row> rows;
  bool ok = true;
  for (int step = static_cast<int>(resumed) + 1; step <= opt.steps; ++step) {
    current_step = step;
    const bool kill = opt.kill_every > 0 && step % opt.kill_every == 0;
    say("step " + std::to_string(step) + "/" + std::to_string(opt.steps) + ": AdamW step...");
    committed_canon = export_committed(); // what a restored receiver gets on this step
    t0 = clk::now();
    train_step();
    const double train_s = since(t0);
    round.set_candidate(state.view());
    if (kill) {
      const auto victim = static_cast<std::size_t>(step / opt.kill_every - 1) % endpoints.size();
      support::kill_after(*endpoints[victim], 1);
      say("step " + std::to_string(step) + ": receiver " + endpoints[victim]->id() +
          " will be killed mid-refit");
    }
    if (step == drop_at) {
      // The storage of receiver 0 is gone before the transition (as when the
      // coordinator distrusts it): its membership step restores it densely.
      endpoints.front()->kill();
      say("step " + std::to_string(step) + ": receiver " + endpoints.front()->id() +
          " dropped before the refit");
    }
    say("step " + std::to_string(step) + ": delta refit (trained in " + support::fmt(train_s, 1) +
        " s)...");
    auto rep_t = coord.transition();
    if (!rep_t.result) {
      std::cerr << "dcr-demo: step " << step << " failed: " << to_string(rep_t.result.code) << ": "
                << rep_t.result.message << "\n";
      ok = false;
      break;
    }
    step_row r;
    r.step = step;
    r.attempts = rep_t.attempts.size();
    r.killed = kill;
    std::uint64_t bytes = 0;
    for (auto& a : rep_t.attempts) {
      r.construct += a.construct_seconds;
      r.transport += a.upload_seconds + a.fetch_seconds;
      r.apply += a.apply_seconds;
      r.apply_cpu += a.apply_cpu_seconds;
      bytes += a.payload_bytes;
    }
    r.payload_mb = static_cast<double>(bytes) / 1e6;
    // A rolled-forward transition ran no attempt (the record was already
    // committed): nothing was sent.
    if (!rep_t.attempts.empty()) {
      r.payload_pct = 100.0 * static_cast<double>(rep_t.attempts.back().payload_bytes) /
                      static_cast<double>(ckpt_bytes);
      r.change_pct = 100.0 *
                     static_cast<double>(round.emitted_records(rep_t.attempts.back().attempt)) /
                     static_cast<double>(ckpt_elems);
    }
    r.commit = rep_t.commit_seconds;
    r.refit = rep_t.wall_seconds;
    r.speedup = r.refit > 0 ? dense_seconds / r.refit : 0;
    rows.push_back(r);
    say("step " + std::to_string(step) + ": committed version " +
        std::to_string(rep_t.committed_version) + " in " + support::fmt(r.refit, 2) + " s (" +
        std::to_string(r.attempts) + " attempt" + (r.attempts > 1 ? "s" : "") + ")");
  }

  // ---- final check: every receiver vs a dense refit of the committed version -
  say("verifying every receiver byte for byte against a dense refit...");
  std::size_t checked = 0;
  bool exact = ok;
  {
    auto canon = export_committed();
    protocol::stored_record cur;
    throw_if_failed(commits.load(cur));
    if (cur.record.version != resumed + rows.size()) exact = false;
    std::mutex m;
    support::parallel_for(endpoints.size(), [&](std::size_t k) {
      rank_receiver ref(layouts[k], metas);
      ref.dense_refit(canon);
      endpoints[k]->with_receiver([&](staged& s) {
        auto diff = first_difference(s.inner().storage(), ref.storage());
        if constexpr (Sink::mirrors) {
          // Device storage, downloaded, against the dense refit.
          const auto& sink = s.inner().sink();
          for (std::size_t p = 0; diff.empty() && p < ref.storage().size(); ++p)
            if (sink.bytes(p) != ref.storage()[p].bytes)
              diff = "device copy of " + ref.storage()[p].meta.name;
        }
        const bool digest_ok =
            k < cur.record.receivers.size() && cur.record.receivers[k].state == s.state_digest();
        std::lock_guard l(m);
        if (!diff.empty()) {
          std::cerr << "dcr-demo: receiver " << endpoints[k]->id()
                    << " differs from dense refit: " << diff << "\n";
          exact = false;
        }
        if (!digest_ok) {
          std::cerr << "dcr-demo: receiver " << endpoints[k]->id()
                    << " does not serve its committed digest\n";
          exact = false;
        }
        ++checked;
      });
    });
  }

  // ---- report ---------------------------------------------------------------
  if (opt.json) {
    std::cout << "{\"steps\":[";
    for (std::size_t i = 0; i < rows.size(); ++i)
      std::cout << (i ? "," : "") << "{\"step\":" << rows[i].step
                << ",\"change_pct\":" << support::fmt(rows[i].change_pct, 4)
                << ",\"payload_pct\":" << support::fmt(rows[i].payload_pct, 4)
                << ",\"speedup_vs_dense\":" << support::fmt(rows[i].speedup, 3) << "}";
    std::cout << "],\"rollout_dtype\":\"" << opt.rollout_dtype << "\""
              << ",\"bit_exact\":" << (exact ? "true" : "false")
              << ",\"receivers_checked\":" << checked << "}\n";
  } else {
    std::cout << "\ndcr-demo: " << model_desc << ", " << fmt_bytes(ckpt_bytes) << " checkpoint ("
              << metas.size() << " tensors); " << trainer_desc << "; " << ro.description << "\n"
              << "transport: filesystem object store; commit: file commit store; machine: "
              << support::machine_description() << "\n"
              << "dense refit reference (export + store + fetch + load, all receivers): "
              << support::fmt(dense_seconds, 2) << " s\n\n";
    support::table t({"step", "attempts", "change %", "payload MB", "% of ckpt", "construct s",
                      "transport s", "apply s", "commit s", "refit s", "vs dense"});
    for (auto& r : rows)
      t.add({std::to_string(r.step) + (r.killed ? " (kill)" : ""), std::to_string(r.attempts),
             support::fmt(r.change_pct, 3), support::fmt(r.payload_mb, 2),
             support::fmt(r.payload_pct, 3), support::fmt(r.construct, 2),
             support::fmt(r.transport, 2), support::fmt(r.apply, 2), support::fmt(r.commit, 2),
             support::fmt(r.refit, 2), support::fmt(r.speedup, 1) + "x"});
    t.print(std::cout, false);
    // The apply column is wall time of receiver threads that share the
    // machine's cores with every other receiver and owner of this process.
    std::cout << "\napply s is wall time; CPU time of the busiest receiver thread:";
    for (auto& r : rows)
      std::cout << " step " << r.step << " " << support::fmt(r.apply_cpu, 3) << " s;";
    std::cout << "\nverification: " << checked << " receivers " << (exact ? "equal" : "DIFFER FROM")
              << " a dense refit of version " << resumed + rows.size()
              << " byte for byte: " << (exact ? "PASS" : "FAIL") << "\n"
              << "total " << support::fmt(since(t_start), 1) << " s\n";
  }
  if (own_work) std::filesystem::remove_all(work);
  return exact ? 0 : 1;
}

} // namespace

/// `run_demo_on` with the receivers' storage sink that `--device` names.
template <class Loader>
int run_demo(const options& opt, const progress& say, clk::time_point t_start,
             std::shared_ptr<const source_plan> plan, std::vector<host_tensor> initial,
             rollout<Loader> ro, const std::string& model_desc, const std::string& trainer_desc,
             const fp8_rollout* fp8 = nullptr) {
#ifdef DCR_DEMO_CUDA
  if (opt.device == "cuda") {
    throw_if_failed(cuda::device_sink::available());
    say("receivers apply with the CUDA kernels into device storage");
    return run_demo_on<Loader, cuda::device_sink>(opt, say, t_start, std::move(plan),
                                                  std::move(initial), std::move(ro), model_desc,
                                                  trainer_desc, fp8);
  }
#endif
  return run_demo_on<Loader, host_sink>(opt, say, t_start, std::move(plan), std::move(initial),
                                        std::move(ro), model_desc, trainer_desc, fp8);
}

int main(int argc, char** argv) try {
  const auto opt = parse(argc, argv);
  progress say{opt.json};
  const auto t_start = clk::now();

  if (!opt.checkpoint.empty() && opt.rollout_dtype != "bf16")
    usage("--rollout-dtype fp8 needs a model config (--size), not --checkpoint");
  if (!opt.checkpoint.empty()) {
    // A real checkpoint: its tensors are the initial weights.
    std::vector<host_tensor> initial = examples::read_checkpoint(opt.checkpoint);
    std::vector<tensor_meta> metas;
    for (auto& t : initial) metas.push_back(t.meta);
    auto plan = std::make_shared<const source_plan>(row_split_plan(metas));
    rollout<loaders::row_split_loader> ro;
    for (std::uint64_t r = 0; r < 4; ++r) {
      ro.layouts.emplace_back(4, r, metas);
      ro.ids.push_back("rank" + std::to_string(r));
    }
    ro.description = "4 receivers (each tensor row-split where it divides, else replicated)";
    say("checkpoint " + opt.checkpoint + ": " + std::to_string(metas.size()) + " tensors, " +
        fmt_bytes(plan->checkpoint_bytes()));
    say("trainer: TP2 x DP2 (4 owners); rollout: " + ro.description);
    return run_demo(opt, say, t_start, plan, std::move(initial), std::move(ro),
                    "checkpoint " + opt.checkpoint, "4 trainer owners (TP2 x DP2)");
  }

  model_config cfg = model_for(parse_size(opt.size));
  const trainer_layout tl{2, 1, cfg.is_moe() ? 2u : 1u, 1, 2};
  // Receivers as vLLM is started: MoE "TP 4, DP 2, expert parallel" (8 ranks), dense TP 4.
  loaders::vllm_parallel_config vp;
  vp.tensor_parallel_size = 4;
  vp.data_parallel_size = cfg.is_moe() ? 2 : 1;
  vp.enable_expert_parallel = cfg.is_moe();
  std::optional<fp8_rollout> fp8;
  if (opt.rollout_dtype == "fp8") {
    // The largest square tile (128 as published, else smaller) vLLM accepts
    // for this model on this deployment: the demo's heads are narrower than
    // a 128-row tile per rank.
    for (std::uint64_t b : {128u, 64u, 32u, 16u}) {
      cfg.fp8 = fp8_block_quantization{b, b, {}};
      bool ok = true;
      for (std::uint64_t k = 0; k < vp.world_size() && ok; ++k)
        ok = loaders::vllm_style_loader(cfg, loaders::vllm_layout::of_rank(vp, k))
                 .fp8_unsupported()
                 .empty();
      if (ok) break;
    }
    fp8 = fp8_rollout{cfg, std::make_shared<const source_plan>(megatron_plan(cfg, tl))};
  }
  auto plan = std::make_shared<const source_plan>(fp8 ? megatron_fp8_plan(cfg, tl)
                                                      : megatron_plan(cfg, tl));
  const auto& metas = fp8 ? fp8->training->canonical : plan->canonical;
  rollout<loaders::vllm_style_loader> ro;
  for (std::uint64_t k = 0; k < vp.world_size(); ++k) {
    const auto rl = loaders::vllm_layout::of_rank(vp, k);
    ro.layouts.emplace_back(cfg, rl);
    ro.ids.push_back("dp" + std::to_string(rl.dp_rank) + "-tp" + std::to_string(rl.tp_rank));
  }
  ro.description = std::to_string(vp.world_size()) + " vLLM-style receivers (TP " +
                   std::to_string(vp.tensor_parallel_size) + ", DP " +
                   std::to_string(vp.data_parallel_size) +
                   (vp.enable_expert_parallel ? ", expert parallel)" : ")");
  const std::string trainer_desc = std::to_string(plan->world) + " trainer owners (TP" +
                                   std::to_string(tl.tp) + " x EP" + std::to_string(tl.ep) +
                                   " x DP" + std::to_string(tl.dp) + ")";
  say("model: " + cfg.family + ", " + std::to_string(cfg.layers) + " layers, " +
      std::to_string(cfg.experts) + " experts, " + std::to_string(metas.size()) + " tensors, " +
      fmt_bytes((fp8 ? *fp8->training : *plan).checkpoint_bytes()) + " BF16");
  say("trainer: " + trainer_desc + "; rollout: " + ro.description);
  if (fp8)
    say("rollout serves block-FP8 (e4m3, weight_block_size [" + std::to_string(cfg.fp8->block_n) +
        ", " + std::to_string(cfg.fp8->block_k) + "]): " + fmt_bytes(plan->checkpoint_bytes()) +
        " checkpoint, refit by quantize-then-diff");

  auto t0 = clk::now();
  std::vector<host_tensor> initial = examples::synthetic_weights(metas, opt.seed);
  say("initial weights ready (" + support::fmt(since(t0), 1) + " s)");
  if (!opt.save_checkpoint.empty()) {
    std::vector<std::span<const std::byte>> data;
    for (auto& t : initial) data.emplace_back(t.bytes);
    throw_if_failed(io::write_safetensors(opt.save_checkpoint, metas, data));
    say("wrote " + opt.save_checkpoint);
    return 0;
  }
  return run_demo(opt, say, t_start, plan, std::move(initial), std::move(ro),
                  cfg.family + (fp8 ? " model served in FP8" : " model"), trainer_desc,
                  fp8 ? &*fp8 : nullptr);
} catch (const std::exception& e) {
  std::cerr << "dcr-demo: " << e.what() << "\n";
  return 1;
}
