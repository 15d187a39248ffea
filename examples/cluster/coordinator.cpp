// dcr-coordinator: takes over through the commit store (fencing every older
// coordinator), bootstraps version 0 if nothing is committed, then runs
// transitions until --steps is committed: attempts over the owner and
// rollout processes (remote links), overwrite_all retries, commit by
// compare-and-set. A peer that is down makes it wait and retry (every
// receiver is required); a coordinator started after another one died
// completes or retries what that one left. --verify checks every receiver
// against a dense load of the committed version. See docs/deployment.md.
//
//   dcr-coordinator --owner HOST:PORT... --node HOST:PORT... [job flags]
//                   [--steps N] [--verify] [--rows FILE] [--wait SECONDS]
//                   [--die-at POINT:STEP]   (after_prepare, mid_delivery,
//                                            before_commit, after_commit)

#include <chrono>
#include <fstream>
#include <functional>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "dcr/protocol/commit_store.hpp"
#include "dcr/protocol/coordinator.hpp"
#include "dcr/protocol/remote_links.hpp"
#include "examples/cluster/cluster_job.hpp"
#include "examples/cluster/timeline.hpp"
#include "support/faults.hpp"
#include "support/report.hpp"

using namespace dcr;
using clk = std::chrono::steady_clock;

namespace {

[[noreturn]] void usage(const std::string& why) {
  std::cerr << "dcr-coordinator: " << why << "\n"
            << "usage: dcr-coordinator --owner HOST:PORT... --node HOST:PORT... [--steps N]\n"
            << "         [--verify] [--rows FILE] [--wait SECONDS] [--die-at POINT:STEP]\n"
            << cluster::job_usage;
  std::exit(2);
}

/// Retry `f` while it fails with `unavailable` (a peer down or restarting),
/// for at most `wait`.
template <class F>
status with_patience(std::chrono::seconds wait, const char* what, F&& f) {
  const auto until = clk::now() + wait;
  for (;;) {
    auto s = f();
    if (s || s.code != errc::unavailable || clk::now() > until) return s;
    std::cerr << "dcr-coordinator: " << what << ": " << s.message << " (waiting)" << std::endl;
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
}

} // namespace

int main(int argc, char** argv) try {
  cluster::job_flags flags;
  std::vector<protocol::peer_address> owner_at, node_at;
  std::uint64_t steps = 0;
  bool verify = false;
  std::string rows_file, die_point;
  std::uint64_t die_step = 0;
  std::chrono::seconds wait{60};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (cluster::parse_job_flag(flags, i, argc, argv)) continue;
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(a + " needs a value");
      return argv[++i];
    };
    if (a == "--owner" || a == "--node") {
      protocol::peer_address p;
      throw_if_failed(protocol::parse_peer_address(value(), p));
      (a == "--owner" ? owner_at : node_at).push_back(p);
    } else if (a == "--steps")
      steps = std::stoull(value());
    else if (a == "--verify")
      verify = true;
    else if (a == "--rows")
      rows_file = value();
    else if (a == "--wait")
      wait = std::chrono::seconds(std::stoll(value()));
    else if (a == "--die-at") {
      const auto v = value();
      const auto c = v.find(':');
      if (c == std::string::npos) usage("--die-at POINT:STEP");
      die_point = v.substr(0, c);
      die_step = std::stoull(v.substr(c + 1));
    } else
      usage("unknown argument " + a);
  }
  if (owner_at.empty() || node_at.empty()) usage("--owner and --node are required");
  // An unkeyed coordinator would drive peers anyone on their network can
  // also reach: the same rule as the servers' listeners.
  for (const auto& p : owner_at)
    cluster::check_unkeyed_address(flags, p, "dcr-coordinator: --owner");
  for (const auto& p : node_at) cluster::check_unkeyed_address(flags, p, "dcr-coordinator: --node");
  const auto job = cluster::make_job(flags);
  if (owner_at.size() != job.owners())
    usage("the trainer has " + std::to_string(job.owners()) + " ranks, " +
          std::to_string(owner_at.size()) + " --owner given");
  if (node_at.size() != flags.nodes)
    usage("the job has " + std::to_string(flags.nodes) + " nodes, " +
          std::to_string(node_at.size()) + " --node given");

  cluster::job_object_store objects(job);
  throw_if_failed(objects.prepare());
  cluster::job_commit_store commits(job);
  std::vector<std::unique_ptr<protocol::remote_owner_link>> owners;
  std::vector<std::unique_ptr<protocol::remote_node_link>> nodes;
  std::vector<protocol::remote_owner_link*> op;
  std::vector<protocol::remote_node_link*> np;
  for (std::uint32_t k = 0; k < owner_at.size(); ++k) {
    owners.push_back(std::make_unique<protocol::remote_owner_link>(
        k, owner_at[k], cluster::job_channel_options(job.flags)));
    throw_if_failed(with_patience(wait, "owner", [&] { return owners.back()->connect(); }));
    op.push_back(owners.back().get());
  }
  for (auto& p : node_at) {
    nodes.push_back(
        std::make_unique<protocol::remote_node_link>(p, cluster::job_channel_options(job.flags)));
    throw_if_failed(with_patience(wait, "node", [&] { return nodes.back()->connect(); }));
    np.push_back(nodes.back().get());
  }

  // --die-at: SIGKILL this process at a crash point of the transition to
  // version STEP, once per job.
  protocol::coordinator_options copt;
  std::uint64_t target = 0;
  std::function<void(protocol::crash_point)> die_at;
  if (!die_point.empty()) {
    protocol::crash_point p{};
    if (die_point == "after_prepare")
      p = protocol::crash_point::after_prepare;
    else if (die_point == "mid_delivery" || die_point == "after_first_ack")
      p = protocol::crash_point::after_first_ack;
    else if (die_point == "before_commit")
      p = protocol::crash_point::before_commit;
    else if (die_point == "after_commit")
      p = protocol::crash_point::after_commit;
    else
      usage("--die-at: unknown crash point " + die_point);
    die_at = [&, p](protocol::crash_point q) {
      if (q == p && target == die_step &&
          cluster::fire_once(job, "coordinator-" + die_point + "-" + std::to_string(die_step)))
        cluster::die_now("dcr-coordinator", die_point + " of version " + std::to_string(die_step));
    };
  }
  // Timeline (DCR_TIMELINE): the commit runs from before_commit to after_commit.
  // Both are watched through the fault policy, which never fires itself
  // (the process dies by SIGKILL or not at all).
  cluster::timeline::who() = "coordinator";
  std::uint64_t commit_ns = 0;
  support::crash_at watch([&](protocol::crash_point q) {
    if (q == protocol::crash_point::before_commit) commit_ns = cluster::timeline::now_ns();
    if (q == protocol::crash_point::after_commit && commit_ns)
      cluster::timeline::record("commit", commit_ns, cluster::timeline::now_ns());
    if (die_at) die_at(q);
    return false;
  });
  protocol::link_coordinator<protocol::remote_owner_link, protocol::remote_node_link,
                             cluster::job_object_store, cluster::job_commit_store,
                             support::crash_at>
      coord(commits, objects, op, np, copt, std::move(watch));
  throw_if_failed(with_patience(wait, "take over", [&] { return coord.take_over(); }));
  std::cerr << "dcr-coordinator: epoch " << coord.epoch() << std::endl;
  throw_if_failed(with_patience(wait, "bootstrap", [&] { return coord.bootstrap(); }));

  std::ofstream rows;
  if (!rows_file.empty()) rows.open(rows_file, std::ios::app);
  // Owners behind the record: a coordinator died after a commit and before
  // their baseline update; the next transition rolls them forward.
  auto owners_behind = [&](const protocol::stored_record& cur) {
    std::vector<digest128> d(op.size());
    for (std::size_t k = 0; k < op.size(); ++k)
      throw_if_failed(
          with_patience(wait, "owner digest", [&] { return op[k]->baseline_digest(d[k]); }));
    return protocol::combine(d) != cur.record.source_baseline;
  };
  auto load = [&] {
    protocol::stored_record cur;
    throw_if_failed(with_patience(wait, "commit store", [&] { return commits.load(cur); }));
    return cur;
  };
  for (;;) {
    const auto cur = load();
    if (cur.record.version >= steps && !owners_behind(cur)) break;
    target = cur.record.version + 1;
    const auto until = clk::now() + wait;
    protocol::transition_report rep;
    std::size_t attempts = 0;
    std::uint64_t bytes = 0;
    const auto t_step = clk::now(); // every try of this step, waits included
    // Timeline: the peak resident set over this step's transition.
    cluster::timeline::reset_peak_rss();
    for (;;) {
      rep = coord.transition();
      attempts += rep.attempts.size();
      for (auto& a : rep.attempts) {
        bytes += a.payload_bytes;
        // Every failed attempt, with why (the transition retried it).
        if (!a.result)
          std::cerr << "dcr-coordinator: version " << target << " attempt " << a.attempt << ": "
                    << to_string(a.result.code) << ": " << a.result.message << std::endl;
      }
      // What the transition left behind (garbage kept, a receiver not
      // dropped yet, a gate shut): its result stands either way.
      for (auto& f : rep.best_effort)
        std::cerr << "dcr-coordinator: version " << target << ": best effort: " << f.text()
                  << std::endl;
      if (rep.result || clk::now() > until) break;
      // Committed after all, with every owner's baseline moved (e.g. the
      // reply to a baseline update was lost with its link): this step is
      // done. Another transition() would go on to the next version.
      if (const auto now = load(); now.record.version >= target && !owners_behind(now)) {
        std::cerr << "dcr-coordinator: version " << target << ": " << to_string(rep.result.code)
                  << ": " << rep.result.message << " (version " << now.record.version
                  << " is committed and every owner's baseline is at it)" << std::endl;
        rep.result = status::success();
        rep.committed_version = now.record.version;
        break;
      }
      // A peer down (a node restarting) or an attempt it broke: every
      // receiver is required, so wait for it and retry.
      const bool retry = rep.result.code == errc::unavailable || rep.result.code == errc::aborted ||
                         (rep.result.code != errc::conflict && !rep.attempts.empty());
      std::cerr << "dcr-coordinator: version " << target << ": " << to_string(rep.result.code)
                << ": " << rep.result.message << (retry ? " (retrying)" : "") << std::endl;
      if (!retry) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
    cluster::timeline::record_peak_rss();
    if (!rep.result) {
      std::cerr << "dcr-coordinator: version " << target
                << " failed: " << to_string(rep.result.code) << ": " << rep.result.message
                << std::endl;
      return 1;
    }
    std::cerr << "dcr-coordinator: committed version " << rep.committed_version << " (" << attempts
              << " attempts, " << bytes << " payload bytes, "
              << support::fmt(std::chrono::duration<double>(clk::now() - t_step).count(), 3) << " s"
              << (rep.rolled_forward ? ", rolled forward" : "") << ")" << std::endl;
    if (rows)
      rows << "{\"step\":" << rep.committed_version << ",\"attempts\":" << attempts
           << ",\"payload_bytes\":" << bytes
           << ",\"restore_s\":" << support::fmt(rep.restore_seconds, 4) << ",\"refit_s\":"
           << support::fmt(std::chrono::duration<double>(clk::now() - t_step).count(), 4)
           << ",\"rolled_forward\":" << (rep.rolled_forward ? "true" : "false")
           << ",\"epoch\":" << coord.epoch() << "}" << std::endl;
  }

  if (verify) {
    // Every receiver against a dense load of the committed version through
    // its own loader, from the owners' dense export of their committed
    // baseline (independent of every payload); and each serves the digest
    // the commit record holds for it.
    const auto cur = load();
    for (auto* o : op)
      throw_if_failed(with_patience(wait, "dense export", [&] {
        return o->export_dense(cur.record.version, cur.record.incarnation);
      }));
    std::size_t checked = 0, equal = 0;
    std::size_t next = 0;
    for (auto* n : np) {
      std::vector<bool> eq;
      std::vector<digest128> d;
      throw_if_failed(with_patience(wait, "verify", [&] {
        return n->verify(cur.record.version, cur.record.incarnation, eq, d);
      }));
      const auto ids = n->ids();
      for (std::size_t i = 0; i < ids.size(); ++i, ++next) {
        ++checked;
        const bool digest_ok = next < cur.record.receivers.size() &&
                               cur.record.receivers[next].receiver == ids[i] &&
                               cur.record.receivers[next].state == d[i];
        if (!eq[i]) std::cerr << "dcr-coordinator: " << ids[i] << " differs from dense\n";
        if (!digest_ok) std::cerr << "dcr-coordinator: " << ids[i] << " digest != record\n";
        equal += eq[i] && digest_ok ? 1 : 0;
      }
    }
    const bool pass = checked == job.receivers() && equal == checked &&
                      cur.record.receivers.size() == checked && cur.record.version == steps;
    std::cout << "verification: " << equal << " of " << checked
              << " receivers equal a dense load of version " << cur.record.version
              << " byte for byte: " << (pass ? "PASS" : "FAIL") << std::endl;
    return pass ? 0 : 1;
  }
  return 0;
} catch (const std::exception& e) {
  std::cerr << "dcr-coordinator: " << e.what() << "\n";
  return 1;
}
