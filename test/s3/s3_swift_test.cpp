// The S3 object store against a real S3 server: OpenStack Swift with its
// s3api middleware (Debian packages swift swift-proxy swift-account
// swift-container swift-object), started by start-swift.sh for this process.
// The same object_store laws as the memory and filesystem backends,
// pagination, names, typed failures (bad credentials, wrong region, missing
// bucket, server down), concurrent use, and a joint refit through the
// coordinator with the S3 store carrying the payloads. Skips (exit 77) only
// when the swift binaries are not installed.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dcr/protocol/commit_store.hpp"
#include "dcr/protocol/coordinator.hpp"
#include "dcr/transport/s3_object_store.hpp"

#include "protocol/attempt_faults.hpp"
#include "protocol/models.hpp"
#include "swift_cluster.hpp"
#include "transport/object_store_laws.hpp"

using namespace dcr;
using namespace dcr::transport;
using namespace dcr::test_transport;

namespace {

using test_s3::swift_cluster;
swift_cluster* cluster = nullptr;

s3_options options_for(std::string bucket) {
  s3_options o;
  o.endpoint = "http://127.0.0.1:" + std::to_string(cluster->port);
  o.region = cluster->region;
  o.bucket = std::move(bucket);
  o.credentials = {cluster->access_key, cluster->secret_key, ""};
  return o;
}

/// A store on a fresh bucket.
std::unique_ptr<s3_object_store> fresh_store(std::string bucket, std::uint32_t max_keys = 1000) {
  auto o = options_for(std::move(bucket));
  o.max_keys = max_keys;
  auto s = std::make_unique<s3_object_store>(o);
  auto st = s->create_bucket();
  REQUIRE_MESSAGE(st.ok(), st.message);
  return s;
}

} // namespace

TEST_CASE("S3 (Swift s3api): the object_store laws") {
  auto s = fresh_store("dcr-laws");
  check_laws(*s);
  // Creating a bucket this account already owns is fine.
  CHECK(s->create_bucket().ok());
}

TEST_CASE("S3 (Swift s3api): list pages through continuation tokens") {
  auto s = fresh_store("dcr-pages", 3);
  std::vector<std::string> want;
  for (int i = 0; i < 10; ++i) {
    want.push_back("page/k" + std::to_string(i));
    REQUIRE(s->put(want.back(), bytes_of(want.back())).ok());
  }
  REQUIRE(s->put("pagex", bytes_of("x")).ok());
  REQUIRE(s->put("other/1", bytes_of("y")).ok());
  std::vector<std::string> names;
  const auto pages_before = s->stats().list_pages;
  REQUIRE(s->list("page/", names).ok());
  CHECK(names == want);
  CHECK(s->stats().list_pages - pages_before == 4); // 3 + 3 + 3 + 1
  REQUIRE(s->list("page", names).ok());
  CHECK(names.size() == 11);
  REQUIRE(s->list("", names).ok());
  CHECK(names.size() == 12);
  CHECK(std::is_sorted(names.begin(), names.end()));
  // A page size that divides the count exactly still ends.
  auto o = s->options();
  o.max_keys = 5;
  s3_object_store five(o);
  REQUIRE(five.list("page/", names).ok());
  CHECK(names == want);
  REQUIRE(s->list("page/k1", names).ok());
  CHECK(names == std::vector<std::string>{"page/k1"});
  REQUIRE(s->list("nothing/", names).ok());
  CHECK(names.empty());
}

TEST_CASE("S3 (Swift s3api): every name byte class, deep and long names, large objects") {
  auto s = fresh_store("dcr-names", 2);
  const std::vector<std::string> names = {
      "A9/b..c",
      "a-b_c.d/-x/_y/z.",
      "UPPER/lower/0123456789",
      "x/y/z/1/2/3/4/5/6/7/8/9/10",
      "attempt/00000000000000000001/payload/o0000000001-s0000000002",
      std::string(1000, 'n') + "/tail"};
  for (auto& n : names) {
    INFO(n.substr(0, 60));
    auto data = random_bytes(n.size(), n.size());
    REQUIRE(s->put(n, data).ok());
    std::vector<std::byte> out;
    REQUIRE(s->get(n, out).ok());
    CHECK(out == data);
    std::vector<std::string> listed;
    REQUIRE(s->list(n, listed).ok());
    CHECK(listed == std::vector<std::string>{n});
  }
  std::vector<std::string> all;
  REQUIRE(s->list("", all).ok());
  auto sorted = names;
  std::sort(sorted.begin(), sorted.end());
  CHECK(all == sorted);
  for (auto& n : names) REQUIRE(s->remove(n).ok());
  REQUIRE(s->list("", all).ok());
  CHECK(all.empty());

  const auto big = random_bytes(std::size_t{24} << 20, 7);
  REQUIRE(s->put("big", big).ok());
  std::vector<std::byte> out;
  REQUIRE(s->get("big", out).ok());
  CHECK(out == big);
}

