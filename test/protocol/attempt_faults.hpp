#pragma once
// Attempt-object faults shared by the protocol, S3 and relay tests: a stray
// copy of a payload under the attempt prefix, and a commit record lost while
// the object store still holds attempt objects.
#include <doctest/doctest.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <memory>

#include "dcr/protocol/coordinator.hpp"
#include "models.hpp"

namespace dcr::test_models {

using namespace dcr::protocol;

/// A copy of a valid payload with another sequence number in its header,
/// resealed (a v2 digest covers the sequence, so a copy renumbered without
/// resealing is refused at the digest): a self-consistent stray payload
/// under the attempt prefix, what the manifest check must catch.
std::vector<std::byte> with_sequence(std::vector<std::byte> p, std::uint32_t seq) {
  for (int i = 0; i < 4; ++i) p[28 + i] = static_cast<std::byte>((seq >> (8 * i)) & 0xFF);
  const auto version = static_cast<std::uint16_t>(std::to_integer<unsigned>(p[4]) |
                                                  (std::to_integer<unsigned>(p[5]) << 8));
  const auto d =
      codec::payload_digest(version, p, std::span(p).subspan(codec::payload_header_size));
  std::memcpy(p.data() + codec::payload_digest_offset, d.data(), d.size());
  return p;
}

/// Object store decorator: after owner 0 publishes its first payload of the
/// attempt numbered `from` or later, places such a copy (sequence 77) under
/// the same attempt prefix, once.
template <transport::object_store Inner>
class copy_planting_store {
public:
  explicit copy_planting_store(Inner& s) : s_(&s) {}
  std::atomic<bool> armed{false};
  std::atomic<int> planted{0};
  status put(std::string_view name, std::span<const std::byte> b) {
    DCR_TRY(s_->put(name, b));
    const auto at = name.find("attempt/");
    if (at != std::string_view::npos && name.ends_with("/payload/o0000000000-s0000000000") &&
        armed.exchange(false)) {
      const auto tau = transport::attempt_of(name.substr(at));
      payload_id pid;
      DCR_TRY(read_payload_id(b, pid));
      REQUIRE(pid.sequence == 0);
      const auto copy = with_sequence({b.begin(), b.end()}, 77);
      REQUIRE(read_payload_id(copy, pid).ok());
      REQUIRE(pid.sequence == 77); // a valid payload of its own
      DCR_TRY(s_->put(std::string(name.substr(0, at)) + transport::payload_name(tau, 0, 77), copy));
      ++planted;
    }
    return status::success();
  }
  status get(std::string_view n, std::vector<std::byte>& out) { return s_->get(n, out); }
  status list(std::string_view p, std::vector<std::string>& names) { return s_->list(p, names); }
  status remove(std::string_view n) { return s_->remove(n); }

private:
  Inner* s_;
};

/// The unlisted-copy case on any object store: the attempt with the copy
/// fails before commit, the overwrite retry commits, and every receiver
/// equals the dense state (the copy's XOR masks landed twice before the fix).
template <transport::object_store Inner, commit_store Commits>
void check_unlisted_copy(Inner& objects, Commits& commits, rl_mode mode) {
  auto metas = canonical_tensors(small_llama());
  auto trainer = trainer_state::make(metas, 21);
  std::vector<std::unique_ptr<model_owner>> owners;
  std::vector<model_owner*> op;
  for (std::uint32_t k = 0; k < 2; ++k) {
    owners.push_back(std::make_unique<model_owner>(k, 2, &trainer));
    op.push_back(owners.back().get());
  }
  copy_planting_store<Inner> store(objects);
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
  coordinator_options o;
  o.mode = mode;
  o.attempt_deadline = std::chrono::milliseconds(10000);
  coordinator<model_owner, model_receiver, copy_planting_store<Inner>, Commits> c(commits, store,
                                                                                  op, ep, o);
  REQUIRE(c.take_over().ok());
  REQUIRE(c.bootstrap().ok());
  for (std::uint64_t v = 1; v <= 2; ++v) {
    trainer.step(0.1, v);
    store.armed = true;
    auto rep = c.transition();
    REQUIRE_MESSAGE(rep.result.ok(), rep.result.message);
    CHECK(store.planted == int(v));
    stored_record cur;
    REQUIRE(commits.load(cur).ok());
    CHECK(cur.record.version == v);
    for (std::size_t r = 0; r < ep.size(); ++r)
      ep[r]->with_receiver([&](model_receiver& rc) {
        for (std::size_t t = 0; t < metas.size(); ++t)
          CHECK(rc.tensors()[t].bytes == trainer.tensors[t].bytes);
        CHECK(cur.record.receivers[r].state == rc.state_digest());
      });
    REQUIRE(rep.attempts.size() == 2);
    CHECK(rep.attempts[0].mode == refit_mode::mixed);
    CHECK(rep.attempts[0].result.code == errc::verification);
    CHECK(rep.attempts[1].mode == refit_mode::overwrite_all);
  }
}

/// Commit record lost while the object store holds attempt objects of the
/// killed history: `lose_record()` wipes the control store and `fresh()`
/// returns an empty one. Bootstrap must refuse (typed, says what to do),
/// never start a history that reads the old objects; after the operator
/// removes them, a new history commits bit-exact.
template <transport::object_store Store, commit_store Commits>
void check_lost_record(Store& objects, const std::function<std::unique_ptr<Commits>()>& fresh) {
  auto metas = canonical_tensors(small_llama());
  auto trainer = trainer_state::make(metas, 31);
  std::vector<std::unique_ptr<model_owner>> owners;
  std::vector<model_owner*> op;
  for (std::uint32_t k = 0; k < 2; ++k) {
    owners.push_back(std::make_unique<model_owner>(k, 2, &trainer));
    op.push_back(owners.back().get());
  }
  auto dense = [&](model_receiver& r) {
    for (std::size_t t = 0; t < metas.size(); ++t)
      r.tensors()[t].bytes = owners[t % 2]->baseline(t)->bytes;
    return status::success();
  };
  auto endpoints = [&] {
    std::vector<std::unique_ptr<receiver_endpoint<model_receiver>>> eps;
    for (int r = 0; r < 2; ++r) {
      auto id = "rank-" + std::to_string(r);
      eps.push_back(std::make_unique<receiver_endpoint<model_receiver>>(
          id, [&, id] { return std::make_unique<model_receiver>(id, metas); }, dense));
    }
    return eps;
  };
  auto ptrs = [](auto& eps) {
    std::vector<receiver_endpoint<model_receiver>*> p;
    for (auto& e : eps) p.push_back(e.get());
    return p;
  };
  using coord_t = coordinator<model_owner, model_receiver, Store, Commits, support::crash_at>;
  coordinator_options o;
  o.attempt_deadline = std::chrono::milliseconds(10000);
  // History A: v1 commits, the transition to v2 dies after an ACK (its objects stay).
  {
    auto commits = fresh();
    auto eps = endpoints();
    coord_t a(*commits, objects, op, ptrs(eps), o),
        a2(*commits, objects, op, ptrs(eps), o, support::crash_at(crash_point::after_first_ack));
    REQUIRE(a.take_over().ok());
    REQUIRE(a.bootstrap().ok());
    trainer.step(0.1, 1);
    REQUIRE(a.transition().result.ok());
    trainer.step(0.1, 2);
    REQUIRE(a2.take_over().ok());
    CHECK(a2.transition().result.code == errc::aborted);
  }
  std::vector<std::string> left;
  REQUIRE(objects.list("", left).ok());
  REQUIRE_FALSE(left.empty());
  // The record is lost; processes restart (fresh receivers, owners keep B^1).
  trainer.step(0.1, 3);
  auto commits = fresh();
  auto eps = endpoints();
  coord_t b(*commits, objects, op, ptrs(eps), o);
  REQUIRE(b.take_over().ok());
  auto st = b.bootstrap();
  CHECK(st.code == errc::foreign_incarnation);
  CHECK(st.message.find("remove the objects") != std::string::npos);
  stored_record cur;
  REQUIRE(commits->load(cur).ok());
  CHECK(cur.revision == 0); // nothing committed next to the old objects
  // The operator removes the old history's objects; a new one starts and commits bit-exact.
  for (auto& n : left) REQUIRE(objects.remove(n).ok());
  REQUIRE(b.bootstrap().ok());
  for (std::uint64_t v = 1; v <= 2; ++v) {
    trainer.step(0.1, 10 + v);
    auto rep = b.transition();
    REQUIRE_MESSAGE(rep.result.ok(), rep.result.message);
    REQUIRE(commits->load(cur).ok());
    CHECK(cur.record.version == v);
    for (std::size_t r = 0; r < eps.size(); ++r)
      eps[r]->with_receiver([&](model_receiver& rc) {
        for (std::size_t t = 0; t < metas.size(); ++t)
          CHECK(rc.tensors()[t].bytes == trainer.tensors[t].bytes);
        CHECK(cur.record.receivers[r].state == rc.state_digest());
      });
  }
}

} // namespace dcr::test_models
