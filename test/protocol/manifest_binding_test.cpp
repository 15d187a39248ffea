// An attempt commits only the manifests its owners published: a manifest
// written under an owner's name by anyone else (a forgery, a stale or second
// process claiming the owner) ends in a typed failure or a bit-exact commit,
// never in a wrong commit (docs/protocol.md, "Binding an attempt to the
// owners' manifests").
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "dcr/protocol/coordinator.hpp"
#include "models.hpp"

using namespace dcr;
using namespace dcr::protocol;
using namespace dcr::test_models;

namespace {

/// The manifest name of `owner` in the scoped attempt of `name` (a payload
/// or manifest name under `incarnation/<id>/attempt/<τ>/`), and τ.
std::string sibling_manifest(std::string_view name, std::uint32_t owner, std::uint64_t& tau) {
  const auto at = name.find("attempt/");
  tau = transport::attempt_of(name.substr(at));
  return std::string(name.substr(0, at)) + transport::manifest_name(tau, owner);
}

std::string_view text_of(const std::vector<std::byte>& b) {
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

/// Object store decorator with two attacks on owner `victim` in the first
/// attempt it is armed for:
///  - `forge_empty`: before the owner's first payload lands, a correctly
///    sealed manifest listing no payloads is written under its name, and
///    the owner's upload waits until a reader has read it (so the readers
///    certainly take it, as they did when they kept the first manifest);
///    the owner's own manifest then replaces it;
///  - `forge_on_read`: the owner's manifest lands, but every read of it
///    returns another sealed manifest listing the same payloads (index
///    changed), so the readers consistently take bytes the owner did not
///    write.
template <transport::object_store Inner>
class forging_store {
public:
  enum class attack { none, forge_empty, forge_on_read };
  explicit forging_store(Inner& s, std::uint32_t victim) : s_(&s), victim_(victim) {}
  std::atomic<attack> armed{attack::none};
  std::atomic<int> forged{0};

  status put(std::string_view name, std::span<const std::byte> b) {
    const auto first_payload =
        "/payload/o" + transport::detail::pad(victim_, 10) + "-s" + transport::detail::pad(0, 10);
    if (name.ends_with(first_payload) && armed == attack::forge_empty) {
      armed = attack::none;
      std::uint64_t tau = 0;
      const auto mname = sibling_manifest(name, victim_, tau);
      const auto inc = name.substr(std::string_view("incarnation/").size(), 32);
      transport::manifest m{std::string(inc), tau, victim_, {}};
      const auto text = transport::serialize_manifest(m);
      forged_read_ = false;
      DCR_TRY(s_->put(mname, std::as_bytes(std::span(text))));
      {
        std::lock_guard l(m_);
        watched_ = mname;
      }
      ++forged;
      // Hold the owner until a reader has the forged manifest (bounded, so
      // a reader that never looks cannot hang the test).
      for (int i = 0; i < 5000 && !forged_read_; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::uint64_t tau = 0;
    if (name.find("/manifest/") != std::string_view::npos &&
        sibling_manifest(name, victim_, tau) == name && armed == attack::forge_on_read) {
      armed = attack::none;
      transport::manifest m;
      DCR_TRY(transport::parse_manifest(text_of({b.begin(), b.end()}), m));
      for (auto& e : m.payloads)
        e.tensors =
            e.tensors ? std::nullopt
                      : std::optional<std::vector<std::string>>(std::vector<std::string>{"forged"});
      const auto text = transport::serialize_manifest(m);
      std::lock_guard l(m_);
      shadow_[std::string(name)] = {reinterpret_cast<const std::byte*>(text.data()),
                                    reinterpret_cast<const std::byte*>(text.data() + text.size())};
      ++forged;
    }
    return s_->put(name, b);
  }
  status get(std::string_view n, std::vector<std::byte>& out) {
    {
      std::lock_guard l(m_);
      if (auto it = shadow_.find(std::string(n)); it != shadow_.end()) {
        out = it->second;
        return status::success();
      }
      if (n == watched_) forged_read_ = true;
    }
    return s_->get(n, out);
  }
  status list(std::string_view p, std::vector<std::string>& names) { return s_->list(p, names); }
  status remove(std::string_view n) {
    std::lock_guard l(m_);
    shadow_.erase(std::string(n));
    return s_->remove(n);
  }

private:
  Inner* s_;
  std::uint32_t victim_;
  std::mutex m_;
  std::string watched_;
  std::atomic<bool> forged_read_{false};
  std::map<std::string, std::vector<std::byte>> shadow_;
};

using store_t = forging_store<transport::memory_object_store>;

/// Two owners, three receivers over a forging store; every transition is
/// checked against a dense refit of the committed version.
struct rig {
  std::vector<tensor_meta> metas = canonical_tensors(small_llama());
  trainer_state trainer = trainer_state::make(metas, 31);
  std::vector<std::unique_ptr<model_owner>> owners;
  transport::memory_object_store objects;
  store_t store{objects, 1};
  memory_commit_store commits;
  std::vector<std::unique_ptr<receiver_endpoint<model_receiver>>> eps;

  rig() {
    for (std::uint32_t k = 0; k < 2; ++k)
      owners.push_back(std::make_unique<model_owner>(k, 2, &trainer));
    for (int r = 0; r < 3; ++r) {
      auto id = "rank-" + std::to_string(r);
      eps.push_back(std::make_unique<receiver_endpoint<model_receiver>>(
          id, [this, id] { return std::make_unique<model_receiver>(id, metas); },
          [this](model_receiver& rc) {
            for (std::size_t t = 0; t < metas.size(); ++t)
              rc.tensors()[t].bytes = owners[t % 2]->baseline(t)->bytes;
            return status::success();
          }));
    }
  }
  using coord_t = coordinator<model_owner, model_receiver, store_t, memory_commit_store>;
  coord_t coord() {
    std::vector<model_owner*> o;
    for (auto& p : owners) o.push_back(p.get());
    std::vector<receiver_endpoint<model_receiver>*> e;
    for (auto& p : eps) e.push_back(p.get());
    coordinator_options opt;
    opt.attempt_deadline = std::chrono::milliseconds(10000);
    return coord_t(commits, store, o, e, opt);
  }
  void check_bit_exact(std::uint64_t version) {
    stored_record cur;
    REQUIRE(commits.load(cur).ok());
    CHECK(cur.record.version == version);
    for (auto& e : eps) {
      INFO("receiver " << e->id());
      REQUIRE(e->alive());
      e->with_receiver([&](model_receiver& rc) {
        for (std::size_t t = 0; t < metas.size(); ++t) {
          CHECK(rc.tensors()[t].bytes == owners[t % 2]->baseline(t)->bytes);
          CHECK(rc.tensors()[t].bytes == trainer.tensors[t].bytes);
        }
      });
    }
  }
};

} // namespace

TEST_CASE("a sealed manifest listing no payloads, written for an owner before it publishes, "
          "fails its attempt typed; the retry commits bit-exact") {
  rig s;
  auto c = s.coord();
  REQUIRE(c.take_over().ok());
  REQUIRE(c.bootstrap().ok());
  for (std::uint64_t v = 1; v <= 2; ++v) {
    s.trainer.step(0.1, v);
    s.store.armed = store_t::attack::forge_empty;
    auto rep = c.transition();
    REQUIRE_MESSAGE(rep.result.ok(), rep.result.message);
    CAPTURE(v);
    CHECK(s.store.forged == int(v));
    s.check_bit_exact(v);
    REQUIRE(rep.attempts.size() >= 2);
    // Whether a reader kept the forged manifest (the coordinator's binding
    // names owner 1), saw the owner's replace it (a second manifest of owner
    // 1) or had fetched one of owner 1's payloads before it (a payload of
    // owner 1 no manifest lists), the attempt fails as a verification.
    const auto& msg = rep.attempts[0].result.message;
    INFO(msg);
    CHECK(rep.attempts[0].result.code == errc::verification);
    CHECK((msg.find("owner 1") != std::string::npos ||
           msg.find("/payload/o0000000001-") != std::string::npos));
    CHECK(rep.attempts.back().result.ok());
    s.check_bit_exact(v);
  }
}

TEST_CASE("readers that all take a manifest the owner did not write: the coordinator's binding "
          "fails the attempt naming the owner; the retry commits bit-exact") {
  rig s;
  auto c = s.coord();
  REQUIRE(c.take_over().ok());
  REQUIRE(c.bootstrap().ok());
  s.trainer.step(0.1, 1);
  s.store.armed = store_t::attack::forge_on_read;
  auto rep = c.transition();
  REQUIRE_MESSAGE(rep.result.ok(), rep.result.message);
  CHECK(s.store.forged == 1);
  REQUIRE(rep.attempts.size() == 2);
  CHECK(rep.attempts[0].result.code == errc::verification);
  CHECK(rep.attempts[0].result.message.find("owner 1: node of") != std::string::npos);
  CHECK(rep.attempts[0].result.message.find("the owner reported publishing") != std::string::npos);
  s.check_bit_exact(1);
}

/// Runs `hook` before the `n`-th listing of the manifests of an attempt.
struct listing_hook_store {
  transport::memory_object_store* s;
  int n;
  std::function<void()> hook;
  int lists = 0;
  status put(std::string_view a, std::span<const std::byte> b) { return s->put(a, b); }
  status get(std::string_view a, std::vector<std::byte>& out) { return s->get(a, out); }
  status list(std::string_view p, std::vector<std::string>& names) {
    if (p.ends_with("/manifest/") && ++lists == n) hook();
    return s->list(p, names);
  }
  status remove(std::string_view a) { return s->remove(a); }
};

TEST_CASE("attempt_reader: a second, different manifest for an owner fails the read typed") {
  transport::memory_object_store objects;
  auto put_manifest = [&](std::uint32_t owner, std::size_t payloads) {
    transport::attempt_writer<transport::memory_object_store> w(objects, 7, owner);
    for (std::size_t k = 0; k < payloads; ++k) {
      std::vector<std::byte> p(16, std::byte(owner * 16 + k));
      REQUIRE(w.put_payload(p).ok());
    }
    REQUIRE(w.finish().ok());
    return w.manifest_digest();
  };
  const auto first = put_manifest(0, 0);
  digest128 second{};
  // At the reader's second look at the manifests, it already holds owner 0's
  // first manifest; owner 0's is replaced by another, and owner 1's lands.
  listing_hook_store store{&objects, 2, [&] {
                             second = put_manifest(0, 1);
                             put_manifest(1, 0);
                           }};
  std::atomic<bool> stop{false};
  transport::attempt_reader<listing_hook_store> r(store, 7, {0, 1});
  auto st = r.run([](std::string_view, std::span<const std::byte>) { return status::success(); },
                  stop, std::chrono::steady_clock::now() + std::chrono::seconds(30));
  REQUIRE(store.lists >= 2);
  CHECK(second != first);
  CHECK(st.code == errc::verification);
  CHECK(st.message.find("owner 0: a second, different manifest") != std::string::npos);
}

TEST_CASE("attempt_reader: reports the digest of each manifest it took, as the writer wrote it") {
  transport::memory_object_store objects;
  std::map<std::uint32_t, digest128> written;
  for (std::uint32_t o = 0; o < 2; ++o) {
    transport::attempt_writer<transport::memory_object_store> w(objects, 3, o);
    std::vector<std::byte> p(8, std::byte(o + 1));
    REQUIRE(w.put_payload(p).ok());
    REQUIRE(w.finish().ok());
    written[o] = w.manifest_digest();
  }
  CHECK(written[0] != written[1]);
  std::atomic<bool> stop{false};
  transport::attempt_reader<transport::memory_object_store> r(objects, 3, {0, 1});
  REQUIRE(r.run([](std::string_view, std::span<const std::byte>) { return status::success(); },
                stop, std::chrono::steady_clock::now() + std::chrono::seconds(30))
              .ok());
  CHECK(r.manifest_digests() == written);
}
