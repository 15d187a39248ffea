#pragma once
/// \file
/// The rollout-side endpoint of one receiver: owns the receiver, fences stale
/// attempts (payloads, control calls and gate operations of a replaced attempt
/// are ignored), suppresses duplicates, and handles membership (a killed
/// receiver, or one that reports its storage lost, is recreated and restored
/// to the committed version by dense refit before it joins the next attempt). Shared by every
/// coordinator that drives this receiver; all calls are serialised.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dcr/core/error.hpp"
#include "dcr/protocol/request_gate.hpp"
#include "dcr/protocol/roles.hpp"

namespace dcr::protocol {

/// Per-receiver accounting the endpoint keeps (read by benches and the demo).
struct endpoint_counters {
  std::uint64_t staged = 0, applied_calls = 0, duplicates = 0, stale = 0, restores = 0;
  double apply_seconds = 0, restore_seconds = 0;
};

template <receiver_role Receiver>
class receiver_endpoint {
public:
  /// Creates a receiver at the committed version (dense refit from the committed state).
  using factory = std::function<std::unique_ptr<Receiver>()>;
  /// Dense refit of a receiver to the committed version.
  using restorer = std::function<status(Receiver&)>;

  /// `id` must equal the `receiver_id()` of every receiver this endpoint holds.
  receiver_endpoint(std::string id, factory make, restorer restore, request_gate* gate = nullptr)
      : id_(std::move(id)), make_(std::move(make)), restore_(std::move(restore)), gate_(gate) {}

  /// Adopt an already-restored receiver (initial membership).
  void adopt(std::unique_ptr<Receiver> r) {
    std::lock_guard l(m_);
    if (r && r->receiver_id() != id_)
      throw error(errc::invalid_argument, "endpoint " + id_ + " got receiver " + r->receiver_id());
    r_ = std::move(r);
  }

  /// The receiver died (its storage is lost). It rejoins only after a restore.
  void kill() {
    std::lock_guard l(m_);
    r_.reset();
  }
  bool alive() const {
    std::lock_guard l(m_);
    return r_ != nullptr;
  }
  const std::string& id() const noexcept { return id_; }
  /// The newest attempt `begin` accepted (0 before any).
  std::uint64_t attempt() const {
    std::lock_guard l(m_);
    return attempt_;
  }

  /// Membership step between attempts: recreate and dense-restore a dead
  /// receiver. `expected` (if non-null) is the committed digest this receiver
  /// must reach; a mismatch is `errc::verification`.
  status ensure_member(const digest128* expected) {
    std::lock_guard l(m_);
    if (r_) return status::success();
    DCR_RETURN_ERROR_IF(!make_, aborted, "receiver " + id_ + " is down and has no factory");
    const auto t0 = std::chrono::steady_clock::now();
    auto fresh = make_();
    DCR_RETURN_ERROR_IF(!fresh, aborted, "receiver " + id_ + ": factory returned nothing");
    if (restore_) DCR_TRY(restore_(*fresh));
    if (expected && fresh->state_digest() != *expected)
      return fail(errc::verification,
                  "receiver " + id_ + ": dense restore does not match the committed digest");
    DCR_RETURN_ERROR_IF(fresh->receiver_id() != id_, invalid_argument,
                        "endpoint " + id_ + ": factory made receiver " + fresh->receiver_id());
    r_ = std::move(fresh);
    ++c_.restores;
    c_.restore_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return status::success();
  }

  /// Control call: start attempt τ. Ignored (false) for τ older than the newest seen.
  bool begin(std::uint64_t attempt) {
    std::lock_guard l(m_);
    if (attempt < attempt_) return false;
    attempt_ = attempt;
    seen_.clear();
    staged_.clear();
    if (r_) r_->begin_attempt(attempt);
    return true;
  }

  /// Deliver one payload of attempt τ (object `name`). Stale or duplicate
  /// payloads are ignored (counted, success). With `apply_now` the payload is
  /// applied at once (synchronous RL), else only staged (asynchronous RL).
  status deliver(std::uint64_t attempt, std::string_view name, std::span<const std::byte> bytes,
                 bool apply_now) {
    std::lock_guard l(m_);
    if (attempt != attempt_) {
      ++c_.stale;
      return status::success();
    }
    DCR_RETURN_ERROR_IF(!r_, aborted, "receiver " + id_ + " is down");
    if (!seen_.insert(std::string(name)).second) {
      ++c_.duplicates;
      return status::success();
    }
    const auto t0 = std::chrono::steady_clock::now();
    auto s = r_->stage(bytes);
    if (s.code == errc::duplicate) {
      ++c_.duplicates;
      return status::success();
    }
    if (s.code == errc::stale_attempt) {
      ++c_.stale;
      return status::success();
    }
    if (!s) {
      s.message = "receiver " + id_ + ", " + std::string(name) + ": " + s.message;
      return s;
    }
    ++c_.staged;
    staged_.emplace_back(std::string(name), digest(bytes));
    if (lost_locked()) return drop_lost();
    if (apply_now) s = apply_locked();
    c_.apply_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return s;
  }

