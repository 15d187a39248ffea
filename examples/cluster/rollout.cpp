// dcr-rollout: one rollout node of a cluster job. One node-level endpoint
// fetches every payload of an attempt once from the object store and feeds
// it to the node's receivers, one per serving rank (vLLM-style layouts for
// the synthetic model, row-split for --checkpoints), each behind a request
// gate. Started (or started again after a crash), its receivers hold
// nothing until the coordinator's membership step restores them by a dense
// refit from the owners' dense export of the committed version; their
// digests must equal the commit record's entries. See docs/deployment.md.
//
//   dcr-rollout --node K --listen HOST:PORT [job flags] [--die-mid-apply STEP]

#include <atomic>
#include <functional>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "dcr/assembly/adapters.hpp"
#include "dcr/loaders/row_split.hpp"
#include "dcr/loaders/vllm_style.hpp"
#include "dcr/protocol/control_channel.hpp"
#include "dcr/protocol/links.hpp"
#include "dcr/protocol/remote_links.hpp"
#include "dcr/receiver/receiver.hpp"
#include "dcr/receiver/tensor_set.hpp"
#include "dcr/source/state.hpp"
#include "examples/cluster/cluster_job.hpp"
#include "examples/cluster/relay_job.hpp"
#include "examples/cluster/timeline.hpp"

using namespace dcr;

namespace {

/// Where the dense copy of the committed version lies, and a cache of it
/// (fetched once per node per restore, shared by the node's receivers).
struct dense_source {
  cluster::job_object_store* objects;
  const cluster::job* j;
  std::mutex m;
  std::uint64_t version = 0;
  std::string incarnation;
  std::optional<tensor_set> cached;

  void point_at(std::uint64_t v, const std::string& inc) {
    std::lock_guard l(m);
    if (v != version || inc != incarnation) cached.reset();
    version = v;
    incarnation = inc;
  }
  void drop() {
    std::lock_guard l(m);
    cached.reset();
  }
  status fetch(const tensor_set*& out) {
    std::lock_guard l(m);
    if (!cached) {
      DCR_RETURN_ERROR_IF(incarnation.empty(), not_found, "no committed version to restore");
      transport::incarnation_scope<cluster::job_object_store> scoped(*objects, incarnation);
      // The owners exported the committed bytes of their shards; the
      // canonical tensors are those shards through the trainer's maps.
      const auto& plan = *j->plan;
      source_state shards;
      shards.shards.resize(plan.shards.size());
      for (std::uint32_t id = 0; id < plan.shards.size(); ++id) {
        auto& b = shards.shards[id];
        const auto name = cluster::dense_shard_name(version, id);
        DCR_TRY(scoped.get(name, b));
        DCR_TRY(cluster::open_dense_shard(incarnation, name, b, j->flags.key));
        DCR_RETURN_ERROR_IF(b.size() != plan.shards[id].nbytes(), shape_mismatch,
                            "dense export of shard " + plan.shards[id].key + ": " +
                                std::to_string(b.size()) + " bytes, expected " +
                                std::to_string(plan.shards[id].nbytes()));
      }
      std::vector<host_tensor> canon;
      DCR_TRY(export_canonical(plan, shards.view(), canon));
      shards = {};
      tensor_set s;
      for (auto& t : canon) s.add(std::move(t));
      cached = std::move(s);
    }
    out = &*cached;
    return status::success();
  }
};

/// A rank's receiver as the protocol sees it; `--die-mid-apply` SIGKILLs the
/// process at its second staged payload of the armed step (the first one is
/// applied by then in synchronous mode).
template <class Loader>
class rank_receiver {
public:
  using inner_t = protocol::receiver_role_adapter<receiver<Loader>>;
  rank_receiver(std::string id, std::unique_ptr<receiver<Loader>> r, const std::atomic<bool>* armed,
                std::atomic<std::uint64_t>* largest = nullptr)
      : r_(std::move(id), std::move(r)), armed_(armed), largest_(largest) {}
  std::string receiver_id() const { return r_.receiver_id(); }
  void begin_attempt(std::uint64_t a) {
    staged_ = 0;
    r_.begin_attempt(a);
  }
  status stage(std::span<const std::byte> b) {
    cluster::timeline::scope timed{"apply"};
    if (largest_) {
      auto seen = largest_->load();
      while (b.size() > seen && !largest_->compare_exchange_weak(seen, b.size())) {
      }
    }
    DCR_TRY(r_.stage(b));
    if (armed_ && armed_->load() && ++staged_ == 2) dying();
    return status::success();
  }
  status apply_staged() {
    cluster::timeline::scope timed{"apply"};
    return r_.apply_staged();
  }
  status finish() { return r_.finish(); }
  digest128 state_digest() const { return r_.state_digest(); }
  bool needs(std::string_view name) const { return r_.needs(name); }
  receiver<Loader>& inner() { return r_.inner(); }
  std::function<void()> dying;

private:
  inner_t r_;
  const std::atomic<bool>* armed_;
  std::atomic<std::uint64_t>* largest_; ///< the largest payload any receiver of the node staged
  int staged_ = 0;
};

/// The node link with what a process needs around it: the restore source
/// follows the membership call, the armed fault follows the target version,
/// and each refit leaves its peak resident set and the bytes the node must
/// hold on the timeline (`held(apply_queue)`).
template <class Link>
struct node_process_link {
  Link* link;
  dense_source* dense;
  std::uint64_t die_step;
  std::atomic<bool>* armed;
  const cluster::job* j;
  std::function<std::uint64_t(std::size_t)> held;

