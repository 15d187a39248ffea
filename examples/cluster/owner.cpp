// dcr-owner: one training rank of a cluster job. Holds the source shards its
// owner owns (nothing else of the model), its trackers and its part of the
// residual baseline; detects the changes of its candidate and builds and
// publishes payloads when the coordinator asks; moves its baseline to
// version v, by the changed words only, after it has read in the commit
// store that K^v committed the attempt it published, replies, and only then
// trains the next candidate (on its own thread, outside the refit).
// Training is the built-in AdamW simulator or a replay of --checkpoints.
// Started again after a crash, it replays training to the committed version
// (the simulator is deterministic in seed, shard and step) and serves from
// there. See docs/deployment.md.
//
// The process holds an owner lease in the commit store for its life (see
// "Owner leases" in dcr/protocol/commit_store.hpp): a second process started
// as the same rank while this one runs is refused and exits 3; the lease is
// checked before and after every publish and dense export, so a process that
// lost it writes nothing the coordinator accepts. An etcd lease that lapsed
// while the process was cut off is claimed again (new fence token) if no
// other process claimed the rank meanwhile; if one did, this one exits 3.
//
//   dcr-owner --rank R --listen HOST:PORT [job flags] [--die-mid-upload STEP]
//             [--lease-ttl SECONDS] [--lease-wait SECONDS]

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstring>
#include <future>
#include <iostream>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "dcr/assembly/adapters.hpp"
#include "dcr/io/safetensors.hpp"
#include "dcr/protocol/control_channel.hpp"
#include "dcr/protocol/links.hpp"
#include "dcr/protocol/remote_links.hpp"
#include "dcr/source/state.hpp"
#include "examples/cluster/cluster_job.hpp"
#include "examples/cluster/relay_job.hpp"
#include "examples/cluster/timeline.hpp"
#include "examples/common/simulator.hpp"

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
  // Forwarded, or this owner's manifests would be sealed without the job key.
  const dcr::seal_key& seal_key() const noexcept { return inner->seal_key(); }
  // Forwarded, or this owner would upload one payload at a time.
  std::size_t requests_in_flight() const { return inner->requests_in_flight(); }
  // With --fetch-all no node reads index objects: none is written.
  bool index_objects() const { return !j->flags.fetch_all; }
};

} // namespace

