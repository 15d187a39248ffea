// The fault-injection scenario table (docs/protocol.md): each scenario runs to
// completion and is then checked: the committed version is what every
// receiver serves, every receiver equals a dense refit of the committed
// version byte for byte, and nothing committed is lost.
#include <doctest/doctest.h>

#include <thread>

#include "attempt_faults.hpp"
#include "dcr/protocol/coordinator.hpp"
#include "models.hpp"

using namespace dcr;
using namespace dcr::protocol;
using namespace dcr::test_models;

namespace {

using support::crash_at;

using store_t = faulty_store;
using commits_t = memory_commit_store;

/// A small training side + rollout side over one object store and commit store.
template <class Receiver = model_receiver>
struct rig {
  using endpoint_t = receiver_endpoint<Receiver>;
  // Injects faults where a test asks for them; default-constructed it never fires.
  using coord_t = coordinator<model_owner, Receiver, store_t, commits_t, crash_at>;

  std::vector<tensor_meta> metas = canonical_tensors(small_llama());
  trainer_state trainer = trainer_state::make(metas, 11);
  std::vector<std::unique_ptr<model_owner>> owners;
  transport::memory_object_store objects;
  faulty_store store{objects};
  commits_t commits;
  std::vector<std::unique_ptr<request_gate>> gates;
  std::vector<std::unique_ptr<endpoint_t>> endpoints;
  std::function<std::unique_ptr<Receiver>(std::string)> make_receiver;

  explicit rig(int n_owners = 3, int n_receivers = 3,
               std::function<std::unique_ptr<Receiver>(std::string)> make = nullptr) {
    make_receiver = make ? make : [this](std::string id) {
      if constexpr (std::is_same_v<Receiver, model_receiver>)
        return std::make_unique<model_receiver>(id, metas);
      else
        return std::unique_ptr<Receiver>();
    };
    for (int k = 0; k < n_owners; ++k)
      owners.push_back(std::make_unique<model_owner>(
          static_cast<std::uint32_t>(k), static_cast<std::uint32_t>(n_owners), &trainer));
    for (int r = 0; r < n_receivers; ++r) add_receiver("rank-" + std::to_string(r));
  }

  void add_receiver(const std::string& id) {
    gates.push_back(std::make_unique<request_gate>());
    endpoints.push_back(std::make_unique<endpoint_t>(
        id, [this, id] { return make_receiver(id); },
        [this](Receiver& r) { return dense_refit(r); }, gates.back().get()));
  }

  /// Dense refit from the owners' committed baselines (what a checkpoint of
  /// the committed version holds).
  status dense_refit(Receiver& r) {
    auto& inner = unwrap(r);
    for (std::size_t t = 0; t < metas.size(); ++t) {
      const host_tensor* b = owners[t % owners.size()]->baseline(t);
      DCR_RETURN_ERROR_IF(!b, not_found, "no owner for tensor");
      inner.tensors()[t].bytes = b->bytes;
    }
    return status::success();
  }
  static model_receiver& unwrap(Receiver& r) {
    if constexpr (std::is_same_v<Receiver, model_receiver>)
      return r;
    else
      return r.inner();
  }

  coord_t coord(coordinator_options opt = {}, crash_at faults = {}) {
    std::vector<model_owner*> o;
    for (auto& p : owners) o.push_back(p.get());
    std::vector<endpoint_t*> e;
    for (auto& p : endpoints) e.push_back(p.get());
    opt.attempt_deadline = std::chrono::milliseconds(5000);
    return coord_t(commits, store, o, e, std::move(opt), std::move(faults));
  }

  void start(coord_t& c) {
    REQUIRE(c.take_over().ok());
    REQUIRE(c.bootstrap().ok());
  }

  /// The invariant every scenario ends with.
  void check_consistent(std::uint64_t expect_version, bool caught_up = true) {
    stored_record cur;
    REQUIRE(commits.load(cur).ok());
    CHECK(cur.record.version == expect_version);
    // The record binds the owners' baseline...
    std::vector<digest128> d;
    for (auto& o : owners) d.push_back(o->baseline_digest());
    CHECK(cur.record.source_baseline == combine(d));
    // ...and every receiver equals a dense refit of it, byte for byte, and
    // serves what it acknowledged.
    REQUIRE(cur.record.receivers.size() == endpoints.size());
    for (std::size_t r = 0; r < endpoints.size(); ++r) {
      auto& e = *endpoints[r];
      INFO("receiver " << e.id());
      REQUIRE(e.alive());
      e.with_receiver([&](Receiver& rc) {
        auto& inner = unwrap(rc);
        for (std::size_t t = 0; t < metas.size(); ++t) {
          const auto* b = owners[t % owners.size()]->baseline(t);
          CHECK(inner.tensors()[t].bytes == b->bytes);
        }
        CHECK(cur.record.receivers[r].receiver == e.id());
        CHECK(cur.record.receivers[r].state == rc.state_digest());
      });
    }
    // The committed baseline is the trainer's current state (nothing lost).
    if (caught_up)
      for (std::size_t t = 0; t < metas.size(); ++t)
        CHECK(owners[t % owners.size()]->baseline(t)->bytes == trainer.tensors[t].bytes);
  }
};

} // namespace

TEST_CASE(
    "clean transitions: one mixed attempt each, receivers bit-exact, attempt objects collected") {
  rig<> s;
  auto c = s.coord();
  s.start(c);
  s.check_consistent(0);
  for (std::uint64_t v = 1; v <= 4; ++v) {
    s.trainer.step(0.05, v);
    auto rep = c.transition();
    REQUIRE_MESSAGE(rep.result.ok(), rep.result.message);
    CHECK(rep.committed_version == v);
    REQUIRE(rep.attempts.size() == 1);
    CHECK(rep.attempts[0].mode == refit_mode::mixed);
    CHECK(rep.attempts[0].payloads > 0);
    s.check_consistent(v);
    std::vector<std::string> left;
    REQUIRE(s.objects.list("", left).ok());
    CHECK(left.empty());
  }
  // An unchanged candidate still commits a version (empty delta).
  auto rep = c.transition();
  REQUIRE(rep.result.ok());
  CHECK(rep.attempts[0].payloads == 0);
  s.check_consistent(5);
}

TEST_CASE("a transition before bootstrap is refused") {
  rig<> s;
  auto c = s.coord();
  REQUIRE(c.take_over().ok());
  CHECK(c.transition().result.code == errc::not_found);
}