  std::vector<std::string> ids() const { return link->ids(); }
  status down(std::size_t& n) { return link->down(n); }
  status ensure_member(const protocol::membership& m, std::size_t& n) {
    dense->point_at(m.version, m.incarnation);
    *armed =
        die_step != 0 && m.version + 1 == die_step &&
        !std::filesystem::exists(j->faults_dir() / ("rollout-apply-" + std::to_string(die_step)));
    auto s = link->ensure_member(m, n);
    dense->drop(); // restores done: release the dense copy
    return s;
  }
  status begin(std::uint64_t a) { return link->begin(a); }
  status close_gate(std::uint64_t a) { return link->close_gate(a); }
  status open_gate(std::uint64_t a) { return link->open_gate(a); }
  status refit(const protocol::refit_request& rq, const std::atomic<bool>& stop,
               protocol::refit_result& res) {
    // The peak over this refit only: not the model's prewarm or the dense
    // restores and verifications around it.
    cluster::timeline::reset_peak_rss();
    auto s = link->refit(rq, stop, res);
    if (s) {
      if (held) cluster::timeline::record_held(held(rq.apply_queue));
      cluster::timeline::record_peak_rss();
    }
    return s;
  }
  status acknowledge(std::uint64_t a, std::vector<digest128>& acks) {
    return link->acknowledge(a, acks);
  }
  status staged_payloads(std::uint64_t a, std::vector<protocol::staged_set>& out) {
    return link->staged_payloads(a, out);
  }
  status kill(const std::string& id) { return link->kill(id); }
};

template <class Loader>
int serve_node(const cluster::job& job, unsigned node, const protocol::peer_address& listen,
               std::uint64_t die_step, std::uint64_t forge_relay_at, std::vector<Loader> layouts,
               std::vector<std::string> ids) {
  using rr = rank_receiver<Loader>;
  using endpoint_t = protocol::receiver_endpoint<rr>;
  const std::string who = "dcr-rollout " + std::to_string(node);
  cluster::job_object_store objects(job);
  dense_source dense{&objects, &job, {}, 0, {}, {}};
  std::atomic<bool> armed{false};
  std::atomic<std::uint64_t> largest_payload{0};
  std::vector<std::unique_ptr<protocol::request_gate>> gates;
  std::vector<std::unique_ptr<endpoint_t>> endpoints;
  receiver_options ropt;
  ropt.key = job.flags.key; // payloads must be sealed with the job key, if any
  for (std::size_t k = 0; k < layouts.size(); ++k) {
    gates.push_back(std::make_unique<protocol::request_gate>());
    endpoints.push_back(std::make_unique<endpoint_t>(
        ids[k],
        [&, k] {
          auto r = std::make_unique<rr>(
              ids[k], std::make_unique<receiver<Loader>>(layouts[k], job.metas, ropt), &armed,
              &largest_payload);
          r->dying = [&job, die_step, who] {
            if (cluster::fire_once(job, "rollout-apply-" + std::to_string(die_step)))
              cluster::die_now(who, "mid-apply of version " + std::to_string(die_step));
          };
          return r;
        },
        [&](rr& r) -> status {
          const tensor_set* src = nullptr;
          DCR_TRY(dense.fetch(src));
          r.inner().dense_refit(*src);
          return status::success();
        },
        gates.back().get()));
  }
  std::vector<endpoint_t*> eps;
  for (auto& e : endpoints) eps.push_back(e.get());
  cluster::timeline::who() = "node" + std::to_string(node);

  // Verification: every receiver's complete storage against a dense load of
  // the committed version through the same loader (from the owners' dense
  // export, not from any payload).
  auto verify = [&](std::uint64_t v, const std::string& inc, std::vector<bool>& equal,
                    std::vector<digest128>& digests) -> status {
    dense.point_at(v, inc);
    const tensor_set* src = nullptr;
    DCR_TRY(dense.fetch(src));
    equal.assign(eps.size(), false);
    digests.assign(eps.size(), {});
    for (std::size_t k = 0; k < eps.size(); ++k) {
      if (!eps[k]->alive()) continue;
      receiver<Loader> ref(layouts[k], job.metas);
      ref.dense_refit(*src);
      eps[k]->with_receiver([&](rr& r) {
        const auto diff = first_difference(r.inner().storage(), ref.storage());
        if (!diff.empty()) std::cerr << who << ": " << ids[k] << " differs: " << diff << std::endl;
        equal[k] = diff.empty();
        digests[k] = r.state_digest();
      });
    }
    dense.drop();
    return status::success();
  };
  // What the node must hold: every receiver's storage and scratch, and the
  // payloads in flight at once: the apply queue's, one being fetched, one
  // being applied, and the copy each receiver stages (each at most the
  // largest payload of the refit).
  auto held = [&](std::size_t apply_queue) {
    std::uint64_t b = 0;
    for (auto* e : eps) {
      try {
        e->with_receiver(
            [&](rr& r) { b += r.inner().storage().nbytes() + r.inner().scratch_bytes(); });
      } catch (const error&) { // down: holds nothing
      }
    }
    // Per refit: the next one starts from its own largest payload.
    return b + largest_payload.exchange(0) * (apply_queue + 2 + eps.size());
  };
  // Payloads come from the object store or, with --transport relay_tree,
  // from this process's relay node (relay_job.hpp); restores stay dense.
  auto serve = [&](auto& link) {
    node_process_link<std::remove_reference_t<decltype(link)>> plink{&link,  &dense, die_step,
                                                                     &armed, &job,   held};
    protocol::node_service<decltype(plink)> service(plink, verify);
    protocol::control_server server(
        [&](const protocol::control_frame& f, const std::atomic<bool>& stop,
            protocol::body_writer& out) { return service(f, stop, out); },
        cluster::job_channel_options(job.flags));
    throw_if_failed(server.listen(listen.host, listen.port));
    std::cerr << who << ": " << eps.size() << " receivers, serving on " << listen.host << ":"
              << server.port() << " (" << job.flags.transport << ")" << std::endl;
    cluster::wait_for_termination();
    server.shutdown();
    cluster::timeline::record_peak_rss(); // since the last refit's start
    return 0;
  };
  if (job.relay()) {
    cluster::process_relay relay(job, node);
    if (forge_relay_at) // --forge-relay-digest: once, at the first attempt from that id on
      relay.forge_digest = [&](std::uint64_t attempt) {
        return attempt >= forge_relay_at && cluster::fire_once(job, "relay-forge");
      };
    std::cerr << who << ": relay node listening on " << job.flags.relay_nodes[node] << std::endl;
    protocol::local_node_link<rr, cluster::process_relay> link(eps, relay, node);
    const int rc = serve(link);
    std::cerr << who << ": " << relay.counters_text() << std::endl;
    return rc;
  }
  cluster::timeline::timed_store<cluster::job_object_store> fetches{&objects};
  protocol::local_node_link<rr, decltype(fetches)> link(eps, fetches, node);
  // By the manifest index, only the payloads of tensors these receivers
  // hold anything of (an expert-parallel node skips other nodes' experts).
  link.fetch_all(job.flags.fetch_all);
  // The coordinator binds each manifest this node reads to the digest its
  // owner reported writing, so the node need not read it twice.
  link.recheck_manifests(false);
  const int rc = serve(link);
  const auto t = link.fetch_totals();
  std::cerr << who << ": fetch " << (job.flags.fetch_all ? "all" : "indexed") << ": fetched "
            << t.payloads << " payloads " << t.bytes << " bytes, skipped " << t.skipped_payloads
            << " payloads " << t.skipped_bytes << " bytes" << std::endl;
  return rc;
}

} // namespace

