#pragma once
/// \file
/// A blocking multi-producer multi-consumer FIFO with a capacity and close.
/// The capacity is what limits decoded payloads in memory: a producer that
/// runs ahead of its consumer blocks in `push` (backpressure).

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <optional>

#include "dcr/core/error.hpp"

namespace dcr::pipeline {

/// Outcome of a queue operation with a deadline.
enum class queue_wait { ok, closed, timeout };

/// Bounded blocking queue. Laws: items come out in push order; `push` blocks
/// while `size() == capacity()`; after `close()`, `push` returns false without
/// blocking and `pop` drains what is left, then returns `nullopt`.
template <class T>
class bounded_queue {
public:
  /// `capacity >= 1`; throws `dcr::error(invalid_argument)` otherwise.
  explicit bounded_queue(std::size_t capacity) : capacity_(capacity) {
    if (capacity == 0)
      throw error(errc::invalid_argument, "bounded_queue capacity must be at least 1");
  }

  /// Blocks while full; false if the queue is (or becomes) closed.
  bool push(T value) {
    std::unique_lock l(m_);
    not_full_.wait(l, [&] { return closed_ || q_.size() < capacity_; });
    if (closed_) return false;
    q_.push_back(std::move(value));
    high_water_ = std::max(high_water_, q_.size());
    not_empty_.notify_one();
    return true;
  }

  /// Blocks while empty and open; nullopt once closed and drained.
  std::optional<T> pop() {
    std::unique_lock l(m_);
    not_empty_.wait(l, [&] { return closed_ || !q_.empty(); });
    if (q_.empty()) return std::nullopt;
    T v = std::move(q_.front());
    q_.pop_front();
    not_full_.notify_one();
    return v;
  }

  /// `push` that gives up at `deadline` (`timeout`; the value is dropped);
  /// `closed` if the queue is (or becomes) closed.
  queue_wait push_until(T value, std::chrono::steady_clock::time_point deadline) {
    std::unique_lock l(m_);
    if (!not_full_.wait_until(l, deadline, [&] { return closed_ || q_.size() < capacity_; }))
      return queue_wait::timeout;
    if (closed_) return queue_wait::closed;
    q_.push_back(std::move(value));
    high_water_ = std::max(high_water_, q_.size());
    not_empty_.notify_one();
    return queue_wait::ok;
  }

  /// `pop` that gives up at `deadline` (`timeout`); `closed` once closed and drained.
  queue_wait pop_until(T& out, std::chrono::steady_clock::time_point deadline) {
    std::unique_lock l(m_);
    if (!not_empty_.wait_until(l, deadline, [&] { return closed_ || !q_.empty(); }))
      return queue_wait::timeout;
    if (q_.empty()) return queue_wait::closed;
    out = std::move(q_.front());
    q_.pop_front();
    not_full_.notify_one();
    return queue_wait::ok;
  }

  /// No more pushes; wakes every waiter.
  void close() {
    std::lock_guard l(m_);
    closed_ = true;
    not_full_.notify_all();
    not_empty_.notify_all();
  }

  std::size_t capacity() const noexcept { return capacity_; }
  std::size_t size() const {
    std::lock_guard l(m_);
    return q_.size();
  }
  bool closed() const {
    std::lock_guard l(m_);
    return closed_;
  }
  /// Largest size ever observed (tests check the bound held).
  std::size_t high_water() const {
    std::lock_guard l(m_);
    return high_water_;
  }

private:
  const std::size_t capacity_;
  mutable std::mutex m_;
  std::condition_variable not_full_, not_empty_;
  std::deque<T> q_;
  bool closed_ = false;
  std::size_t high_water_ = 0;
};

} // namespace dcr::pipeline
