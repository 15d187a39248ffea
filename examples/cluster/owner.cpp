// dcr-owner: one training rank of a cluster job. Holds its source shards,
// its trackers and its part of the residual baseline; builds and publishes
// payloads when the coordinator asks; moves its baseline to version v only
// after it has read, in the commit store, that K^v committed the attempt it
// published. Training is the built-in AdamW simulator or a replay of
// --checkpoints. Started again after a crash, it replays training to the
// committed version (the simulator is deterministic in seed and step) and
// serves from there. See docs/deployment.md.
//
//   dcr-owner --rank R --listen HOST:PORT [job flags] [--die-mid-upload STEP]

#include <atomic>
#include <iostream>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "dcr/assembly/adapters.hpp"
#include "dcr/protocol/control_channel.hpp"
#include "dcr/protocol/links.hpp"
#include "dcr/protocol/remote_links.hpp"
#include "dcr/source/simulator.hpp"
#include "dcr/source/state.hpp"
#include "examples/cluster/cluster_job.hpp"
#include "examples/cluster/relay_job.hpp"
#include "examples/cluster/timeline.hpp"

using namespace dcr;
using member_t = protocol::training_round::member;

namespace {

/// The object store as the owner writes it; `--die-mid-upload` SIGKILLs the
/// process after the first payload of the armed step's attempt is stored.
struct owner_store {
  cluster::job_object_store* inner;
  const cluster::job* j;
  std::uint64_t die_step = 0;
  std::atomic<std::uint64_t> target{0};

  status put(std::string_view name, std::span<const std::byte> b) {
    const auto t0 = cluster::timeline::now_ns();
    DCR_TRY(inner->put(name, b));
    if (name.find("/payload/") != std::string_view::npos)
      cluster::timeline::record("upload", t0, cluster::timeline::now_ns(), b.size());
    if (die_step && target == die_step && name.find("/payload/") != std::string_view::npos &&
        cluster::fire_once(*j, "owner-upload-" + std::to_string(die_step)))
      cluster::die_now("dcr-owner", "mid-upload of version " + std::to_string(die_step));
    return status::success();
  }
  status get(std::string_view name, std::vector<std::byte>& out) { return inner->get(name, out); }
  status list(std::string_view p, std::vector<std::string>& names) { return inner->list(p, names); }
  status remove(std::string_view name) { return inner->remove(name); }
};

} // namespace

