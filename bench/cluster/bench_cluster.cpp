// dcr-bench-cluster: measurements on the network-namespace testbed
// (scripts/testbed.sh). Run it under the testbed, which puts the cluster's
// layout into the environment:
//
//   scripts/testbed.sh run --train 2 --roll 2 --rate 1gbit -- build/bench/dcr-bench-cluster
//
// Row "full checkpoint (reference)": the transport-only full-checkpoint
// reference as the paper defines it. Each training node uploads 1/N_train of
// the checkpoint to the object store (in parallel), then every rollout node
// downloads all of it (in parallel). Latency is from the first upload's start
// to the last download's end, on one clock (CLOCK_REALTIME; every namespace
// shares the kernel's). Bytes across the cluster boundary (V_cross) are read
// from the kernel's counters of every node's link, before and after, not
// computed. The link floor is the time the same bytes take at the configured
// link rate: each training node's part up, then the whole checkpoint down
// each rollout node's link, which run in parallel.
//
// The store is touched only from inside the namespaces: the host is not
// connected to the testbed (workers are this program, started with
// `ip netns exec <node> <self> --worker ...`).
//
// Refit rows: the role programs (dcr-owner, dcr-rollout, dcr-coordinator)
// bootstrap version 0, then one timed refit to version 1; the window runs
// from the first owner's comparison of the candidate to the last owner's
// baseline update after the joint commit (timeline.hpp intervals; see
// analyse_timeline), then, outside it, a second coordinator with --verify
// checks every receiver against a dense load (--verify no skips it). Options
// (after --quick/--json/--markdown): --size S, --change-pct P,P,...,
// --transports object_store,relay_tree, --fetch all,indexed, --chunk-bytes N
// and --bucket-bytes N (the owners' targets, job flags), --requests-in-flight N
// (object store requests per owner and node at once, a job flag), --verify yes|no,
// --bin DIR, --svg FILE, --workdir DIR, --port BASE, --relay-fanout K,
// --chunk-mb M and --size-mb M (the reference's objects and size).
// --self-test checks the timeline analysis on a made-up timeline (no testbed).
//
// Outside a testbed (no DCR_TB_NAME) it exits 77 with a message.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>
#include <signal.h>

#include "bench_common.hpp"
#include "dcr/model/config.hpp"
#include "dcr/transport/s3_object_store.hpp"
#include "examples/common/model_setup.hpp"

extern char** environ;

namespace {

using dcr::status;

std::uint64_t now_ns() {
  timespec t{};
  clock_gettime(CLOCK_REALTIME, &t);
  return std::uint64_t(t.tv_sec) * 1000000000u + std::uint64_t(t.tv_nsec);
}

std::string env_or(const char* name, std::string fallback = {}) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : fallback;
}

[[noreturn]] void die(const std::string& what) {
  std::cerr << "dcr-bench-cluster: " << what << "\n";
  std::exit(1);
}

/// The testbed's layout, from the environment `testbed.sh run` exports.
struct testbed {
  std::string name, s3, access, secret, region, rate;
  std::vector<std::string> train, roll;
  double link_bits = 0; ///< per second

  static std::vector<std::string> words(const std::string& s) {
    std::istringstream in(s);
    std::vector<std::string> w;
    for (std::string x; in >> x;) w.push_back(x);
    return w;
  }
  static double rate_bits(std::string r) {
    for (auto& c : r) c = char(std::tolower(static_cast<unsigned char>(c)));
    const std::pair<const char*, double> units[] = {
        {"gbit", 1e9}, {"mbit", 1e6}, {"kbit", 1e3}, {"bit", 1}};
    for (auto [u, f] : units)
      if (r.size() > std::strlen(u) && r.ends_with(u))
        return std::stod(r.substr(0, r.size() - std::strlen(u))) * f;
    die("rate '" + r + "' is not Nkbit, Nmbit or Ngbit");
  }
  static testbed from_env() {
    testbed t;
    t.name = env_or("DCR_TB_NAME");
    t.s3 = env_or("DCR_TB_S3");
    t.access = env_or("DCR_TB_S3_ACCESS_KEY");
    t.secret = env_or("DCR_TB_S3_SECRET_KEY");
    t.region = env_or("DCR_TB_S3_REGION", "us-east-1");
    t.rate = env_or("DCR_TB_RATE", "1gbit");
    t.train = words(env_or("DCR_TB_TRAIN"));
    t.roll = words(env_or("DCR_TB_ROLL"));
    t.link_bits = rate_bits(t.rate);
    return t;
  }
  std::string ns(const std::string& node) const { return name + "-" + node; }
};

dcr::transport::s3_options s3_options_from(const std::map<std::string, std::string>& a) {
  dcr::transport::s3_options o;
  o.endpoint = a.at("s3");
  o.bucket = a.at("bucket");
  o.region = a.at("region");
  o.credentials.access_key = a.at("access");
  o.credentials.secret_key = a.at("secret");
  return o;
}

// ---- workers (run inside a node's namespace) -------------------------------

/// --worker put: uploads bytes [begin, end) of a synthetic checkpoint as
/// objects of `chunk` bytes under `prefix`; --worker get: downloads every
/// object under `prefix`; --worker bucket / clean: creates the bucket /
/// removes everything under `prefix`. Prints one line
/// "WORKER <start_ns> <end_ns> <bytes> <objects>".
int worker(const std::map<std::string, std::string>& a) {
  dcr::transport::s3_object_store store(s3_options_from(a));
  const auto& what = a.at("worker");
  const auto prefix = a.count("prefix") ? a.at("prefix") : std::string("reference/");
  std::uint64_t bytes = 0, objects = 0;
  const auto t0 = now_ns();
  auto check = [](status s, const std::string& op) {
    if (!s) die(op + ": " + s.message);
  };
  if (what == "bucket") {
    check(store.create_bucket(), "create bucket");
  } else if (what == "put") {
    const std::uint64_t begin = std::stoull(a.at("begin")), end = std::stoull(a.at("end"));
    const std::uint64_t chunk = std::stoull(a.at("chunk"));
    std::vector<std::byte> buf(chunk);
    std::mt19937_64 rng(begin + 1);
    for (std::size_t i = 0; i + 8 <= buf.size(); i += 8) {
      const auto v = rng();
      std::memcpy(buf.data() + i, &v, 8);
    }
    for (std::uint64_t off = begin; off < end; off += chunk) {
      const auto n = std::min<std::uint64_t>(chunk, end - off);
      char name[64];
      std::snprintf(name, sizeof name, "part-%016llx", static_cast<unsigned long long>(off));
      check(store.put(prefix + name, std::span(buf.data(), n)), "put");
      bytes += n;
      ++objects;
    }
  } else if (what == "get" || what == "clean") {
    std::vector<std::string> names;
    check(store.list(prefix, names), "list");
    std::vector<std::byte> out;
    for (auto& n : names) {
      if (what == "get") {
        check(store.get(n, out), "get " + n);
        bytes += out.size();
      } else {
        check(store.remove(n), "remove " + n);
      }
      ++objects;
    }
  } else {
    die("unknown worker '" + what + "'");
  }
  std::printf("WORKER %llu %llu %llu %llu\n", static_cast<unsigned long long>(t0),
              static_cast<unsigned long long>(now_ns()), static_cast<unsigned long long>(bytes),
              static_cast<unsigned long long>(objects));
  return 0;
}

