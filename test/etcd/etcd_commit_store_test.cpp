// etcd_commit_store against a real etcd server (started here): the commit
// store laws shared with the other models, the documented key layout, racing
// store objects, a killed / frozen / restarted server, endpoint failover, and
// one joint commit through the coordinator. Skips (exit 77) only when
// /usr/bin/etcd is not installed (Debian package etcd-server).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <array>
#include <atomic>
#include <barrier>
#include <cstdio>
#include <memory>
#include <set>
#include <thread>

#include <csignal>
#include <unistd.h>

#include "dcr/core/json.hpp"
#include "dcr/net/base64.hpp"
#include "dcr/protocol/coordinator.hpp"
#include "dcr/protocol/etcd_commit_store.hpp"
#include "dcr/transport/object_store.hpp"
#include "etcd_server.hpp"
#include "fake_server.hpp"
#include "protocol/commit_store_laws.hpp"
#include "protocol/models.hpp"

using namespace dcr;
using namespace dcr::protocol;
using dcr::test_etcd::etcd_server;
using dcr::test_laws::check_laws;
using dcr::test_laws::sample_record;

namespace {

/// One server for the tests that do not stop it; each test uses its own prefix.
etcd_server& shared_server() {
  static etcd_server s;
  return s;
}

etcd_options options_for(const etcd_server& s, std::string prefix) {
  etcd_options o;
  o.endpoints = {s.url()};
  o.prefix = std::move(prefix);
  o.http.connect_timeout = std::chrono::milliseconds(1000);
  o.http.request_timeout = std::chrono::milliseconds(5000);
  return o;
}

/// Raw range of one key through the gateway: {exists, value, version}.
struct raw_kv {
  bool exists = false;
  std::string value;
  std::uint64_t version = 0;
};
/// POST `body` to the etcd gateway's `target` outside the store (a test's
/// own view of etcd); the answer parsed.
json_value raw_post(const etcd_server& s, const char* target, const std::string& body) {
  net::http_client c(net::http_endpoint{"127.0.0.1", s.client_port()});
  net::http_request rq;
  rq.method = "POST";
  rq.target = target;
  rq.body = body;
  net::http_response res;
  REQUIRE(c.request(rq, res).ok());
  REQUIRE(res.status == 200);
  json_value doc;
  REQUIRE(parse_json(res.body, doc).ok());
  return doc;
}

raw_kv raw_get(const etcd_server& s, const std::string& key) {
  const json_value doc =
      raw_post(s, "/v3/kv/range", R"({"key":")" + net::base64_encode(key) + R"("})");
  raw_kv out;
  if (auto* kvs = doc.get("kvs"); kvs && !kvs->items.empty()) {
    out.exists = true;
    auto& kv = kvs->items[0];
    if (auto* v = kv.get("value")) REQUIRE(net::base64_decode(v->text, out.value).ok());
    REQUIRE(kv.get("version"));
    REQUIRE(kv.get("version")->as_u64(out.version));
  }
  return out;
}

} // namespace

TEST_CASE("etcd store: commit_store laws") {
  etcd_commit_store s(options_for(shared_server(), "laws/"));
  check_laws(s);
}

