#pragma once
// What every program of one local cluster job agrees on, computed from the
// same flags in each process: the model, the trainer's plan (one owner
// process per trainer rank), the rollout layout (nodes × receivers per node),
// and where the object store and the commit store are (docs/deployment.md).

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <csignal>
#include <fcntl.h>
#include <unistd.h>

#include "dcr/core/error.hpp"
#include "dcr/core/hash.hpp"
#include "dcr/model/config.hpp"
#include "dcr/model/trainer_layout.hpp"
#include "dcr/protocol/commit_store.hpp"
#include "dcr/protocol/control_channel.hpp"
#if DCR_CLUSTER_NET
#include "dcr/protocol/etcd_commit_store.hpp"
#include "dcr/transport/s3_object_store.hpp"
#endif
#include "dcr/source/builder.hpp"
#include "dcr/source/plan.hpp"
#include "dcr/source/row_split_plan.hpp"
#include "dcr/transport/dense_export.hpp"
#include "dcr/transport/object_store.hpp"
#include "examples/common/model_setup.hpp"

namespace dcr::cluster {

struct job_flags {
  std::string size = "small";
  std::uint64_t seed = 42;
  unsigned tp = 2, ep = 1, dp = 1; ///< trainer layout: tp*ep*dp owner processes
  unsigned nodes = 2, ranks = 2;   ///< rollout nodes × receivers per node
  std::vector<std::string> checkpoints;
  std::filesystem::path workdir = "dcr-cluster";
  std::vector<std::string> etcd;            ///< etcd client URLs: commit record in etcd
  std::string etcd_prefix = "dcr/cluster/"; ///< its keys' prefix
  std::string s3;                           ///< S3 endpoint: objects in a bucket there
  std::string s3_bucket = "dcr-cluster";
  std::string s3_region = "us-east-1";
  std::string transport = "object_store"; ///< how payloads travel: object_store | relay_tree
  std::vector<std::string> relay_nodes;   ///< relay listen address of rollout node i (HOST:PORT)
  unsigned relay_fanout = 2;              ///< k of the k-ary relay tree (root = node 0)
  double change_pct = 0;                  ///< > 0: each step changes exactly this % of the elements
  /// Owners split each bucket into one payload per block of experts (a
  /// block per rollout node) and one of the rest, so that expert-parallel
  /// nodes can skip the experts they do not hold (builder_options::grouping,
  /// expert_blocks); false: one payload per bucket.
  bool expert_payloads = true;
  /// Rollout nodes fetch every listed payload instead of only those the
  /// manifest index says their receivers need (object store only).
  bool fetch_all = false;
  /// Object store requests each owner and node keeps in flight; 0: the
  /// store's default (s3_options::requests_in_flight, fs_object_store's).
  std::size_t requests_in_flight = 0;
  /// Owners' chunk and bucket targets in bytes (builder_options); 0: scaled
  /// to the owner's share (job_builder_options).
  std::uint64_t chunk_bytes = 0, bucket_bytes = 0;
  /// The job key from --job-key (empty: unkeyed seals and an
  /// unauthenticated control plane, for loopback demos only).
  seal_key key;
  /// --insecure: listen unkeyed on addresses beyond loopback (a network
  /// the operator trusts); without it such a listener is refused.
  bool insecure = false;
  /// S3 keys from --s3-credentials (else DCR_S3_ACCESS_KEY/DCR_S3_SECRET_KEY).
  std::string s3_access_key, s3_secret_key;
  /// etcd client TLS files from --etcd-credentials (else none: plain or
  /// server-verified only).
  std::string etcd_ca, etcd_cert, etcd_key;
};

/// Bytes of a file (`invalid_argument` naming `flag` when it cannot be read).
inline std::string read_flag_file(const std::string& flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw error(errc::invalid_argument, flag + ": cannot read " + path);
  std::ostringstream o;
  o << in.rdbuf();
  return o.str();
}

/// The job key of a key file: its bytes (at least 16; a longer file than
/// BLAKE2b's 64-byte key is reduced to its BLAKE2b-512, so any length of
/// random text or bytes works). Every program of a job reads the same file.
inline seal_key read_job_key(const std::string& path) {
  seal_key k;
  if (auto st = seal_key::from_secret(read_flag_file("--job-key", path), k); !st)
    throw error(st.code, "--job-key " + path + ": " + st.message);
  return k;
}

/// `name value` lines of a credentials file (blank lines and `#` comments
/// skipped); `invalid_argument` for a line without a value or a name not in
/// `allowed`.
inline std::map<std::string, std::string> read_credentials(const std::string& flag,
                                                           const std::string& path,
                                                           const std::set<std::string>& allowed) {
  std::istringstream in(read_flag_file(flag, path));
  std::map<std::string, std::string> out;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    const auto sp = line.find_first_of(" \t=");
    const auto name = line.substr(0, sp);
    const auto vpos = sp == std::string::npos ? sp : line.find_first_not_of(" \t=", sp);
    if (vpos == std::string::npos || !allowed.count(name))
      throw error(errc::invalid_argument, flag + " " + path + ": bad line '" + name +
                                              "' (expected one of the names with a value)");
    out[name] = line.substr(vpos);
  }
  return out;
}

