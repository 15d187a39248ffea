#pragma once
/// \file
/// Per-attempt layout of an object store and the manifests that make an
/// attempt's payload set explicit.
///
/// Layout (all names valid object names, zero-padded so that lexicographic
/// listing order is numeric order):
/// ```
/// attempt/<τ:20>/payload/o<owner:10>-s<seq:10>   one payload, uploaded once
/// attempt/<τ:20>/index/o<owner:10>-s<seq:10>     its entry, written once the payload is durable
/// attempt/<τ:20>/manifest/o<owner:10>            that owner's manifest, published last
/// ```
/// The coordinator places these names under `incarnation/<id>/` through an
/// `incarnation_scope`, `id` being its commit history's incarnation (see
/// `commit_record::incarnation`): attempt ids restart when a commit record is
/// lost, and the scope keeps a new history from ever listing or reading the
/// objects of an old one.
/// A manifest is text: `dcr-manifest 2|3`, `incarnation <id|none>`, `attempt τ`,
/// `owner o`, `payloads n`, then n lines `<name> <bytes> <blake2b-128 hex>`
/// (version 3: each followed by ` -`, no index, or ` k` and k lines
/// `<shared> <suffix>`, the payload's canonical tensor names, sorted and
/// front-coded: the tensor -> payload index), then `digest <hex>` of all
/// bytes before that line (docs/protocol.md).
///
/// A payload's index object is a manifest of one entry, that payload's (the
/// same text, sealed the same way), written right after the payload: its
/// presence says the payload is durable, and its entry says which tensors
/// the payload updates, so a filtered reader can decide to fetch it while
/// the owner is still constructing, long before the owner's manifest. The
/// index object is a hint, never a binding: what a reader applies is
/// checked against the owner's manifest, whose digest the owner reports to
/// the coordinator (`publish_report::manifest_digest`), so a forged or stale
/// index object can make a reader fetch bytes it then drops, never apply
/// them. A per-payload object was chosen over tensor names in the payload
/// name (S3 keys hold 1024 bytes, an index can hold thousands of names) and
/// over a chain of partial manifests (a reader would have to read and link
/// every link of the chain, and the coordinator's binding would have to name
/// the chain's last link; one entry per object keeps the manifest, its
/// digest and the binding exactly as they were).

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dcr/core/error.hpp"
#include "dcr/core/hash.hpp"
#include "dcr/transport/object_store.hpp"

namespace dcr::transport {

namespace detail {
inline std::string pad(std::uint64_t v, int width) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%0*llu", width, static_cast<unsigned long long>(v));
  return buf;
}
} // namespace detail

/// "attempt/<τ>/": every object of attempt τ lies under this prefix.
inline std::string attempt_prefix(std::uint64_t attempt) {
  return "attempt/" + detail::pad(attempt, 20) + "/";
}
/// Object name of payload `seq` of `owner` in attempt τ.
inline std::string payload_name(std::uint64_t attempt, std::uint32_t owner, std::uint32_t seq) {
  return attempt_prefix(attempt) + "payload/o" + detail::pad(owner, 10) + "-s" +
         detail::pad(seq, 10);
}
/// Object name of `owner`'s manifest in attempt τ.
inline std::string manifest_name(std::uint64_t attempt, std::uint32_t owner) {
  return attempt_prefix(attempt) + "manifest/o" + detail::pad(owner, 10);
}
/// Object name of the index object of payload `seq` of `owner` in attempt τ
/// (a one-entry manifest, written once that payload is durable).
inline std::string index_name(std::uint64_t attempt, std::uint32_t owner, std::uint32_t seq) {
  return attempt_prefix(attempt) + "index/o" + detail::pad(owner, 10) + "-s" + detail::pad(seq, 10);
}

/// Whether attempt writers put an index object beside each payload on
/// `store` (its own `index_objects()` where it has one, else true). Only
/// filtered readers read them; where every reader fetches every payload,
/// leaving them out saves a PUT per payload. A filtered reader on a store
/// without them fetches an owner's payloads once its manifest is in.
template <class Store>
bool index_objects_of(const Store& store) {
  if constexpr (requires {
                  { store.index_objects() } -> std::convertible_to<bool>;
                })
    return store.index_objects();
  else
    return true;
}

/// How many requests attempt writers and readers keep in flight on `store`
/// (its own `requests_in_flight()` where it has one, else 1: one at a time,
/// on the caller's thread, which is all a store that is not thread-safe
/// allows). More than one needs a thread-safe store.
template <class Store>
std::size_t requests_in_flight_of(const Store& store) {
  if constexpr (requires {
                  { store.requests_in_flight() } -> std::convertible_to<std::size_t>;
                })
    return std::max<std::size_t>(1, store.requests_in_flight());
  else
    return 1;
}