int main(int argc, char** argv) try {
  cluster::job_flags flags;
  std::uint32_t rank = 0;
  bool have_rank = false;
  protocol::peer_address listen{"127.0.0.1", 0};
  std::uint64_t die_step = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (cluster::parse_job_flag(flags, i, argc, argv)) continue;
    if (a == "--rank" && i + 1 < argc) {
      rank = static_cast<std::uint32_t>(std::stoul(argv[++i]));
      have_rank = true;
    } else if (a == "--listen" && i + 1 < argc) {
      throw_if_failed(protocol::parse_peer_address(argv[++i], listen));
    } else if (a == "--die-mid-upload" && i + 1 < argc) {
      die_step = std::stoull(argv[++i]);
    } else {
      std::cerr << "usage: dcr-owner --rank R --listen HOST:PORT [--die-mid-upload STEP]\n"
                << cluster::job_usage;
      return 2;
    }
  }
  if (!have_rank || listen.port == 0) {
    std::cerr << "dcr-owner: --rank and --listen HOST:PORT are required\n";
    return 2;
  }
  cluster::block_termination_signals();
  const auto job = cluster::make_job(flags);
  const auto& plan = *job.plan;
  if (rank >= job.owners())
    throw error(errc::invalid_argument, "--rank " + std::to_string(rank) + ": the trainer has " +
                                            std::to_string(job.owners()) + " ranks");
  const std::string who = "dcr-owner " + std::to_string(rank);
  cluster::timeline::who() = "owner" + std::to_string(rank);
  std::uint64_t commit_call_ns = 0; // start of the commit_baseline call (timeline)

  cluster::job_object_store objects(job);
  throw_if_failed(objects.prepare());
  cluster::job_commit_store commits(job);
  owner_store store{&objects, &job, die_step};

  // ---- training: every owner computes the whole (deterministic) state, so
  // the required set, which spans owners, is known here without an exchange.
  std::vector<host_tensor> initial = job.from_checkpoints
                                         ? examples::read_checkpoint(flags.checkpoints.front())
                                         : examples::synthetic_weights(job.metas, flags.seed);
  source_state state = source_from_canonical(plan, initial);
  initial.clear();
  std::vector<std::unique_ptr<sim::adamw_trainer>> trainers(plan.shards.size());
  if (!job.from_checkpoints && flags.change_pct == 0)
    for (std::size_t s = 0; s < plan.shards.size(); ++s) {
      if (plan.shards[s].dtype != dtype_id::bf16) continue;
      auto& b = state.shards[s];
      trainers[s] = std::make_unique<sim::adamw_trainer>(
          std::span<const std::uint16_t>(reinterpret_cast<const std::uint16_t*>(b.data()),
                                         b.size() / 2),
          flags.seed * 104729 + s);
    }
  std::uint64_t trained = 0; // the version `state` holds
  auto advance_to = [&](std::uint64_t v) {
    if (job.from_checkpoints) {
      const auto k = std::min<std::uint64_t>(v, flags.checkpoints.size() - 1);
      auto t = examples::read_checkpoint(flags.checkpoints[k]);
      state = source_from_canonical(plan, t);
      trained = v;
      return;
    }
    for (; trained < v; ++trained)
      for (std::size_t s = 0; s < plan.shards.size(); ++s) {
        if (flags.change_pct > 0 && plan.shards[s].dtype == dtype_id::bf16) {
          // --change-pct: exactly this share of the elements changes per step
          auto& b = state.shards[s];
          sim::stress_update(std::span(reinterpret_cast<std::uint16_t*>(b.data()), b.size() / 2),
                             flags.change_pct / 100, 1e-2,
                             flags.seed * 104729 + s + (trained + 1) * 7919);
          continue;
        }
        if (!trainers[s]) continue;
        trainers[s]->step();
        auto w = trainers[s]->bf16();
        std::memcpy(state.shards[s].data(), w.data(), w.size_bytes());
      }
  };

  // ---- resume at the committed version ------------------------------------
  const auto cur = cluster::load_record(commits);
  const std::uint64_t committed = cur.revision ? cur.record.version : 0;
  advance_to(committed);
  source_state baseline = state; // the committed version, for dense exports
  builder_options bo;
  // One payload per expert: a node whose receivers hold some experts only
  // (expert parallelism) skips the others' payloads by the manifest index.
  // The experts in one block per rollout node: vLLM's linear placement puts
  // a contiguous block on each node's ranks, so each node fetches one.
  if (job.flags.expert_payloads) {
    bo.grouping = payload_grouping::by_expert;
    bo.expert_blocks = job.flags.nodes;
  }
  protocol::training_round round(job.plan, state.view(), bo);
  auto members = round.members();
  advance_to(committed + 1);
  round.set_candidate(state.view());
  std::uint64_t base_version = committed;
  std::cerr << who << ": baseline at version " << committed << ", candidate " << committed + 1
            << std::endl;

  protocol::owner_hooks hooks;
  hooks.verify_commit = [&](std::uint64_t tau, std::uint64_t v) -> status {
    protocol::stored_record r;
    DCR_TRY(commits.load(r));
    DCR_RETURN_ERROR_IF(r.revision == 0 || r.record.version != v || r.record.attempt != tau,
                        verification,
                        who + ": the commit store does not hold version " + std::to_string(v) +
                            " committed by attempt " + std::to_string(tau) + " (it holds version " +
                            std::to_string(r.record.version) + ", attempt " +
                            std::to_string(r.record.attempt) + "): baseline not moved");
    DCR_RETURN_ERROR_IF(v != base_version + 1, verification,
                        who + ": commit of version " + std::to_string(v) + ", baseline is at " +
                            std::to_string(base_version));
    return status::success();
  };
  hooks.at_version = [&](std::uint64_t v) { return v == base_version; };
  hooks.committed = [&](std::uint64_t v) {
    baseline = state;
    base_version = v;
    cluster::timeline::record("baseline", commit_call_ns, cluster::timeline::now_ns());
    advance_to(v + 1); // the next candidate
    round.set_candidate(state.view());
    std::cerr << who << ": baseline at version " << v << std::endl;
  };
  hooks.export_dense = [&](std::uint64_t v, const std::string& inc) -> status {
    DCR_RETURN_ERROR_IF(v != base_version, not_found,
                        who + ": dense export of version " + std::to_string(v) +
                            ", the committed baseline is version " + std::to_string(base_version));
    std::vector<host_tensor> canon;
    DCR_TRY(export_canonical(plan, baseline.view(), canon));
    transport::incarnation_scope<cluster::job_object_store> scoped(objects, inc);
    // Each owner uploads its share (tensor i of owner i mod world).
    for (std::size_t i = rank; i < canon.size(); i += job.owners())
      DCR_TRY(scoped.put(cluster::dense_name(v, canon[i].meta.name), canon[i].bytes));
    return status::success();
  };
  // Payloads go to the object store or, with --transport relay_tree, stream
  // to the relay root (relay_job.hpp); the protocol is the same over both.
  auto serve = [&](auto& link) {
    protocol::owner_service<std::remove_reference_t<decltype(link)>> service(link, hooks);
    std::mutex one_call; // the process serves one call at a time (training state is shared)
    protocol::control_server server([&](const protocol::control_frame& f,
                                        const std::atomic<bool>& stop, protocol::body_writer& out) {
      std::lock_guard l(one_call);
      commit_call_ns = cluster::timeline::now_ns();
      std::optional<cluster::timeline::scope> timed;
      if (f.type == protocol::control_type::publish) {
        timed.emplace("construction");
        protocol::body_reader r(f.body);
        std::uint64_t target = 0;
        if (r.u64(target)) store.target = target;
      }
      return service(f, stop, out);
    });
    throw_if_failed(server.listen(listen.host, listen.port));
    std::cerr << who << ": serving on " << listen.host << ":" << server.port() << " ("
              << job.flags.transport << ")" << std::endl;
    cluster::wait_for_termination();
    server.shutdown();
    return 0;
  };
  if (job.relay()) {
    cluster::process_relay relay(job, std::nullopt);
    relay.after_payload = [&] { // --die-mid-upload: after the first payload streamed
      if (die_step && store.target == die_step &&
          cluster::fire_once(job, "owner-upload-" + std::to_string(die_step)))
        cluster::die_now("dcr-owner", "mid-stream of version " + std::to_string(die_step));
    };
    protocol::local_owner_link<member_t, cluster::process_relay> link(members[rank], relay);
    return serve(link);
  }
  protocol::local_owner_link<member_t, owner_store> link(members[rank], store);
  return serve(link);
} catch (const std::exception& e) {
  std::cerr << "dcr-owner: " << e.what() << "\n";
  return 1;
}
