#pragma once
/// \file
/// The two roles the protocol drives, as concepts. The training side's owners
/// and the rollout side's receivers model them (directly or through a small
/// adapter); the coordinator knows nothing else about them.

#include <concepts>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "dcr/codec/item.hpp"
#include "dcr/core/error.hpp"
#include "dcr/core/hash.hpp"

namespace dcr::protocol {

/// How an attempt encodes its records (one enum with the builder's option).
using dcr::refit_mode;

/// What the coordinator asks an owner to build: the complete changed set of
/// its candidate against its (unchanged) committed baseline, stamped with the
/// attempt id and the target version.
struct build_request {
  std::uint64_t attempt = 0;
  std::uint64_t target_version = 0;
  refit_mode mode = refit_mode::mixed;
};

/// Where an owner hands each finished payload (in sequence order). A failed
/// status (e.g. `aborted` after a stop) means: stop building and return it.
using payload_sink = std::function<status(std::vector<std::byte>&&)>;

/// An owner: one training-side rank that owns a set of source elements.
///
/// Minimal complete definition and laws:
///  - `owner_id()`: stable, unique among the transition's owners;
///  - `build(rq, emit)`: emits payloads covering every element of its
///    candidate whose bits differ from its baseline, and nothing else; does not
///    change the baseline; may run again with the same result modulo encoding
///    (`overwrite_all` retries);
///  - `commit_baseline()`: the candidate becomes the baseline (after a joint commit only);
///  - `baseline_digest()` / `candidate_digest()`: deterministic digests of the
///    two states; equal states give equal digests;
///  - calls on distinct owners may run at the same time (the coordinator
///    calls every owner of a step on its own thread); one owner gets one
///    call at a time.
template <class O>
concept owner_role = requires(O& o, const O& co, const build_request& rq,
                              const payload_sink& emit) {
  { co.owner_id() } -> std::convertible_to<std::uint32_t>;
  { o.build(rq, emit) } -> std::same_as<status>;
  { o.commit_baseline() } -> std::same_as<void>;
  { co.baseline_digest() } -> std::same_as<digest128>;
  { co.candidate_digest() } -> std::same_as<digest128>;
};

/// A receiver: one serving rank holding its native-layout weights.
///
/// Minimal complete definition and laws:
///  - `begin_attempt(τ)`: from now on only payloads of attempt τ are accepted;
///    `stage` of any other attempt's payload returns `errc::stale_attempt` and
///    changes nothing; dedupe state starts empty;
///  - `stage(bytes)`: validates the payload completely (digest, header, every
///    table field) and queues it; the same payload twice → `errc::duplicate`,
///    no effect; any invalid payload → its typed error, no effect;
///  - `apply_staged()`: applies every staged payload through the native loader
///    (may fail part way: then storage is a mix, which an `overwrite_all`
///    retry repairs);
///  - `finish()`: flush, device sync and any post-apply check;
///  - `state_digest()`: digest of the complete storage, equal for equal bytes.
template <class R>
concept receiver_role = requires(R& r, const R& cr, std::uint64_t a, std::span<const std::byte> b) {
  { cr.receiver_id() } -> std::convertible_to<std::string>;
  { r.begin_attempt(a) } -> std::same_as<void>;
  { r.stage(b) } -> std::same_as<status>;
  { r.apply_staged() } -> std::same_as<status>;
  { r.finish() } -> std::same_as<status>;
  { cr.state_digest() } -> std::same_as<digest128>;
};

/// Digest of an ordered list of digests (owners in id order, receivers in
/// membership order): binds the whole training side's baseline in one value.
inline digest128 combine(std::span<const digest128> parts) {
  blake2b_128 h;
  for (auto& p : parts) h.update(std::as_bytes(std::span(p)));
  return h.final();
}

} // namespace dcr::protocol