TEST_CASE("scenario: receiver fails mid-apply (alive, partial writes) -> overwrite retry repairs") {
  rig<> s;
  auto c = s.coord();
  s.start(c);
  s.trainer.step(0.1, 1);
  s.endpoints[1]->with_receiver([](model_receiver& r) { r.fail_after(2); });
  auto rep = c.transition();
  REQUIRE_MESSAGE(rep.result.ok(), rep.result.message);
  REQUIRE(rep.attempts.size() == 2);
  CHECK(rep.attempts[0].result.code == errc::loader_condition);
  CHECK(rep.attempts[1].mode == refit_mode::overwrite_all);
  CHECK(rep.attempts[1].attempt > rep.attempts[0].attempt);
  s.check_consistent(1);
  // The retry does not leak into the next transition's mode.
  s.trainer.step(0.1, 2);
  rep = c.transition();
  REQUIRE(rep.result.ok());
  CHECK(rep.attempts.size() == 1);
  CHECK(rep.attempts[0].mode == refit_mode::mixed);
  s.check_consistent(2);
}

TEST_CASE("scenario: the trainer restarts and trains another candidate after a failed attempt "
          "-> every receiver restored densely, then the retry") {
  // The overwrite retry rewrites the changed set of the candidate it
  // publishes; what a lost attempt of another candidate wrote elsewhere
  // stays unless the receivers are restored first.
  rig<> s;
  auto c = s.coord([] {
    coordinator_options o;
    o.max_attempts = 1;
    return o;
  }());
  s.start(c);
  const trainer_state committed = s.trainer;
  s.trainer.step(0.2, 1);
  s.endpoints[1]->with_receiver([](model_receiver& r) { r.fail_after(2); });
  auto rep = c.transition();
  REQUIRE(rep.result.code == errc::loader_condition);
  // Restarted from the committed weights, it trains step 1 again, differently.
  s.trainer = committed;
  s.trainer.step(0.2, 77);
  rep = c.transition();
  REQUIRE_MESSAGE(rep.result.ok(), rep.result.message);
  REQUIRE(rep.attempts.size() == 1);
  CHECK(rep.attempts[0].mode == refit_mode::overwrite_all);
  CHECK(rep.restore_seconds > 0);
  s.check_consistent(1);
  // The same candidate after a failed attempt is repaired in place.
  s.trainer.step(0.2, 2);
  s.endpoints[2]->with_receiver([](model_receiver& r) { r.fail_after(1); });
  rep = c.transition();
  REQUIRE(!rep.result.ok());
  rep = c.transition();
  REQUIRE_MESSAGE(rep.result.ok(), rep.result.message);
  CHECK(rep.restore_seconds == 0);
  s.check_consistent(2);
}

TEST_CASE("scenario: the candidate changes during an attempt -> the attempt fails, every receiver "
          "is restored, the retry commits the candidate as it is now") {
  rig<> s;
  auto c = s.coord();
  s.start(c);
  s.trainer.step(0.1, 1);
  std::atomic<int> manifests{0};
  // After the last owner's manifest (every owner has read its candidate):
  // the trainer moves on before the attempt ends.
  s.store.after_put = [&](std::string_view name) {
    if (name.find("manifest/") != std::string_view::npos && ++manifests == 3)
      s.trainer.step(0.1, 2);
  };
  auto rep = c.transition();
  s.store.after_put = nullptr;
  REQUIRE_MESSAGE(rep.result.ok(), rep.result.message);
  REQUIRE(rep.attempts.size() == 2);
  CHECK(rep.attempts[0].result.code == errc::verification);
  CHECK(rep.attempts[0].result.message.find("candidate changed") != std::string::npos);
  CHECK(rep.restore_seconds > 0);
  s.check_consistent(1);
}

TEST_CASE("best-effort garbage collection that fails is reported, the commit stands") {
  rig<> s;
  auto c = s.coord();
  s.start(c);
  s.trainer.step(0.1, 1);
  s.store.mode = faulty_store::fault::fail_remove;
  s.store.remaining = 1;
  auto rep = c.transition();
  REQUIRE_MESSAGE(rep.result.ok(), rep.result.message);
  CHECK(rep.committed_version == 1);
  REQUIRE(rep.best_effort.size() == 1);
  const auto& f = rep.best_effort[0];
  CHECK(f.step == best_effort_step::collect_garbage);
  CHECK(f.attempt == rep.attempts.back().attempt);
  CHECK(f.cause.code == errc::io);
  CHECK(f.text().find("collect_garbage, attempt ") == 0);
  CHECK(f.text().find("injected remove failure") != std::string::npos);
  s.check_consistent(1);
  // The next transition collects what was left; nothing fails.
  s.store.mode = faulty_store::fault::none;
  s.trainer.step(0.1, 2);
  rep = c.transition();
  REQUIRE_MESSAGE(rep.result.ok(), rep.result.message);
  CHECK(rep.best_effort.empty());
  s.check_consistent(2);
}

TEST_CASE("scenario: receiver killed mid-refit -> restarted, dense restore of v, joins the retry") {
  rig<> s;
  auto c = s.coord();
  s.start(c);
  s.trainer.step(0.1, 1);
  support::kill_after(*s.endpoints[2], 2);
  const auto restores = s.endpoints[2]->counters().restores;
  auto rep = c.transition();
  REQUIRE_MESSAGE(rep.result.ok(), rep.result.message);
  REQUIRE(rep.attempts.size() == 2);
  CHECK(rep.attempts[0].result.code == errc::aborted);
  CHECK(s.endpoints[2]->counters().restores == restores + 1);
  s.check_consistent(1);
}

TEST_CASE("scenario: receiver dies between transitions -> restored to the committed digest before "
          "the attempt") {
  rig<> s;
  auto c = s.coord();
  s.start(c);
  s.trainer.step(0.1, 1);
  REQUIRE(c.transition().result.ok());
  s.endpoints[0]->kill();
  s.trainer.step(0.1, 2);
  const auto restores = s.endpoints[0]->counters().restores;
  auto rep = c.transition();
  REQUIRE(rep.result.ok());
  CHECK(rep.attempts.size() == 1); // the restore happened before prepare
  CHECK(s.endpoints[0]->counters().restores == restores + 1);
  s.check_consistent(2);
}

