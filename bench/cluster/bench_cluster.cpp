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
// Outside a testbed (no DCR_TB_NAME) it exits 77 with a message.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
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

#include "bench_common.hpp"
#include "dcr/transport/s3_object_store.hpp"

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
  const std::uint64_t bytes =
      flags.count("size-mb") ? std::stoull(flags["size-mb"]) * mib : (opt.quick ? 16 : 1024) * mib;
  const std::uint64_t chunk =
      flags.count("chunk-mb") ? std::stoull(flags["chunk-mb"]) * mib : (opt.quick ? 4 : 64) * mib;

  if (!opt.json)
    std::cerr << "full-checkpoint reference: " << bytes / mib << " MiB over " << tb.train.size()
              << " training and " << tb.roll.size() << " rollout node(s) at " << tb.rate
              << " per link ...\n";
  const auto ref = full_checkpoint_reference(tb, s3, bytes, chunk, "reference/");

  if (opt.json) {
    std::cout << "{\"rows\": [{\"transport\": \"full_checkpoint_reference\", \"change_pct\": 100"
              << ", \"reference_s\": " << ref.total_s << ", \"upload_s\": " << ref.upload_s
              << ", \"download_s\": " << ref.download_s << ", \"floor_s\": " << ref.floor_s
              << ", \"ratio_to_floor\": " << ref.total_s / ref.floor_s
              << ", \"checkpoint_bytes\": " << ref.checkpoint_bytes
              << ", \"v_cross_bytes\": " << ref.v_cross
              << ", \"link_mbit_s\": " << tb.link_bits / 1e6
              << ", \"train_nodes\": " << tb.train.size()
              << ", \"rollout_nodes\": " << tb.roll.size() << "}]}\n";
    return 0;
  }
  std::cout << dcr::bench::machine_description() << "\n";
  std::cout << "testbed '" << tb.name << "': " << tb.train.size() << " training node(s), "
            << tb.roll.size() << " rollout node(s), every node's link " << tb.rate
            << "; checkpoint " << bytes / mib << " MiB in objects of " << chunk / mib
            << " MiB; S3 = Swift with s3api on the storage host\n\n";
  dcr::bench::table t({"row", "checkpoint MB", "V_cross MB", "upload s", "download s", "total s",
                       "link floor s", "x floor"});
  t.add({"full checkpoint (reference)", dcr::bench::fmt(double(bytes) / 1e6, 1),
         dcr::bench::fmt(double(ref.v_cross) / 1e6, 1), dcr::bench::fmt(ref.upload_s),
         dcr::bench::fmt(ref.download_s), dcr::bench::fmt(ref.total_s),
         dcr::bench::fmt(ref.floor_s), dcr::bench::fmt(ref.total_s / ref.floor_s)});
  t.print(std::cout, opt.markdown);
  std::cout << "\nV_cross: bytes the training nodes sent plus bytes the rollout nodes received on "
               "their links (kernel counters, headers included).\n";
  return 0;
}