// ---- the orchestrator (host namespace) ------------------------------------

/// A child process with its stdout on a pipe.
struct child {
  pid_t pid = -1;
  int out = -1;
};

child spawn(const std::vector<std::string>& argv) {
  int fds[2];
  if (pipe(fds) != 0) die("pipe failed");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  posix_spawn_file_actions_addclose(&fa, fds[1]);
  std::vector<char*> args;
  for (auto& s : argv) args.push_back(const_cast<char*>(s.c_str()));
  args.push_back(nullptr);
  child c;
  const int rc = posix_spawnp(&c.pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  if (rc != 0) die("spawn " + argv[0] + " failed: " + std::strerror(rc));
  c.out = fds[0];
  return c;
}

/// Waits for the child; its stdout, or dies with what it said.
std::string reap(child c, const std::string& what) {
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = read(c.out, buf, sizeof buf)) > 0;) text.append(buf, std::size_t(n));
  close(c.out);
  int st = 0;
  waitpid(c.pid, &st, 0);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) die(what + " failed (see its message above)");
  return text;
}

struct worker_result {
  std::uint64_t start_ns = 0, end_ns = 0, bytes = 0, objects = 0;
};
worker_result parse_worker(const std::string& text, const std::string& what) {
  worker_result r;
  const auto at = text.find("WORKER ");
  unsigned long long a, b, c, d;
  if (at == std::string::npos ||
      std::sscanf(text.c_str() + at, "WORKER %llu %llu %llu %llu", &a, &b, &c, &d) != 4)
    die(what + ": no result line in its output: " + text);
  r = {a, b, c, d};
  return r;
}

std::string self_exe() {
  char buf[4096];
  const auto n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) die("cannot read /proc/self/exe");
  return std::string(buf, std::size_t(n));
}

/// Bytes sent and received on a node's link, as its kernel counted them.
std::pair<std::uint64_t, std::uint64_t> link_bytes(const testbed& tb, const std::string& node) {
  auto read_one = [&](const char* which) {
    auto c = spawn({"ip", "netns", "exec", tb.ns(node), "cat",
                    std::string("/sys/class/net/uplink/statistics/") + which});
    return std::stoull(reap(c, "reading the counters of " + node));
  };
  return {read_one("tx_bytes"), read_one("rx_bytes")};
}

/// V_cross: bytes on every node's link (training nodes send, rollout nodes receive).
struct counters {
  std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> by_node;
  static counters read(const testbed& tb) {
    counters c;
    for (auto& n : tb.train) c.by_node[n] = link_bytes(tb, n);
    for (auto& n : tb.roll) c.by_node[n] = link_bytes(tb, n);
    return c;
  }
  /// Bytes the training nodes sent plus bytes the rollout nodes received since `before`.
  std::uint64_t cross_since(const counters& before, const testbed& tb) const {
    std::uint64_t v = 0;
    for (auto& n : tb.train) v += by_node.at(n).first - before.by_node.at(n).first;
    for (auto& n : tb.roll) v += by_node.at(n).second - before.by_node.at(n).second;
    return v;
  }
};

struct reference_row {
  std::uint64_t checkpoint_bytes = 0, v_cross = 0, chunk = 0;
  double upload_s = 0, download_s = 0, total_s = 0, floor_s = 0;
};

reference_row full_checkpoint_reference(const testbed& tb,
                                        const std::map<std::string, std::string>& s3,
                                        std::uint64_t bytes, std::uint64_t chunk,
                                        const std::string& prefix) {
  const auto self = self_exe();
  auto worker_argv = [&](const std::string& node, const std::string& what) {
    std::vector<std::string> v{"ip",       "netns", "exec",     tb.ns(node), self,
                               "--worker", what,    "--prefix", prefix};
    for (auto& [k, val] : s3) {
      v.push_back("--" + k);
      v.push_back(val);
    }
    return v;
  };
  reap(spawn(worker_argv(tb.train[0], "bucket")), "create bucket");
  reap(spawn(worker_argv(tb.train[0], "clean")), "clean");
  const auto before = counters::read(tb);
  const auto n = tb.train.size();
  std::vector<child> ups;
  for (std::size_t i = 0; i < n; ++i) {
    auto v = worker_argv(tb.train[i], "put");
    // Parts on chunk boundaries, so every object but the last is `chunk` bytes.
    const auto chunks = (bytes + chunk - 1) / chunk;
    const auto b = std::min(bytes, chunks * i / n * chunk);
    const auto e = std::min(bytes, chunks * (i + 1) / n * chunk);
    v.insert(v.end(), {"--begin", std::to_string(b), "--end", std::to_string(e), "--chunk",
                       std::to_string(chunk)});
    ups.push_back(spawn(v));
  }
  std::vector<worker_result> up, down;
  for (std::size_t i = 0; i < n; ++i)
    up.push_back(parse_worker(reap(ups[i], "upload on " + tb.train[i]), "upload"));
  std::vector<child> downs;
  for (auto& r : tb.roll) downs.push_back(spawn(worker_argv(r, "get")));
  for (std::size_t j = 0; j < downs.size(); ++j)
    down.push_back(parse_worker(reap(downs[j], "download on " + tb.roll[j]), "download"));
  const auto after = counters::read(tb);
  reap(spawn(worker_argv(tb.train[0], "clean")), "clean");

  reference_row row;
  row.checkpoint_bytes = bytes;
  row.chunk = chunk;
  std::uint64_t t0 = ~0ull, t_up = 0, t1 = 0;
  for (auto& u : up) {
    t0 = std::min(t0, u.start_ns);
    t_up = std::max(t_up, u.end_ns);
  }
  for (auto& d : down) {
    if (d.bytes != bytes)
      die("a rollout node downloaded " + std::to_string(d.bytes) + " of " + std::to_string(bytes) +
          " bytes");
    t1 = std::max(t1, d.end_ns);
  }
  row.upload_s = double(t_up - t0) / 1e9;
  row.download_s = double(t1 - t_up) / 1e9;
  row.total_s = double(t1 - t0) / 1e9;
  row.v_cross = after.cross_since(before, tb);
  const double link = tb.link_bits / 8;
  row.floor_s = double(bytes) / double(n) / link + double(bytes) / link;
  return row;
}

// ---- refit rows: the role programs over the testbed ------------------------

