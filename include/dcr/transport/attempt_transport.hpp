#pragma once
/// \file
/// What the coordinator needs from a transport, per attempt τ: an owner-side
/// writer and a receiver-side reader with the contract of `attempt_writer` /
/// `attempt_reader` (attempt_objects.hpp), and garbage collection of attempts
/// `<= τ` after τ commits. An object store is adapted to it with the
/// per-attempt object layout; a relay tree (relay_tree.hpp) models it directly.

#include <atomic>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string_view>
#include <vector>

#include "dcr/core/error.hpp"
#include "dcr/transport/attempt_objects.hpp"
#include "dcr/transport/object_store.hpp"

namespace dcr::transport {

/// Callback a reader hands each payload to: (name unique within the attempt, bytes).
using payload_delivery = std::function<status(std::string_view, std::span<const std::byte>)>;

/// A transport that carries one attempt's payloads from owners to receivers.
///
/// Minimal complete definition and laws:
///  - `open_writer(τ, owner)` returns a writer with `put_payload(bytes)` (each
///    payload once, in the owner's sequence order) and `finish()` (the
///    owner's part of τ is complete; a failure is a typed status, never a
///    silent success);
///  - `open_reader(τ, receiver, owners)` returns a reader for receiver index
///    `receiver` whose `run(deliver, stop, deadline)` hands every payload of
///    τ to `deliver` exactly once and succeeds only when every owner in
///    `owners` has finished and all of its payloads were delivered; `stop` or
///    the deadline end it with `errc::aborted`;
///  - `collect(τ, removed)` releases what attempts `<= τ` hold (may do nothing).
template <class T>
concept attempt_transport = requires(T& t, std::uint64_t attempt, std::uint32_t owner,
                                     std::size_t receiver, std::vector<std::uint32_t> owners,
                                     std::span<const std::byte> bytes,
                                     const payload_delivery& deliver, const std::atomic<bool>& stop,
                                     std::chrono::steady_clock::time_point deadline,
                                     std::size_t* removed) {
  { t.open_writer(attempt, owner).put_payload(bytes) } -> std::same_as<status>;
  { t.open_writer(attempt, owner).finish() } -> std::same_as<status>;
  { t.open_reader(attempt, receiver, owners).run(deliver, stop, deadline) } -> std::same_as<status>;
  { t.collect(attempt, removed) } -> std::same_as<status>;
};

/// What a coordinator can run over: an object store or an attempt transport.
template <class T>
concept attempt_medium = object_store<T> || attempt_transport<T>;

/// Owner-side writer of attempt τ over either kind of medium.
template <attempt_medium M>
auto open_writer(M& m, std::uint64_t attempt, std::uint32_t owner) {
  if constexpr (attempt_transport<M>)
    return m.open_writer(attempt, owner);
  else
    return attempt_writer<M>(m, attempt, owner);
}

/// Reader of attempt τ for receiver index `receiver` (an object store ignores the index).
template <attempt_medium M>
auto open_reader(M& m, std::uint64_t attempt, std::size_t receiver,
                 std::vector<std::uint32_t> owners) {
  if constexpr (attempt_transport<M>)
    return m.open_reader(attempt, receiver, std::move(owners));
  else
    return attempt_reader<M>(m, attempt, std::move(owners));
}

/// Release what attempts `<= up_to` left behind.
template <attempt_medium M>
status collect(M& m, std::uint64_t up_to, std::size_t* removed = nullptr) {
  if constexpr (attempt_transport<M>)
    return m.collect(up_to, removed);
  else
    return collect_attempts(m, up_to, removed);
}

} // namespace dcr::transport