inline const char* job_usage =
    "job flags (the same for every program of one job):\n"
    "  --workdir DIR            objects in DIR/objects, commit record in DIR/control\n"
    "  --size small|N[KB|MB|GB] synthetic Qwen3-MoE-style model (default small)\n"
    "  --seed S                 initial weights and AdamW noise (default 42)\n"
    "  --tp N --ep N --dp N     trainer layout; one dcr-owner per rank (default 2 1 1)\n"
    "  --nodes N                rollout nodes (default 2)\n"
    "  --receivers-per-node R   receivers (serving ranks) per node (default 2)\n"
    "  --change-pct P           each step changes exactly P % of the BF16 elements\n"
    "                           (a stress update) instead of an AdamW step\n"
    "  --checkpoints F0 F1 ...  replay canonical safetensors files instead of AdamW\n"
    "  --etcd URL[,URL...]      commit record in etcd (default: file in DIR/control)\n"
    "  --etcd-prefix P          etcd key prefix (default dcr/cluster/)\n"
    "  --s3 URL [--s3-bucket B] [--s3-region R]   objects in an S3 bucket (default: DIR/objects);\n"
    "                           keys from --s3-credentials, else DCR_S3_ACCESS_KEY and\n"
    "                           DCR_S3_SECRET_KEY\n"
    "  --s3-credentials FILE    lines 'access_key K' and 'secret_key S'\n"
    "  --etcd-credentials FILE  lines 'ca FILE', 'cert FILE', 'key FILE': etcd over TLS\n"
    "                           with a client certificate\n"
    "  --job-key FILE           the job's shared secret (>= 16 bytes, same file for every\n"
    "                           program): keyed seals on payloads, manifests and the commit\n"
    "                           record, and an authenticated control channel that refuses\n"
    "                           peers without it (default: none, which only loopback\n"
    "                           listeners accept; scripts/cluster.sh makes one per job)\n"
    "  --insecure               listen unkeyed beyond loopback (a network you trust)\n"
    "  --transport object_store|relay_tree   how payloads travel (default object_store)\n"
    "  --relay-nodes H:P,H:P,...  relay_tree: listen address of rollout node i (one per node)\n"
    "  --relay-fanout K         relay_tree: k-ary tree over the nodes, root node 0 (default 2)\n"
    "  --fetch-all              object_store: nodes fetch every payload, not only those the\n"
    "                           manifest index says their receivers need\n"
    "  --requests-in-flight N   object_store: GETs per node and PUTs per owner at once\n"
    "                           (default: the store's, 8 for S3, 4 for the fs store)\n"
    "  --bucket-payloads        owners send one payload per bucket, experts not split out\n"
    "  --bucket-bytes N[KB|MB|GB|KiB|MiB|GiB]   owners' bucket target (default: an eighth\n"
    "                           of the owner's shard bytes, 1 MiB to 512 MiB)\n"
    "  --chunk-bytes N[...]     owners' chunk target (default: half the bucket target,\n"
    "                           at most 64 MiB)\n";