TEST_CASE("etcd store: keys, values and the record's revision as documented") {
  auto& srv = shared_server();
  etcd_commit_store s(options_for(srv, "layout/"));
  CHECK(s.record_key() == "layout/record");
  CHECK(s.epoch_key() == "layout/epoch");
  CHECK(s.attempt_key() == "layout/attempt");
  std::uint64_t e = 0, a = 0;
  REQUIRE(s.take_over(e).ok());
  REQUIRE(s.take_over(e).ok());
  REQUIRE(s.prepare(e, a).ok());
  CHECK_FALSE(raw_get(srv, s.record_key()).exists);
  CHECK(raw_get(srv, s.epoch_key()).value == std::to_string(e));
  CHECK(raw_get(srv, s.attempt_key()).value == std::to_string(a));
  const auto k = sample_record(3, a, 42);
  REQUIRE(s.compare_and_set(e, a, 0, k).ok());
  REQUIRE(s.compare_and_set(e, a, 1, k).ok());
  const auto rec = raw_get(srv, s.record_key());
  CHECK(rec.version == 2);
  stored_record parsed;
  REQUIRE(parse_commit_record(rec.value, parsed).ok());
  CHECK(parsed == stored_record{k, 2, e, a});
  // A record key written by something else is reported, not misread.
  {
    net::http_client c(net::http_endpoint{"127.0.0.1", srv.client_port()});
    net::http_request rq;
    rq.method = "POST";
    rq.target = "/v3/kv/put";
    rq.body = R"({"key":")" + net::base64_encode(s.record_key()) + R"(","value":")" +
              net::base64_encode(serialize_commit_record(parsed)) +
              R"("})"; // version 3, record says 2
    net::http_response res;
    REQUIRE(c.request(rq, res).ok());
    REQUIRE(res.status == 200);
  }
  stored_record r;
  auto st = s.load(r);
  CHECK(st.code == errc::bad_format);
  CHECK(st.message.find("layout/record") != std::string::npos);
  // Other prefixes are untouched.
  etcd_commit_store other(options_for(srv, "layout-other/"));
  REQUIRE(other.load(r).ok());
  CHECK(r == stored_record{});
}

TEST_CASE("etcd store: store objects racing take_over and prepare get unique, increasing ids") {
  auto& srv = shared_server();
  constexpr int threads = 4, per = 25;
  std::uint64_t epoch = 0;
  {
    etcd_commit_store s(options_for(srv, "race-prepare/"));
    REQUIRE(s.take_over(epoch).ok());
  }
  std::vector<std::vector<std::uint64_t>> got(threads);
  std::vector<std::thread> ts;
  std::atomic<int> failures{0};
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      etcd_commit_store s(options_for(srv, "race-prepare/"));
      for (int i = 0; i < per; ++i) {
        std::uint64_t a = 0;
        if (!s.prepare(epoch, a).ok()) ++failures;
        got[static_cast<std::size_t>(t)].push_back(a);
      }
    });
  for (auto& t : ts) t.join();
  REQUIRE(failures == 0);
  std::set<std::uint64_t> all;
  for (auto& v : got) {
    for (std::size_t i = 1; i < v.size(); ++i) CHECK(v[i] > v[i - 1]);
    for (auto a : v) CHECK(all.insert(a).second);
  }
  // No call was lost or applied twice: the ids are exactly 1..N.
  CHECK(all.size() == std::size_t{threads * per});
  CHECK(*all.begin() == 1);
  CHECK(*all.rbegin() == std::uint64_t{threads * per});

  // Racing take_over: unique epochs, and only the newest may prepare.
  std::vector<std::uint64_t> epochs(threads);
  ts.clear();
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      etcd_commit_store s(options_for(srv, "race-prepare/"));
      if (!s.take_over(epochs[static_cast<std::size_t>(t)]).ok()) ++failures;
    });
  for (auto& t : ts) t.join();
  REQUIRE(failures == 0);
  std::set<std::uint64_t> es(epochs.begin(), epochs.end());
  CHECK(es.size() == std::size_t{threads});
  CHECK(*es.begin() == epoch + 1);
  CHECK(*es.rbegin() == epoch + threads);
  etcd_commit_store s(options_for(srv, "race-prepare/"));
  for (auto e : es) {
    std::uint64_t a = 0;
    CHECK(s.prepare(e, a).code == (e == *es.rbegin() ? errc::ok : errc::conflict));
  }
}

