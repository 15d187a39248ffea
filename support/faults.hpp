#pragma once
/// \file
/// Fault injection for the tests, the demo and the cluster scripts: a
/// receiver that crashes mid-refit, a coordinator that dies at a crash
/// point. Not installed and not part of the library: `include/dcr/` never
/// includes it. The library's side of a crash is general: a receiver that
/// reports `lost()` is dropped by its endpoint and restored before it
/// rejoins (`protocol/endpoint.hpp`); a coordinator takes its fault policy as
/// a type (`protocol::fault_policy`) whose production default never fires.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <utility>

#include "dcr/core/error.hpp"
#include "dcr/protocol/coordinator.hpp"
#include "dcr/protocol/endpoint.hpp"

namespace dcr::support {

/// `R` that can be told to crash: after `crash_after(n)`, the `n`-th payload
/// it stages successfully from then on is its last (the endpoint drops it
/// right after staging, before any apply: a process crash mid-refit that
/// loses the storage, whatever was applied). Construct it as `R`.
template <class R>
class crash_injectable : public R {
public:
  using R::R;

  /// Crash after `n` more staged payloads; 0 disarms.
  void crash_after(std::uint64_t n) noexcept { left_ = n; }

  status stage(std::span<const std::byte> bytes) {
    auto s = R::stage(bytes);
    if (s.ok() && left_ && --left_ == 0) lost_ = true;
    return s;
  }
  bool lost() const noexcept { return lost_; }

private:
  std::uint64_t left_ = 0;
  bool lost_ = false;
};

/// Kill the receiver of `ep` after it has staged `n` more payloads (what
/// the tests and the demo call; the receiver must offer `crash_after`). A
/// receiver that is already down has nothing to kill: its replacement starts
/// healthy.
template <class Receiver>
void kill_after(protocol::receiver_endpoint<Receiver>& ep, std::uint64_t n) {
  if (ep.alive()) ep.with_receiver([n](Receiver& r) { r.crash_after(n); });
}

/// Coordinator fault policy: dies at the crash points `pick` says (it may
/// also act there itself, e.g. SIGKILL the process or take a timestamp, and
/// return false). Default-constructed it never fires, so one coordinator
/// type serves a test's dying and surviving coordinators alike.
class crash_at {
public:
  static constexpr bool armed = true;

  crash_at() = default;
  explicit crash_at(std::function<bool(protocol::crash_point)> pick) : pick_(std::move(pick)) {}
  /// Dies exactly at `p`.
  explicit crash_at(protocol::crash_point p)
      : pick_([p](protocol::crash_point q) { return q == p; }) {}

  bool operator()(protocol::crash_point p) const { return pick_ && pick_(p); }

private:
  std::function<bool(protocol::crash_point)> pick_;
};
static_assert(protocol::fault_policy<crash_at>);

} // namespace dcr::support