/// Bytes from "N", "N KB|MB|GB" (powers of 1000, as --size) or
/// "N KiB|MiB|GiB" (powers of 1024), without a space; positive.
inline std::uint64_t parse_bytes(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  const std::string unit = end ? end : "";
  double mul = 0;
  const std::pair<const char*, double> units[] = {
      {"", 1},          {"B", 1},         {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"KiB", 1024.0},
      {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"K", 1e3},  {"M", 1e6},  {"G", 1e9}};
  for (auto [u, m] : units)
    if (unit == u) mul = m;
  if (v.empty() || end == v.c_str() || mul == 0 || !(x * mul >= 1) || !(x * mul < 1e18))
    throw error(errc::invalid_argument, flag + ": not a positive byte count: " + v);
  return static_cast<std::uint64_t>(x * mul);
}

/// Consume argv[i] (and its values) if it is a job flag.
inline bool parse_job_flag(job_flags& f, int& i, int argc, char** argv) {
  const std::string a = argv[i];
  auto value = [&]() -> std::string {
    if (i + 1 >= argc) throw error(errc::invalid_argument, a + " needs a value");
    return argv[++i];
  };
  auto number = [&]() -> unsigned long {
    const auto v = value();
    char* end = nullptr;
    const auto x = std::strtoul(v.c_str(), &end, 10);
    if (v.empty() || *end) throw error(errc::invalid_argument, a + ": not a number: " + v);
    return x;
  };
  auto list = [&](std::vector<std::string>& out) {
    const auto v = value();
    std::size_t at = 0;
    while (at <= v.size()) {
      const auto c = std::min(v.find(',', at), v.size());
      if (c > at) out.push_back(v.substr(at, c - at));
      at = c + 1;
    }
  };
  if (a == "--workdir")
    f.workdir = value();
  else if (a == "--transport") {
    f.transport = value();
    if (f.transport != "object_store" && f.transport != "relay_tree")
      throw error(errc::invalid_argument,
                  "--transport " + f.transport + ": expected object_store or relay_tree");
  } else if (a == "--relay-nodes") {
    f.relay_nodes.clear();
    list(f.relay_nodes);
  } else if (a == "--relay-fanout")
    f.relay_fanout = static_cast<unsigned>(number());
  else if (a == "--size")
    f.size = value();
  else if (a == "--seed")
    f.seed = number();
  else if (a == "--tp")
    f.tp = static_cast<unsigned>(number());
  else if (a == "--ep")
    f.ep = static_cast<unsigned>(number());
  else if (a == "--dp")
    f.dp = static_cast<unsigned>(number());
  else if (a == "--nodes")
    f.nodes = static_cast<unsigned>(number());
  else if (a == "--receivers-per-node")
    f.ranks = static_cast<unsigned>(number());
  else if (a == "--etcd") {
    const auto v = value();
    std::size_t at = 0;
    while (at <= v.size()) {
      const auto c = std::min(v.find(',', at), v.size());
      if (c > at) f.etcd.push_back(v.substr(at, c - at));
      at = c + 1;
    }
  } else if (a == "--etcd-prefix")
    f.etcd_prefix = value();
  else if (a == "--s3")
    f.s3 = value();
  else if (a == "--s3-bucket")
    f.s3_bucket = value();
  else if (a == "--s3-region")
    f.s3_region = value();
  else if (a == "--fetch-all")
    f.fetch_all = true;
  else if (a == "--requests-in-flight") {
    const auto v = value();
    if (v.empty() || v.size() > 4 || v.find_first_not_of("0123456789") != std::string::npos ||
        std::stoul(v) == 0)
      throw error(errc::invalid_argument, "--requests-in-flight " + v + ": expected 1..9999");
    f.requests_in_flight = std::stoul(v);
  } else if (a == "--job-key")
    f.key = read_job_key(value());
  else if (a == "--insecure")
    f.insecure = true;
  else if (a == "--s3-credentials") {
    auto c = read_credentials(a, value(), {"access_key", "secret_key"});
    if (!c.count("access_key") || !c.count("secret_key"))
      throw error(errc::invalid_argument, a + ": needs access_key and secret_key lines");
    f.s3_access_key = c["access_key"];
    f.s3_secret_key = c["secret_key"];
  } else if (a == "--etcd-credentials") {
    auto c = read_credentials(a, value(), {"ca", "cert", "key"});
    if (c.count("cert") != c.count("key"))
      throw error(errc::invalid_argument, a + ": 'cert' and 'key' go together");
    f.etcd_ca = c["ca"];
    f.etcd_cert = c["cert"];
    f.etcd_key = c["key"];
  } else if (a == "--bucket-payloads")
    f.expert_payloads = false;
  else if (a == "--bucket-bytes")
    f.bucket_bytes = parse_bytes(a, value());
  else if (a == "--chunk-bytes")
    f.chunk_bytes = parse_bytes(a, value());
  else if (a == "--change-pct") {
    const auto v = value();
    char* end = nullptr;
    f.change_pct = std::strtod(v.c_str(), &end);
    if (v.empty() || *end || !(f.change_pct > 0 && f.change_pct <= 100))
      throw error(errc::invalid_argument, a + ": not a percentage in (0, 100]: " + v);
  } else if (a == "--checkpoints") {
    while (i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0)
      f.checkpoints.push_back(argv[++i]);
    if (f.checkpoints.empty()) throw error(errc::invalid_argument, "--checkpoints needs files");
  } else
    return false;
  if (f.tp == 0 || f.ep == 0 || f.dp == 0 || f.nodes == 0 || f.ranks == 0 || f.relay_fanout == 0)
    throw error(errc::invalid_argument, a + " must be positive");
  return true;
}