/// One interval of a process's timeline (examples/cluster/timeline.hpp).
struct event {
  std::string who, what;
  std::uint64_t t0 = 0, t1 = 0, bytes = 0;
};

std::vector<event> read_timeline(const std::string& path) {
  std::vector<event> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    auto str = [&](const char* key) {
      const auto k = std::string("\"") + key + "\":\"";
      const auto a = line.find(k);
      if (a == std::string::npos) die("timeline line without " + std::string(key) + ": " + line);
      const auto b = line.find('"', a + k.size());
      return line.substr(a + k.size(), b - a - k.size());
    };
    auto num = [&](const char* key) {
      const auto k = std::string("\"") + key + "\":";
      const auto a = line.find(k);
      if (a == std::string::npos) die("timeline line without " + std::string(key) + ": " + line);
      return std::stoull(line.substr(a + k.size()));
    };
    out.push_back({str("who"), str("what"), num("t0"), num("t1"), num("bytes")});
  }
  return out;
}

using span_ns = std::pair<std::uint64_t, std::uint64_t>;

/// Measure of the union of intervals clipped to [lo, hi], in ns.
std::uint64_t union_ns(std::vector<span_ns> v, std::uint64_t lo, std::uint64_t hi) {
  for (auto& [a, b] : v) a = std::max(a, lo), b = std::min(b, hi);
  std::erase_if(v, [](const span_ns& x) { return x.second <= x.first; });
  std::sort(v.begin(), v.end());
  std::uint64_t total = 0, cur_a = 0, cur_b = 0;
  bool open = false;
  for (auto [a, b] : v) {
    if (open && a <= cur_b) {
      cur_b = std::max(cur_b, b);
      continue;
    }
    if (open) total += cur_b - cur_a;
    cur_a = a, cur_b = b, open = true;
  }
  if (open) total += cur_b - cur_a;
  return total;
}

/// `v` minus the union of `minus` (both unions of intervals).
std::vector<span_ns> subtract(const std::vector<span_ns>& v, std::vector<span_ns> minus) {
  std::sort(minus.begin(), minus.end());
  std::vector<span_ns> out;
  for (auto [a, b] : v) {
    auto at = a;
    for (auto [c, d] : minus) {
      if (d <= at || c >= b) continue;
      if (c > at) out.push_back({at, c});
      at = std::max(at, d);
    }
    if (at < b) out.push_back({at, b});
  }
  return out;
}

struct refit_row {
  std::string transport;
  /// "all": every node fetches every payload, one payload per bucket (the
  /// behaviour before the manifest index: --fetch-all --bucket-payloads);
  /// "indexed": payloads per expert block, each node fetches only those the
  /// manifest index says its receivers need (the job's default).
  std::string fetch = "all";
  double change_pct = 0;
  double refit_s = 0, ideal_s = 0, construction_lb_s = 0, transport_lb_s = 0, finalization_s = 0;
  double upload_lb_s = 0, fetch_lb_s = 0; ///< the transport bound's owner and node sides
  std::uint64_t v_payload = 0, v_cross = 0, v_up = 0, v_down = 0, payloads = 0;
  std::vector<event> events;
  std::uint64_t t0 = 0, t1 = 0;
  /// The window opens at the first owner's comparison of the candidate
  /// ("compare"); false: no owner recorded one, it opens at the first
  /// construction instead.
  bool from_compare = false;
  /// Peak resident set per role over the refit (the largest of that role's
  /// processes) and the bytes it must hold ("held": an owner's shards and
  /// trackers, a node's receivers' storage, scratch and payloads in flight);
  /// 0 where no process of the role recorded it. `owner_owned`: the
  /// largest owner's owned shard bytes ("owned"), what the RSS target is
  /// relative to.
  std::uint64_t owner_peak_rss = 0, owner_held = 0, owner_owned = 0, rollout_peak_rss = 0,
                rollout_held = 0, coordinator_peak_rss = 0;
  bool verified = false; ///< every receiver checked against a dense load after the window
};

/// The refit window and bounds from a refit's timeline. Intervals that began
/// before `start_ns` (the refit's coordinator was started then) are not this
/// refit's. t0 = the first owner begins comparing the candidate ("compare"),
/// else (no comparison recorded) its first construction; t1 = the last owner
/// ends its baseline update after the joint commit. Construction LB: the
/// busiest owner's comparison and construction outside its uploads;
/// transport LB: the busiest owner's uploads or node's fetches;
/// finalization: last apply -> t1. Returns false when the timeline has no
/// window.
bool analyse_timeline(refit_row& r, std::uint64_t start_ns) {
  std::uint64_t first_compare = ~0ull, first_construct = ~0ull;
  r.t1 = 0;
  for (auto& e : r.events) {
    if (e.t0 < start_ns) continue;
    if (e.what == "compare") first_compare = std::min(first_compare, e.t0);
    if (e.what == "construction") first_construct = std::min(first_construct, e.t0);
    if (e.what == "baseline") r.t1 = std::max(r.t1, e.t1);
  }
  r.from_compare = first_compare != ~0ull && first_compare < r.t1;
  r.t0 = r.from_compare ? first_compare : first_construct;
  if (r.t0 == ~0ull || r.t1 <= r.t0) return false;
  std::uint64_t last_apply = 0;
  std::map<std::string, std::vector<span_ns>> construct, upload, fetch;
  r.v_payload = r.payloads = 0;
  r.owner_peak_rss = r.owner_held = r.owner_owned = r.rollout_peak_rss = r.rollout_held = 0;
  r.coordinator_peak_rss = 0;
  for (auto& e : r.events) {
    if (e.what == "construction" || e.what == "compare") construct[e.who].push_back({e.t0, e.t1});
    if (e.what == "upload")
      upload[e.who].push_back({e.t0, e.t1}), r.v_payload += e.bytes, ++r.payloads;
    if (e.what == "fetch") fetch[e.who].push_back({e.t0, e.t1});
    if (e.what == "apply") last_apply = std::max(last_apply, e.t1);
    if (e.what == "owned" && e.t1 >= start_ns && e.who.starts_with("owner"))
      r.owner_owned = std::max(r.owner_owned, e.bytes);
    if ((e.what == "peak_rss" || e.what == "held") && e.t1 >= start_ns) {
      const bool peak = e.what == "peak_rss";
      if (e.who.starts_with("owner"))
        (peak ? r.owner_peak_rss : r.owner_held) =
            std::max(peak ? r.owner_peak_rss : r.owner_held, e.bytes);
      else if (e.who.starts_with("node"))
        (peak ? r.rollout_peak_rss : r.rollout_held) =
            std::max(peak ? r.rollout_peak_rss : r.rollout_held, e.bytes);
      else if (e.who == "coordinator" && peak)
        r.coordinator_peak_rss = std::max(r.coordinator_peak_rss, e.bytes);
    }
  }
  r.refit_s = double(r.t1 - r.t0) / 1e9;
  std::uint64_t c_lb = 0, up_lb = 0, fetch_lb = 0;
  for (auto& [who, v] : construct)
    c_lb = std::max(c_lb, union_ns(subtract(v, upload[who]), r.t0, r.t1));
  for (auto& [who, v] : upload) up_lb = std::max(up_lb, union_ns(v, r.t0, r.t1));
  for (auto& [who, v] : fetch) fetch_lb = std::max(fetch_lb, union_ns(v, r.t0, r.t1));
  r.construction_lb_s = double(c_lb) / 1e9;
  r.upload_lb_s = double(up_lb) / 1e9;
  r.fetch_lb_s = double(fetch_lb) / 1e9;
  r.transport_lb_s = double(std::max(up_lb, fetch_lb)) / 1e9;
  r.finalization_s = last_apply ? double(r.t1 - std::max(last_apply, r.t0)) / 1e9 : 0;
  return true;
}

