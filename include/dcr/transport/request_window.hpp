#pragma once
/// \file
/// `request_window`: at most `n` store requests in flight at once, on up to
/// `n` worker threads. An object store's cost per request is mostly
/// latency (S3 answers a small GET in milliseconds whatever the link), so a
/// writer or reader that waits for each request before the next one moves
/// a few payloads per round trip; a window of requests in flight overlaps
/// those round trips, bounded so that a node neither floods the store nor
/// holds unbounded bytes in flight. A window of 1 runs each job on the
/// caller's thread, as if there were no window (stores that are not
/// thread-safe stay usable).

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "dcr/core/error.hpp"

namespace dcr::transport {

class request_window {
public:
  /// `n` >= 1 requests in flight; throws `dcr::error(invalid_argument)` for 0.
  explicit request_window(std::size_t n) : n_(n) {
    if (n_ == 0) throw error(errc::invalid_argument, "request_window: a window of 0 requests");
  }
  request_window(const request_window&) = delete;
  request_window& operator=(const request_window&) = delete;
  /// Waits for every job submitted (a store request cannot be cancelled;
  /// its own timeout bounds the wait), then joins the workers.
  ~request_window() {
    {
      std::unique_lock l(m_);
      done_.wait(l, [&] { return outstanding_ == 0; });
      stop_ = true;
    }
    work_.notify_all();
    for (auto& t : workers_) t.join();
  }

  std::size_t capacity() const noexcept { return n_; }
  /// Jobs submitted and not yet returned.
  std::size_t outstanding() const {
    std::lock_guard l(m_);
    return outstanding_;
  }

  /// Runs `job` if fewer than `capacity()` jobs are outstanding (true), else
  /// returns false at once. A window of 1 runs it here, before returning.
  bool try_submit(std::function<void()> job) {
    if (n_ == 1) {
      job();
      return true;
    }
    std::lock_guard l(m_);
    if (outstanding_ >= n_) return false;
    enqueue(std::move(job));
    return true;
  }
  /// Runs `job`, first waiting while `capacity()` jobs are outstanding.
  void submit(std::function<void()> job) {
    if (n_ == 1) {
      job();
      return;
    }
    std::unique_lock l(m_);
    done_.wait(l, [&] { return outstanding_ < n_; });
    enqueue(std::move(job));
  }
  /// Waits until no job is outstanding.
  void drain() {
    std::unique_lock l(m_);
    done_.wait(l, [&] { return outstanding_ == 0; });
  }

private:
  /// Under `m_`: queue the job; a worker is started per job up to `n_`,
  /// so a window that never fills never starts them all.
  void enqueue(std::function<void()> job) {
    queue_.push_back(std::move(job));
    ++outstanding_;
    if (idle_ == 0 && workers_.size() < n_)
      workers_.emplace_back([this] { serve(); });
    else
      work_.notify_one();
  }
  void serve() {
    std::unique_lock l(m_);
    for (;;) {
      ++idle_;
      work_.wait(l, [&] { return stop_ || !queue_.empty(); });
      --idle_;
      if (queue_.empty()) return; // stop_
      auto job = std::move(queue_.front());
      queue_.pop_front();
      l.unlock();
      job(); // jobs report their own outcome; none may throw
      l.lock();
      --outstanding_;
      done_.notify_all();
    }
  }

  std::size_t n_;
  mutable std::mutex m_;
  std::condition_variable work_, done_;
  std::deque<std::function<void()>> queue_;
  std::vector<std::thread> workers_;
  std::size_t outstanding_ = 0, idle_ = 0;
  bool stop_ = false;
};

} // namespace dcr::transport