TEST_CASE("etcd store: two store objects racing compare-and-set: exactly one wins each round") {
  auto& srv = shared_server();
  std::uint64_t epoch = 0, attempt = 0;
  {
    etcd_commit_store s(options_for(srv, "race-cas/"));
    REQUIRE(s.take_over(epoch).ok());
    REQUIRE(s.prepare(epoch, attempt).ok());
  }
  constexpr int rounds = 30;
  std::barrier sync(2);
  std::array<std::vector<errc>, 2> results;
  std::array<std::vector<std::uint64_t>, 2> seen_revision;
  auto racer = [&](int who) {
    etcd_commit_store s(options_for(srv, "race-cas/"));
    for (int r = 0; r < rounds; ++r) {
      stored_record cur;
      auto l = s.load(cur);
      sync.arrive_and_wait(); // both loaded the same revision before either writes
      auto next = cur.record;
      ++next.version;
      next.incarnation = std::string(32, 'e');
      next.receivers = {{"racer-" + std::to_string(who), {}}};
      results[static_cast<std::size_t>(who)].push_back(
          l.ok() ? s.compare_and_set(epoch, attempt, cur.revision, next).code : l.code);
      seen_revision[static_cast<std::size_t>(who)].push_back(cur.revision);
      sync.arrive_and_wait();
    }
  };
  std::thread t0(racer, 0), t1(racer, 1);
  t0.join();
  t1.join();
  for (int r = 0; r < rounds; ++r) {
    INFO("round " << r);
    const auto a = results[0][static_cast<std::size_t>(r)],
               b = results[1][static_cast<std::size_t>(r)];
    CHECK(seen_revision[0][static_cast<std::size_t>(r)] == std::uint64_t(r));
    CHECK(seen_revision[1][static_cast<std::size_t>(r)] == std::uint64_t(r));
    CHECK(((a == errc::ok && b == errc::conflict) || (a == errc::conflict && b == errc::ok)));
  }
  etcd_commit_store s(options_for(srv, "race-cas/"));
  stored_record cur;
  REQUIRE(s.load(cur).ok());
  CHECK(cur.revision == rounds);
  CHECK(cur.record.version == rounds);
}

TEST_CASE(
    "etcd store: server killed -> typed errors; frozen -> timeout; restarted -> state persisted") {
  etcd_server srv;
  auto opt = options_for(srv, "crash/");
  opt.http.request_timeout = std::chrono::milliseconds(1500);
  etcd_commit_store s(opt);
  std::uint64_t e = 0, a = 0;
  REQUIRE(s.take_over(e).ok());
  REQUIRE(s.prepare(e, a).ok());
  const auto k = sample_record(1, a, 5);
  REQUIRE(s.compare_and_set(e, a, 0, k).ok());
  stored_record before;
  REQUIRE(s.load(before).ok());

  // Frozen server: connections are accepted by the kernel but never answered.
  srv.kill(SIGSTOP);
  {
    stored_record r;
    const auto t0 = std::chrono::steady_clock::now();
    auto st = s.load(r);
    const auto took = std::chrono::steady_clock::now() - t0;
    CHECK(st.code == errc::unavailable);
    CHECK(st.message.find("timed out") != std::string::npos);
    CHECK(took < std::chrono::seconds(6)); // request timeout, not a hang
    // The server may still act on a request it never answered, so this one
    // expects a wrong revision: whenever etcd gets to it, it changes nothing.
    auto cas = s.compare_and_set(e, a, 7, sample_record(2, a, 6));
    CHECK(cas.code == errc::unavailable);
    CHECK(cas.message.find("outcome unknown") != std::string::npos);
  }
  srv.kill(SIGCONT);
  stored_record after_freeze;
  REQUIRE(s.load(after_freeze).ok());
  CHECK(after_freeze == before);

  srv.kill(SIGKILL);
  {
    stored_record r;
    std::uint64_t x = 0;
    auto l = s.load(r);
    CHECK(l.code == errc::unavailable);
    CHECK(l.message.find(srv.url().substr(7)) != std::string::npos);
    CHECK(s.take_over(x).code == errc::unavailable);
    CHECK(s.prepare(e, x).code == errc::unavailable);
    CHECK(s.compare_and_set(e, a, after_freeze.revision, k).code == errc::unavailable);
  }
  srv.start();
  stored_record r;
  REQUIRE(s.load(r).ok()); // the same object reconnects
  CHECK(r == after_freeze);
  etcd_commit_store fresh(opt);
  REQUIRE(fresh.load(r).ok());
  CHECK(r == after_freeze);
  // Counters keep increasing across the restart.
  std::uint64_t e2 = 0, a2 = 0;
  REQUIRE(fresh.take_over(e2).ok());
  CHECK(e2 > e);
  REQUIRE(fresh.prepare(e2, a2).ok());
  CHECK(a2 > a);
  REQUIRE(fresh.compare_and_set(e2, a2, r.revision, sample_record(9, a2, 9)).ok());
  CHECK(s.compare_and_set(e, a, r.revision + 1, k).code ==
        errc::conflict); // the old coordinator is fenced
}