/// Checks analyse_timeline on a made-up timeline (--self-test): the window
/// from the first comparison, the bounds, the memory records, the fallback
/// to construction, and intervals before the refit ignored.
int self_test() {
  int failures = 0;
  auto check = [&](bool ok, const char* what) {
    if (!ok) {
      std::cerr << "self-test: " << what << "\n";
      ++failures;
    }
  };
  auto near = [](double a, double b) { return std::abs(a - b) < 1e-9; };
  const std::uint64_t s = 1000000000000ull, ms = 1000000;
  refit_row r;
  r.events = {
      {"owner0", "compare", s - 50 * ms, s - 40 * ms, 0},   // before the refit: ignored
      {"owner0", "peak_rss", s - 60 * ms, s - 40 * ms, 99}, // before the refit: ignored
      {"owner0", "compare", s + 10 * ms, s + 110 * ms, 0},
      {"owner1", "compare", s + 20 * ms, s + 60 * ms, 0},
      {"owner0", "construction", s + 110 * ms, s + 310 * ms, 0},
      {"owner1", "construction", s + 60 * ms, s + 200 * ms, 0},
      {"owner0", "upload", s + 200 * ms, s + 400 * ms, 1000},
      {"owner1", "upload", s + 150 * ms, s + 250 * ms, 500},
      {"node0", "fetch", s + 210 * ms, s + 500 * ms, 1500},
      {"node0", "apply", s + 400 * ms, s + 600 * ms, 0},
      {"coordinator", "commit", s + 600 * ms, s + 700 * ms, 0},
      {"owner0", "baseline", s + 650 * ms, s + 800 * ms, 0},
      {"owner1", "baseline", s + 650 * ms, s + 750 * ms, 0},
      {"owner0", "held", s + 800 * ms, s + 800 * ms, 300},
      {"owner1", "held", s + 800 * ms, s + 800 * ms, 400},
      {"owner0", "owned", s + 800 * ms, s + 800 * ms, 150},
      {"owner1", "owned", s + 800 * ms, s + 800 * ms, 210},
      {"owner0", "peak_rss", s + 10 * ms, s + 800 * ms, 700},
      {"owner1", "peak_rss", s + 20 * ms, s + 800 * ms, 650},
      {"node0", "held", s + 600 * ms, s + 600 * ms, 2000},
      {"node0", "peak_rss", s + 100 * ms, s + 600 * ms, 2500},
      {"coordinator", "peak_rss", s, s + 800 * ms, 50},
  };
  check(analyse_timeline(r, s), "no window");
  check(r.from_compare && r.t0 == s + 10 * ms && r.t1 == s + 800 * ms, "window");
  check(near(r.refit_s, 0.79), "refit s");
  // owner0: compare 10-110 + construction 110-310 = 10-310 minus upload 200-400 = 190 ms;
  // owner1: 20-200 minus 150-250 = 130 ms.
  check(near(r.construction_lb_s, 0.19), "construction LB");
  check(near(r.upload_lb_s, 0.2) && near(r.fetch_lb_s, 0.29) && near(r.transport_lb_s, 0.29),
        "transport LB");
  check(near(r.finalization_s, 0.2), "finalization");
  check(r.v_payload == 1500 && r.payloads == 2, "payload bytes");
  check(r.owner_peak_rss == 700 && r.owner_held == 400 && r.owner_owned == 210, "owner memory");
  check(r.rollout_peak_rss == 2500 && r.rollout_held == 2000, "rollout memory");
  check(r.coordinator_peak_rss == 50, "coordinator memory");
  // Without comparisons: the window opens at the first construction.
  std::erase_if(r.events, [](const event& e) { return e.what == "compare"; });
  check(analyse_timeline(r, s), "no window without compare");
  check(!r.from_compare && r.t0 == s + 60 * ms, "fallback window");
  // owner0: 110-310 minus 200-400 = 90 ms; owner1: 60-200 minus 150-250 = 90 ms.
  check(near(r.construction_lb_s, 0.09), "construction LB without compare");
  r.events = {{"owner0", "construction", s, s + ms, 0}};
  check(!analyse_timeline(r, s), "a window without a baseline update");
  std::cout << "self-test: " << (failures ? "FAIL" : "ok") << "\n";
  return failures ? 1 : 0;
}

/// A child whose stdout and stderr go to `log`.
pid_t spawn_logged(const std::vector<std::string>& argv, const std::string& log,
                   const std::vector<std::string>& env_extra) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  std::vector<char*> args;
  for (auto& s : argv) args.push_back(const_cast<char*>(s.c_str()));
  args.push_back(nullptr);
  std::vector<std::string> env_s(env_extra);
  for (char** e = environ; *e; ++e) env_s.emplace_back(*e);
  std::vector<char*> env;
  for (auto& s : env_s) env.push_back(const_cast<char*>(s.c_str()));
  env.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, args[0], &fa, nullptr, args.data(), env.data());
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) die("spawn " + argv[0] + " failed: " + std::strerror(rc));
  return pid;
}

std::string tail_of(const std::string& path) {
  std::ifstream in(path);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return all.size() > 2000 ? all.substr(all.size() - 2000) : all;
}

struct refit_setup {
  std::string bin, size, work, etcd;
  std::string chunk_bytes, bucket_bytes; ///< the owners' targets (job flags; "" = their default)
  std::string in_flight; ///< --requests-in-flight of the object store (job flag; "" = default)
  unsigned fanout = 2;
  int port = 0;
  bool verify = true;
};