/// Refuses (`invalid_argument`) a listener or peer `a` beyond loopback in
/// an unkeyed job without --insecure: anyone who reaches an unkeyed port can
/// publish, fence attempts or drop receivers. `what` names the socket.
inline void check_unkeyed_address(const job_flags& f, const protocol::peer_address& a,
                                  const std::string& what) {
  if (!f.key.empty() || f.insecure || net::is_loopback(a)) return;
  throw error(errc::invalid_argument,
              what + " " + a.text() +
                  " is beyond loopback and the job has no key: give every program the same "
                  "--job-key FILE (scripts/cluster.sh makes one), or --insecure on a network "
                  "you trust");
}

/// Control channel options of the job: the library's timeouts and the job key.
inline protocol::channel_options job_channel_options(const job_flags& f) {
  protocol::channel_options o;
  o.key = f.key;
  return o;
}

/// The job's model and plans.
struct job {
  job_flags flags;
  bool from_checkpoints = false;
  model_config cfg;
  std::vector<tensor_meta> metas;
  std::shared_ptr<const source_plan> plan;

  std::uint32_t owners() const { return plan->world; }
  std::size_t receivers() const { return std::size_t{flags.nodes} * flags.ranks; }
  std::filesystem::path objects_dir() const { return flags.workdir / "objects"; }
  std::filesystem::path control_dir() const { return flags.workdir / "control"; }
  std::filesystem::path faults_dir() const { return flags.workdir / "faults"; }
  /// Payloads through the relay tree (relay_job.hpp) instead of the object store.
  bool relay() const { return flags.transport == "relay_tree"; }
};

inline job make_job(const job_flags& f) {
  if (f.transport == "relay_tree" && f.relay_nodes.size() != f.nodes)
    throw error(errc::invalid_argument,
                "--transport relay_tree: --relay-nodes lists " +
                    std::to_string(f.relay_nodes.size()) + " address(es), the job has --nodes " +
                    std::to_string(f.nodes) + " (one HOST:PORT per rollout node)");
  job j;
  j.flags = f;
  if (!f.checkpoints.empty()) {
    j.from_checkpoints = true;
    auto file = io::safetensors_file::open_or_throw(f.checkpoints.front());
    j.metas = file.tensors();
    j.plan = std::make_shared<const source_plan>(row_split_plan(j.metas, f.tp, f.dp));
  } else {
    j.cfg = examples::model_for(examples::parse_size(f.size));
    const trainer_layout tl{f.tp, 1, j.cfg.is_moe() ? f.ep : 1u, 1, f.dp};
    j.plan = std::make_shared<const source_plan>(megatron_plan(j.cfg, tl));
    j.metas = j.plan->canonical;
  }
  return j;
}