/// The job key manifests on `store` are sealed with (empty when the store
/// carries none: unkeyed).
template <class Store>
dcr::seal_key seal_key_of(const Store& store) {
  if constexpr (requires {
                  { store.seal_key() } -> std::convertible_to<dcr::seal_key>;
                })
    return store.seal_key();
  else
    return {};
}

/// An object store seen through one commit history's namespace: every name
/// is stored as `incarnation/<id>/<name>`, and `list` shows only (and strips)
/// that prefix. Attempt writers and readers over it carry the id in their
/// manifests and refuse a manifest of another incarnation. A scope made
/// with a job `key` also seals (and requires) every manifest keyed with it,
/// so only holders of the key can publish what its readers take.
template <object_store Store>
class incarnation_scope {
public:
  /// `id`: 32 lower-case hex digits; throws `dcr::error(invalid_argument)`
  /// otherwise. Manifests are sealed with the store's own key, if it
  /// carries one (`seal_key_of`).
  incarnation_scope(Store& store, std::string id)
      : incarnation_scope(store, std::move(id), seal_key_of(store)) {}
  /// As above, manifests sealed with `key` (empty: unkeyed).
  incarnation_scope(Store& store, std::string id, dcr::seal_key key)
      : store_(&store), id_(std::move(id)), key_(key) {
    if (!valid_incarnation(id_))
      throw error(errc::invalid_argument,
                  "incarnation_scope: '" + id_ + "' is not 32 lower-case hex digits");
    prefix_ = "incarnation/" + id_ + "/";
  }
  const std::string& incarnation() const noexcept { return id_; }
  /// The job key manifests in this scope are sealed with (empty: unkeyed).
  const dcr::seal_key& seal_key() const noexcept { return key_; }
  /// Where this scope's objects lie in the underlying store.
  const std::string& prefix() const noexcept { return prefix_; }

  status put(std::string_view name, std::span<const std::byte> bytes) {
    DCR_TRY(validate_object_name(name));
    return store_->put(prefix_ + std::string(name), bytes);
  }
  status get(std::string_view name, std::vector<std::byte>& out) {
    DCR_TRY(validate_object_name(name));
    return store_->get(prefix_ + std::string(name), out);
  }
  status list(std::string_view prefix, std::vector<std::string>& names) {
    DCR_TRY(validate_object_prefix(prefix));
    DCR_TRY(store_->list(prefix_ + std::string(prefix), names));
    for (auto& n : names) n.erase(0, prefix_.size());
    return status::success();
  }
  status list_after(std::string_view prefix, std::string_view after,
                    std::vector<std::string>& names) {
    DCR_TRY(validate_object_prefix(prefix));
    DCR_TRY(list_names_after(*store_, prefix_ + std::string(prefix), prefix_ + std::string(after),
                             names));
    for (auto& n : names) n.erase(0, prefix_.size());
    return status::success();
  }
  status remove(std::string_view name) {
    DCR_TRY(validate_object_name(name));
    return store_->remove(prefix_ + std::string(name));
  }
  std::chrono::microseconds list_poll_max() const requires requires(const Store& s) {
    s.list_poll_max();
  }
  { return std::chrono::microseconds(store_->list_poll_max()); }
  std::size_t requests_in_flight() const { return requests_in_flight_of(*store_); }
  bool index_objects() const { return index_objects_of(*store_); }

private:
  Store* store_;
  std::string id_, prefix_;
  dcr::seal_key key_;
};

/// The incarnation attempt objects on `store` are bound to ("" when unscoped).
template <class Store>
std::string incarnation_of(const Store& store) {
  if constexpr (requires {
                  { store.incarnation() } -> std::convertible_to<std::string>;
                })
    return store.incarnation();
  else
    return {};
}

/// One listed payload.
struct manifest_entry {
  std::string name;
  std::uint64_t bytes = 0;
  digest128 digest{};
  /// The canonical tensors the payload updates, sorted, without repeats:
  /// the manifest's tensor -> payload index. Absent (version 2 manifests,
  /// or a writer that could not say) means "may update anything": every
  /// reader fetches such a payload.
  std::optional<std::vector<std::string>> tensors;
  friend bool operator==(const manifest_entry&, const manifest_entry&) = default;
};

/// Bounds of a manifest's index: tensor names per payload and in all, and
/// bytes per name (a payload item's name has at most 65535).
inline constexpr std::uint64_t manifest_max_tensors = std::uint64_t{1} << 24;
inline constexpr std::uint64_t manifest_max_name = 65535;

/// Whether `name` can be stored in a manifest's index: non-empty, at most
/// `manifest_max_name` bytes of printable ASCII other than space (the text
/// form separates tokens by white space).
inline bool indexable_tensor_name(std::string_view name) noexcept {
  if (name.empty() || name.size() > manifest_max_name) return false;
  for (char c : name)
    if (c <= ' ' || c > '~') return false;
  return true;
}