TEST_CASE("scenario: a restore that does not reach the committed digest fails the transition") {
  rig<> s;
  auto c = s.coord();
  s.start(c);
  s.endpoints[0]->kill();
  s.trainer.step(0.1, 1);
  s.make_receiver = [&](std::string id) {
    auto r = std::make_unique<model_receiver>(id, s.metas);
    return r;
  };
  // Corrupt the restore source: dense refit from the candidate, not the committed baseline.
  receiver_endpoint<model_receiver> bad(
      "rank-0", [&] { return s.make_receiver("rank-0"); },
      [&](model_receiver& r) {
        for (std::size_t t = 0; t < s.metas.size(); ++t)
          r.tensors()[t].bytes = s.trainer.tensors[t].bytes;
        return status::success();
      });
  coordinator<model_owner, model_receiver, store_t, commits_t> c2(
      s.commits, s.store, {s.owners[0].get(), s.owners[1].get(), s.owners[2].get()}, {&bad});
  REQUIRE(c2.take_over().ok());
  auto rep = c2.transition();
  CHECK(rep.result.code == errc::verification);
}

TEST_CASE("scenario: new receiver joins between attempts (membership change)") {
  rig<> s;
  auto c = s.coord();
  s.start(c);
  s.trainer.step(0.1, 1);
  REQUIRE(c.transition().result.ok());
  s.add_receiver("rank-new");
  auto c2 = s.coord();
  REQUIRE(c2.take_over().ok());
  s.trainer.step(0.1, 2);
  auto rep = c2.transition();
  REQUIRE_MESSAGE(rep.result.ok(), rep.result.message);
  CHECK(s.endpoints.back()->counters().restores == 1);
  s.check_consistent(2);
}

TEST_CASE("scenario: payload dropped in transit -> not_found -> overwrite retry") {
  rig<> s;
  auto c = s.coord();
  s.start(c);
  s.trainer.step(0.1, 1);
  s.store.mode = faulty_store::fault::drop;
  s.store.remaining = 1;
  auto rep = c.transition();
  REQUIRE_MESSAGE(rep.result.ok(), rep.result.message);
  REQUIRE(rep.attempts.size() == 2);
  CHECK(rep.attempts[0].result.code == errc::not_found);
  CHECK(rep.attempts[1].mode == refit_mode::overwrite_all);
  s.check_consistent(1);
}

TEST_CASE("scenario: payload corrupted (digest) -> rejected before apply -> retry") {
  rig<> s;
  auto c = s.coord();
  s.start(c);
  s.trainer.step(0.1, 1);
  s.store.mode = faulty_store::fault::corrupt;
  s.store.remaining = 1;
  auto rep = c.transition();
  REQUIRE_MESSAGE(rep.result.ok(), rep.result.message);
  REQUIRE(rep.attempts.size() == 2);
  CHECK(rep.attempts[0].result.code == errc::digest_mismatch);
  s.check_consistent(1);
}

TEST_CASE("scenario: payload truncated -> typed rejection -> retry") {
  rig<> s;
  auto c = s.coord();
  s.start(c);
  s.trainer.step(0.1, 1);
  s.store.mode = faulty_store::fault::truncate;
  s.store.remaining = 1;
  auto rep = c.transition();
  REQUIRE_MESSAGE(rep.result.ok(), rep.result.message);
  REQUIRE(rep.attempts.size() == 2);
  // The reader checks each payload against its manifest entry before any
  // receiver sees it, so the short copy is refused there, typed.
  CHECK(rep.attempts[0].result.code == errc::digest_mismatch);
  s.check_consistent(1);
}

TEST_CASE("scenario: payloads reordered -> same result in one attempt") {
  rig<> s(2, 2);
  auto c = s.coord();
  s.start(c);
  s.store.mode = faulty_store::fault::reverse_list;
  for (std::uint64_t v = 1; v <= 2; ++v) {
    s.trainer.step(0.2, v);
    auto rep = c.transition();
    REQUIRE_MESSAGE(rep.result.ok(), rep.result.message);
    CHECK(rep.attempts.size() == 1);
    CHECK(rep.attempts[0].payloads >= 4);
    s.check_consistent(v);
  }
}

TEST_CASE("scenario: payloads duplicated -> suppressed (XOR applied once) in one attempt") {
  rig<duplicating_receiver> s(3, 2, [&](std::string id) {
    return std::make_unique<duplicating_receiver>(
        std::make_unique<model_receiver>(id, canonical_tensors(small_llama())));
  });
  auto c = s.coord();
  s.start(c);
  s.trainer.step(0.1, 1);
  auto rep = c.transition();
  REQUIRE_MESSAGE(rep.result.ok(), rep.result.message);
  CHECK(rep.attempts.size() == 1);
  CHECK(rep.attempts[0].mode == refit_mode::mixed);
  s.endpoints[0]->with_receiver(
      [&](duplicating_receiver& r) { CHECK(r.duplicates == int(rep.attempts[0].payloads)); });
  s.check_consistent(1);
}

TEST_CASE("endpoint: duplicates (same object, or same payload id) and stale attempts are ignored") {
  rig<> s(1, 1);
  auto c = s.coord();
  s.start(c);
  auto& e = *s.endpoints[0];
  const std::uint64_t tau = 1000;
  REQUIRE(e.begin(tau));
  CHECK_FALSE(e.begin(tau - 1)); // a replaced attempt's control call
  item it;
  it.tensor = s.metas[1];
  it.encoding = value_encoding::xor_mask;
  it.indices = {0, 5};
  it.values = {std::byte{1}, std::byte{0}, std::byte{0}, std::byte{0x80}};
  const std::vector<item> items{it};
  auto p = encode_payload({tau, 1, 0, 0}, items);
  auto before = e.with_receiver([](model_receiver& r) { return r.tensors()[1].bytes; });
  REQUIRE(e.deliver(tau, "attempt/a/payload/one", p, true).ok());
  REQUIRE(e.deliver(tau, "attempt/a/payload/one", p, true).ok());  // same object again
  REQUIRE(e.deliver(tau, "attempt/a/payload/copy", p, true).ok()); // same payload id, other name
  auto stale = encode_payload({tau - 1, 1, 0, 1}, items);
  REQUIRE(
      e.deliver(tau, "attempt/a/payload/stale", stale, true).ok()); // payload of a replaced attempt
  REQUIRE(e.deliver(tau - 1, "attempt/b/payload/late", p, true)
              .ok()); // late delivery of a replaced attempt
  auto after = e.with_receiver([](model_receiver& r) { return r.tensors()[1].bytes; });
  before[0] ^= std::byte{1};
  before[11] ^= std::byte{0x80};
  CHECK(after == before); // XOR applied exactly once
  const auto k = e.counters();
  CHECK(k.staged == 1);
  CHECK(k.duplicates == 2);
  CHECK(k.stale == 2);
  // Invalid payloads are typed failures, not ignored.
  auto bad = p;
  bad.back() ^= std::byte{1};
  CHECK(e.deliver(tau, "attempt/a/payload/bad", bad, true).code == errc::digest_mismatch);
  CHECK(e.apply(tau - 1).code == errc::stale_attempt);
  digest128 d{};
  CHECK(e.finish(tau - 1, d).code == errc::stale_attempt);
  e.kill();
  CHECK(e.deliver(tau, "attempt/a/payload/two", p, true).code == errc::aborted);
  CHECK(e.finish(tau, d).code == errc::aborted);
}

