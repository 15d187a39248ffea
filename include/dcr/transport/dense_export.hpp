#pragma once
/// \file
/// Dense export objects: an owner's committed shard bytes, written to the
/// object store of one commit history so that a rollout node can restore a
/// receiver (or check one) from the committed version alone, independent of
/// every payload. The C++ owner program and the Python owner server write
/// them; the rollout program and its verification read them.

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dcr/core/error.hpp"
#include "dcr/core/hash.hpp"

namespace dcr::transport {

/// Object name of source shard `shard` (a plan shard id) in the dense
/// export of `version`: each owner exports the committed bytes of the shards
/// it owns, and a reader assembles the canonical tensors from all of them.
inline std::string dense_shard_name(std::uint64_t version, std::uint32_t shard) {
  return "dense/v" + std::to_string(version) + "/shard/" + std::to_string(shard);
}

/// Dense export objects are sealed: the shard's committed bytes, then 16
/// bytes of BLAKE2b-128 over "dcr-dense 1\n", the incarnation, "\n", the
/// object name, "\n" and the bytes, keyed by the job key when there is one.
/// A restore reads the committed state from these objects alone, so with a
/// job key anyone who can write the bucket but lacks the key cannot make a
/// receiver restore from bytes no owner exported; the name and incarnation
/// in the seal stop a genuine object from being replayed as another
/// version's or shard's. Without a key the seal is a checksum (damage only).
inline digest128 dense_shard_seal(std::string_view incarnation, std::string_view name,
                                  std::span<const std::byte> bytes, const seal_key& key) {
  const std::string head =
      "dcr-dense 1\n" + std::string(incarnation) + "\n" + std::string(name) + "\n";
  return blake2b_128{key}.update(std::as_bytes(std::span(head))).update(bytes).final();
}
inline constexpr std::size_t dense_seal_bytes = 16;

/// The object `dense_shard_name` names: `bytes` and their seal.
inline std::vector<std::byte> seal_dense_shard(std::string_view incarnation, std::string_view name,
                                               std::span<const std::byte> bytes,
                                               const seal_key& key) {
  std::vector<std::byte> out(bytes.size() + dense_seal_bytes);
  std::memcpy(out.data(), bytes.data(), bytes.size());
  const auto d = dense_shard_seal(incarnation, name, bytes, key);
  std::memcpy(out.data() + bytes.size(), d.data(), d.size());
  return out;
}

/// Check and strip the seal of a dense export object read as `name` under
/// `incarnation`: `digest_mismatch` (naming the object) when it was
/// modified, forged, moved from another name or sealed with another key;
/// `truncated` when it is shorter than a seal.
inline status open_dense_shard(std::string_view incarnation, std::string_view name,
                               std::vector<std::byte>& object, const seal_key& key) {
  DCR_RETURN_ERROR_IF(object.size() < dense_seal_bytes, truncated,
                      "dense export " + std::string(name) + ": " + std::to_string(object.size()) +
                          " bytes, shorter than its seal");
  const auto n = object.size() - dense_seal_bytes;
  digest128 want{};
  std::memcpy(want.data(), object.data() + n, want.size());
  const auto got = dense_shard_seal(incarnation, name, std::span(object).first(n), key);
  DCR_RETURN_ERROR_IF(!same_digest(got, want), digest_mismatch,
                      "dense export " + std::string(name) +
                          (key.empty() ? ": seal does not match its contents (damaged or moved)"
                                       : ": keyed seal does not match its contents (damaged, "
                                         "forged, moved, or sealed without the job key)"));
  object.resize(n);
  return status::success();
}

} // namespace dcr::transport