TEST_CASE(
    "etcd store: a compare-and-set whose answer is lost is resolved by reading the state back") {
  auto& srv = shared_server();
  // A proxy in front of etcd that can lose one record put: either after
  // etcd applied it (answer lost) or before forwarding it (request lost).
  enum class lose { nothing, answer, request };
  std::atomic<lose> mode{lose::nothing};
  std::atomic<int> lost{0};
  etcd_commit_store direct(options_for(srv, "lost-answer/"));
  const std::string record_put =
      R"("request_put":{"key":")" + net::base64_encode(direct.record_key()) + "\"";
  test_net::fake_server proxy([&](int fd, int) {
    net::http_client up(net::http_endpoint{"127.0.0.1", srv.client_port()});
    for (std::string rq; !(rq = test_net::fake_server::read_request(fd)).empty();) {
      const auto sp1 = rq.find(' '), sp2 = rq.find(' ', sp1 + 1);
      net::http_request fwd;
      fwd.method = rq.substr(0, sp1);
      fwd.target = rq.substr(sp1 + 1, sp2 - sp1 - 1);
      fwd.body = rq.substr(rq.find("\r\n\r\n") + 4);
      const bool is_put = fwd.body.find(record_put) != std::string::npos;
      const lose m = mode;
      if (is_put && m == lose::request) {
        mode = lose::nothing;
        ++lost;
        return;
      }
      net::http_response res;
      if (!up.request(fwd, res).ok()) return;
      if (is_put && m == lose::answer) {
        mode = lose::nothing;
        ++lost;
        return;
      }
      test_net::fake_server::write_all(
          fd, "HTTP/1.1 " + std::to_string(res.status) + " " + res.reason +
                  "\r\nContent-Length: " + std::to_string(res.body.size()) + "\r\n\r\n" + res.body);
    }
  });
  auto opt = options_for(srv, "lost-answer/");
  opt.endpoints = {"http://" + proxy.endpoint().authority()};
  etcd_commit_store s(opt);
  std::uint64_t e = 0, a = 0;
  REQUIRE(s.take_over(e).ok());
  REQUIRE(s.prepare(e, a).ok());
  REQUIRE(s.compare_and_set(e, a, 0, sample_record(1, a, 1)).ok());

  // Applied, answer lost: the read-back finds this very record at r + 1.
  mode = lose::answer;
  const auto k2 = sample_record(2, a, 2);
  auto st = s.compare_and_set(e, a, 1, k2);
  CHECK(lost == 1);
  CHECK_MESSAGE(st.ok(), st.message);
  stored_record r;
  REQUIRE(direct.load(r).ok());
  CHECK(r == stored_record{k2, 2, e, a});

  // Lost before etcd saw it: nothing changed, and the store does not claim success.
  mode = lose::request;
  st = s.compare_and_set(e, a, 2, sample_record(3, a, 3));
  CHECK(lost == 2);
  CHECK(st.code == errc::unavailable);
  CHECK(st.message.find("outcome unknown") != std::string::npos);
  REQUIRE(direct.load(r).ok());
  CHECK(r == stored_record{k2, 2, e, a});
  REQUIRE(s.compare_and_set(e, a, 2, sample_record(3, a, 3)).ok()); // and the next try works
}