/// An owner's list of the payloads it uploaded in one attempt.
struct manifest {
  std::string incarnation; ///< "" for an unscoped store (serialised as `none`)
  std::uint64_t attempt = 0;
  std::uint32_t owner = 0;
  std::vector<manifest_entry> payloads;
  friend bool operator==(const manifest&, const manifest&) = default;
};

/// Text form (see file comment). Entries with an index are written in
/// version 3 (each name front-coded against the previous one of its entry);
/// a manifest without any index is written as version 2, byte for byte
/// what older writers wrote. Throws `invalid_argument` for an index that is
/// not sorted and unique or holds a name `indexable_tensor_name` refuses.
/// `key`: the job key of the seal (empty: unkeyed).
inline std::string serialize_manifest(const manifest& m, const seal_key& key = {}) {
  bool indexed = false;
  for (auto& e : m.payloads) indexed = indexed || e.tensors.has_value();
  std::ostringstream o;
  o << "dcr-manifest " << (indexed ? 3 : 2) << "\nincarnation "
    << (m.incarnation.empty() ? std::string("none") : m.incarnation) << "\nattempt " << m.attempt
    << "\nowner " << m.owner << "\npayloads " << m.payloads.size() << "\n";
  for (auto& e : m.payloads) {
    o << e.name << " " << e.bytes << " " << to_hex(e.digest);
    if (indexed) {
      if (!e.tensors) {
        o << " -\n";
        continue;
      }
      o << " " << e.tensors->size() << "\n";
      const std::string* prev = nullptr;
      for (auto& t : *e.tensors) {
        if (!indexable_tensor_name(t) || (prev && !(*prev < t)))
          throw error(errc::invalid_argument,
                      "manifest: index of '" + e.name + "' is not sorted unique printable names");
        std::size_t shared = 0;
        if (prev)
          while (shared < prev->size() && shared < t.size() && (*prev)[shared] == t[shared])
            ++shared;
        // A strictly greater name never is a prefix of the previous one, so
        // the suffix is never empty.
        o << shared << " " << std::string_view(t).substr(shared) << "\n";
        prev = &t;
      }
    } else {
      o << "\n";
    }
  }
  return seal_text(o.str(), key);
}

/// Parse a manifest (version 2 or 3); checks its digest, every field and
/// every name, and that each index is sorted and unique with its counts
/// bounded (`manifest_max_tensors` in all). `key`: the job key it must be
/// sealed with (empty: unkeyed); any other seal is `digest_mismatch`.
inline status parse_manifest(std::string_view text, manifest& out, const seal_key& key = {}) {
  std::string_view body;
  DCR_TRY(open_sealed_text(text, "manifest", body, key));
  std::istringstream in{std::string(body)};
  std::string magic, k0, k1, k2, k3, inc;
  manifest m;
  std::uint64_t owner = 0, n = 0;
  std::string ver;
  in >> magic >> ver;
  DCR_RETURN_ERROR_IF(!in || magic != "dcr-manifest", bad_format, "manifest: malformed header");
  DCR_RETURN_ERROR_IF(ver != "2" && ver != "3", unsupported_version, "manifest: version " + ver);
  const bool indexed = ver == "3";
  in >> k0 >> inc >> k1 >> m.attempt >> k2 >> owner >> k3 >> n;
  DCR_RETURN_ERROR_IF(!in || k0 != "incarnation" || k1 != "attempt" || k2 != "owner" ||
                          k3 != "payloads",
                      bad_format, "manifest: malformed header");
  DCR_RETURN_ERROR_IF(inc != "none" && !valid_incarnation(inc), bad_format,
                      "manifest: incarnation '" + inc + "' is not 32 lower-case hex digits");
  if (inc != "none") m.incarnation = inc;
  DCR_RETURN_ERROR_IF(owner > 0xFFFFFFFFu || n > (1u << 24), bad_format,
                      "manifest: owner or count out of range");
  m.owner = static_cast<std::uint32_t>(owner);
  std::set<std::string> names;
  std::uint64_t indexed_names = 0;
  for (std::uint64_t i = 0; i < n; ++i) {
    manifest_entry e;
    std::string hex;
    in >> e.name >> e.bytes >> hex;
    DCR_RETURN_ERROR_IF(!in || !parse_hex_digest(hex, e.digest), bad_format,
                        "manifest: malformed entry " + std::to_string(i));
    DCR_TRY(validate_object_name(e.name));
    DCR_RETURN_ERROR_IF(e.name.rfind(attempt_prefix(m.attempt), 0) != 0, bad_format,
                        "manifest: entry '" + e.name + "' is outside its attempt prefix");
    DCR_RETURN_ERROR_IF(!names.insert(e.name).second, bad_format,
                        "manifest: entry '" + e.name + "' listed twice");
    if (indexed) {
      std::string count;
      in >> count;
      DCR_RETURN_ERROR_IF(!in, bad_format, "manifest: entry '" + e.name + "' lacks its index");
      if (count != "-") {
        std::uint64_t k = 0;
        DCR_RETURN_ERROR_IF(count.empty() || count.size() > 9 ||
                                count.find_first_not_of("0123456789") != std::string::npos,
                            bad_format,
                            "manifest: entry '" + e.name + "': index count '" + count + "'");
        k = std::stoull(count);
        DCR_RETURN_ERROR_IF(k > manifest_max_tensors - indexed_names, bad_format,
                            "manifest: more than " + std::to_string(manifest_max_tensors) +
                                " indexed tensor names");
        indexed_names += k;
        std::vector<std::string> t;
        for (std::uint64_t j = 0; j < k; ++j) {
          std::uint64_t shared = 0;
          std::string suffix;
          in >> shared >> suffix;
          const auto where = "manifest: entry '" + e.name + "', tensor " + std::to_string(j);
          DCR_RETURN_ERROR_IF(!in, bad_format, where + ": malformed");
          DCR_RETURN_ERROR_IF(shared > (t.empty() ? 0 : t.back().size()), bad_format,
                              where + ": shares " + std::to_string(shared) +
                                  " bytes with a shorter previous name");
          std::string name = t.empty() ? suffix : t.back().substr(0, shared) + suffix;
          DCR_RETURN_ERROR_IF(!indexable_tensor_name(name), bad_format,
                              where + ": not a printable name of at most " +
                                  std::to_string(manifest_max_name) + " bytes");
          DCR_RETURN_ERROR_IF(!t.empty() && !(t.back() < name), bad_format,
                              where + ": '" + name + "' is not after '" + t.back() +
                                  "' (the index is sorted, without repeats)");
          t.push_back(std::move(name));
        }
        e.tensors = std::move(t);
      }
    }
    m.payloads.push_back(std::move(e));
  }
  std::string rest;
  DCR_RETURN_ERROR_IF(in >> rest, trailing_bytes, "manifest: unexpected text after entries");
  out = std::move(m);
  return status::success();
}