TEST_CASE("S3 (Swift s3api): failures are typed") {
  auto good = fresh_store("dcr-errors");
  REQUIRE(good->put("x", bytes_of("1")).ok());
  std::vector<std::byte> out;
  std::vector<std::string> names;
  SUBCASE("wrong secret") {
    auto o = options_for("dcr-errors");
    o.credentials.secret_key = "not-the-secret";
    s3_object_store s(o);
    auto st = s.get("x", out);
    CHECK(st.code == errc::io);
    CHECK(st.message.find("HTTP 403 SignatureDoesNotMatch") != std::string::npos);
    CHECK(s.put("y", bytes_of("2")).code == errc::io);
    CHECK(s.list("", names).code == errc::io);
    CHECK(s.remove("x").code == errc::io);
    CHECK(s.stats().retries == 0);
    REQUIRE(good->get("x", out).ok()); // nothing was removed
  }
  SUBCASE("unknown access key") {
    auto o = options_for("dcr-errors");
    o.credentials.access_key = "nobody:none";
    s3_object_store s(o);
    auto st = s.get("x", out);
    CHECK(st.code == errc::io);
    CHECK(st.message.find("HTTP 403") != std::string::npos);
    INFO(st.message);
    // AWS says InvalidAccessKeyId; Swift's tempauth cannot tell an unknown
    // key from a wrong secret and says SignatureDoesNotMatch.
    CHECK((st.message.find("InvalidAccessKeyId") != std::string::npos ||
           st.message.find("SignatureDoesNotMatch") != std::string::npos));
  }
  SUBCASE("wrong region in the signature scope") {
    auto o = options_for("dcr-errors");
    o.region = "eu-west-9";
    s3_object_store s(o);
    auto st = s.get("x", out);
    CHECK(st.code == errc::io);
    CHECK(st.message.find("HTTP 400") != std::string::npos);
  }
  SUBCASE("missing bucket: not a missing object") {
    s3_object_store s(options_for("dcr-no-such-bucket"));
    auto st = s.get("x", out);
    CHECK(st.code == errc::io);
    CHECK(st.message.find("NoSuchBucket") != std::string::npos);
    CHECK(s.list("", names).code == errc::io);
  }
  SUBCASE("server down") {
    auto o = options_for("dcr-errors");
    o.endpoint = "http://127.0.0.1:1"; // nothing listens on port 1
    o.max_attempts = 3;
    o.backoff = std::chrono::milliseconds(5);
    s3_object_store s(o);
    auto st = s.get("x", out);
    CHECK(st.code == errc::unavailable);
    CHECK(st.message.find("after 3 attempts") != std::string::npos);
    CHECK(s.put("x", bytes_of("1")).code == errc::unavailable);
    CHECK(s.stats().retries == 4);
  }
}

TEST_CASE("S3 (Swift s3api): one store used from several threads") {
  auto s = fresh_store("dcr-threads");
  std::vector<std::thread> ts;
  std::atomic<int> bad{0};
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&, t] {
      for (int i = 0; i < 6; ++i) {
        auto name = "t" + std::to_string(t) + "/o" + std::to_string(i);
        auto data = random_bytes(1000 + i, t * 100 + i);
        std::vector<std::byte> out;
        if (!s->put(name, data).ok() || !s->get(name, out).ok() || out != data) ++bad;
      }
    });
  for (auto& t : ts) t.join();
  CHECK(bad == 0);
  std::vector<std::string> names;
  REQUIRE(s->list("", names).ok());
  CHECK(names.size() == 24);
}