TEST_CASE("scenario: a stale attempt's payload appears under the current attempt -> unlisted, "
          "attempt fails, retry commits") {
  rig<> s;
  auto c = s.coord();
  s.start(c);
  s.trainer.step(0.1, 1);
  s.store.mode = faulty_store::fault::inject_stale;
  s.endpoints[0]->with_receiver(
      [](model_receiver& r) { r.fail_after(1); }); // attempt 1 fails, leaves payloads
  s.store.remaining = 1;
  auto rep = c.transition();
  REQUIRE_MESSAGE(rep.result.ok(), rep.result.message);
  REQUIRE(rep.attempts.size() == 3);
  CHECK(rep.attempts[1].result.code == errc::verification); // no manifest lists it
  std::uint64_t stale = 0;
  for (auto& e : s.endpoints) stale += e->counters().stale;
  CHECK(stale == 0); // no manifest binds it: no receiver was ever handed its bytes
  s.check_consistent(1);
}

TEST_CASE("unlisted payload: a copy with another sequence number fails the attempt; the retry "
          "commits bit-exact (memory)") {
  for (auto mode : {rl_mode::synchronous, rl_mode::asynchronous}) {
    CAPTURE(int(mode));
    transport::memory_object_store objects;
    memory_commit_store commits;
    check_unlisted_copy(objects, commits, mode);
  }
}

