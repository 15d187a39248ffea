#pragma once
/// \file
/// The storage sink of a receiver (`receiver<Loader, Sink>`): the policy
/// that says where applied words live besides the host `parameter_store`.
/// `host_sink` (the default) keeps nothing else; `cuda::device_sink` keeps a
/// device copy written by the CUDA kernels (cuda/dcr/gpu/device_sink.hpp),
/// `twin::device_sink` its host twin. Free of Boost and of the payload
/// codec, so that code compiled by nvcc may include it.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>

#include "dcr/codec/values.hpp"
#include "dcr/core/error.hpp"
#include "dcr/receiver/storage.hpp"

namespace dcr {

/// Where a receiver's applied words live besides its host `parameter_store`
/// (the store always holds them: the plan, the state digest, `verify` and
/// the dense refit read it). A sink with `mirrors` keeps its own copy of
/// every parameter, bit for bit equal to the store after every call of the
/// receiver: `attach` copies all parameters (after prewarm and after a dense
/// refit), `refresh` copies one again (after writes the apply stage does not
/// see: copies through loader temporaries, overlapping copies, a failed
/// load), and `scatter<E>` applies `E` at strictly increasing element
/// positions of one parameter, exactly as the host loop did. `concurrent`:
/// `scatter` and `refresh` may run on several threads at once for distinct
/// parameters (required for `apply_threads` other than 1).
template <class S>
concept storage_sink = requires(S& s, const parameter_store& store, std::size_t p,
                                std::span<const std::uint64_t> at,
                                std::span<const std::uint16_t> values) {
  { S::mirrors } -> std::convertible_to<bool>;
  { S::concurrent } -> std::convertible_to<bool>;
  { s.attach(store) } -> std::same_as<status>;
  { s.refresh(store, p) } -> std::same_as<status>;
  { s.template scatter<codec::xor_mask>(p, at, values) } -> std::same_as<status>;
};

/// The default sink: the host store is the only storage (nothing mirrored,
/// every call a no-op that the apply stage compiles away).
struct host_sink {
  static constexpr bool mirrors = false;
  static constexpr bool concurrent = true;
  status attach(const parameter_store&) noexcept { return status::success(); }
  status refresh(const parameter_store&, std::size_t) noexcept { return status::success(); }
  template <codec::delta_encoding E, class W>
  status scatter(std::size_t, std::span<const std::uint64_t>, std::span<const W>) noexcept {
    return status::success();
  }
};
static_assert(storage_sink<host_sink>);

} // namespace dcr
