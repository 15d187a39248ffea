#pragma once
/// \file
/// What a relay tree carried for one owner in one attempt, as one digest:
/// the relay tree's stand-in for the object store's manifest digest
/// (docs/protocol.md, "Binding an attempt to the owners' manifests"). The
/// owner's writer digests what it sent and reports it with its publish
/// reply; every node's reader digests what it delivered and reports it with
/// its refit reply; the coordinator compares them, so a payload planted in
/// the tree (a process that sent an (owner, sequence) frame first) or one
/// lost on the way fails the attempt, and the node that took it is restored.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dcr/core/error.hpp"
#include "dcr/core/hash.hpp"
#include "dcr/transport/attempt_objects.hpp"

namespace dcr::transport {

/// BLAKE2b-128 (keyed by the job key, if any) over "dcr-relay-stream 1", τ,
/// the owner, the payload count and the BLAKE2b-128 of each payload's
/// bytes, sorted: the tree delivers each payload once but not in a fixed
/// order across owners, and each payload's header carries its sequence
/// number, so the set fixes the stream.
inline digest128 relay_stream_digest(std::uint64_t attempt, std::uint32_t owner,
                                     std::vector<digest128> payloads, const seal_key& key) {
  std::sort(payloads.begin(), payloads.end());
  blake2b_128 h{key};
  const std::string head = "dcr-relay-stream 1\n" + std::to_string(attempt) + " " +
                           std::to_string(owner) + " " + std::to_string(payloads.size()) + "\n";
  h.update(std::as_bytes(std::span(head)));
  for (const auto& d : payloads) h.update(std::as_bytes(std::span(d)));
  return h.final();
}

/// An owner's relay writer that digests what it sent (`manifest_digest`,
/// which the owner link reports as the publish's manifest digest).
template <class Writer>
class digesting_writer {
public:
  digesting_writer(Writer w, std::uint64_t attempt, std::uint32_t owner, const seal_key& key)
      : w_(std::move(w)), attempt_(attempt), owner_(owner), key_(key) {}
  status put_payload(std::span<const std::byte> b) {
    DCR_TRY(w_.put_payload(b));
    sent_.push_back(digest(b));
    return status::success();
  }
  status finish() { return w_.finish(); }
  digest128 manifest_digest() const { return relay_stream_digest(attempt_, owner_, sent_, key_); }

private:
  Writer w_;
  std::uint64_t attempt_;
  std::uint32_t owner_;
  seal_key key_;
  std::vector<digest128> sent_;
};

/// A node's relay reader that digests, per owner, what it delivered
/// (`manifest_digests`, which the node link reports with its refit). Every
/// required owner is reported, one that delivered nothing as the digest of
/// an empty stream.
template <class Reader>
class digesting_reader {
public:
  digesting_reader(Reader r, std::uint64_t attempt, std::vector<std::uint32_t> owners,
                   const seal_key& key)
      : r_(std::move(r)), attempt_(attempt), owners_(std::move(owners)), key_(key) {}
  digesting_reader(digesting_reader&& o) noexcept
      : r_(std::move(o.r_)), attempt_(o.attempt_), owners_(std::move(o.owners_)), key_(o.key_),
        got_(std::move(o.got_)) {}

  template <class Deliver>
  status run(Deliver&& deliver, const std::atomic<bool>& stop,
             std::chrono::steady_clock::time_point deadline) {
    return r_.run(
        [&](std::string_view name, std::span<const std::byte> b) -> status {
          const auto owner = payload_owner(name, attempt_);
          DCR_RETURN_ERROR_IF(!owner, bad_format,
                              "relay tree: payload name " + std::string(name) +
                                  " names no owner of attempt " + std::to_string(attempt_));
          DCR_TRY(deliver(name, b));
          std::lock_guard l(m_); // a node's deliveries may run on several threads
          got_[*owner].push_back(digest(b));
          return status::success();
        },
        stop, deadline);
  }
  std::vector<std::pair<std::uint32_t, digest128>> manifest_digests() const {
    std::lock_guard l(m_);
    std::vector<std::pair<std::uint32_t, digest128>> out;
    for (auto o : owners_) {
      const auto it = got_.find(o);
      out.emplace_back(
          o, relay_stream_digest(attempt_, o,
                                 it == got_.end() ? std::vector<digest128>{} : it->second, key_));
    }
    return out;
  }

private:
  Reader r_;
  std::uint64_t attempt_;
  std::vector<std::uint32_t> owners_;
  seal_key key_;
  mutable std::mutex m_;
  std::map<std::uint32_t, std::vector<digest128>> got_;
};

} // namespace dcr::transport
