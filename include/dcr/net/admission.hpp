#pragma once
/// \file
/// What a listener grants a peer before it has authenticated, shared by the
/// control channel (protocol/control_channel.hpp) and the relay links
/// (transport/relay_tcp.hpp): a few KiB of input, a deadline to finish the
/// key exchange, a cap on the connections served at once; and how far ahead
/// of the newest attempt it has seen a peer that never authenticated may
/// move it (docs/protocol.md, "Threat model").
///
/// Why the attempt window: attempts fence each other by id (a node or owner
/// that saw attempt τ refuses every older one), so an id far in the future
/// from anyone who can reach the port (2^63, say) would fence every real
/// attempt until the process restarts. A keyed peer proved the job key and
/// is trusted with any id; an unkeyed one is trusted only within `window`
/// of the newest attempt seen. A process that has seen no attempt yet has
/// nothing to measure against and takes the first id it is given: attempt
/// ids come from the commit store's counter and may be large after a long
/// job, so a fresh process cannot guess them.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "dcr/core/error.hpp"

namespace dcr::net {

/// Bytes a keyed listener reads from a peer before the key exchange is done
/// (a hello carries a 16-byte nonce, an error reply a message).
inline constexpr std::uint64_t max_unauthenticated_bytes = 4096;
/// A keyed listener drops a connection that has not finished the key
/// exchange this long after it was accepted.
inline constexpr std::chrono::milliseconds default_hello_timeout{10000};
/// Connections a listener serves at once (each is a thread); one more is
/// closed on accept, before anything of it is read.
inline constexpr std::size_t default_max_connections = 256;
/// How far past the newest attempt seen an unauthenticated peer may go. A
/// peer inside the window can still fence the real attempts until the
/// coordinator's ids pass its id, so the window is the most an unkeyed
/// listener can lose: a few hundred steps of a job (one attempt each, a
/// few when retried). A process cut off (not restarted) for longer than
/// that refuses the coordinator's next attempt, typed, and takes it again
/// after a restart.
inline constexpr std::uint64_t default_attempt_window = 1024;

/// Attempt `attempt` from a peer that did not authenticate, at a process
/// whose newest attempt is `newest` (0: none yet): `invalid_argument` when
/// it lies more than `window` past `newest`. Older attempts pass (the
/// fencing refuses them as stale, typed, without moving anything).
inline status check_attempt_window(std::uint64_t newest, std::uint64_t attempt,
                                   std::uint64_t window, const std::string& who) {
  DCR_RETURN_ERROR_IF(
      newest != 0 && attempt > newest && attempt - newest > window, invalid_argument,
      who + ": attempt " + std::to_string(attempt) + " is more than " + std::to_string(window) +
          " past the newest attempt seen (" + std::to_string(newest) +
          ") and its sender did not authenticate (no job key): refused, "
          "nothing fenced");
  return status::success();
}

/// The newest attempt a process has taken, across its connections, with
/// `check_attempt_window` applied to unauthenticated callers. Thread-safe.
class attempt_window {
public:
  explicit attempt_window(std::uint64_t window = default_attempt_window) : window_(window) {}
  /// Take `attempt` (0: a call outside any attempt, always taken) from a
  /// peer that did or did not authenticate; taken, it raises the newest.
  status admit(std::uint64_t attempt, bool authenticated, const std::string& who) {
    if (attempt == 0) return status::success();
    auto seen = newest_.load();
    do {
      if (!authenticated) DCR_TRY(check_attempt_window(seen, attempt, window_, who));
      if (attempt <= seen) return status::success();
    } while (!newest_.compare_exchange_weak(seen, attempt));
    return status::success();
  }
  std::uint64_t newest() const noexcept { return newest_.load(); }

private:
  std::uint64_t window_;
  std::atomic<std::uint64_t> newest_{0};
};

/// Live connections of one listener against a cap. A `ticket` holds one
/// place until it is released or destroyed, whichever comes first.
class connection_slots {
  struct state {
    std::size_t cap;
    std::atomic<std::size_t> live{0};
  };

public:
  explicit connection_slots(std::size_t cap = default_max_connections)
      : s_(std::make_shared<state>()) {
    s_->cap = cap;
  }

  class ticket {
  public:
    ticket() = default;
    ticket(ticket&& o) noexcept : s_(std::move(o.s_)) {}
    ticket& operator=(ticket&& o) noexcept {
      if (this != &o) {
        release();
        s_ = std::move(o.s_);
      }
      return *this;
    }
    ~ticket() { release(); }
    void release() noexcept {
      if (auto s = std::exchange(s_, nullptr)) --s->live;
    }

  private:
    friend class connection_slots;
    std::shared_ptr<state> s_;
  };

  /// A place for one more connection; false (and `out` empty) at the cap.
  bool try_take(ticket& out) {
    auto n = s_->live.load();
    do {
      if (n >= s_->cap) return false;
    } while (!s_->live.compare_exchange_weak(n, n + 1));
    out = ticket{};
    out.s_ = s_;
    return true;
  }
  std::size_t live() const noexcept { return s_->live.load(); }

private:
  std::shared_ptr<state> s_;
};

} // namespace dcr::net