TEST_CASE("etcd store: a dead endpoint first in the list fails over to the live one") {
  auto& srv = shared_server();
  auto opt = options_for(srv, "failover/");
  opt.endpoints = {"http://127.0.0.1:" + std::to_string(test_etcd::free_port()), srv.url()};
  etcd_commit_store s(opt);
  check_laws(s);
  // Only dead endpoints: a typed error naming the last one tried.
  opt.endpoints = {"http://127.0.0.1:" + std::to_string(test_etcd::free_port())};
  etcd_commit_store dead(opt);
  stored_record r;
  auto st = dead.load(r);
  CHECK(st.code == errc::unavailable);
  CHECK(st.message.find("cannot connect") != std::string::npos);
  if (!dcr::net::tls_supported()) // with TLS it connects lazily, and the dead host shows on use
    CHECK_THROWS_AS(etcd_commit_store(etcd_options{{"https://x:1"}, "p/", {}, 1}), dcr::error);
  CHECK_THROWS_AS(etcd_commit_store(etcd_options{{"ftp://x:1"}, "p/", {}, 1}), dcr::error);
  CHECK_THROWS_AS(etcd_commit_store(etcd_options{{}, "p/", {}, 1}), dcr::error);
}

TEST_CASE("etcd store: a joint commit through the coordinator, crash and successor") {
  using namespace dcr::test_models;
  auto& srv = shared_server();
  auto metas = canonical_tensors(tiny_qwen3_moe());
  auto trainer = trainer_state::make(metas, 5);
  std::vector<std::unique_ptr<model_owner>> owners;
  std::vector<model_owner*> op;
  for (std::uint32_t k = 0; k < 4; ++k) {
    owners.push_back(std::make_unique<model_owner>(k, 4, &trainer, 8));
    op.push_back(owners.back().get());
  }
  transport::memory_object_store objects;
  etcd_commit_store commits(options_for(srv, "coordinator/"));
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
  using C =
      coordinator<model_owner, model_receiver, transport::memory_object_store, etcd_commit_store>;
  coordinator<model_owner, model_receiver, transport::memory_object_store, etcd_commit_store,
              support::crash_at>
      c1(commits, objects, op, ep, {}, support::crash_at(crash_point::after_first_ack));
  REQUIRE(c1.take_over().ok());
  REQUIRE(c1.bootstrap().ok());
  trainer.step(0.05, 1);
  CHECK(c1.transition().result.code == errc::aborted);
  etcd_commit_store reopened(
      options_for(srv, "coordinator/")); // the successor reads the durable record
  C c2(reopened, objects, op, ep);
  REQUIRE(c2.take_over().ok());
  auto rep = c2.transition();
  REQUIRE_MESSAGE(rep.result.ok(), rep.result.message);
  CHECK(rep.committed_version == 1);
  stored_record cur;
  REQUIRE(reopened.load(cur).ok());
  CHECK(cur.record.version == 1);
  CHECK(cur.revision == 2); // bootstrap, then v1
  REQUIRE(cur.record.receivers.size() == 2);
  for (std::size_t i = 0; i < ep.size(); ++i)
    ep[i]->with_receiver([&](model_receiver& r) {
      CHECK(cur.record.receivers[i].state == r.state_digest());
      for (std::size_t t = 0; t < metas.size(); ++t)
        CHECK(r.tensors()[t].bytes == trainer.tensors[t].bytes);
    });
  // The first coordinator was fenced by the successor's take_over.
  std::uint64_t a = 0;
  CHECK(commits.prepare(1, a).code == errc::conflict);
}