namespace detail {
/// The number in the 10 decimal digits of `name` from `at` (owner ids and
/// sequence numbers of payload and manifest names), if they are digits of a
/// 32-bit number.
inline std::optional<std::uint32_t> owner_digits(std::string_view name, std::size_t at) {
  std::uint64_t v = 0;
  for (std::size_t i = at; i < at + 10; ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    v = v * 10 + static_cast<std::uint64_t>(name[i] - '0');
  }
  if (v > 0xFFFFFFFFu) return std::nullopt;
  return static_cast<std::uint32_t>(v);
}
} // namespace detail

/// The owner named by a payload name of attempt τ, if it is one.
inline std::optional<std::uint32_t> payload_owner(std::string_view name, std::uint64_t attempt) {
  const auto p = attempt_prefix(attempt) + "payload/o";
  if (name.size() != p.size() + 10 + 2 + 10 || name.compare(0, p.size(), p) != 0)
    return std::nullopt;
  return detail::owner_digits(name, p.size());
}

/// The sequence number named by a payload name of attempt τ, if it is one.
inline std::optional<std::uint32_t> payload_sequence(std::string_view name, std::uint64_t attempt) {
  if (!payload_owner(name, attempt) || name[name.size() - 12] != '-' ||
      name[name.size() - 11] != 's')
    return std::nullopt;
  return detail::owner_digits(name, name.size() - 10);
}

/// The owner and sequence number named by an index object name of attempt τ,
/// if it is one.
inline std::optional<std::pair<std::uint32_t, std::uint32_t>>
index_owner_sequence(std::string_view name, std::uint64_t attempt) {
  const auto p = attempt_prefix(attempt) + "index/o";
  if (name.size() != p.size() + 10 + 2 + 10 || name.compare(0, p.size(), p) != 0 ||
      name[p.size() + 10] != '-' || name[p.size() + 11] != 's')
    return std::nullopt;
  const auto o = detail::owner_digits(name, p.size());
  const auto s = detail::owner_digits(name, p.size() + 12);
  if (!o || !s) return std::nullopt;
  return std::pair{*o, *s};
}

/// The owner named by a manifest name of attempt τ, if it is one.
inline std::optional<std::uint32_t> manifest_owner(std::string_view name, std::uint64_t attempt) {
  const auto p = attempt_prefix(attempt) + "manifest/o";
  if (name.size() != p.size() + 10 || name.compare(0, p.size(), p) != 0) return std::nullopt;
  return detail::owner_digits(name, p.size());
}

} // namespace dcr::transport