TEST_CASE("unlisted payload: same on the filesystem object store with the file commit store") {
  char tmpl[] = "/tmp/dcr-unlisted-XXXXXX";
  const std::filesystem::path dir = ::mkdtemp(tmpl);
  {
    transport::fs_object_store objects(dir / "objects");
    file_commit_store commits(dir / "control");
    check_unlisted_copy(objects, commits, rl_mode::synchronous);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE(
    "scenario: coordinator dies after prepare -> successor fences it and commits with overwrite") {
  rig<> s;
  auto c1 = s.coord({}, crash_at(crash_point::after_prepare));
  s.start(c1);
  s.trainer.step(0.1, 1);
  auto r1 = c1.transition();
  CHECK(r1.result.code == errc::aborted);
  CHECK(c1.dead());
  s.check_consistent(0, false); // v stays committed; nothing was streamed
  auto c2 = s.coord();
  REQUIRE(c2.take_over().ok());
  auto r2 = c2.transition();
  REQUIRE_MESSAGE(r2.result.ok(), r2.result.message);
  REQUIRE(r2.attempts.size() == 1);
  CHECK(r2.attempts[0].mode ==
        refit_mode::overwrite_all); // an attempt was prepared since the commit
  s.check_consistent(1);
}

TEST_CASE("scenario: coordinator dies after some ACKs -> successor repairs every receiver") {
  rig<> s;
  auto c1 = s.coord({}, crash_at(crash_point::after_first_ack));
  s.start(c1);
  s.trainer.step(0.1, 1);
  auto r1 = c1.transition();
  CHECK(r1.result.code == errc::aborted);
  stored_record cur;
  REQUIRE(s.commits.load(cur).ok());
  CHECK(cur.record.version == 0);                    // v stays committed...
  for (auto& g : s.gates) CHECK_FALSE(g->is_open()); // ...and partial weights are not served
  auto c2 = s.coord();
  REQUIRE(c2.take_over().ok());
  auto r2 = c2.transition();
  REQUIRE_MESSAGE(r2.result.ok(), r2.result.message);
  CHECK(r2.attempts[0].mode == refit_mode::overwrite_all);
  s.check_consistent(1);
}

TEST_CASE("scenario: coordinator dies after commit, before the baseline update -> successor rolls "
          "forward") {
  rig<> s;
  auto c1 = s.coord({}, crash_at(crash_point::after_commit));
  s.start(c1);
  s.trainer.step(0.1, 1);
  auto r1 = c1.transition();
  CHECK(r1.result.code == errc::aborted);
  stored_record cur;
  REQUIRE(s.commits.load(cur).ok());
  CHECK(cur.record.version == 1); // committed; nothing may lose it
  auto c2 = s.coord();
  REQUIRE(c2.take_over().ok());
  auto r2 = c2.transition();
  REQUIRE_MESSAGE(r2.result.ok(), r2.result.message);
  CHECK(r2.rolled_forward);
  CHECK(r2.attempts.empty());
  s.check_consistent(1);
  // The dead coordinator cannot act; a fenced live one gets conflict.
  CHECK(c1.transition().result.code == errc::aborted);
  s.trainer.step(0.1, 2);
  auto c3 = s.coord();
  REQUIRE(c3.take_over().ok());
  CHECK(c2.transition().result.code == errc::conflict);
  auto r3 = c3.transition();
  REQUIRE(r3.result.ok());
  s.check_consistent(2);
}

TEST_CASE(
    "scenario: two coordinators race -> the replaced one gets conflict, one version commits") {
  for (int round = 0; round < 4; ++round) {
    CAPTURE(round);
    rig<> s;
    auto setup = s.coord();
    s.start(setup);
    s.trainer.step(0.1, 1);
    std::atomic<bool> a_streaming{false};
    std::atomic<bool> b_done{false};
    // A pauses after its first ACK until B has finished, so B's attempt
    // replaces A's while A is mid-transition.
    auto a = s.coord({}, crash_at([&](crash_point p) {
                       if (p == crash_point::after_first_ack) {
                         a_streaming = true;
                         for (int i = 0; i < 5000 && !b_done; ++i)
                           std::this_thread::sleep_for(std::chrono::milliseconds(1));
                       }
                       return false;
                     }));
    auto b = s.coord();
    REQUIRE(a.take_over().ok());
    transition_report ra, rb;
    std::thread ta([&] { ra = a.transition(); });
    std::thread tb([&] {
      for (int i = 0; i < 5000 && !a_streaming; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (round % 2) std::this_thread::sleep_for(std::chrono::milliseconds(round));
      REQUIRE(b.take_over().ok());
      rb = b.transition();
      b_done = true;
    });
    ta.join();
    tb.join();
    REQUIRE_MESSAGE(rb.result.ok(), rb.result.message);
    CHECK(ra.result.code == errc::conflict);
    s.check_consistent(1);
  }
}

namespace {

/// Version 1 committed by a coordinator that died right after the commit:
/// no owner's baseline moved. Returns the record.
stored_record committed_before_baseline_update(rig<>& s) {
  auto c1 = s.coord({}, crash_at(crash_point::after_commit));
  s.start(c1);
  s.trainer.step(0.1, 1);
  CHECK(c1.transition().result.code == errc::aborted);
  stored_record cur;
  REQUIRE(s.commits.load(cur).ok());
  REQUIRE(cur.record.version == 1);
  return cur;
}

/// A new candidate for one owner only: its own tensors change.
void train_owner(rig<>& s, std::size_t owner) {
  for (std::size_t t = owner; t < s.trainer.tensors.size(); t += s.owners.size())
    s.trainer.tensors[t].bytes[0] ^= std::byte{0x5A};
}

} // namespace

TEST_CASE("scenario: a baseline update cut short after the commit (some owners moved, one of "
          "them already on its next candidate) -> the successor moves only the owners behind") {
  rig<> s;
  const stored_record cur = committed_before_baseline_update(s);
  // Owner 0 got its update before the link went down and trained on: its
  // candidate is no longer version 1.
  s.owners[0]->commit_baseline();
  const digest128 owner0_at_1 = s.owners[0]->baseline_digest();
  train_owner(s, 0);
  REQUIRE(s.owners[0]->candidate_digest() != owner0_at_1);
  auto combined_baseline = [&] {
    std::vector<digest128> d;
    for (auto& o : s.owners) d.push_back(o->baseline_digest());
    return combine(d);
  };
  REQUIRE(combined_baseline() != cur.record.source_baseline);
  auto c2 = s.coord();
  REQUIRE(c2.take_over().ok());
  auto r2 = c2.transition();
  REQUIRE_MESSAGE(r2.result.ok(), r2.result.message);
  CHECK(r2.rolled_forward);
  // Owners 1 and 2 moved to version 1; owner 0 was not moved onto its next candidate.
  CHECK(s.owners[0]->baseline_digest() == owner0_at_1);
  CHECK(combined_baseline() == cur.record.source_baseline);
  // The next version from there is a normal transition, every receiver
  // equal to a dense load of it.
  train_owner(s, 1);
  train_owner(s, 2);
  auto r3 = c2.transition();
  REQUIRE_MESSAGE(r3.result.ok(), r3.result.message);
  CHECK_FALSE(r3.rolled_forward);
  s.check_consistent(2);
}

TEST_CASE("scenario: owners that match no mix of baseline and candidate -> verification, no owner "
          "moved") {
  rig<> s;
  committed_before_baseline_update(s);
  // Owners 0 and 1 both hold candidates that are not version 1, none moved.
  train_owner(s, 0);
  train_owner(s, 1);
  std::vector<digest128> before;
  for (auto& o : s.owners) before.push_back(o->baseline_digest());
  auto c2 = s.coord();
  REQUIRE(c2.take_over().ok());
  auto r2 = c2.transition();
  CHECK(r2.result.code == errc::verification);
  for (std::size_t k = 0; k < s.owners.size(); ++k)
    CHECK(s.owners[k]->baseline_digest() == before[k]);
}

TEST_CASE("scenario: a persistent fault exhausts the attempts; v stays committed; a later "
          "transition repairs") {
  rig<> s;
  auto c = s.coord([] {
    coordinator_options o;
    o.max_attempts = 2;
    return o;
  }());
  s.start(c);
  s.trainer.step(0.1, 1);
  s.store.mode = faulty_store::fault::corrupt;
  s.store.remaining = 1000;
  auto rep = c.transition();
  CHECK(rep.result.code == errc::digest_mismatch);
  CHECK(rep.attempts.size() == 2);
  CHECK(rep.result.message.find("operator intervention") != std::string::npos);
  stored_record cur;
  REQUIRE(s.commits.load(cur).ok());
  CHECK(cur.record.version == 0);
  CHECK_FALSE(s.gates[0]->is_open()); // partial weights are never served
  s.store.remaining = 0;
  rep = c.transition();
  REQUIRE_MESSAGE(rep.result.ok(), rep.result.message);
  CHECK(rep.attempts[0].mode == refit_mode::overwrite_all);
  CHECK(s.gates[0]->is_open());
  s.check_consistent(1);
}

namespace {
/// Serve requests on every receiver while transitions run; each request reads
/// the complete storage under a gate ticket. Returns the digests it saw.
template <class Sys>
struct request_load {
  Sys& s;
  std::atomic<bool> stop{false};
  std::mutex m;
  std::vector<digest128> seen;
  std::atomic<int> served{0};
  std::vector<std::thread> ts;
  explicit request_load(Sys& sys) : s(sys) {
    for (std::size_t r = 0; r < s.endpoints.size(); ++r)
      ts.emplace_back([this, r] {
        while (!stop) {
          auto t = s.gates[r]->admit();
          if (stop) break;
          auto d =
              s.endpoints[r]->with_receiver([](model_receiver& rc) { return rc.state_digest(); });
          std::this_thread::sleep_for(std::chrono::microseconds(200));
          {
            std::lock_guard l(m);
            seen.push_back(d);
          }
          ++served;
        }
      });
  }
  void finish() {
    stop = true;
    for (auto& g : s.gates) g->open(~0ull); // release admit() waiters at the end
    for (auto& t : ts) t.join();
  }
};
} // namespace

TEST_CASE("request gate: requests only ever see a committed version (sync and async RL)") {
  for (auto mode : {rl_mode::synchronous, rl_mode::asynchronous}) {
    CAPTURE(int(mode));
    rig<> s;
    auto c = s.coord([&] {
      coordinator_options o;
      o.mode = mode;
      return o;
    }());
    s.start(c);
    std::set<digest128> committed;
    auto note_committed = [&] {
      stored_record cur;
      REQUIRE(s.commits.load(cur).ok());
      for (auto& a : cur.record.receivers) committed.insert(a.state);
    };
    note_committed();
    request_load load(s);
    for (std::uint64_t v = 1; v <= 3; ++v) {
      s.trainer.step(0.2, v);
      if (v == 2) s.endpoints[1]->with_receiver([](model_receiver& r) { r.fail_after(3); });
      auto rep = c.transition();
      REQUIRE_MESSAGE(rep.result.ok(), rep.result.message);
      note_committed();
    }
    while (load.served < 20) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    load.finish();
    std::size_t mixed = 0;
    for (auto& d : load.seen) mixed += !committed.count(d);
    CHECK(mixed == 0);
    CHECK(load.seen.size() >= 20);
    s.check_consistent(3);
  }
}

TEST_CASE(
    "request gate: close waits for in-flight requests; replaced attempts' operations are ignored") {
  request_gate g;
  auto t = g.admit();
  std::atomic<bool> closed{false};
  std::thread closer([&] {
    CHECK(g.close(5));
    closed = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK_FALSE(closed); // a request is still in flight
  CHECK_FALSE(g.try_admit());
  t = {};
  closer.join();
  CHECK(closed);
  CHECK(g.in_flight() == 0);
  CHECK_FALSE(g.open(4)); // replaced attempt
  CHECK_FALSE(g.is_open());
  CHECK(g.open(5));
  CHECK(g.is_open());
  CHECK_FALSE(g.close(3));
  CHECK(g.is_open());
  CHECK(g.try_admit());
}

TEST_CASE("file-backed run: filesystem object store + file commit store, crash and successor") {
  char tmpl[] = "/tmp/dcr-proto-XXXXXX";
  const std::filesystem::path dir = ::mkdtemp(tmpl);
  {
    auto metas = canonical_tensors(tiny_qwen3_moe());
    auto trainer = trainer_state::make(metas, 5);
    std::vector<std::unique_ptr<model_owner>> owners;
    std::vector<model_owner*> op;
    for (std::uint32_t k = 0; k < 4; ++k) {
      owners.push_back(std::make_unique<model_owner>(k, 4, &trainer, 8));
      op.push_back(owners.back().get());
    }
    transport::fs_object_store objects(dir / "objects");
    file_commit_store commits(dir / "control");
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
    using C = coordinator<model_owner, model_receiver, transport::fs_object_store,
                          file_commit_store, crash_at>;
    C c1(commits, objects, op, ep, {}, crash_at(crash_point::after_first_ack));
    REQUIRE(c1.take_over().ok());
    REQUIRE(c1.bootstrap().ok());
    trainer.step(0.05, 1);
    CHECK(c1.transition().result.code == errc::aborted);
    file_commit_store reopened(dir / "control"); // the successor reads the durable record
    C c2(reopened, objects, op, ep);
    REQUIRE(c2.take_over().ok());
    auto rep = c2.transition();
    REQUIRE_MESSAGE(rep.result.ok(), rep.result.message);
    CHECK(rep.collected_objects > 0);
    stored_record cur;
    REQUIRE(reopened.load(cur).ok());
    CHECK(cur.record.version == 1);
    for (auto* e : ep)
      e->with_receiver([&](model_receiver& r) {
        for (std::size_t t = 0; t < metas.size(); ++t)
          CHECK(r.tensors()[t].bytes == trainer.tensors[t].bytes);
      });
    std::vector<std::string> left;
    REQUIRE(objects.list("", left).ok());
    CHECK(left.empty());
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("lost commit record next to attempt objects: bootstrap refuses, typed; after cleanup a "
          "new history commits (memory)") {
  transport::memory_object_store objects;
  check_lost_record<transport::memory_object_store, memory_commit_store>(
      objects, [] { return std::make_unique<memory_commit_store>(); });
}

TEST_CASE("lost commit record next to attempt objects: same with the fs object store and a deleted "
          "commit file") {
  char tmpl[] = "/tmp/dcr-lost-XXXXXX";
  const std::filesystem::path dir = ::mkdtemp(tmpl);
  {
    transport::fs_object_store objects(dir / "objects");
    check_lost_record<transport::fs_object_store, file_commit_store>(objects, [&] {
      std::filesystem::remove(dir / "control" / "commit");
      return std::make_unique<file_commit_store>(dir / "control");
    });
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("attempt objects are bound to the incarnation: another history's objects are never "
          "listed or read") {
  transport::memory_object_store raw;
  const std::string a(32, 'a'), b(32, 'b');
  transport::incarnation_scope<transport::memory_object_store> sa(raw, a), sb(raw, b);
  CHECK_THROWS_AS((transport::incarnation_scope<transport::memory_object_store>(raw, "xyz")),
                  error);
  std::vector<std::byte> p1(40, std::byte{1}), p2(40, std::byte{2});
  {
    transport::attempt_writer w(sa, 5, 0);
    REQUIRE(w.put_payload(p1).ok());
    REQUIRE(w.finish().ok());
  }
  std::vector<std::string> names;
  REQUIRE(sb.list("attempt/", names).ok());
  CHECK(names.empty()); // b's attempt 5 does not see a's
  REQUIRE(sa.list("attempt/", names).ok());
  CHECK(names.size() == 3); // the payload, its index object, the manifest
  // a's manifest copied under b's prefix: refused as another incarnation's.
  std::vector<std::byte> m;
  REQUIRE(sa.get(transport::manifest_name(5, 0), m).ok());
  REQUIRE(sb.put(transport::payload_name(5, 0, 0), p1).ok());
  REQUIRE(sb.put(transport::manifest_name(5, 0), m).ok());
  std::atomic<bool> stop{false};
  transport::attempt_reader<decltype(sb)> reader(sb, 5, {0});
  auto st =
      reader.run([](std::string_view, std::span<const std::byte>) { return status::success(); },
                 stop, std::chrono::steady_clock::now() + std::chrono::seconds(5));
  CHECK(st.code == errc::foreign_incarnation);
  // Garbage collection of one history leaves the other's objects alone.
  REQUIRE(transport::collect_attempts(sa, 5).ok());
  REQUIRE(sa.list("", names).ok());
  CHECK(names.empty());
  REQUIRE(sb.list("", names).ok());
  CHECK(names.size() == 2);
}

TEST_CASE("a commit record replaced by an older one hands out attempt ids again: their objects are "
          "never read") {
  char tmpl[] = "/tmp/dcr-rollback-XXXXXX";
  const std::filesystem::path dir = ::mkdtemp(tmpl);
  {
    auto metas = canonical_tensors(small_llama());
    auto trainer = trainer_state::make(metas, 41);
    std::vector<std::unique_ptr<model_owner>> owners;
    std::vector<model_owner*> op;
    for (std::uint32_t k = 0; k < 2; ++k) {
      owners.push_back(std::make_unique<model_owner>(k, 2, &trainer));
      op.push_back(owners.back().get());
    }
    transport::fs_object_store objects(dir / "objects");
    file_commit_store commits(dir / "control");
    auto dense = [&](model_receiver& r) {
      for (std::size_t t = 0; t < metas.size(); ++t)
        r.tensors()[t].bytes = owners[t % 2]->baseline(t)->bytes;
      return status::success();
    };
    std::vector<std::unique_ptr<receiver_endpoint<model_receiver>>> eps;
    std::vector<receiver_endpoint<model_receiver>*> ep;
    for (int r = 0; r < 2; ++r) {
      auto id = "rank-" + std::to_string(r);
      eps.push_back(std::make_unique<receiver_endpoint<model_receiver>>(
          id, [&, id] { return std::make_unique<model_receiver>(id, metas); }, dense));
      ep.push_back(eps.back().get());
    }
    using C = coordinator<model_owner, model_receiver, transport::fs_object_store,
                          file_commit_store, crash_at>;
    C c1(commits, objects, op, ep, {}, crash_at(crash_point::after_first_ack));
    C c0(commits, objects, op, ep);
    REQUIRE(c0.take_over().ok());
    REQUIRE(c0.bootstrap().ok());
    trainer.step(0.1, 1);
    REQUIRE(c0.transition().result.ok());
    const auto saved = dir / "commit.saved";
    std::filesystem::copy_file(dir / "control" / "commit", saved);
    trainer.step(0.1, 2);
    REQUIRE(c1.take_over().ok());
    CHECK(c1.transition().result.code == errc::aborted); // its objects stay
    // The record (with its attempt counter) is put back to the saved one,
    // and the candidate moves on: the old attempt's objects are now wrong.
    std::filesystem::copy_file(saved, dir / "control" / "commit",
                               std::filesystem::copy_options::overwrite_existing);
    trainer.step(0.1, 3);
    for (auto* e : ep) e->kill(); // restarted receivers: no in-memory fence helps
    C c2(commits, objects, op, ep);
    REQUIRE(c2.take_over().ok());
    auto rep = c2.transition();
    REQUIRE_MESSAGE(rep.result.ok(), rep.result.message);
    stored_record cur;
    REQUIRE(commits.load(cur).ok());
    CHECK(cur.record.version == 2);
    for (std::size_t r = 0; r < ep.size(); ++r)
      ep[r]->with_receiver([&](model_receiver& rc) {
        for (std::size_t t = 0; t < metas.size(); ++t)
          CHECK(rc.tensors()[t].bytes == trainer.tensors[t].bytes);
        CHECK(cur.record.receivers[r].state == rc.state_digest());
      });
    REQUIRE(rep.attempts.size() == 2);
    CHECK(rep.attempts[0].result.code == errc::stale_attempt); // τ reused: refused, nothing read
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("a foreign payload that changes elements outside the changed set: the receiver is "
          "restored densely, never committed") {
  // Owner 0's first payload is replaced, as published, by another valid
  // payload with the same attempt, owner and sequence (what another
  // history's object looks like): it XORs element 0 of tensor 0, which this
  // candidate does not change, so the overwrite retry alone cannot repair it.
  struct replacing_store {
    transport::memory_object_store* s;
    std::vector<tensor_meta> metas;
    std::atomic<bool> armed{true};
    status put(std::string_view name, std::span<const std::byte> b) {
      if (name.ends_with("/payload/o0000000000-s0000000000") && armed.exchange(false)) {
        payload_id pid;
        DCR_TRY(read_payload_id(b, pid));
        item it;
        it.tensor = metas[0];
        it.encoding = value_encoding::xor_mask;
        it.indices = {0};
        it.values.assign(width_of(metas[0].dtype), std::byte{0x40});
        const std::vector<item> items{it};
        return s->put(name, encode_payload(pid, items));
      }
      return s->put(name, b);
    }
    status get(std::string_view n, std::vector<std::byte>& out) { return s->get(n, out); }
    status list(std::string_view p, std::vector<std::string>& names) { return s->list(p, names); }
    status remove(std::string_view n) { return s->remove(n); }
  };
  auto metas = canonical_tensors(small_llama());
  auto trainer = trainer_state::make(metas, 51);
  auto before = trainer.tensors[0].bytes;
  std::vector<std::unique_ptr<model_owner>> owners;
  std::vector<model_owner*> op;
  for (std::uint32_t k = 0; k < 2; ++k) {
    owners.push_back(std::make_unique<model_owner>(k, 2, &trainer));
    op.push_back(owners.back().get());
  }
  transport::memory_object_store objects;
  replacing_store store{&objects, metas};
  memory_commit_store commits;
  auto dense = [&](model_receiver& r) {
    for (std::size_t t = 0; t < metas.size(); ++t)
      r.tensors()[t].bytes = owners[t % 2]->baseline(t)->bytes;
    return status::success();
  };
  std::vector<std::unique_ptr<receiver_endpoint<model_receiver>>> eps;
  std::vector<receiver_endpoint<model_receiver>*> ep;
  for (int r = 0; r < 2; ++r) {
    auto id = "rank-" + std::to_string(r);
    eps.push_back(std::make_unique<receiver_endpoint<model_receiver>>(
        id, [&, id] { return std::make_unique<model_receiver>(id, metas); }, dense));
    ep.push_back(eps.back().get());
  }
  coordinator<model_owner, model_receiver, replacing_store, memory_commit_store> c(commits, store,
                                                                                   op, ep);
  REQUIRE(c.take_over().ok());
  REQUIRE(c.bootstrap().ok());
  trainer.step(0.1, 1);
  for (std::size_t b = 0; b < width_of(metas[0].dtype);
       ++b) // element 0 of tensor 0 stays unchanged
    trainer.tensors[0].bytes[b] = before[b];
  auto rep = c.transition();
  REQUIRE_MESSAGE(rep.result.ok(), rep.result.message);
  stored_record cur;
  REQUIRE(commits.load(cur).ok());
  CHECK(cur.record.version == 1);
  std::uint64_t restores = 0;
  for (std::size_t r = 0; r < ep.size(); ++r) {
    ep[r]->with_receiver([&](model_receiver& rc) {
      for (std::size_t t = 0; t < metas.size(); ++t)
        CHECK(rc.tensors()[t].bytes == trainer.tensors[t].bytes);
      CHECK(cur.record.receivers[r].state == rc.state_digest());
    });
    restores += ep[r]->counters().restores;
  }
  REQUIRE(rep.attempts.size() == 2);
  CHECK(rep.attempts[0].result.code == errc::digest_mismatch);
  CHECK(restores >= 1); // whoever staged it was restored densely
}

namespace {

std::string_view text_of(const std::vector<std::byte>& b) {
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

/// Step the trainer, keeping element 0 of tensor `t` as committed: an
/// element outside the changed set, which the overwrite retry never rewrites.
void step_keeping_element(rig<>& s, std::size_t t, std::uint64_t seed) {
  const auto before = s.trainer.tensors[t].bytes;
  s.trainer.step(0.1, seed);
  for (std::size_t b = 0; b < width_of(s.metas[t].dtype); ++b)
    s.trainer.tensors[t].bytes[b] = before[b];
}

std::uint64_t restores(rig<>& s) {
  std::uint64_t n = 0;
  for (auto& e : s.endpoints) n += e->counters().restores;
  return n;
}

/// A bucket writer racing owner `victim` (unkeyed store) in the first
/// attempt after `install`: as the owner's manifest is put, it plants a
/// valid payload under the owner's name (sequence 99) that XORs element 0
/// of tensor `t` (see `step_keeping_element`), then the owner's manifest
/// lands re-written to list that payload too, so every reader applies it.
/// `fail_put`: the owner's own put fails instead, after the re-written
/// manifest landed in its place and every receiver staged the planted
/// payload (an owner that reports no publish, whose name a manifest holds).
/// `after_reads(name)` runs once every reader read the manifest twice
/// (its first read and the check before it completes).
struct manifest_forger {
  std::uint32_t victim = 1;
  std::size_t tensor = 1;
  bool fail_put = false;
  std::function<void(const std::string&)> after_reads;
  std::mutex m;
  std::string name; ///< scoped manifest name, once forged
  std::atomic<bool> armed{true};
  std::atomic<int> reads{0};

  void install(rig<>& s) {
    s.store.before_put = [this, &s](std::string_view put, std::vector<std::byte>& bytes) {
      return forge(s, put, bytes);
    };
    s.store.after_get = [this, &s](std::string_view got) {
      {
        std::lock_guard l(m);
        if (name.empty() || got != name) return;
      }
      if (++reads == 2 * static_cast<int>(s.endpoints.size()) && after_reads) after_reads(name);
    };
  }
  status forge(rig<>& s, std::string_view put, std::vector<std::byte>& bytes) {
    if (!put.ends_with("/manifest/o" + transport::detail::pad(victim, 10)) ||
        !armed.exchange(false))
      return status::success();
    transport::manifest mf;
    DCR_TRY(transport::parse_manifest(text_of(bytes), mf));
    const auto scope = std::string(put.substr(0, put.find("attempt/")));
    const auto p = xor_element0(s.metas[tensor], mf.attempt, victim, 99);
    const auto pname = transport::payload_name(mf.attempt, victim, 99);
    DCR_TRY(s.store.inner().put(scope + pname, p));
    mf.payloads.push_back({pname, p.size(), digest(p), std::nullopt});
    const auto text = transport::serialize_manifest(mf);
    bytes.assign(reinterpret_cast<const std::byte*>(text.data()),
                 reinterpret_cast<const std::byte*>(text.data() + text.size()));
    {
      std::lock_guard l(m);
      name = std::string(put);
    }
    if (!fail_put) return status::success();
    DCR_TRY(s.store.inner().put(put, bytes));
    // Bounded, so that a reader that never looks cannot hang the test.
    for (int i = 0; i < 5000; ++i) {
      bool all = true;
      for (auto& e : s.endpoints) {
        bool got = false;
        for (auto& [n, d] : e->staged_payloads(mf.attempt)) got = got || n == pname;
        all = all && got;
      }
      if (all) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return fail(errc::io, "injected: the owner's manifest put failed");
  }
};

/// The common end of the forged-manifest scenarios: the first attempt fails
/// typed, every receiver that applied the planted payload was restored
/// densely, and the retry committed bit-exact.
void check_repaired(rig<>& s, const transition_report& rep, std::uint64_t restores_before,
                    errc first) {
  s.store.before_put = nullptr;
  s.store.after_get = nullptr;
  REQUIRE_MESSAGE(rep.result.ok(), rep.result.message);
  REQUIRE(rep.attempts.size() == 2);
  INFO(rep.attempts[0].result.message);
  CHECK(rep.attempts[0].result.code == first);
  CHECK(rep.attempts[1].mode == refit_mode::overwrite_all);
  CHECK(restores(s) - restores_before == s.endpoints.size()); // every receiver applied it
  s.check_consistent(1);
}

} // namespace

TEST_CASE("scenario: a payload planted under an owner's name and its manifest re-written to list "
          "it -> the repair trusts only the manifest the owner reported, every receiver that "
          "applied it is restored densely, the retry commits bit-exact") {
  rig<> s;
  auto c = s.coord();
  s.start(c);
  step_keeping_element(s, 1, 1);
  manifest_forger f;
  f.install(s);
  const auto before = restores(s);
  auto rep = c.transition();
  check_repaired(s, rep, before, errc::verification);
  CHECK(rep.attempts[0].result.message.find("owner 1: node of") != std::string::npos);
}

TEST_CASE("scenario: the re-written manifest deleted after the readers' second read -> the owner "
          "still counts as published, every receiver that applied the planted payload is "
          "restored densely, the retry commits bit-exact") {
  rig<> s;
  auto c = s.coord();
  s.start(c);
  step_keeping_element(s, 1, 1);
  manifest_forger f;
  f.after_reads = [&](const std::string& name) { REQUIRE(s.store.inner().remove(name).ok()); };
  f.install(s);
  const auto before = restores(s);
  auto rep = c.transition();
  CHECK(f.reads >= int(2 * s.endpoints.size()));
  check_repaired(s, rep, before, errc::verification);
}

TEST_CASE("scenario: the re-written manifest garbled after the readers' second read -> same: "
          "restored densely, the retry commits bit-exact") {
  rig<> s;
  auto c = s.coord();
  s.start(c);
  step_keeping_element(s, 1, 1);
  manifest_forger f;
  f.after_reads = [&](const std::string& name) {
    const std::string junk = "dcr-manifest 3\nnot a manifest\n";
    REQUIRE(s.store.inner().put(name, std::as_bytes(std::span(junk))).ok());
  };
  f.install(s);
  const auto before = restores(s);
  auto rep = c.transition();
  CHECK(f.reads >= int(2 * s.endpoints.size()));
  check_repaired(s, rep, before, errc::verification);
}

TEST_CASE("scenario: a manifest under the name of an owner whose publish failed -> a forgery: "
          "every receiver that staged a payload of that owner is restored densely, the retry "
          "commits bit-exact") {
  rig<> s;
  auto c = s.coord();
  s.start(c);
  step_keeping_element(s, 1, 1);
  manifest_forger f;
  f.fail_put = true;
  f.install(s);
  const auto before = restores(s);
  auto rep = c.transition();
  check_repaired(s, rep, before, errc::io);
}