  /// Apply everything staged for attempt τ (asynchronous RL, after the gate closed).
  status apply(std::uint64_t attempt) {
    std::lock_guard l(m_);
    DCR_RETURN_ERROR_IF(attempt != attempt_, stale_attempt,
                        "apply of replaced attempt " + std::to_string(attempt));
    DCR_RETURN_ERROR_IF(!r_, aborted, "receiver " + id_ + " is down");
    const auto t0 = std::chrono::steady_clock::now();
    auto s = apply_locked();
    c_.apply_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return s;
  }

  /// Flush, sync and check; then the ACK digest of the target state.
  status finish(std::uint64_t attempt, digest128& ack) {
    std::lock_guard l(m_);
    DCR_RETURN_ERROR_IF(attempt != attempt_, stale_attempt,
                        "finish of replaced attempt " + std::to_string(attempt));
    DCR_RETURN_ERROR_IF(!r_, aborted, "receiver " + id_ + " is down");
    auto done = r_->finish();
    if (lost_locked()) return drop_lost();
    DCR_TRY(std::move(done));
    ack = r_->state_digest();
    return status::success();
  }

  /// Digests of the payloads staged in attempt τ, sorted (duplicates and
  /// stale payloads, which were ignored, excluded); the coordinator compares
  /// them with what the manifests list before the receiver may acknowledge.
  std::vector<digest128> staged_digests(std::uint64_t attempt) const {
    std::lock_guard l(m_);
    std::vector<digest128> d;
    if (attempt != attempt_) return d;
    for (auto& [n, g] : staged_) d.push_back(g);
    std::sort(d.begin(), d.end());
    return d;
  }
  /// The same with the object names they were delivered under.
  std::vector<std::pair<std::string, digest128>> staged_payloads(std::uint64_t attempt) const {
    std::lock_guard l(m_);
    if (attempt != attempt_) return {};
    return staged_;
  }

  /// Whether this receiver needs updates of canonical tensor `name`: false
  /// only when its receiver says it stores nothing of it (`needs(name)`);
  /// true for a receiver that cannot say, and for a dead one (a payload
  /// delivered to it fails as it would without the question).
  bool needs(std::string_view name) const {
    std::lock_guard l(m_);
    if constexpr (requires(const Receiver& r) {
                    { r.needs(name) } -> std::convertible_to<bool>;
                  })
      return !r_ || r_->needs(name);
    else
      return true;
  }

  /// Gate operations carry τ; the gate itself ignores replaced attempts.
  bool close_gate(std::uint64_t attempt) { return gate_ ? gate_->close(attempt) : true; }
  bool open_gate(std::uint64_t attempt) { return gate_ ? gate_->open(attempt) : true; }
  request_gate* gate() const noexcept { return gate_; }

  /// Run `f(receiver)` under the endpoint lock (verification, serving).
  template <class F>
  decltype(auto) with_receiver(F&& f) {
    std::lock_guard l(m_);
    if (!r_) throw error(errc::aborted, "receiver " + id_ + " is down");
    return f(*r_);
  }
  endpoint_counters counters() const {
    std::lock_guard l(m_);
    return c_;
  }

private:
  status apply_locked() {
    ++c_.applied_calls;
    auto s = r_->apply_staged();
    if (lost_locked()) return drop_lost();
    if (!s) s.message = "receiver " + id_ + ": " + s.message;
    return s;
  }

  /// Whether the receiver says its storage is gone (`lost()`, optional in
  /// the role: a receiver whose process or device died mid-refit, whatever
  /// it had applied). Such a receiver is dropped like a killed one and
  /// rejoins only after a restore.
  bool lost_locked() const {
    if constexpr (requires(const Receiver& r) {
                    { r.lost() } -> std::convertible_to<bool>;
                  })
      return r_ && r_->lost();
    else
      return false;
  }
  status drop_lost() {
    r_.reset();
    return fail(errc::aborted, "receiver " + id_ + " lost its storage mid-refit");
  }

  const std::string id_;
  mutable std::mutex m_;
  factory make_;
  restorer restore_;
  request_gate* gate_ = nullptr;
  std::unique_ptr<Receiver> r_;
  std::uint64_t attempt_ = 0;
  std::set<std::string> seen_;
  std::vector<std::pair<std::string, digest128>> staged_;
  endpoint_counters c_;
};

} // namespace dcr::protocol
