// Laws of bounded_queue and of stage composition: order, bounds, overlap,
// failure propagation.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <numeric>
#include <stdexcept>
#include <thread>

#include "dcr/pipeline/bounded_queue.hpp"
#include "dcr/pipeline/stage.hpp"

using namespace dcr;
using namespace dcr::pipeline;

TEST_CASE("bounded_queue: FIFO, capacity bound under a fast producer, close drains") {
  for (std::size_t cap : {1u, 2u, 5u}) {
    bounded_queue<int> q(cap);
    std::thread producer([&] {
      for (int i = 0; i < 500; ++i) REQUIRE(q.push(i));
      q.close();
    });
    int expect = 0;
    while (auto v = q.pop()) {
      CHECK(*v == expect++);
      if (expect % 97 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    producer.join();
    CHECK(expect == 500);
    CHECK(q.high_water() <= cap);
    CHECK(q.high_water() >= 1);
  }
}

TEST_CASE("bounded_queue: push after close fails, a blocked push is released by close") {
  bounded_queue<int> q(1);
  REQUIRE(q.push(1));
  std::atomic<int> result{-1};
  std::thread blocked([&] { result = q.push(2) ? 1 : 0; });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(result == -1); // still blocked: full
  q.close();
  blocked.join();
  CHECK(result == 0);
  CHECK_FALSE(q.push(3));
  auto v = q.pop();
  REQUIRE(v);
  CHECK(*v == 1); // what was queued before close is still delivered
  CHECK_FALSE(q.pop());
  CHECK_THROWS_AS(bounded_queue<int>(0), dcr::error);
}

TEST_CASE("bounded_queue: many producers and consumers deliver every item exactly once") {
  bounded_queue<int> q(3);
  constexpr int producers = 3, per = 300;
  std::vector<std::thread> ts;
  std::atomic<long> sum{0};
  std::atomic<int> count{0};
  for (int p = 0; p < producers; ++p)
    ts.emplace_back([&, p] {
      for (int i = 0; i < per; ++i) REQUIRE(q.push(p * per + i));
    });
  std::vector<std::thread> cs;
  for (int c = 0; c < 2; ++c)
    cs.emplace_back([&] {
      while (auto v = q.pop()) {
        sum += *v;
        ++count;
      }
    });
  for (auto& t : ts) t.join();
  q.close();
  for (auto& t : cs) t.join();
  CHECK(count == producers * per);
  CHECK(sum == long{producers * per} * (producers * per - 1) / 2);
}

TEST_CASE("stage composition equals function composition, in order") {
  auto p = stage{[](int x) { return x * 3; }} | stage{[](int x) { return std::to_string(x); }, 1} |
           stage{[](std::string s) { return s + "!"; }, 4};
  static_assert(std::is_same_v<chain_output<int, decltype(p)>::type, std::string>);
  std::vector<std::string> out;
  run<int>(
      p,
      [](auto&& emit) {
        for (int i = 0; i < 200; ++i)
          if (!emit(i)) return;
      },
      [&](std::string s) { out.push_back(std::move(s)); });
  REQUIRE(out.size() == 200);
  for (int i = 0; i < 200; ++i) CHECK(out[i] == std::to_string(3 * i) + "!");
  // A single stage works too.
  int total = 0;
  run<int>(
      stage{[](int x) { return x + 1; }}, [](auto&& emit) { emit(1), emit(2); },
      [&](int v) { total += v; });
  CHECK(total == 5);
}

TEST_CASE("stages overlap: stage 1 starts item l+1 while stage 2 still works on item l") {
  std::mutex m;
  std::condition_variable cv;
  int stage1_started = 0;
  bool overlapped = false;
  auto p = stage{[&](int x) {
             std::lock_guard l(m);
             ++stage1_started;
             cv.notify_all();
             return x;
           }} |
           stage{[&](int x) {
             if (x == 0) {
               // Hold item 0 here until stage 1 has taken item 1 (or give up).
               std::unique_lock l(m);
               overlapped =
                   cv.wait_for(l, std::chrono::seconds(10), [&] { return stage1_started >= 2; });
             }
             return x;
           }};
  int n = 0;
  run<int>(
      p,
      [](auto&& emit) {
        for (int i = 0; i < 3; ++i) emit(i);
      },
      [&](int) { ++n; });
  CHECK(n == 3);
  CHECK(overlapped);
}

TEST_CASE("a failing stage stops the pipeline; run rethrows after joining every thread") {
  std::atomic<int> produced{0}, sunk{0};
  auto p = stage{[](int x) {
             if (x == 50) throw std::runtime_error("stage failed at 50");
             return x;
           }} |
           stage{[](int x) { return x; }};
  CHECK_THROWS_WITH_AS(run<int>(
                           p,
                           [&](auto&& emit) {
                             for (int i = 0; i < 100000; ++i) {
                               if (!emit(i)) return;
                               ++produced;
                             }
                           },
                           [&](int) { ++sunk; }),
                       "stage failed at 50", std::runtime_error);
  CHECK(sunk <= 50);
  CHECK(produced < 100000); // the source saw the stop
  // A failing sink and a failing source propagate too.
  CHECK_THROWS_AS(run<int>(
                      p, [](auto&& emit) { emit(1); }, [](int) { throw std::logic_error("sink"); }),
                  std::logic_error);
  CHECK_THROWS_AS(run<int>(
                      p, [](auto&&) { throw std::out_of_range("source"); }, [](int) {}),
                  std::out_of_range);
}

TEST_CASE(
    "an empty chain joins the source's thread and the sink by one queue of sink_capacity items") {
  for (std::size_t cap : {1u, 3u}) {
    std::atomic<int> produced{0};
    int max_ahead = 0, next = 0;
    run<int>(
        chain<>{},
        [&](auto&& emit) {
          for (int i = 0; i < 40; ++i) {
            if (!emit(i)) return;
            ++produced;
          }
        },
        [&](int v) {
          CHECK(v == next++);
          if (v % 10 == 0)
            std::this_thread::sleep_for(
                std::chrono::milliseconds(20)); // let the producer run ahead
          max_ahead = std::max(max_ahead, produced.load() - v);
        },
        cap);
    CHECK(next == 40);
    CHECK(max_ahead <= static_cast<int>(cap) + 1); // the queue, plus the item the sink holds
  }
}

TEST_CASE("run_status: a dcr::error keeps its code and message; other exceptions are aborted") {
  auto src = [](auto&& emit) {
    for (int i = 0; i < 5; ++i)
      if (!emit(i)) return;
  };
  auto failing = stage{[](int x) {
    if (x == 3) throw error(errc::bad_format, "item 3");
    return x;
  }};
  const status s = run_status<int>(as_chain(failing), src, [](int) {});
  CHECK(s.code == errc::bad_format);
  CHECK(s.message == "item 3");
  const status t = run_status<int>(chain<>{}, src, [](int x) {
    if (x == 2) throw std::runtime_error("sink");
  });
  CHECK(t.code == errc::aborted);
  CHECK(t.message == "sink");
  CHECK(run_status<int>(chain<>{}, src, [](int) {}).ok());
}