int main(int argc, char** argv) try {
  cluster::job_flags flags;
  unsigned node = 0;
  bool have_node = false;
  protocol::peer_address listen{"127.0.0.1", 0};
  std::uint64_t die_step = 0;
  std::uint64_t forge_relay_at = 0; // test fault: report a wrong relay stream digest once
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (cluster::parse_job_flag(flags, i, argc, argv)) continue;
    if (a == "--node" && i + 1 < argc) {
      node = static_cast<unsigned>(std::stoul(argv[++i]));
      have_node = true;
    } else if (a == "--listen" && i + 1 < argc) {
      throw_if_failed(protocol::parse_peer_address(argv[++i], listen));
    } else if (a == "--die-mid-apply" && i + 1 < argc) {
      die_step = std::stoull(argv[++i]);
    } else if (a == "--forge-relay-digest" && i + 1 < argc) {
      forge_relay_at = std::stoull(argv[++i]);
    } else {
      std::cerr << "usage: dcr-rollout --node K --listen HOST:PORT [--die-mid-apply STEP]\n"
                   "                   [--forge-relay-digest ATTEMPT]\n"
                << cluster::job_usage;
      return 2;
    }
  }
  if (!have_node || listen.port == 0) {
    std::cerr << "dcr-rollout: --node and --listen HOST:PORT are required\n";
    return 2;
  }
  cluster::check_unkeyed_address(flags, listen, "dcr-rollout: --listen");
  cluster::block_termination_signals();
  const auto job = cluster::make_job(flags);
  if (node >= flags.nodes)
    throw error(errc::invalid_argument, "--node " + std::to_string(node) + ": the job has " +
                                            std::to_string(flags.nodes) + " nodes");
  if (job.relay() && node < flags.relay_nodes.size()) {
    protocol::peer_address relay_at;
    throw_if_failed(protocol::parse_peer_address(flags.relay_nodes[node], relay_at));
    cluster::check_unkeyed_address(flags, relay_at, "dcr-rollout: relay node");
  }
  const std::size_t world = job.receivers();
  const std::size_t first = std::size_t{node} * flags.ranks;
  if (job.from_checkpoints) {
    std::vector<loaders::row_split_loader> layouts;
    std::vector<std::string> ids;
    for (std::size_t r = first; r < first + flags.ranks; ++r) {
      layouts.emplace_back(world, r, job.metas);
      ids.push_back("rank" + std::to_string(r));
    }
    return serve_node(job, node, listen, die_step, forge_relay_at, std::move(layouts),
                      std::move(ids));
  }
  // vLLM as started for the job: TP = receivers per node, DP = nodes (expert parallel).
  const auto vp = examples::vllm_config(job.cfg, flags.ranks, flags.nodes);
  if (vp.world_size() != world)
    throw error(errc::invalid_argument, "the model is dense: use --nodes 1 (vLLM TP only)");
  std::vector<loaders::vllm_style_loader> layouts;
  std::vector<std::string> ids;
  for (std::size_t r = first; r < first + flags.ranks; ++r) {
    const auto rl = loaders::vllm_layout::of_rank(vp, r);
    layouts.emplace_back(job.cfg, rl);
    ids.push_back(examples::vllm_rank_id(rl));
  }
  return serve_node(job, node, listen, die_step, forge_relay_at, std::move(layouts),
                    std::move(ids));
} catch (const std::exception& e) {
  std::cerr << "dcr-rollout: " << e.what() << "\n";
  return 1;
}