/// Bytes of the source shards `rank` owns (what it holds of the model).
inline std::uint64_t owned_shard_bytes(const job& j, std::uint32_t rank) {
  std::uint64_t b = 0;
  for (auto s : j.plan->owned_shards(rank)) b += j.plan->shards[s].nbytes();
  return b;
}

/// The builder options of the owner of rank `rank`: the job's payload
/// grouping, and chunk and bucket targets from the flags or scaled to the
/// owner's share. A bucket is a payload group (one payload, or one per
/// expert block): it is uploaded or streamed while the next one is built,
/// so construction overlaps delivery only from the second bucket on. The
/// default bucket is an eighth of what the owner holds (at least 8 buckets,
/// so at most an eighth of the construction is not overlapped), at least
/// 1 MiB (smaller objects cost more in requests than they gain in overlap)
/// and at most builder_options' 512 MiB (the memory a bucket holds while it
/// is encoded and sent).
inline builder_options job_builder_options(const job& j, std::uint32_t rank) {
  builder_options bo;
  // One payload per expert: a node whose receivers hold some experts only
  // (expert parallelism) skips the others' payloads by the manifest index.
  // The experts in one block per rollout node: vLLM's linear placement puts
  // a contiguous block on each node's ranks, so each node fetches one.
  if (j.flags.expert_payloads) {
    bo.grouping = payload_grouping::by_expert;
    bo.expert_blocks = j.flags.nodes;
  }
  constexpr std::uint64_t mib = std::uint64_t{1} << 20;
  const std::uint64_t max_bucket = bo.bucket_bytes, max_chunk = bo.chunk_bytes;
  const std::uint64_t bucket = j.flags.bucket_bytes
                                   ? j.flags.bucket_bytes
                                   : std::clamp<std::uint64_t>(owned_shard_bytes(j, rank) / 8, mib,
                                                               std::max(mib, max_bucket));
  // A bucket closes only at a chunk boundary (chunks are never split), so
  // with chunks as large as the bucket every bucket would be one chunk and
  // overshoot its target by up to a chunk; half the bucket keeps about two
  // chunks per bucket, so bucket sizes track the target, while chunks stay
  // large enough for per-chunk costs (sorting, merging records) not to
  // matter. Never above the builder's 64 MiB default: a chunk's records are
  // held while it waits to be merged.
  const std::uint64_t chunk = j.flags.chunk_bytes
                                  ? j.flags.chunk_bytes
                                  : std::max<std::uint64_t>(1, std::min(max_chunk, bucket / 2));
  bo.bucket_bytes = static_cast<std::size_t>(bucket);
  bo.chunk_bytes = static_cast<std::size_t>(chunk);
  bo.encoding.key = j.flags.key; // payload digests keyed by the job key, if any
  return bo;
}

/// A fault armed by a flag fires once per job: its marker file says it did,
/// so the restarted process does not fire it again.
inline bool fire_once(const job& j, const std::string& what) {
  std::error_code ec;
  std::filesystem::create_directories(j.faults_dir(), ec);
  const auto p = j.faults_dir() / what;
  const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  ::fsync(fd);
  ::close(fd);
  return true;
}

/// SIGKILL this process (a crash at a named point: nothing is flushed, no
/// destructor runs).
[[noreturn]] inline void die_now(const std::string& who, const std::string& where) {
  std::cerr << who << ": SIGKILL at " << where << std::endl;
  ::kill(::getpid(), SIGKILL);
  std::abort();
}

/// Block until SIGTERM or SIGINT.
inline void wait_for_termination() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  int sig = 0;
  sigwait(&set, &sig);
}
/// Block SIGTERM/SIGINT in every thread started after this (sigwait takes them).
inline void block_termination_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

