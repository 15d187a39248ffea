#pragma once
/// \file
/// Compile-time composition of concurrent stages. A stage is an object holding
/// a callable `In -> Out` and the capacity of the queue in front of it;
/// `a | b` composes stages into a `chain` whose types are fixed at compile
/// time, and `run` executes a chain with one thread per stage connected by
/// `bounded_queue`s, so stage k works on item ℓ+1 while stage k+1 works on ℓ
/// (e.g. build bucket ℓ+1 while sending ℓ; apply ℓ while ℓ+1 arrives).
///
/// ```cpp
/// auto p = stage{[](int x) { return 2 * x; }} | stage{[](int x) { return x + 1; }, 4};
/// run<int>(p, [](auto&& emit) { for (int i = 0; i < 9; ++i) emit(i); }, [](int y) { use(y); });
/// ```
/// Failure: the first exception thrown by the source, a stage or the sink
/// stops every stage (queues close, pending items are dropped) and `run`
/// rethrows it after joining all threads, so no stage outlives `run`.
/// `run_status` does the same for code that reports `dcr::status`.
///
/// An empty chain (`chain<>{}`) is a producer thread and the calling thread
/// joined by one queue of `sink_capacity` items: e.g. fetch payload ℓ+1
/// while payload ℓ is applied.

#include <array>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "dcr/core/error.hpp"
#include "dcr/pipeline/bounded_queue.hpp"

namespace dcr::pipeline {

/// One stage: `fn(In) -> Out`, with `capacity` items queued in front of it.
template <class F>
struct stage {
  F fn;
  std::size_t capacity = 2;
};
template <class F>
stage(F) -> stage<F>;
template <class F>
stage(F, std::size_t) -> stage<F>;

/// A fixed sequence of stages.
template <class... Stages>
struct chain {
  std::tuple<Stages...> stages;
};

template <class A, class B>
constexpr chain<stage<A>, stage<B>> operator|(stage<A> a, stage<B> b) {
  return {{std::move(a), std::move(b)}};
}
template <class... S, class B>
constexpr chain<S..., stage<B>> operator|(chain<S...> c, stage<B> b) {
  return {std::tuple_cat(std::move(c.stages), std::tuple<stage<B>>{std::move(b)})};
}
template <class F>
constexpr chain<stage<F>> as_chain(stage<F> s) {
  return {{std::move(s)}};
}
template <class... S>
constexpr chain<S...> as_chain(chain<S...> c) {
  return c;
}

namespace detail {

template <class In, class... S>
struct types;
template <class In>
struct types<In> {
  using queues = std::tuple<>;
  using out = In;
};
template <class In, class F, class... S>
struct types<In, stage<F>, S...> {
  using mid = std::invoke_result_t<F&, In>;
  static_assert(!std::is_void_v<mid>, "a stage must return a value; use the sink to consume");
  using queues = decltype(std::tuple_cat(std::declval<std::tuple<bounded_queue<In>*>>(),
                                         std::declval<typename types<mid, S...>::queues>()));
  using out = typename types<mid, S...>::out;
};

struct failure {
  std::mutex m;
  std::exception_ptr first;
  std::vector<std::function<void()>> closers;
  void set(std::exception_ptr e) {
    std::lock_guard l(m);
    if (!first) first = e;
    for (auto& c : closers) c();
  }
};

/// Capacity of queue `I` of a run: the capacity of stage `I`, or the sink's
/// for the last queue.
template <std::size_t I, class... S>
constexpr std::size_t capacity_of(const chain<S...>& c, std::size_t sink) {
  if constexpr (I < sizeof...(S))
    return std::get<I>(c.stages).capacity;
  else
    return sink;
}

} // namespace detail

/// Output type of chain `C` for input type `In`.
template <class In, class C>
struct chain_output;
template <class In, class... S>
struct chain_output<In, chain<S...>> {
  using type = typename detail::types<In, S...>::out;
};

/// Run `c` over the items `source(emit)` produces (`emit(In)` returns false
/// once the pipeline has failed; the source should then return), delivering
/// each output in order to `sink(Out)` on the calling thread, with at most
/// `sink_capacity` outputs queued in front of it. Items keep their order.
/// Rethrows the first failure after every thread has ended.
template <class In, class... S, class Source, class Sink>
void run(chain<S...> c, Source&& source, Sink&& sink, std::size_t sink_capacity = 2) {
  constexpr std::size_t n = sizeof...(S);
  using Out = typename detail::types<In, S...>::out;
  detail::failure fail_state;

  // Queue k feeds stage k; queue n feeds the sink.
  using qtuple = decltype(std::tuple_cat(std::declval<typename detail::types<In, S...>::queues>(),
                                         std::declval<std::tuple<bounded_queue<Out>*>>()));
  auto storage = [&]<std::size_t... I>(std::index_sequence<I...>) {
    return std::tuple{std::make_unique<std::remove_pointer_t<std::tuple_element_t<I, qtuple>>>(
        detail::capacity_of<I>(c, sink_capacity))...};
  }
  (std::make_index_sequence<n + 1>{});
  std::apply(
      [&](auto&... q) { (fail_state.closers.push_back([p = q.get()] { p->close(); }), ...); },
      storage);

  std::array<std::thread, n> threads; // fixed count: no reallocation
  auto launch = [&]<std::size_t I>(std::integral_constant<std::size_t, I>) {
    threads[I] = std::thread([&] {
      auto& in = *std::get<I>(storage);
      auto& out = *std::get<I + 1>(storage);
      auto& st = std::get<I>(c.stages);
      try {
        while (auto v = in.pop()) {
          if (!out.push(st.fn(std::move(*v)))) break;
        }
      } catch (...) {
        fail_state.set(std::current_exception());
      }
      out.close();
    });
  };
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (launch(std::integral_constant<std::size_t, I>{}), ...);
  }
  (std::make_index_sequence<n>{});

  std::thread producer([&] {
    auto& q0 = *std::get<0>(storage);
    try {
      source([&](In v) { return q0.push(std::move(v)); });
    } catch (...) {
      fail_state.set(std::current_exception());
    }
    q0.close();
  });

  auto& last = *std::get<n>(storage);
  try {
    while (auto v = last.pop()) sink(std::move(*v));
  } catch (...) {
    fail_state.set(std::current_exception());
  }
  last.close();
  producer.join();
  for (auto& t : threads) t.join();
  if (fail_state.first) std::rethrow_exception(fail_state.first);
}

/// `run` reporting a `dcr::status`: ok, or the first failure (a `dcr::error`
/// keeps its code and message; any other exception is `errc::aborted` with
/// its `what()`).
template <class In, class... S, class Source, class Sink>
status run_status(chain<S...> c, Source&& source, Sink&& sink, std::size_t sink_capacity = 2) {
  try {
    run<In>(std::move(c), std::forward<Source>(source), std::forward<Sink>(sink), sink_capacity);
  } catch (const error& e) {
    std::string what = e.what();
    const std::string prefix = std::string(to_string(e.code())) + ": ";
    if (what.rfind(prefix, 0) == 0) what.erase(0, prefix.size());
    return fail(e.code(), std::move(what));
  } catch (const std::exception& e) {
    return fail(errc::aborted, e.what());
  }
  return status::success();
}

/// Run a single stage (convenience).
template <class In, class F, class Source, class Sink>
void run(stage<F> s, Source&& source, Sink&& sink) {
  run<In>(as_chain(std::move(s)), std::forward<Source>(source), std::forward<Sink>(sink));
}

} // namespace dcr::pipeline
