#pragma once
/// \file
/// The object-store transport of one attempt, in one include: the layout
/// and manifests (attempt_manifest.hpp), the owner's writer
/// (attempt_writer.hpp), the receiver's reader (attempt_reader.hpp), and
/// here what the coordinator reads of an attempt after the fact
/// (`read_listed`) and the collection of attempts no receiver needs.

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "dcr/core/error.hpp"
#include "dcr/core/hash.hpp"
#include "dcr/transport/attempt_manifest.hpp"
#include "dcr/transport/attempt_reader.hpp"
#include "dcr/transport/attempt_writer.hpp"
#include "dcr/transport/object_store.hpp"

namespace dcr::transport {

/// What the well-formed manifests of attempt τ on `store` list: payload name
/// → digest, and the owners whose manifest is there (manifests of another
/// incarnation or attempt, under a name that is not their owner's, or listing
/// another owner's payload names, which every reader refuses, count as
/// absent). After a failed attempt the coordinator checks what each receiver
/// staged against this, and `found` against what the owners reported: per
/// owner that an object under the manifest names is named for, the digest
/// of its bytes as read now (well-formed or not), or none where it is listed
/// but could not be read.
struct listed_payloads {
  std::map<std::string, digest128> entries;
  std::set<std::uint32_t> owners;
  std::map<std::uint32_t, std::optional<digest128>> found;
};
template <object_store Store>
status read_listed(Store& store, std::uint64_t attempt, listed_payloads& out) {
  out = {};
  std::vector<std::string> names;
  DCR_TRY(store.list(attempt_prefix(attempt) + "manifest/", names));
  std::vector<std::byte> bytes;
  for (auto& n : names) {
    const auto named = manifest_owner(n, attempt);
    if (!store.get(n, bytes)) {
      if (named) out.found[*named] = std::nullopt;
      continue;
    }
    if (named) out.found[*named] = digest(bytes);
    manifest m;
    if (!parse_manifest(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()),
                        m, seal_key_of(store)))
      continue;
    if (m.incarnation != incarnation_of(store) || m.attempt != attempt ||
        n != manifest_name(attempt, m.owner))
      continue;
    bool own = true;
    for (auto& e : m.payloads) own = own && payload_owner(e.name, attempt) == m.owner;
    if (!own) continue;
    out.owners.insert(m.owner);
    for (auto& e : m.payloads) out.entries.emplace(e.name, e.digest);
  }
  return status::success();
}

/// Parse the attempt id out of an object name under `attempt/`; 0 if none.
inline std::uint64_t attempt_of(std::string_view name) {
  if (name.rfind("attempt/", 0) != 0 || name.size() < 29 || name[28] != '/') return 0;
  std::uint64_t v = 0;
  for (std::size_t i = 8; i < 28; ++i) {
    if (name[i] < '0' || name[i] > '9') return 0;
    v = v * 10 + static_cast<std::uint64_t>(name[i] - '0');
  }
  return v;
}

/// Remove every object of every attempt `<= up_to` (after the commit of
/// attempt `up_to`, no receiver needs them: new receivers restore densely).
template <object_store Store>
status collect_attempts(Store& store, std::uint64_t up_to, std::size_t* removed = nullptr) {
  std::vector<std::string> names;
  DCR_TRY(store.list("attempt/", names));
  std::size_t n = 0;
  for (auto& name : names) {
    const auto a = attempt_of(name);
    if (a == 0 || a > up_to) continue;
    auto s = store.remove(name);
    if (!s && s.code != errc::not_found) return s;
    ++n;
  }
  if (removed) *removed = n;
  return status::success();
}

} // namespace dcr::transport