/// The job's commit store: the file store in DIR/control, or etcd.
class job_commit_store {
public:
  explicit job_commit_store(const job& j) {
    if (j.flags.etcd.empty()) {
      file_ = std::make_unique<protocol::file_commit_store>(j.control_dir(), j.flags.key);
      return;
    }
#if DCR_CLUSTER_NET
    protocol::etcd_options o;
    o.endpoints = j.flags.etcd;
    o.prefix = j.flags.etcd_prefix;
    o.key = j.flags.key;
    o.http.tls.ca_file = j.flags.etcd_ca;
    o.http.tls.cert_file = j.flags.etcd_cert;
    o.http.tls.key_file = j.flags.etcd_key;
    etcd_opt_ = o;
    etcd_ = std::make_unique<protocol::etcd_commit_store>(std::move(o));
#else
    throw error(errc::invalid_argument,
                "--etcd: this build has no dcr-net (configure -Dnet=enabled)");
#endif
  }
  status load(protocol::stored_record& out) {
    return visit([&](auto& s) { return s.load(out); });
  }
  status take_over(std::uint64_t& e) {
    return visit([&](auto& s) { return s.take_over(e); });
  }
  status prepare(std::uint64_t e, std::uint64_t& a) {
    return visit([&](auto& s) { return s.prepare(e, a); });
  }
  status compare_and_set(std::uint64_t e, std::uint64_t a, std::uint64_t r,
                         const protocol::commit_record& k) {
    return visit([&](auto& s) { return s.compare_and_set(e, a, r, k); });
  }

