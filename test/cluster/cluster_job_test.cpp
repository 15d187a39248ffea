// The cluster job's byte-count flags and the owners' builder options: chunk
// and bucket targets from the flags, or scaled to each owner's share.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "examples/cluster/cluster_job.hpp"
#include "examples/cluster/relay_job.hpp"

using namespace dcr;

namespace {

cluster::job_flags parse(std::vector<std::string> args) {
  args.insert(args.begin(), "prog");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  cluster::job_flags f;
  const int argc = static_cast<int>(argv.size());
  for (int i = 1; i < argc; ++i)
    if (!cluster::parse_job_flag(f, i, argc, argv.data()))
      throw std::invalid_argument("not a job flag: " + args[std::size_t(i)]);
  return f;
}

constexpr std::uint64_t mib = std::uint64_t{1} << 20;

} // namespace

TEST_CASE("cluster job: byte counts in decimal and binary units") {
  CHECK(cluster::parse_bytes("--x", "4096") == 4096);
  CHECK(cluster::parse_bytes("--x", "3KB") == 3000);
  CHECK(cluster::parse_bytes("--x", "2MB") == 2000000);
  CHECK(cluster::parse_bytes("--x", "1.5GB") == 1500000000);
  CHECK(cluster::parse_bytes("--x", "3KiB") == 3 * 1024);
  CHECK(cluster::parse_bytes("--x", "2MiB") == 2 * mib);
  CHECK(cluster::parse_bytes("--x", "1GiB") == 1024 * mib);
  for (const char* bad : {"", "MB", "0", "-1MB", "12XB", "1 MB", "0.0001"})
    CHECK_THROWS_AS(cluster::parse_bytes("--x", bad), dcr::error);
  const auto f = parse({"--chunk-bytes", "3MiB", "--bucket-bytes", "24MiB"});
  CHECK(f.chunk_bytes == 3 * mib);
  CHECK(f.bucket_bytes == 24 * mib);
  CHECK_THROWS_AS(parse({"--bucket-bytes", "lots"}), dcr::error);
}

TEST_CASE("cluster job: owners' chunk and bucket targets scale with their share") {
  for (const char* size : {"small", "64MB", "1GB"}) {
    CAPTURE(size);
    auto flags = parse({"--size", size, "--tp", "2", "--nodes", "2"});
    const auto job = cluster::make_job(flags);
    const builder_options defaults;
    for (std::uint32_t rank = 0; rank < job.owners(); ++rank) {
      CAPTURE(rank);
      const auto owned = cluster::owned_shard_bytes(job, rank);
      REQUIRE(owned > 0);
      std::uint64_t expect = 0;
      for (auto s : job.plan->owned_shards(rank)) expect += job.plan->shards[s].nbytes();
      CHECK(owned == expect);
      const auto bo = cluster::job_builder_options(job, rank);
      // The job's expert grouping, one block per rollout node.
      CHECK(bo.grouping == payload_grouping::by_expert);
      CHECK(bo.expert_blocks == 2);
      // At least 8 buckets per owner unless the 1 MiB floor says otherwise,
      // never above the builder's default; chunks half a bucket, at most 64 MiB.
      CHECK(bo.bucket_bytes >= mib);
      CHECK(bo.bucket_bytes <= defaults.bucket_bytes);
      if (owned >= 8 * mib) CHECK(owned / bo.bucket_bytes >= 8);
      CHECK(bo.chunk_bytes == std::min<std::uint64_t>(defaults.chunk_bytes, bo.bucket_bytes / 2));
    }
  }
  // The flags win, each on its own; --bucket-payloads: no expert grouping.
  auto flags = parse({"--size", "64MB", "--bucket-bytes", "8MiB", "--bucket-payloads"});
  auto bo = cluster::job_builder_options(cluster::make_job(flags), 0);
  CHECK(bo.bucket_bytes == 8 * mib);
  CHECK(bo.chunk_bytes == 4 * mib);
  CHECK(bo.grouping == payload_grouping::none);
  flags = parse({"--size", "64MB", "--chunk-bytes", "1MiB"});
  const auto job = cluster::make_job(flags);
  bo = cluster::job_builder_options(job, 1);
  CHECK(bo.chunk_bytes == mib);
  CHECK(bo.bucket_bytes == std::max(mib, cluster::owned_shard_bytes(job, 1) / 8));
}

TEST_CASE("cluster job: --job-key, --s3-credentials and --etcd-credentials files") {
  const auto dir =
      std::filesystem::temp_directory_path() / ("dcr-job-flags-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir / name, std::ios::binary) << text;
    return (dir / name).string();
  };
  auto code_of = [&](std::vector<std::string> args) {
    try {
      parse(std::move(args));
    } catch (const error& e) {
      return e.code();
    }
    return errc::ok;
  };
  // A key file: its bytes; shorter than 16 bytes or missing is a typed error.
  const auto key16 = write("k16", "0123456789abcdef");
  const auto f = parse({"--job-key", key16});
  seal_key want;
  REQUIRE(seal_key::make(std::string_view("0123456789abcdef"), want).ok());
  CHECK(f.key == want);
  CHECK(parse({}).key.empty());
  CHECK(code_of({"--job-key", write("k15", "0123456789abcde")}) == errc::invalid_argument);
  CHECK(code_of({"--job-key", (dir / "absent").string()}) == errc::invalid_argument);
  // Longer than a BLAKE2b key: reduced to 64 bytes, different files give different keys.
  const auto k1 = parse({"--job-key", write("long1", std::string(100, 'a'))}).key;
  const auto k2 = parse({"--job-key", write("long2", std::string(100, 'b'))}).key;
  CHECK(k1.size() == 64);
  CHECK(!(k1 == k2));

  const auto s3 =
      parse({"--s3-credentials", write("s3", "# test\naccess_key AK\nsecret_key SK\n")});
  CHECK(s3.s3_access_key == "AK");
  CHECK(s3.s3_secret_key == "SK");
  CHECK(code_of({"--s3-credentials", write("s3b", "access_key AK\n")}) == errc::invalid_argument);
  CHECK(code_of({"--s3-credentials", write("s3c", "password x\n")}) == errc::invalid_argument);
  const auto etcd = parse({"--etcd-credentials", write("etcd", "ca /c\ncert /a\nkey /b\n")});
  CHECK(etcd.etcd_ca == "/c");
  CHECK(etcd.etcd_cert == "/a");
  CHECK(etcd.etcd_key == "/b");
  CHECK(code_of({"--etcd-credentials", write("etcdb", "cert /a\n")}) == errc::invalid_argument);
  std::filesystem::remove_all(dir);
}