int main(int argc, char** argv) try {
  cluster::job_flags flags;
  std::uint32_t rank = 0;
  bool have_rank = false;
  protocol::peer_address listen{"127.0.0.1", 0};
  std::uint64_t die_step = 0;
  std::chrono::seconds lease_ttl{10};
  double lease_wait =
      -1; // < 0: 2 s (file store), the TTL + 2 s (etcd: a killed holder's lease expires)
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
    } else if (a == "--lease-ttl" && i + 1 < argc) {
      lease_ttl = std::chrono::seconds(std::max<unsigned long>(1, std::stoul(argv[++i])));
    } else if (a == "--lease-wait" && i + 1 < argc) {
      lease_wait = std::stod(argv[++i]);
    } else {
      std::cerr << "usage: dcr-owner --rank R --listen HOST:PORT [--die-mid-upload STEP]\n"
                   "                 [--lease-ttl SECONDS] [--lease-wait SECONDS]\n"
                << cluster::job_usage;
      return 2;
    }
  }
  if (!have_rank || listen.port == 0) {
    std::cerr << "dcr-owner: --rank and --listen HOST:PORT are required\n";
    return 2;
  }
  cluster::check_unkeyed_address(flags, listen, "dcr-owner: --listen");
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
  {
    // The owner lease: one process per rank. A second one is refused here,
    // before it trains or serves anything.
    const auto wait = std::chrono::milliseconds(static_cast<std::int64_t>(
        1000 *
        (lease_wait >= 0 ? lease_wait : (flags.etcd.empty() ? 2.0 : lease_ttl.count() + 2.0))));
    if (auto s = commits.claim_owner(rank, lease_ttl, wait); !s) {
      std::cerr << who << ": " << s.message << std::endl;
      return s.code == errc::conflict ? 3 : 1;
    }
    std::cerr << who << ": owner lease held, fence token " << commits.owner_token() << std::endl;
  }

  // ---- training: this process is one training rank. It holds the shards its
  // owner owns (and its residual tasks' inputs), nothing else of the model:
  // they are made from the canonical tensors one tensor at a time (the
  // simulator's, or the slices of a checkpoint file read through its
  // mapping), so its memory is its shards and its trackers.
  const std::vector<std::uint32_t> mine{rank};
  const auto held = owned_inputs(plan, mine);
  const auto pool =
      job.from_checkpoints ? std::vector<std::uint16_t>{} : examples::synthetic_pool(flags.seed);
  auto load_checkpoint = [&](const std::string& path) {
    auto file = io::safetensors_file::open_or_throw(path);
    return owned_source_from_canonical(
        plan, mine, [&](std::uint32_t t) { return file.bytes(plan.canonical[t].name); });
  };
  source_state state =
      job.from_checkpoints
          ? load_checkpoint(flags.checkpoints.front())
          : owned_source_from_canonical(plan, mine, [&](std::uint32_t t) {
              return std::move(examples::synthetic_tensor(job.metas, t, pool, flags.seed).bytes);
            });
  std::uint64_t shard_bytes = 0;
  for (auto s : held) shard_bytes += state.shards[s].size();
  std::vector<std::unique_ptr<sim::adamw_trainer>> trainers(plan.shards.size());
  if (!job.from_checkpoints && flags.change_pct == 0)
    for (auto s : held) {
      if (plan.shards[s].dtype != dtype_id::bf16) continue;
      auto& b = state.shards[s];
      trainers[s] = std::make_unique<sim::adamw_trainer>(
          std::span<const std::uint16_t>(reinterpret_cast<const std::uint16_t*>(b.data()),
                                         b.size() / 2),
          flags.seed * 104729 + s);
    }
  std::uint64_t trained = 0; // the version `state` holds
  // Every step depends on the shard id, the seed and the step only, so a
  // rank that makes its own shards trains them to the same bits as a
  // process holding the whole model would.
  auto advance_to = [&](std::uint64_t v) {
    if (job.from_checkpoints) {
      const auto k = std::min<std::uint64_t>(v, flags.checkpoints.size() - 1);
      auto next = load_checkpoint(flags.checkpoints[k]);
      for (auto s : held) // in place: the round's candidate view points here
        std::memcpy(state.shards[s].data(), next.shards[s].data(), next.shards[s].size());
      trained = v;
      return;
    }
    for (; trained < v; ++trained)
      for (auto s : held) {
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
  // Chunk and bucket targets scaled to this owner's share (at least 8
  // buckets, so that bucket l+1 is built while payload l travels), payloads
  // per block of experts (cluster_job.hpp).
  const builder_options bo = cluster::job_builder_options(job, rank);
  protocol::training_round round(job.plan, state.view(), bo, mine);
  auto members = round.members();
  const auto baseline_bytes = round.baseline(rank).memory().total();
  std::uint64_t base_version = committed;

  // ---- the next candidate, outside the refit ------------------------------
  // Training (or the change injection of --change-pct) runs on its own
  // thread after the owner has replied to the commit, never inside a call
  // the coordinator waits on. Change detection of the candidate is part of
  // the refit: it runs when a call first needs the candidate (the
  // coordinator's candidate digest at the start of a transition, or
  // publish), timed as "compare".
  std::future<void> training;
  bool detected = false;
  auto train_next = [&](std::uint64_t v) {
    detected = false;
    training = std::async(std::launch::async, [&, v] {
      const auto t0 = cluster::timeline::now_ns();
      advance_to(v);
      cluster::timeline::record("train", t0, cluster::timeline::now_ns());
    });
  };
  auto ensure_candidate = [&] {
    if (training.valid()) training.get(); // rethrows a failed step
    if (detected) return;
    cluster::timeline::reset_peak_rss(); // the peak of this refit, not of training
    cluster::timeline::scope timed{"compare"};
    round.set_candidate(state.view());
    detected = true;
  };
  train_next(committed + 1);
  std::cerr << who << ": baseline at version " << committed << ", training candidate "
            << committed + 1 << " (holds " << shard_bytes << " shard bytes, " << baseline_bytes
            << " baseline bytes)" << std::endl;

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
    // The trackers moved by the changed words only (commit_baseline): no copy
    // of the model; dense exports read the trackers.
    base_version = v;
    cluster::timeline::record("baseline", commit_call_ns, cluster::timeline::now_ns());
    cluster::timeline::record_held(shard_bytes + baseline_bytes);
    const auto t = cluster::timeline::now_ns(); // its owned shard bytes, beside
    cluster::timeline::record("owned", t, t, shard_bytes);
    cluster::timeline::record_peak_rss();
    std::cerr << who << ": baseline at version " << v << std::endl;
    train_next(v + 1); // after the reply's work, on its own thread
  };
  hooks.export_dense = [&](std::uint64_t v, const std::string& inc) -> status {
    DCR_RETURN_ERROR_IF(v != base_version, not_found,
                        who + ": dense export of version " + std::to_string(v) +
                            ", the committed baseline is version " + std::to_string(base_version));
    // The committed bytes of every owned shard; a node assembles the
    // canonical tensors from all owners' shards (rollout.cpp).
    transport::incarnation_scope<cluster::job_object_store> scoped(objects, inc);
    try {
      for (auto s : plan.owned_shards(rank)) {
        const auto name = cluster::dense_shard_name(v, s);
        DCR_TRY(scoped.put(name, cluster::seal_dense_shard(inc, name,
                                                           round.baseline(rank).committed_shard(s),
                                                           job.flags.key)));
      }
    } catch (const error& e) {
      return fail(e.code(), who + ": dense export: " + e.what());
    }
    return status::success();
  };
  // Payloads go to the object store or, with --transport relay_tree, stream
  // to the relay root (relay_job.hpp); the protocol is the same over both.
  std::atomic<bool> stale{false}; // the owner id was claimed by another process
  auto serve = [&](auto& link) {
    protocol::owner_service<std::remove_reference_t<decltype(link)>> service(link, hooks);
    std::mutex one_call; // the process serves one call at a time (training state is shared)
    protocol::control_server server(
        [&](const protocol::control_frame& f, const std::atomic<bool>& stop,
            protocol::body_writer& out) {
          std::lock_guard l(one_call);
          commit_call_ns = cluster::timeline::now_ns();
          // The fence: a process that no longer holds the owner lease
          // publishes, exports and moves its baseline no more. Checked again
          // after a publish or export, so a success reply means the lease was
          // held while it wrote (a lost claim never comes back with this token).
          const bool writes = f.type == protocol::control_type::publish ||
                              f.type == protocol::control_type::export_dense;
          // A claim that lapsed while this process was cut off from etcd
          // is taken again here if nobody claimed the id meanwhile; if
          // somebody did, this process is stale for good and exits (3), so
          // that a supervisor sees it.
          if (writes || f.type == protocol::control_type::commit_baseline) {
            const auto before = commits.owner_token();
            if (auto s = commits.hold_owner(); !s) {
              if (s.code == errc::conflict && !stale.exchange(true)) {
                std::cerr << who << ": " << s.message << "; exiting" << std::endl;
                ::kill(::getpid(), SIGTERM);
              }
              return s;
            }
            if (commits.owner_token() != before)
              std::cerr << who << ": owner lease lapsed and claimed again, fence token "
                        << commits.owner_token() << std::endl;
          }
          // Calls that read the candidate wait for its training and detect its
          // changes first (a repeated commit of the version the baseline is at
          // is a no-op and does not wait).
          std::uint64_t commit_of = 0;
          const bool repeated_commit = f.type == protocol::control_type::commit_baseline &&
                                       protocol::body_reader(f.body).u64(commit_of) &&
                                       commit_of == base_version;
          if (f.type == protocol::control_type::candidate_digest ||
              f.type == protocol::control_type::publish ||
              (f.type == protocol::control_type::commit_baseline && !repeated_commit))
            ensure_candidate();
          std::optional<cluster::timeline::scope> timed;
          if (f.type == protocol::control_type::publish) {
            timed.emplace("construction");
            protocol::body_reader r(f.body);
            std::uint64_t target = 0;
            if (r.u64(target)) store.target = target;
          }
          DCR_TRY(service(f, stop, out));
          if (writes) DCR_TRY(commits.check_owner());
          return status::success();
        },
        cluster::job_channel_options(job.flags));
    throw_if_failed(server.listen(listen.host, listen.port));
    std::cerr << who << ": serving on " << listen.host << ":" << server.port() << " ("
              << job.flags.transport << ")" << std::endl;
    cluster::wait_for_termination();
    server.shutdown();
    return stale ? 3 : 0;
  };
  if (job.relay()) {
    cluster::process_relay relay(job, std::nullopt);
    relay.after_payload = [&] { // --die-mid-upload: after the first payload streamed
      if (die_step && store.target == die_step &&
          cluster::fire_once(job, "owner-upload-" + std::to_string(die_step)))
        cluster::die_now("dcr-owner", "mid-stream of version " + std::to_string(die_step));
    };
    protocol::local_owner_link<member_t, cluster::process_relay> link(members.front(), relay);
    return serve(link);
  }
  protocol::local_owner_link<member_t, owner_store> link(members.front(), store);
  return serve(link);
} catch (const std::exception& e) {
  std::cerr << "dcr-owner: " << e.what() << "\n";
  return 1;
}
