#pragma once
/// \file
/// Ordered parallel map with bounded memory: `for_each_ordered(n, threads,
/// window, work, consume)` runs `work(i) -> R` for i in [0, n) on `threads`
/// threads, the calling thread one of them (`threads` - 1 workers), and
/// passes each result to `consume(i, R&&)` on the calling thread in index
/// order. Used for the payload builder's chunks, whose
/// results must come out in the same order (so the same bytes) whatever the
/// thread count. (The receiver's apply uses its own pool: its results are
/// writes to disjoint storage, not values to consume in order; see
/// receiver/receiver.hpp.)
///
/// Memory bound: at most `window` indices are claimed but not yet consumed
/// (computing, or computed and waiting for their turn); a worker that would
/// run further ahead waits (backpressure), so a slow consumer never lets
/// results pile up.
///
/// Failure: an exception from `work(k)` stops workers from claiming indices
/// past k; every index below k still runs and is consumed (as a sequential
/// loop would), then the exception of the lowest failing index is rethrown
/// after all workers have joined. An exception from `consume` stops the
/// workers and is rethrown after they joined. Nothing outlives the call.

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>
#include <type_traits>
#include <vector>

namespace dcr::pipeline {

/// `requested`, or the machine's hardware threads when 0 (at least 1).
inline std::size_t resolve_threads(std::size_t requested) noexcept {
  if (requested != 0) return requested;
  const unsigned h = std::thread::hardware_concurrency();
  return h == 0 ? 1 : h;
}

/// See the file comment. `threads <= 1` (or n <= 1) runs the plain loop on
/// the calling thread; `window` 0 means 2 * threads, and a window below
/// `threads` is raised to `threads` (every worker can hold one index).
template <class Work, class Consume>
void for_each_ordered(std::size_t n, std::size_t threads, std::size_t window, Work&& work,
                      Consume&& consume) {
  using R = std::invoke_result_t<Work&, std::size_t>;
  threads = std::min(threads, n);
  if (threads <= 1) {
    for (std::size_t i = 0; i < n; ++i) consume(i, work(i));
    return;
  }
  if (window == 0) window = 2 * threads;
  window = std::max(window, threads);

  constexpr std::size_t none = std::numeric_limits<std::size_t>::max();
  std::mutex m;
  std::condition_variable claimable, ready;
  std::vector<std::optional<R>> slot(window);
  std::size_t next = 0, consumed = 0, fail_at = none;
  bool stop = false;
  std::exception_ptr work_error, consume_error;

  // Builds index `i` (claimed under the lock) and publishes its result, or
  // its error when it is the earliest so far; run by the workers and by the
  // calling thread alike.
  auto build = [&](std::size_t i) {
    std::optional<R> r;
    std::exception_ptr e;
    try {
      r.emplace(work(i));
    } catch (...) {
      e = std::current_exception();
    }
    std::lock_guard l(m);
    if (e) {
      if (i < fail_at) {
        fail_at = i;
        work_error = e;
      }
      claimable.notify_all();
    } else {
      slot[i % window] = std::move(r);
    }
    ready.notify_all();
  };
  auto worker = [&] {
    for (;;) {
      std::size_t i;
      {
        std::unique_lock l(m);
        claimable.wait(
            l, [&] { return stop || next >= n || next >= fail_at || next < consumed + window; });
        if (stop || next >= n || next >= fail_at) return;
        i = next++;
      }
      build(i);
    }
  };
  // The calling thread is one of the `threads`: while the index it must
  // consume next is not ready, it claims and builds the next index itself
  // instead of sleeping. So `threads` runnable threads, not `threads` + 1
  // (on a machine with as many cores, one more would time-slice against
  // them), and the index the caller waits for is most often one it is
  // building, so its turn comes without waiting to be woken.
  std::vector<std::thread> pool;
  pool.reserve(threads - 1);
  for (std::size_t t = 1; t < threads; ++t) pool.emplace_back(worker);

  for (std::size_t c = 0; c < n; ++c) {
    std::optional<R> r;
    bool failed = false;
    for (;;) {
      std::size_t i;
      {
        std::unique_lock l(m);
        if (c >= fail_at) {
          failed = true;
          break;
        }
        if (slot[c % window].has_value()) {
          r = std::move(slot[c % window]);
          slot[c % window].reset();
          break;
        }
        if (!(next < n && next < fail_at && next < consumed + window)) {
          ready.wait(l);
          continue;
        }
        i = next++;
      }
      build(i);
    }
    if (failed) break;
    try {
      consume(c, std::move(*r));
    } catch (...) {
      consume_error = std::current_exception();
    }
    std::lock_guard l(m);
    ++consumed;
    if (consume_error) stop = true;
    claimable.notify_all();
    if (consume_error) break;
  }
  {
    std::lock_guard l(m);
    stop = true;
    claimable.notify_all();
  }
  for (auto& t : pool) t.join();
  if (consume_error) std::rethrow_exception(consume_error);
  if (work_error) std::rethrow_exception(work_error);
}

} // namespace dcr::pipeline