refit_row run_refit(const testbed& tb, const refit_setup& rs, const std::string& transport,
                    const std::string& fetch_mode, double pct, int row_no) {
  auto addr = [&](const std::string& node) {
    const auto a = env_or(("DCR_TB_ADDR_" + node).c_str());
    if (a.empty()) die("the testbed exports no DCR_TB_ADDR_" + node);
    return a;
  };
  char pct_s[32];
  std::snprintf(pct_s, sizeof pct_s, "%g", pct);
  const auto work = rs.work + "/" + transport + "-" + fetch_mode + "-" + pct_s;
  std::filesystem::remove_all(work);
  std::filesystem::create_directories(work + "/logs");
  const auto timeline = work + "/timeline.jsonl";
  const std::vector<std::string> env{"DCR_TIMELINE=" + timeline, "DCR_S3_ACCESS_KEY=" + tb.access,
                                     "DCR_S3_SECRET_KEY=" + tb.secret};
  const auto tag = std::to_string(getpid()) + "-" + std::to_string(row_no);
  const int base = rs.port + row_no * 20;
  const auto n_train = tb.train.size(), n_roll = tb.roll.size();
  std::vector<std::string> job{"--workdir",
                               work,
                               "--size",
                               rs.size,
                               "--tp",
                               std::to_string(n_train),
                               "--nodes",
                               std::to_string(n_roll),
                               "--receivers-per-node",
                               "1",
                               "--change-pct",
                               pct_s,
                               "--s3",
                               tb.s3,
                               "--s3-bucket",
                               "dcr-bench-" + tag,
                               "--s3-region",
                               tb.region};
  {
    // The roles listen on the testbed's addresses, beyond loopback: the job
    // is keyed, as the programs require there (a fresh secret per row).
    const auto key = work + "/job.key";
    std::random_device rd;
    std::string secret(32, '\0');
    for (auto& c : secret) c = static_cast<char>(rd());
    std::ofstream(key, std::ios::binary) << secret;
    job.insert(job.end(), {"--job-key", key});
  }
  if (!rs.etcd.empty())
    job.insert(job.end(), {"--etcd", rs.etcd, "--etcd-prefix", "dcr/bench-" + tag + "/"});
  if (fetch_mode == "all") job.insert(job.end(), {"--fetch-all", "--bucket-payloads"});
  if (!rs.chunk_bytes.empty()) job.insert(job.end(), {"--chunk-bytes", rs.chunk_bytes});
  if (!rs.bucket_bytes.empty()) job.insert(job.end(), {"--bucket-bytes", rs.bucket_bytes});
  if (!rs.in_flight.empty()) job.insert(job.end(), {"--requests-in-flight", rs.in_flight});
  if (transport != "object_store") {
    std::string relays;
    for (std::size_t j = 0; j < n_roll; ++j)
      relays += (j ? "," : "") + addr(tb.roll[j]) + ":" + std::to_string(base + 10 + int(j));
    job.insert(job.end(), {"--transport", transport, "--relay-nodes", relays, "--relay-fanout",
                           std::to_string(rs.fanout)});
  }
  std::vector<pid_t> roles;
  auto netns = [&](const std::string& node, const std::string& prog) {
    return std::vector<std::string>{"ip", "netns", "exec", tb.ns(node), rs.bin + "/" + prog};
  };
  std::vector<std::string> co_flags;
  for (std::size_t k = 0; k < n_train; ++k) {
    const auto at = addr(tb.train[k]) + ":" + std::to_string(base + int(k));
    auto v = netns(tb.train[k], "dcr-owner");
    v.insert(v.end(), {"--rank", std::to_string(k), "--listen", at});
    v.insert(v.end(), job.begin(), job.end());
    roles.push_back(spawn_logged(v, work + "/logs/owner" + std::to_string(k) + ".log", env));
    co_flags.insert(co_flags.end(), {"--owner", at});
  }
  for (std::size_t j = 0; j < n_roll; ++j) {
    const auto at = addr(tb.roll[j]) + ":" + std::to_string(base + 5 + int(j));
    auto v = netns(tb.roll[j], "dcr-rollout");
    v.insert(v.end(), {"--node", std::to_string(j), "--listen", at});
    v.insert(v.end(), job.begin(), job.end());
    roles.push_back(spawn_logged(v, work + "/logs/node" + std::to_string(j) + ".log", env));
    co_flags.insert(co_flags.end(), {"--node", at});
  }
  auto stop_roles = [&] {
    for (auto p : roles) kill(p, SIGTERM);
    for (auto p : roles) waitpid(p, nullptr, 0);
  };
  auto coordinator = [&](int steps, const char* what, bool verify = false) {
    auto v = netns("st", "dcr-coordinator");
    v.insert(v.end(), co_flags.begin(), co_flags.end());
    v.insert(v.end(), job.begin(), job.end());
    v.insert(v.end(), {"--steps", std::to_string(steps), "--wait", "900"});
    if (verify) v.push_back("--verify");
    const auto log = work + "/logs/coordinator.log";
    const auto pid = spawn_logged(v, log, env);
    int st = 0;
    waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      stop_roles();
      std::string logs;
      for (auto& f : std::filesystem::directory_iterator(work + "/logs"))
        logs += "--- " + f.path().filename().string() + ":\n" + tail_of(f.path()) + "\n";
      die(transport + " (fetch " + fetch_mode + ") at " + pct_s + "%: the coordinator's " + what +
          " failed (exit " + std::to_string(WIFEXITED(st) ? WEXITSTATUS(st) : -1) + "); logs in " +
          work + "/logs:\n" + logs);
    }
  };
  coordinator(0, "bootstrap");                      // version 0 everywhere: outside the timed refit
  std::ofstream(timeline, std::ios::trunc).close(); // bootstrap intervals are not the refit
  const auto before = counters::read(tb);
  const auto start_ns = now_ns();
  coordinator(1, "refit to version 1");
  const auto after = counters::read(tb);

  refit_row r;
  r.transport = transport;
  r.fetch = fetch_mode;
  r.change_pct = pct;
  // Read before the verification: its dense export and loads are no part of
  // the refit (nor of its peak resident sets).
  r.events = read_timeline(timeline);
  // Every receiver against a dense load of version 1 through its own loader
  // (a second coordinator, --verify: it finds version 1 committed and only
  // checks), after the window and the counters.
  if (rs.verify) coordinator(1, "verification", true);
  r.verified = rs.verify;
  stop_roles();
  if (!analyse_timeline(r, start_ns))
    die(transport + " at " + pct_s + "%: the timeline has no comparison or construction and " +
        "baseline update (" + timeline + ")");
  // Every node reads the payloads on both transports (gets from the object
  // store; payload frames from the relay tree): without its side the
  // transport bound would be the owners' writes alone, which over the relay
  // tree return before the bytes have crossed the link.
  if (r.fetch_lb_s <= 0)
    die(transport + " at " + pct_s + "%: the timeline has no node's payload fetch (" + timeline +
        ")");
  for (auto& n : tb.train) r.v_up += after.by_node.at(n).first - before.by_node.at(n).first;
  for (auto& n : tb.roll) r.v_down += after.by_node.at(n).second - before.by_node.at(n).second;
  r.v_cross = after.cross_since(before, tb);
  // The same per-link accounting as the reference's floor: the training
  // nodes' links in parallel, then the rollout nodes' links in parallel.
  const double link = tb.link_bits / 8;
  r.ideal_s = double(r.v_up) / double(n_train) / link + double(r.v_down) / double(n_roll) / link;
  return r;
}