TEST_CASE("cluster job: dense export objects are sealed and checked on read") {
  using namespace dcr;
  std::vector<std::byte> bytes(1000);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = std::byte(i * 7 + 3);
  seal_key key, other;
  REQUIRE(seal_key::make("a job key of 32 bytes, not more.", key).ok());
  REQUIRE(seal_key::make("another key", other).ok());
  const std::string inc = "0123456789abcdef0123456789abcdef";
  const std::string name = cluster::dense_shard_name(3, 5);
  CHECK(name == "dense/v3/shard/5");
  for (const seal_key& used : {key, seal_key{}}) {
    const auto sealed = cluster::seal_dense_shard(inc, name, bytes, used);
    REQUIRE(sealed.size() == bytes.size() + cluster::dense_seal_bytes);
    auto ok = sealed;
    REQUIRE(cluster::open_dense_shard(inc, name, ok, used).ok());
    CHECK(ok == bytes); // the exported bytes exactly
    // Any modified byte, of the shard or of the seal.
    for (std::size_t at : {std::size_t{0}, std::size_t{499}, bytes.size(), sealed.size() - 1}) {
      auto bad = sealed;
      bad[at] ^= std::byte{1};
      auto s = cluster::open_dense_shard(inc, name, bad, used);
      CHECK(s.code == errc::digest_mismatch);
      CHECK(s.message.find(name) != std::string::npos);
    }
    // A genuine object replayed as another version's, shard's or history's.
    auto moved = sealed;
    CHECK(cluster::open_dense_shard(inc, cluster::dense_shard_name(4, 5), moved, used).code ==
          errc::digest_mismatch);
    CHECK(cluster::open_dense_shard(inc, cluster::dense_shard_name(3, 6), moved, used).code ==
          errc::digest_mismatch);
    CHECK(cluster::open_dense_shard("fedcba9876543210fedcba9876543210", name, moved, used).code ==
          errc::digest_mismatch);
    std::vector<std::byte> tiny(cluster::dense_seal_bytes - 1);
    CHECK(cluster::open_dense_shard(inc, name, tiny, used).code == errc::truncated);
  }
  // A writer without the job key: an unkeyed seal, or one with another key,
  // over the bytes it chose, is refused by a reader holding the key.
  auto forged = cluster::seal_dense_shard(inc, name, bytes, seal_key{});
  CHECK(cluster::open_dense_shard(inc, name, forged, key).code == errc::digest_mismatch);
  forged = cluster::seal_dense_shard(inc, name, bytes, other);
  CHECK(cluster::open_dense_shard(inc, name, forged, key).code == errc::digest_mismatch);
}

TEST_CASE("cluster job: the file store's owner lease refuses a second claim, fences a stale one") {
  using namespace dcr;
  const auto dir = std::filesystem::temp_directory_path() /
                   ("dcr-lease-test-" + std::to_string(static_cast<long>(::getpid())));
  std::filesystem::remove_all(dir);
  std::unique_ptr<protocol::file_owner_lease> a, b, c;
  REQUIRE(protocol::file_owner_lease::acquire(dir, 1, a).ok());
  CHECK(valid_incarnation(a->token()));
  CHECK(a->check().ok());
  // Another claim of owner 1 (another open file description: as another
  // process) is refused while `a` lives; owner 2 is independent.
  auto s = protocol::file_owner_lease::acquire(dir, 1, b);
  CHECK(s.code == errc::conflict);
  CHECK(s.message.find("held by another process") != std::string::npos);
  CHECK(s.message.find(a->token()) != std::string::npos); // names the holder
  CHECK(!b);
  REQUIRE(protocol::file_owner_lease::acquire(dir, 2, c).ok());
  CHECK(c->token() != a->token());
  // Released (as by the kernel when the holder dies): the next claim wins
  // with a new token.
  const auto old = a->token();
  a.reset();
  REQUIRE(protocol::file_owner_lease::acquire(dir, 1, b).ok());
  CHECK(b->token() != old);
  // The lock file replaced by hand: a new claim can lock the new inode, and
  // the old holder is fenced (conflict), not left writing beside it.
  std::filesystem::remove(dir / "owners" / "1.lock");
  CHECK(b->check().code == errc::conflict);
  REQUIRE(protocol::file_owner_lease::acquire(dir, 1, a).ok());
  CHECK(a->check().ok());
  CHECK(b->check().code == errc::conflict);
  a.reset();
  b.reset();
  c.reset();
  std::filesystem::remove_all(dir);
}
