#pragma once
/// \file
/// The request gate shields inference requests from partially applied weights.
/// Requests hold a `ticket` while they read weights; `close(τ)` stops new
/// admissions and waits until every in-flight request has finished, after
/// which weights may be changed in place; `open(τ)` admits again.
///
/// Gate operations carry the attempt id τ: once an operation of attempt τ' has
/// been seen, operations of any attempt τ < τ' are ignored (return false), so a
/// replaced attempt's late `open` cannot expose weights a newer attempt is
/// writing.
///
/// Synchronous RL: the coordinator closes the gate when the first attempt
/// starts and opens it at the end of the transition. Asynchronous RL: receivers
/// stage compressed payloads while the gate is open (serving v), the gate
/// closes after the last payload arrives, application starts once in-flight
/// requests are done, and the gate reopens at the end of the transition.

#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace dcr::protocol {

/// Whether application overlaps serving (async) or not (sync).
enum class rl_mode { synchronous, asynchronous };

class request_gate {
public:
  /// RAII admission of one request.
  class ticket {
  public:
    ticket() = default;
    ticket(ticket&& o) noexcept : g_(o.g_) { o.g_ = nullptr; }
    ticket& operator=(ticket&& o) noexcept {
      if (this != &o) {
        release();
        g_ = o.g_;
        o.g_ = nullptr;
      }
      return *this;
    }
    ~ticket() { release(); }
    explicit operator bool() const noexcept { return g_ != nullptr; }

  private:
    friend class request_gate;
    explicit ticket(request_gate* g) : g_(g) {}
    void release() {
      if (g_) g_->leave();
      g_ = nullptr;
    }
    request_gate* g_ = nullptr;
  };

  /// Block while closed, then admit one request.
  ticket admit() {
    std::unique_lock l(m_);
    cv_.wait(l, [&] { return open_; });
    ++in_flight_;
    return ticket(this);
  }
  /// Admit without blocking; an empty ticket if closed.
  ticket try_admit() {
    std::lock_guard l(m_);
    if (!open_) return {};
    ++in_flight_;
    return ticket(this);
  }

  /// Close for attempt τ and wait until no request is in flight. False (and no
  /// effect) if a newer attempt's operation was seen.
  bool close(std::uint64_t attempt) {
    std::unique_lock l(m_);
    if (attempt < newest_) return false;
    newest_ = attempt;
    open_ = false;
    cv_.wait(l, [&] { return in_flight_ == 0; });
    return true;
  }
  /// Reopen for attempt τ. False (and no effect) if a newer attempt's operation was seen.
  bool open(std::uint64_t attempt) {
    std::lock_guard l(m_);
    if (attempt < newest_) return false;
    newest_ = attempt;
    open_ = true;
    cv_.notify_all();
    return true;
  }

  bool is_open() const {
    std::lock_guard l(m_);
    return open_;
  }
  std::uint64_t in_flight() const {
    std::lock_guard l(m_);
    return in_flight_;
  }

private:
  void leave() {
    std::lock_guard l(m_);
    --in_flight_;
    cv_.notify_all();
  }
  mutable std::mutex m_;
  std::condition_variable cv_;
  bool open_ = true;
  std::uint64_t in_flight_ = 0;
  std::uint64_t newest_ = 0;
};

} // namespace dcr::protocol