/// The SVG timeline of one refit: a row per process, a bar per interval.
void write_svg(const refit_row& r, const std::string& path, const std::string& title) {
  std::vector<std::string> whos;
  for (auto& e : r.events)
    if (std::find(whos.begin(), whos.end(), e.who) == whos.end()) whos.push_back(e.who);
  std::sort(whos.begin(), whos.end());
  const std::map<std::string, std::pair<int, const char*>> kinds{
      {"compare", {0, "#72b7b2"}}, {"construction", {0, "#4c78a8"}}, {"upload", {1, "#f58518"}},
      {"fetch", {2, "#54a24b"}},   {"apply", {3, "#e45756"}},        {"commit", {4, "#b279a2"}},
      {"baseline", {5, "#9d755d"}}};
  const double span = std::max(1e-9, double(r.t1 - r.t0) / 1e9);
  const int left = 110, width = 760, row_h = 22, top = 40;
  const int height = top + int(whos.size()) * row_h + 70;
  std::ofstream o(path);
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << left + width + 20 << "\" height=\""
    << height << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
    << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    << "<text x=\"10\" y=\"20\" font-size=\"14\">" << title << "</text>\n";
  auto x_of = [&](std::uint64_t t) {
    const double s = (double(t) - double(r.t0)) / 1e9;
    return left + std::clamp(s / span, 0.0, 1.0) * width;
  };
  for (std::size_t i = 0; i < whos.size(); ++i) {
    const int y = top + int(i) * row_h;
    o << "<text x=\"10\" y=\"" << y + 15 << "\">" << whos[i] << "</text>\n";
    for (auto& e : r.events) {
      if (e.who != whos[i] || !kinds.count(e.what)) continue;
      const auto [lane, color] = kinds.at(e.what);
      const double x0 = x_of(e.t0), x1 = std::max(x_of(e.t1), x0 + 1);
      const int sub = (e.what == "upload" || e.what == "fetch") ? 6 : 0;
      o << "<rect x=\"" << x0 << "\" y=\"" << y + 2 + sub << "\" width=\"" << x1 - x0
        << "\" height=\"" << row_h - 4 - 2 * sub << "\" fill=\"" << color
        << "\" fill-opacity=\"0.85\"><title>" << e.what << "</title></rect>\n";
      (void)lane;
    }
  }
  const int axis_y = top + int(whos.size()) * row_h + 5;
  o << "<line x1=\"" << left << "\" y1=\"" << axis_y << "\" x2=\"" << left + width << "\" y2=\""
    << axis_y << "\" stroke=\"black\"/>\n";
  for (int k = 0; k <= 5; ++k) {
    const double x = left + width * k / 5.0;
    o << "<text x=\"" << x - 10 << "\" y=\"" << axis_y + 15 << "\">"
      << dcr::bench::fmt(span * k / 5, 2) << "</text>\n";
  }
  o << "<text x=\"" << left + width / 2 - 20 << "\" y=\"" << axis_y + 30 << "\">seconds</text>\n";
  int lx = 10;
  for (auto name : {"compare", "construction", "upload", "fetch", "apply", "commit", "baseline"}) {
    o << "<rect x=\"" << lx << "\" y=\"" << axis_y + 40 << "\" width=\"12\" height=\"12\" fill=\""
      << kinds.at(name).second << "\"/><text x=\"" << lx + 16 << "\" y=\"" << axis_y + 50 << "\">"
      << name << "</text>\n";
    lx += 105;
  }
  o << "</svg>\n";
}

std::map<std::string, std::string> parse_flags(const std::vector<std::string>& rest) {
  std::map<std::string, std::string> a;
  for (std::size_t i = 0; i < rest.size(); ++i) {
    if (!rest[i].starts_with("--")) die("unexpected argument '" + rest[i] + "'");
    const auto key = rest[i].substr(2);
    if (i + 1 >= rest.size()) die("--" + key + " needs a value");
    a[key] = rest[++i];
  }
  return a;
}

} // namespace