TEST_CASE(
    "S3 (Swift s3api): joint refits through the coordinator, payloads in S3, attempts collected") {
  using namespace dcr::protocol;
  using namespace dcr::test_models;
  auto metas = canonical_tensors(tiny_qwen3_moe());
  auto trainer = trainer_state::make(metas, 11);
  std::vector<std::unique_ptr<model_owner>> owners;
  std::vector<model_owner*> op;
  for (std::uint32_t k = 0; k < 4; ++k) {
    owners.push_back(std::make_unique<model_owner>(k, 4, &trainer, 8));
    op.push_back(owners.back().get());
  }
  auto objects = fresh_store("dcr-refit", 4); // small pages: the reader lists across pages
  memory_commit_store commits;
  auto dense = [&](model_receiver& r) {
    for (std::size_t t = 0; t < metas.size(); ++t)
      r.tensors()[t].bytes = owners[t % 4]->baseline(t)->bytes;
    return status::success();
  };
  std::vector<std::unique_ptr<receiver_endpoint<model_receiver>>> eps;
  std::vector<receiver_endpoint<model_receiver>*> ep;
  for (int r = 0; r < 2; ++r) {
    auto id = "tp" + std::to_string(r);
    eps.push_back(std::make_unique<receiver_endpoint<model_receiver>>(
        id, [&, id] { return std::make_unique<model_receiver>(id, metas); }, dense));
    ep.push_back(eps.back().get());
  }
  coordinator<model_owner, model_receiver, s3_object_store, memory_commit_store> c(
      commits, *objects, op, ep);
  REQUIRE(c.take_over().ok());
  REQUIRE(c.bootstrap().ok());
  for (std::uint64_t v = 1; v <= 2; ++v) {
    trainer.step(0.05, v);
    auto rep = c.transition();
    REQUIRE_MESSAGE(rep.result.ok(), rep.result.message);
    CHECK(rep.committed_version == v);
    CHECK(rep.collected_objects > 0);
    for (auto* e : ep)
      e->with_receiver([&](model_receiver& r) {
        for (std::size_t t = 0; t < metas.size(); ++t)
          CHECK(r.tensors()[t].bytes == trainer.tensors[t].bytes);
      });
  }
  CHECK(objects->stats().list_pages > 0);
  std::vector<std::string> left;
  REQUIRE(objects->list("", left).ok());
  CHECK(left.empty()); // every committed attempt's objects were collected
}

TEST_CASE("S3 (Swift s3api): an unlisted copy of a payload fails its attempt; the overwrite retry "
          "commits bit-exact") {
  auto objects = fresh_store("dcr-unlisted", 5);
  protocol::memory_commit_store commits;
  dcr::test_models::check_unlisted_copy(*objects, commits, protocol::rl_mode::synchronous);
}

TEST_CASE("S3 (Swift s3api): a lost commit record next to attempt objects is refused; after "
          "cleanup a new history commits") {
  auto objects = fresh_store("dcr-lost-record");
  dcr::test_models::check_lost_record<s3_object_store, protocol::memory_commit_store>(
      *objects, [] { return std::make_unique<protocol::memory_commit_store>(); });
}

int main(int argc, char** argv) {
  for (const char* b : {"/usr/bin/swift-proxy-server", "/usr/bin/swift-object-server",
                        "/usr/bin/swift-container-server", "/usr/bin/swift-account-server",
                        "/usr/bin/swift-ring-builder"})
    if (::access(b, X_OK) != 0) {
      std::printf("skip: %s not found (install the Debian packages swift swift-proxy swift-account "
                  "swift-container swift-object)\n",
                  b);
      return 77;
    }
  ::signal(SIGPIPE, SIG_IGN);
  swift_cluster c;
  const int rc = c.start();
  if (rc == 77) {
    std::printf("skip: start-swift.sh found no swift installation\n");
    return 77;
  }
  if (rc != 0) {
    std::fprintf(stderr, "could not start Swift (see start-swift.sh messages above)\n");
    return 1;
  }
  cluster = &c;
  doctest::Context ctx(argc, argv);
  const int result = ctx.run();
  c.stop();
  return result;
}