int main(int argc, char** argv) {
  if (::access(test_etcd::etcd_binary, X_OK) != 0) {
    std::printf("skip: %s not found (install the Debian package etcd-server)\n",
                test_etcd::etcd_binary);
    return 77;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}

TEST_CASE("etcd owner lease: one claimant, released on destruction, fenced when its key is gone") {
  auto& srv = shared_server();
  const auto opt = options_for(srv, "lease/");
  const std::string key = "lease/owners/3";
  std::unique_ptr<etcd_owner_lease> a, b;
  REQUIRE(etcd_owner_lease::acquire(opt, 3, {std::chrono::seconds(5), {}}, a).ok());
  CHECK(dcr::valid_incarnation(a->token()));
  CHECK(a->check().ok());
  auto held = raw_get(srv, key);
  REQUIRE(held.exists);
  CHECK(held.value.find("token " + a->token()) == 0);
  // A second claimant is refused, after its wait, naming the holder.
  const auto t0 = std::chrono::steady_clock::now();
  auto s = etcd_owner_lease::acquire(opt, 3,
                                     {std::chrono::seconds(5), std::chrono::milliseconds(600)}, b);
  CHECK(s.code == errc::conflict);
  CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(600));
  CHECK(s.message.find(a->token()) != std::string::npos);
  CHECK(!b);
  CHECK(a->check().ok()); // the refused claim took nothing from the holder
  // Another owner id is independent.
  REQUIRE(etcd_owner_lease::acquire(opt, 4, {std::chrono::seconds(5), {}}, b).ok());
  b.reset();
  // Destruction revokes the lease: the key goes, the next claim wins at once.
  const auto old = a->token();
  a.reset();
  CHECK_FALSE(raw_get(srv, key).exists);
  REQUIRE(etcd_owner_lease::acquire(opt, 3, {std::chrono::seconds(5), {}}, a).ok());
  CHECK(a->token() != old);
  // The key deleted behind the holder's back (its lease expired, an
  // operator removed it) and claimed by another process: the old holder is
  // fenced (conflict), never back.
  raw_post(srv, "/v3/kv/deleterange", R"({"key":")" + net::base64_encode(key) + R"("})");
  CHECK(a->check().code == errc::conflict);
  REQUIRE(etcd_owner_lease::acquire(opt, 3, {std::chrono::seconds(5), {}}, b).ok());
  CHECK(b->check().ok());
  s = a->check();
  CHECK(s.code == errc::conflict);
  CHECK(s.message.find(b->token()) != std::string::npos);
}

TEST_CASE("etcd owner lease: renewed past its TTL while the holder lives") {
  auto& srv = shared_server();
  const auto opt = options_for(srv, "lease-ttl/");
  std::unique_ptr<etcd_owner_lease> a, b;
  REQUIRE(etcd_owner_lease::acquire(opt, 1, {std::chrono::seconds(1), {}}, a).ok());
  // Three TTLs later the claim still holds (renewed every third of the TTL),
  // and a claimant waiting another TTL is refused. (A holder that stops
  // renewing, SIGKILLed, is test/cluster/cluster_lease_test.sh etcd: its
  // restart waits for the expiry and gets the id.)
  std::this_thread::sleep_for(std::chrono::milliseconds(3000));
  CHECK(a->check().ok());
  CHECK(etcd_owner_lease::acquire(opt, 1,
                                  {std::chrono::seconds(1), std::chrono::milliseconds(1200)}, b)
            .code == errc::conflict);
  CHECK(a->check().ok());
}

TEST_CASE("etcd owner lease: a claim won at the end of a long wait keeps a live lease") {
  // The restart of a SIGKILLed owner: the dead holder's key lives until its
  // lease's TTL runs out, and the claimant waits for that. Its own lease,
  // granted before the wait, must not run down meanwhile: a claim won with a
  // nearly expired lease lost its key before the first renewal (seen as
  // "lease ... lost (etcd key ... holds nothing)" after a restart).
  auto& srv = shared_server();
  const auto opt = options_for(srv, "lease-wait/");
  const std::string key = "lease-wait/owners/2";
  // A holder that never renews: its lease (TTL 3 s) is granted and the key
  // put by hand, as a killed owner leaves them.
  auto granted = raw_post(srv, "/v3/lease/grant", R"({"TTL":"3"})");
  std::uint64_t dead_lease = 0;
  REQUIRE(granted.get("ID"));
  REQUIRE(granted.get("ID")->as_u64(dead_lease));
  raw_post(srv, "/v3/kv/put",
           R"({"key":")" + net::base64_encode(key) + R"(","value":")" +
               net::base64_encode("token 0 pid 1") + R"(","lease":")" + std::to_string(dead_lease) +
               R"("})");
  // The claimant's TTL (1 s) is shorter than the wait for the dead claim (~3 s).
  std::unique_ptr<etcd_owner_lease> b;
  const auto t0 = std::chrono::steady_clock::now();
  const auto s =
      etcd_owner_lease::acquire(opt, 2, {std::chrono::seconds(1), std::chrono::seconds(8)}, b);
  REQUIRE_MESSAGE(s.ok(), s.message);
  CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(1500));
  // Two of its TTLs after the claim, it still holds the key.
  std::this_thread::sleep_for(std::chrono::milliseconds(2000));
  const auto held = raw_get(srv, key);
  REQUIRE(held.exists);
  CHECK(held.value.find("token " + b->token()) == 0);
  CHECK(b->check().ok());
}