int main(int argc, char** argv) {
  auto opt = dcr::bench::options::parse(argc, argv);
  // --self-test: the timeline analysis on a made-up timeline (no testbed).
  if (std::find(opt.rest.begin(), opt.rest.end(), "--self-test") != opt.rest.end())
    return self_test();
  auto flags = parse_flags(opt.rest);
  if (flags.count("worker")) return worker(flags);

  if (env_or("DCR_TB_NAME").empty()) {
    std::cerr << "dcr-bench-cluster: skip: not inside a testbed; run it as\n"
                 "  scripts/testbed.sh run -- "
              << argv[0] << " [--quick] [--json]\n";
    return 77;
  }
  const auto tb = testbed::from_env();
  if (tb.s3.empty()) die("the testbed runs no S3 (start it with --services etcd,s3)");
  if (tb.train.empty() || tb.roll.empty()) die("the testbed has no training or rollout nodes");
  const std::map<std::string, std::string> s3{{"s3", tb.s3},
                                              {"bucket", "dcr-bench-cluster"},
                                              {"region", tb.region},
                                              {"access", tb.access},
                                              {"secret", tb.secret}};
  const std::uint64_t mib = 1u << 20;
  const std::string size = flags.count("size") ? flags["size"] : (opt.quick ? "small" : "1GB");
  std::uint64_t bytes = 0; // the job's checkpoint: canonical BF16 tensors of the model
  for (auto& m : dcr::canonical_tensors(dcr::examples::model_for(dcr::examples::parse_size(size))))
    bytes += m.nbytes();
  if (flags.count("size-mb")) bytes = std::stoull(flags["size-mb"]) * mib; // reference only
  const std::uint64_t chunk =
      flags.count("chunk-mb") ? std::stoull(flags["chunk-mb"]) * mib : (opt.quick ? 4 : 64) * mib;
  auto list = [](const std::string& v) {
    std::vector<std::string> out;
    std::stringstream in(v);
    for (std::string x; std::getline(in, x, ',');)
      if (!x.empty()) out.push_back(x);
    return out;
  };
  std::vector<double> pcts;
  for (auto& p :
       list(flags.count("change-pct") ? flags["change-pct"] : (opt.quick ? "3" : "1.2,3,5")))
    pcts.push_back(std::stod(p));
  // Both transports; --quick: the object store only.
  const auto transports =
      list(flags.count("transports")
               ? flags["transports"]
               : std::string(opt.quick ? "object_store" : "object_store,relay_tree"));
  for (auto& t : transports)
    if (t != "object_store" && t != "relay_tree")
      die("--transports: unknown transport '" + t + "' (object_store, relay_tree)");
  // Object-store rows before (all) and after (indexed) the manifest index;
  // the relay tree has no index, its rows fetch all.
  const auto fetches = list(flags.count("fetch") ? flags["fetch"] : std::string("all,indexed"));
  for (auto& f : fetches)
    if (f != "all" && f != "indexed") die("--fetch: unknown mode '" + f + "' (all, indexed)");
  refit_setup rs;
  rs.bin =
      flags.count("bin")
          ? flags["bin"]
          : (std::filesystem::path(self_exe()).parent_path().parent_path() / "examples").string();
  for (auto p : {"dcr-owner", "dcr-rollout", "dcr-coordinator"})
    if (access((rs.bin + "/" + p).c_str(), X_OK) != 0)
      die("no " + rs.bin + "/" + p + " (build it, or pass --bin DIR)");
  rs.size = size;
  if (flags.count("chunk-bytes")) rs.chunk_bytes = flags["chunk-bytes"];
  if (flags.count("bucket-bytes")) rs.bucket_bytes = flags["bucket-bytes"];
  if (flags.count("requests-in-flight")) rs.in_flight = flags["requests-in-flight"];
  if (flags.count("verify")) {
    if (flags["verify"] != "yes" && flags["verify"] != "no") die("--verify: yes or no");
    rs.verify = flags["verify"] == "yes";
  }
  rs.etcd = env_or("DCR_TB_ETCD");
  rs.fanout = flags.count("relay-fanout") ? unsigned(std::stoul(flags["relay-fanout"])) : 2;
  rs.port = flags.count("port") ? std::stoi(flags["port"]) : 22000 + int(getpid() % 100) * 100;
  rs.work = flags.count("workdir") ? flags["workdir"]
                                   : "/tmp/dcr-bench-cluster-" + std::to_string(getpid());
  const std::string svg = flags.count("svg") ? flags["svg"] : "dcr-bench-cluster-timeline.svg";

  std::cerr << "full-checkpoint reference: " << bytes / mib << " MiB over " << tb.train.size()
            << " training and " << tb.roll.size() << " rollout node(s) at " << tb.rate
            << " per link ...\n";
  const auto ref = full_checkpoint_reference(tb, s3, bytes, chunk, "reference/");
  std::cerr << "  " << dcr::bench::fmt(ref.total_s) << " s\n";
  std::vector<refit_row> rows;
  int row_no = 0;
  for (auto& t : transports)
    for (auto p : pcts)
      // The relay tree has no manifest index: one row per change rate.
      for (auto& f : t == "object_store" ? fetches : std::vector<std::string>{"all"}) {
        std::cerr << "refit (" << t << ", fetch " << f << ", " << p << " % changed, model --size "
                  << size << ") ...\n";
        rows.push_back(run_refit(tb, rs, t, f, p, row_no++));
        std::cerr << "  " << dcr::bench::fmt(rows.back().refit_s) << " s\n";
      }
  std::error_code ec;
  std::filesystem::remove_all(rs.work, ec);
  // The picture: the 3 % row if there is one, else the first.
  const refit_row* pic = &rows.front();
  for (auto& r : rows)
    if (r.change_pct == 3 && r.transport == rows.front().transport) pic = &r;
  char title[256];
  std::snprintf(title, sizeof title,
                "one refit: %s, %g %% changed, %.0f MB model, %zu+%zu nodes, %s links",
                pic->transport.c_str(), pic->change_pct, double(bytes) / 1e6, tb.train.size(),
                tb.roll.size(), tb.rate.c_str());
  write_svg(*pic, svg, title);
  std::cerr << "timeline picture: " << svg << "\n";

  struct derived {
    double speedup, ideal_speedup, bound_s, ratio_bound;
    double
        cross_vs_all; ///< V_cross / that of the fetch-all row of the same transport and %; 0: none
  };
  auto derive = [&](const refit_row& r) {
    derived d;
    d.cross_vs_all = 0;
    for (auto& a : rows)
      if (a.fetch == "all" && a.transport == r.transport && a.change_pct == r.change_pct &&
          a.v_cross > 0)
        d.cross_vs_all = double(r.v_cross) / double(a.v_cross);
    d.speedup = ref.total_s / r.refit_s;
    d.ideal_speedup = ref.total_s / r.ideal_s;
    d.bound_s = std::max(r.construction_lb_s, r.transport_lb_s) + r.finalization_s;
    d.ratio_bound = r.refit_s / d.bound_s;
    return d;
  };
  if (opt.json) {
    std::cout << "{\"rows\": [";
    bool first = true;
    for (auto& r : rows) {
      const auto d = derive(r);
      std::cout << (first ? "" : ", ") << "{\"transport\": \"" << r.transport << "\", \"fetch\": \""
                << r.fetch << "\", \"change_pct\": " << r.change_pct
                << ", \"refit_s\": " << r.refit_s << ", \"reference_s\": " << ref.total_s
                << ", \"speedup\": " << d.speedup << ", \"ideal_s\": " << r.ideal_s
                << ", \"ideal_speedup\": " << d.ideal_speedup
                << ", \"v_payload_bytes\": " << r.v_payload << ", \"payloads\": " << r.payloads
                << ", \"v_cross_bytes\": " << r.v_cross << ", \"v_cross_up_bytes\": " << r.v_up
                << ", \"v_cross_down_bytes\": " << r.v_down;
      if (d.cross_vs_all > 0) std::cout << ", \"v_cross_over_fetch_all\": " << d.cross_vs_all;
      std::cout << ", \"construction_lb_s\": " << r.construction_lb_s
                << ", \"transport_lb_s\": " << r.transport_lb_s
                << ", \"upload_lb_s\": " << r.upload_lb_s << ", \"fetch_lb_s\": " << r.fetch_lb_s
                << ", \"finalization_s\": " << r.finalization_s
                << ", \"refit_over_bound\": " << d.ratio_bound << ", \"window_from\": \""
                << (r.from_compare ? "compare" : "construction")
                << "\", \"verified\": " << (r.verified ? "true" : "false")
                << ", \"owner_peak_rss_bytes\": " << r.owner_peak_rss
                << ", \"owner_owned_bytes\": " << r.owner_owned
                << ", \"owner_held_bytes\": " << r.owner_held
                << ", \"rollout_peak_rss_bytes\": " << r.rollout_peak_rss
                << ", \"rollout_held_bytes\": " << r.rollout_held
                << ", \"coordinator_peak_rss_bytes\": " << r.coordinator_peak_rss
                << ", \"checkpoint_bytes\": " << bytes
                << ", \"link_mbit_s\": " << tb.link_bits / 1e6
                << ", \"train_nodes\": " << tb.train.size()
                << ", \"rollout_nodes\": " << tb.roll.size() << "}";
      first = false;
    }
    std::cout << "], \"reference\": {\"reference_s\": " << ref.total_s
              << ", \"upload_s\": " << ref.upload_s << ", \"download_s\": " << ref.download_s
              << ", \"floor_s\": " << ref.floor_s << ", \"checkpoint_bytes\": " << bytes
              << ", \"v_cross_bytes\": " << ref.v_cross << "}, \"svg\": \"" << svg << "\"}\n";
    return 0;
  }
  std::cout << dcr::bench::machine_description() << "\n";
  std::cout << "testbed '" << tb.name << "': " << tb.train.size() << " training node(s) (one "
            << "dcr-owner each), " << tb.roll.size() << " rollout node(s) (one dcr-rollout with "
            << "one receiver each), every node's link " << tb.rate << "; model --size " << size
            << " = " << dcr::bench::fmt(double(bytes) / 1e6, 1)
            << " MB checkpoint; reference objects of " << chunk / mib
            << " MiB; S3 = Swift with s3api, commit record in "
            << (rs.etcd.empty() ? "files" : "etcd") << " on the storage host\n\n";
  dcr::bench::table t({"row", "fetch", "changed %", "V_payload MB", "V_cross MB",
                       "V_cross / fetch all", "refit s", "reference s", "speedup", "ideal speedup",
                       "x ideal", "constr LB s", "transp LB s", "final s", "refit / (LB+final)",
                       "owner RSS / held MB", "node RSS / held MB", "coord RSS MB"});
  t.add({"full checkpoint (reference)", "", "100", dcr::bench::fmt(double(bytes) / 1e6, 1),
         dcr::bench::fmt(double(ref.v_cross) / 1e6, 1), "", "", dcr::bench::fmt(ref.total_s), "1",
         dcr::bench::fmt(ref.total_s / ref.floor_s) + " x floor", "", "", "", "", "", "", "", ""});
  auto mb = [](std::uint64_t b) {
    return b ? dcr::bench::fmt(double(b) / 1e6, 0) : std::string("-");
  };
  for (auto& r : rows) {
    const auto d = derive(r);
    t.add({"refit, " + r.transport, r.fetch, dcr::bench::fmt(r.change_pct, 1),
           dcr::bench::fmt(double(r.v_payload) / 1e6, 2),
           dcr::bench::fmt(double(r.v_cross) / 1e6, 2),
           d.cross_vs_all > 0 ? dcr::bench::fmt(d.cross_vs_all, 2) : "", dcr::bench::fmt(r.refit_s),
           dcr::bench::fmt(ref.total_s), dcr::bench::fmt(d.speedup, 2),
           dcr::bench::fmt(d.ideal_speedup, 2), dcr::bench::fmt(d.speedup / d.ideal_speedup, 2),
           dcr::bench::fmt(r.construction_lb_s), dcr::bench::fmt(r.transport_lb_s),
           dcr::bench::fmt(r.finalization_s), dcr::bench::fmt(d.ratio_bound, 2),
           mb(r.owner_peak_rss) + " / " + mb(r.owner_held),
           mb(r.rollout_peak_rss) + " / " + mb(r.rollout_held), mb(r.coordinator_peak_rss)});
  }
  t.print(std::cout, opt.markdown);
  std::cout << "\nreference: upload " << dcr::bench::fmt(ref.upload_s) << " s, download "
            << dcr::bench::fmt(ref.download_s) << " s, link floor " << dcr::bench::fmt(ref.floor_s)
            << " s. Refit window: the first owner begins comparing the candidate (change "
               "detection) -> the last owner finishes its baseline update after the joint "
               "commit (CLOCK_REALTIME intervals the programs write, "
               "examples/cluster/timeline.hpp); outside it: the change injection (--change-pct), "
               "model loading, prewarm, the bootstrap of version 0 (initial baselines, dense "
               "restore)"
            << (rs.verify ? " and the verification after it (every receiver against a dense "
                            "load of version 1, byte for byte)"
                          : "")
            << ". V_cross: bytes the training nodes sent "
               "plus bytes the rollout nodes received on their links (kernel counters, headers "
               "and control traffic included). Ideal speedup (wire only): reference / time "
               "V_cross takes at the link rate (training links in parallel, then rollout links "
               "in parallel). Construction LB: the busiest owner's comparison and construction "
               "time outside its uploads; transport LB: the busiest owner's uploads or node's "
               "fetches (unions, one clock); finalization: last apply -> end of window. Memory: "
               "peak resident set (VmHWM) over the refit, reset as it starts, of the largest "
               "owner, rollout node and the coordinator, beside what the role must hold: an "
               "owner its shards and baseline trackers, a node its receivers' storage and "
               "scratch and the payloads in flight (apply queue + 2 + one staged per receiver, "
               "each the refit's largest payload); - = not recorded. Fetch all: one payload per "
               "bucket, every node fetches every payload (--fetch-all --bucket-payloads, the "
               "behaviour before the manifest index); indexed: one payload per block of experts (a "
               "block per rollout node) and one of the rest, each node "
               "fetches only the payloads whose manifest index names a tensor its receivers "
               "hold (vLLM DP = nodes with expert parallelism: each node holds its experts).\n";
  for (auto& r : rows)
    if (!r.from_compare) {
      std::cout << "note: no owner recorded its comparison of the candidate in some rows (first: "
                << r.transport << ", fetch " << r.fetch << ", " << r.change_pct
                << " %): their window opens at the first owner's construction, and their "
                   "construction LB has no comparison in it.\n";
      break;
    }
  // The targets (issue "the cluster refit at its bounds"): finalization
  // <= 0.25 s at 1 GB, refit <= 1.25 x (larger LB + finalization), at 3 %
  // speedup >= 10 x at 1 Gbit/s and >= 40 x at 100 Mbit/s, owner peak RSS
  // <= 2.5 x its owned shard bytes.
  const double speedup_target = tb.link_bits <= 100e6 ? 40 : 10;
  auto met = [](bool ok) { return ok ? "met" : "NOT met"; };
  for (auto& r : rows) {
    if (r.change_pct != 3) continue;
    const auto d = derive(r);
    std::cout << "target (" << r.transport << ", fetch " << r.fetch << ", 3 %): finalization <= "
              << "0.25 s: " << met(r.finalization_s <= 0.25) << " ("
              << dcr::bench::fmt(r.finalization_s) << " s); refit <= 1.25 x (larger LB + "
              << "finalization): " << met(d.ratio_bound <= 1.25) << " ("
              << dcr::bench::fmt(d.ratio_bound, 2) << "); speedup >= " << speedup_target << " x at "
              << tb.rate << ": " << met(d.speedup >= speedup_target) << " ("
              << dcr::bench::fmt(d.speedup, 2) << "); owner peak RSS <= 2.5 x owned: ";
    if (r.owner_peak_rss && r.owner_owned)
      std::cout << met(double(r.owner_peak_rss) <= 2.5 * double(r.owner_owned)) << " ("
                << dcr::bench::fmt(double(r.owner_peak_rss) / double(r.owner_owned), 2) << ")\n";
    else
      std::cout << "not recorded\n";
  }
  return 0;
}