  /// Claims owner id `owner` for this process's life (the owner lease, see
  /// commit_store.hpp): `errc::conflict` when another process still holds it
  /// after `wait`. `ttl`: the etcd lease's TTL (the file store's flock needs none).
  status claim_owner(std::uint32_t owner, std::chrono::seconds ttl,
                     std::chrono::milliseconds wait) {
#if DCR_CLUSTER_NET
    if (etcd_)
      return protocol::etcd_owner_lease::acquire(etcd_opt_, owner, {ttl, wait}, etcd_lease_);
#endif
    (void)ttl;
    const auto until = std::chrono::steady_clock::now() + wait;
    for (;;) {
      auto s = protocol::file_owner_lease::acquire(file_->directory(), owner, file_lease_);
      if (s || s.code != errc::conflict || std::chrono::steady_clock::now() >= until) return s;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  /// Success iff this process still holds its owner lease (`conflict` otherwise).
  status check_owner() {
#if DCR_CLUSTER_NET
    if (etcd_lease_) return etcd_lease_->check();
#endif
    DCR_RETURN_ERROR_IF(!file_lease_, conflict, "no owner lease held");
    return file_lease_->check();
  }
  /// `check_owner`, claiming the id again if the etcd lease lapsed while
  /// this process was cut off and nobody claimed it since
  /// (`etcd_owner_lease::hold`; the file store's flock does not lapse).
  /// Before a write only, never between a write and its closing check.
  status hold_owner() {
#if DCR_CLUSTER_NET
    if (etcd_lease_) return etcd_lease_->hold();
#endif
    return check_owner();
  }
  /// The fence token of the lease held (empty: none).
  std::string owner_token() const {
#if DCR_CLUSTER_NET
    if (etcd_lease_) return etcd_lease_->token();
#endif
    return file_lease_ ? file_lease_->token() : std::string();
  }

private:
  template <class F>
  status visit(F&& f) {
#if DCR_CLUSTER_NET
    if (etcd_) return f(*etcd_);
#endif
    return f(*file_);
  }
  std::unique_ptr<protocol::file_commit_store> file_;
  std::unique_ptr<protocol::file_owner_lease> file_lease_;
#if DCR_CLUSTER_NET
  protocol::etcd_options etcd_opt_;
  std::unique_ptr<protocol::etcd_commit_store> etcd_;
  std::unique_ptr<protocol::etcd_owner_lease> etcd_lease_;
#endif
};
static_assert(protocol::commit_store<job_commit_store>);

/// The job's object store: the fs store in DIR/objects, or an S3 bucket.
class job_object_store {
public:
  explicit job_object_store(const job& j)
      : key_(j.flags.key), in_flight_(j.flags.requests_in_flight) {
    if (j.flags.s3.empty()) {
      fs_ = std::make_unique<transport::fs_object_store>(j.objects_dir());
      return;
    }
#if DCR_CLUSTER_NET
    transport::s3_options o;
    o.endpoint = j.flags.s3;
    o.bucket = j.flags.s3_bucket;
    o.region = j.flags.s3_region;
    if (!j.flags.s3_access_key.empty()) {
      o.credentials.access_key = j.flags.s3_access_key;
      o.credentials.secret_key = j.flags.s3_secret_key;
    } else {
      const char* ak = std::getenv("DCR_S3_ACCESS_KEY");
      const char* sk = std::getenv("DCR_S3_SECRET_KEY");
      if (!ak || !sk)
        throw error(errc::invalid_argument, "--s3: give --s3-credentials FILE or set "
                                            "DCR_S3_ACCESS_KEY and DCR_S3_SECRET_KEY");
      o.credentials.access_key = ak;
      o.credentials.secret_key = sk;
    }
    s3_ = std::make_unique<transport::s3_object_store>(std::move(o));
#else
    throw error(errc::invalid_argument,
                "--s3: this build has no dcr-net (configure -Dnet=enabled)");
#endif
  }
  /// Create the bucket if it is not there (S3; nothing for a directory).
  status prepare() {
#if DCR_CLUSTER_NET
    if (s3_) return s3_->create_bucket();
#endif
    return status::success();
  }
  status put(std::string_view n, std::span<const std::byte> b) {
    return visit([&](auto& s) { return s.put(n, b); });
  }
  status get(std::string_view n, std::vector<std::byte>& out) {
    return visit([&](auto& s) { return s.get(n, out); });
  }
  status list(std::string_view p, std::vector<std::string>& names) {
    return visit([&](auto& s) { return s.list(p, names); });
  }
  status remove(std::string_view n) {
    return visit([&](auto& s) { return s.remove(n); });
  }
  /// S3's start-after where the store is S3: a waiting node lists only the
  /// names published since its last poll.
  status list_after(std::string_view p, std::string_view after, std::vector<std::string>& names) {
    return visit([&](auto& s) { return transport::list_names_after(s, p, after, names); });
  }
  /// Requests writers and readers keep in flight (`--requests-in-flight`,
  /// else the store's own default).
  std::size_t requests_in_flight() const {
    if (in_flight_) return in_flight_;
#if DCR_CLUSTER_NET
    if (s3_) return s3_->requests_in_flight();
#endif
    return fs_->requests_in_flight();
  }
  /// The job key: every incarnation scope over this store seals and
  /// requires its manifests with it (attempt_objects.hpp, `seal_key_of`).
  const dcr::seal_key& seal_key() const noexcept { return key_; }
  /// How long a waiting reader may sleep between listings (attempt_objects.hpp).
  std::chrono::microseconds list_poll_max() const {
#if DCR_CLUSTER_NET
    if (s3_) return s3_->list_poll_max();
#endif
    return std::chrono::microseconds(5000);
  }

private:
  template <class F>
  status visit(F&& f) {
#if DCR_CLUSTER_NET
    if (s3_) return f(*s3_);
#endif
    return f(*fs_);
  }
  dcr::seal_key key_;
  std::size_t in_flight_ = 0;
  std::unique_ptr<transport::fs_object_store> fs_;
#if DCR_CLUSTER_NET
  std::unique_ptr<transport::s3_object_store> s3_;
#endif
};
static_assert(transport::object_store<job_object_store>);

/// The committed version and incarnation (version 0 and "" before the first commit).
inline protocol::stored_record load_record(job_commit_store& commits) {
  protocol::stored_record cur;
  throw_if_failed(commits.load(cur));
  return cur;
}

// The dense export objects (names and seals) are the library's
// (transport/dense_export.hpp), shared with the Python owner server.
using transport::dense_seal_bytes;
using transport::dense_shard_name;
using transport::dense_shard_seal;
using transport::open_dense_shard;
using transport::seal_dense_shard;

} // namespace dcr::cluster