TEST_CASE("etcd owner lease: a lapsed claim is taken again by hold, unless another process claimed "
          "the id since") {
  auto& srv = shared_server();
  const auto opt = options_for(srv, "lease-hold/");
  const std::string key = "lease-hold/owners/5";
  const auto drop_key = [&] {
    raw_post(srv, "/v3/kv/deleterange", R"({"key":")" + net::base64_encode(key) + R"("})");
  };
  std::unique_ptr<etcd_owner_lease> a, b;
  REQUIRE(etcd_owner_lease::acquire(opt, 5, {std::chrono::seconds(5), {}}, a).ok());
  CHECK(a->hold().ok()); // held: hold is check
  const auto first = a->token();
  // The key gone and nobody else claimed the id: check refuses, hold claims
  // it again under a fresh token, which the key then names.
  drop_key();
  CHECK(a->check().code == errc::conflict);
  REQUIRE_MESSAGE(a->hold().ok(), a->hold().message);
  CHECK(a->token() != first);
  CHECK(dcr::valid_incarnation(a->token()));
  CHECK(a->check().ok());
  CHECK(raw_get(srv, key).value.find("token " + a->token()) == 0);
  // Another process claims the id while the key is gone: hold refuses.
  drop_key();
  REQUIRE(etcd_owner_lease::acquire(opt, 5, {std::chrono::seconds(5), {}}, b).ok());
  auto s = a->hold();
  CHECK(s.code == errc::conflict);
  CHECK(s.message.find(b->token()) != std::string::npos); // names the holder
  // ... and it still refuses once that process has gone again: what it
  // wrote as owner 5 is not this process's to continue.
  const auto other = b->token();
  b.reset();
  CHECK_FALSE(raw_get(srv, key).exists);
  s = a->hold();
  CHECK(s.code == errc::conflict);
  CHECK(s.message.find("claimed by another process (token " + other) != std::string::npos);
  CHECK(a->check().code == errc::conflict);
  // The refused re-claims left the id free for a new process.
  REQUIRE(etcd_owner_lease::acquire(opt, 5, {std::chrono::seconds(5), {}}, b).ok());
  CHECK(b->check().ok());
}

TEST_CASE("etcd owner lease: kept through an etcd stall shorter than its TTL, claimed again by "
          "hold after a longer one") {
  // The partition of test/cluster (a link down for 6 s against a TTL of
  // 10 s) fenced the owner for good: one keepalive sent into the cut link
  // waited 10 s for its answer, and the lease expired meanwhile. Here etcd
  // itself stops answering (SIGSTOP), which looks the same to the client.
  auto& srv = shared_server();
  const auto opt = options_for(srv, "lease-stall/");
  struct resume_on_exit {
    pid_t pid;
    ~resume_on_exit() { ::kill(pid, SIGCONT); }
  } resume{srv.pid()};
  const auto stall = [&](std::chrono::milliseconds d) {
    REQUIRE(::kill(srv.pid(), SIGSTOP) == 0);
    std::this_thread::sleep_for(d);
    REQUIRE(::kill(srv.pid(), SIGCONT) == 0);
  };
  std::unique_ptr<etcd_owner_lease> a;
  REQUIRE(etcd_owner_lease::acquire(opt, 7, {std::chrono::seconds(4), {}}, a).ok());
  const auto first = a->token();
  // 2.5 s of a 4 s TTL: a renewal falls in the stall and is retried after it.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  stall(std::chrono::milliseconds(2500));
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  auto s = a->check();
  CHECK_MESSAGE(s.ok(), s.message);
  CHECK(a->token() == first);
  // Twice the TTL: the claim lapses; hold takes the id again (or finds the
  // lease still alive in etcd, and keeps the token), and it holds after.
  stall(std::chrono::milliseconds(8000));
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  s = a->hold();
  REQUIRE_MESSAGE(s.ok(), s.message);
  CHECK(a->check().ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(5000)); // past a TTL: renewed
  CHECK(a->check().ok());
}
