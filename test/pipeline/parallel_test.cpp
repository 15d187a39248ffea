// Laws of for_each_ordered: results consumed in index order for any thread
// count, at most `window` indices in flight, failures propagate (lowest
// failing index, everything before it consumed) and nothing deadlocks.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "dcr/core/error.hpp"
#include "dcr/pipeline/parallel.hpp"

using namespace dcr;
using namespace dcr::pipeline;

TEST_CASE("for_each_ordered: index order and same results for 1..5 threads and any window") {
  const std::size_t n = 200;
  for (std::size_t threads : {1u, 2u, 3u, 5u})
    for (std::size_t window : {0u, 1u, 2u, 7u}) {
      std::vector<std::size_t> seen;
      std::atomic<std::size_t> in_flight{0}, most{0};
      std::size_t consumed = 0;
      for_each_ordered(
          n, threads, window,
          [&](std::size_t i) {
            const std::size_t now = ++in_flight;
            std::size_t m = most.load();
            while (now > m && !most.compare_exchange_weak(m, now)) {
            }
            if (i % 7 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
            --in_flight;
            return i * i;
          },
          [&](std::size_t i, std::size_t r) {
            CHECK(r == i * i);
            seen.push_back(i);
            ++consumed;
          });
      REQUIRE(seen.size() == n);
      for (std::size_t i = 0; i < n; ++i) CHECK(seen[i] == i);
      const std::size_t bound =
          threads <= 1 ? 1 : std::max(window == 0 ? 2 * threads : window, threads);
      CHECK(most.load() <= std::min(threads, bound));
    }
}

TEST_CASE("for_each_ordered: claimed but unconsumed indices never exceed the window") {
  // A slow consumer: workers must wait instead of running ahead.
  for (std::size_t window : {2u, 3u, 6u}) {
    std::atomic<std::size_t> started{0};
    std::size_t consumed = 0, worst = 0;
    for_each_ordered(
        60, 3, window,
        [&](std::size_t i) {
          ++started;
          return i;
        },
        [&](std::size_t, std::size_t) {
          std::this_thread::sleep_for(std::chrono::microseconds(300));
          worst = std::max(worst, started.load() - consumed);
          ++consumed;
        });
    CHECK(worst <= std::max<std::size_t>(window, 3)); // the window is at least the threads
    CHECK(worst >= 1);
  }
}

TEST_CASE("for_each_ordered: a worker's error is the lowest failing index, after all before it") {
  for (std::size_t threads : {1u, 2u, 4u}) {
    std::vector<std::size_t> seen;
    try {
      for_each_ordered(
          100, threads, 3,
          [&](std::size_t i) -> int {
            if (i == 41 || i == 57) throw error(errc::coverage, "index " + std::to_string(i));
            return static_cast<int>(i);
          },
          [&](std::size_t i, int) { seen.push_back(i); });
      FAIL("no error");
    } catch (const error& e) {
      CHECK(e.code() == errc::coverage);
      CHECK(std::string(e.what()).find("index 41") != std::string::npos);
    }
    REQUIRE(seen.size() == 41);
    for (std::size_t i = 0; i < seen.size(); ++i) CHECK(seen[i] == i);
  }
}

TEST_CASE("for_each_ordered: a consumer's error stops the workers and is rethrown") {
  for (std::size_t threads : {1u, 3u}) {
    std::atomic<std::size_t> ran{0};
    CHECK_THROWS_AS(for_each_ordered(
                        1000, threads, 4,
                        [&](std::size_t i) {
                          ++ran;
                          return i;
                        },
                        [&](std::size_t i, std::size_t) {
                          if (i == 5) throw std::runtime_error("sink");
                        }),
                    std::runtime_error);
    CHECK(ran.load() <= 5 + 1 + 4); // never ran far past the failure
  }
  CHECK(resolve_threads(0) >= 1);
  CHECK(resolve_threads(1) == 1);
}
