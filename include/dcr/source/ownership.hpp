#pragma once
/// \file
/// DP ownership. Data-parallel replicas hold bitwise-identical copies, so each
/// unique source element needs exactly one owner: the replica chosen by a
/// stable XXH3 hash of the shard's key. The choice depends only on the key and
/// the replica list, so it is fixed across attempts, processes and builds.

#include <algorithm>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "dcr/core/error.hpp"
#include "dcr/core/hash.hpp"

namespace dcr {

/// Owner among `replicas` (rank ids, in a fixed order) of the shard named `key`.
inline std::uint32_t owner_of(std::string_view key, std::span<const std::uint32_t> replicas) {
  if (replicas.empty())
    throw error(errc::invalid_argument, "owner_of: no replicas for " + std::string(key));
  return replicas[name_hash(key) % replicas.size()];
}

/// Owner among `world` owners of a canonical tensor's residual baseline.
inline std::uint32_t residual_owner_of(std::string_view canonical_name, std::uint32_t world) {
  if (world == 0) throw error(errc::invalid_argument, "residual_owner_of: empty world");
  return static_cast<std::uint32_t>(name_hash(canonical_name) % world);
}

/// How a plan assigns owners (`source_plan::ownership`).
///  - `key_hash` (the default): `owner_of` / `residual_owner_of`. Needs only
///    the key and the replica list, so a rank can compute the owner of a shard
///    without knowing the rest of the plan; uneven when a stage has few large
///    shards.
///  - `balanced`: longest-processing-time greedy over the whole plan: shards
///    in decreasing size (ties by key hash, then key) each go to the replica
///    that owns the fewest bytes so far (ties by the hash of key and rank);
///    residual tasks then go, by decreasing output size, to the rank holding
///    the fewest owned bytes. The result is a function of the plan's contents
///    only (not of the order shards were added), so it is stable across
///    attempts and processes provided every rank builds the same plan, as
///    `megatron_plan` does from the model config and layout.
enum class ownership_policy : std::uint8_t { key_hash, balanced };

/// Bytes per owner and how even they are.
struct balance_report {
  std::vector<std::uint64_t> bytes; ///< per owner
  std::uint64_t total = 0, max = 0, min = 0;
  double mean = 0;
  /// max / mean: 1 is perfect balance; the slowest owner bounds construction.
  double imbalance() const noexcept { return mean > 0 ? static_cast<double>(max) / mean : 1.0; }
};

/// Summarises per-owner byte counts.
inline balance_report make_balance_report(std::vector<std::uint64_t> bytes) {
  balance_report r;
  r.bytes = std::move(bytes);
  for (auto b : r.bytes) r.total += b;
  if (!r.bytes.empty()) {
    r.max = *std::max_element(r.bytes.begin(), r.bytes.end());
    r.min = *std::min_element(r.bytes.begin(), r.bytes.end());
    r.mean = static_cast<double>(r.total) / static_cast<double>(r.bytes.size());
  }
  return r;
}

} // namespace dcr
