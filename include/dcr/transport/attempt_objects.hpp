#pragma once
/// \file
/// Per-attempt layout of an object store and the manifests that make an
/// attempt's payload set explicit.
///
/// Layout (all names valid object names, zero-padded so that lexicographic
/// listing order is numeric order):
/// ```
/// attempt/<τ:20>/payload/o<owner:10>-s<seq:10>   one payload, uploaded once
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
/// bytes before that line (docs/protocol.md). A reader with a filter
/// (`attempt_reader::need_only`) fetches only the payloads whose index names
/// a tensor it needs, once their owner's manifest is in (as soon as it is,
/// whether or not the other owners' manifests are). An owner publishes its
/// manifest only after every payload it lists is published, so a receiver
/// that sees every required owner's manifest knows the complete payload set
/// of the attempt; the reader completes only when the payloads it delivered
/// are exactly that set, digest for digest (an unlisted object under a
/// required owner's payload names fails the attempt; objects under no
/// required owner's name are never fetched). A waiting reader lists, per
/// owner whose manifest it lacks, only the names after the last it saw
/// (`list_after`, S3's `start-after`), so polling costs the new names only. A retry uploads its
/// complete changed set again under its own attempt prefix; no object is ever overwritten.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <concepts>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
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

/// Owner side of one attempt: uploads payloads once each, then the manifest.
template <object_store Store>
class attempt_writer {
public:
  attempt_writer(Store& store, std::uint64_t attempt, std::uint32_t owner)
      : store_(&store), m_{incarnation_of(store), attempt, owner, {}} {}

  /// Upload the next payload (sequence numbers 0, 1, ...), listed without
  /// an index (every reader fetches it).
  status put_payload(std::span<const std::byte> bytes) { return put(bytes, std::nullopt); }
  /// Upload the next payload and list the canonical tensors it updates in
  /// the manifest's index, so a reader that holds none of them skips it.
  /// `tensors` is sorted and deduplicated here; a name the index cannot hold
  /// (`indexable_tensor_name`) lists the payload without an index instead.
  status put_payload(std::span<const std::byte> bytes, std::vector<std::string> tensors) {
    std::sort(tensors.begin(), tensors.end());
    tensors.erase(std::unique(tensors.begin(), tensors.end()), tensors.end());
    bool ok = indexed_ + tensors.size() <= manifest_max_tensors;
    for (auto& t : tensors) ok = ok && indexable_tensor_name(t);
    if (ok) indexed_ += tensors.size();
    return put(bytes, ok ? std::optional(std::move(tensors)) : std::nullopt);
  }
  /// Publish the manifest; after this the owner's part of the attempt is complete.
  status finish() {
    const auto text = serialize_manifest(m_, seal_key_of(*store_));
    const auto bytes = std::as_bytes(std::span(text));
    DCR_TRY(store_->put(manifest_name(m_.attempt, m_.owner), bytes));
    manifest_digest_ = digest(bytes);
    return status::success();
  }
  const manifest& listed() const noexcept { return m_; }
  /// After a successful `finish`: the digest of the manifest's bytes as
  /// written. The owner reports it at publish, and the coordinator commits
  /// only if every reader took exactly these bytes as the owner's manifest
  /// (anyone else's manifest under the owner's name fails the attempt).
  const digest128& manifest_digest() const noexcept { return manifest_digest_; }

private:
  status put(std::span<const std::byte> bytes, std::optional<std::vector<std::string>> tensors) {
    auto name = payload_name(m_.attempt, m_.owner, static_cast<std::uint32_t>(m_.payloads.size()));
    DCR_TRY(store_->put(name, bytes));
    m_.payloads.push_back({std::move(name), bytes.size(), digest(bytes), std::move(tensors)});
    return status::success();
  }

  Store* store_;
  manifest m_;
  digest128 manifest_digest_{};
  std::uint64_t indexed_ = 0; ///< tensor names in the index so far
};

/// What a filtered reader asks of each indexed tensor name: does this
/// reader (a rollout node) need any update of it?
using tensor_filter = std::function<bool(std::string_view)>;

/// How often a waiting reader lists its attempt: right after progress it
/// waits `min`, then twice as long after each empty listing, up to `max`.
struct poll_policy {
  std::chrono::microseconds min{100};
  std::chrono::microseconds max{5000};
};

/// The poll policy for `store`: its own `list_poll_max()` bound where it has
/// one (a LIST request to S3 is billed and rate-limited per prefix, a
/// directory listing is cheap), 5 ms otherwise.
template <class Store>
poll_policy default_poll_policy(const Store& store) {
  poll_policy p;
  if constexpr (requires {
                  { store.list_poll_max() } -> std::convertible_to<std::chrono::microseconds>;
                })
    p.max = std::max(p.min, std::chrono::microseconds(store.list_poll_max()));
  return p;
}

/// Receiver side of one attempt: fetches payloads as they are published (so
/// application overlaps upload) and completes once every required owner's
/// manifest is present and every listed payload was delivered exactly once.
template <object_store Store>
class attempt_reader {
public:
  attempt_reader(Store& store, std::uint64_t attempt, std::vector<std::uint32_t> owners)
      : attempt_reader(store, attempt, std::move(owners), default_poll_policy(store)) {}
  attempt_reader(Store& store, std::uint64_t attempt, std::vector<std::uint32_t> owners,
                 poll_policy poll)
      : store_(&store), attempt_(attempt), owners_(owners.begin(), owners.end()), poll_(poll) {
    if (poll_.min.count() <= 0 || poll_.max < poll_.min)
      throw error(errc::invalid_argument,
                  "attempt_reader: poll interval bounds must satisfy 0 < min <= max");
  }

  /// Fetch only what the index says this reader needs: a payload whose
  /// manifest entry carries an index is fetched only when `need` accepts
  /// one of its tensors; a payload without an index is always fetched.
  /// Payloads of an owner are then fetched only after that owner's manifest
  /// is in (its index is what tells), so a filtered reader gives up the
  /// overlap of fetch with the owner's upload for the bytes it skips; they
  /// are fetched as soon as it is in, while other owners' manifests are
  /// still awaited. Set before `run`; an empty function means no filter.
  void need_only(tensor_filter need) { need_ = std::move(need); }

  /// Listings made so far (each is one `list` or `list_after` call on the store).
  std::size_t listings() const noexcept { return listings_; }
  /// Poll rounds made so far (each lists every owner still pending once).
  std::size_t polls() const noexcept { return polls_; }

  /// Poll until complete, `stop` becomes true (`errc::aborted`) or `deadline`
  /// passes (`errc::aborted`). `deliver(name, bytes)` is called once per
  /// payload; its failure ends the read with that status. Payloads are
  /// delivered in listing order as they appear, each owner's in its sequence
  /// order; once an owner's manifest is in, its remaining payloads are
  /// fetched by name at once (not after the last owner's manifest), so a
  /// slow owner delays only its own payloads. A listed payload that is
  /// missing (`not_found`) or differs from its manifest entry
  /// (`digest_mismatch`) fails the read.
  template <class Deliver>
  status run(Deliver&& deliver, const std::atomic<bool>& stop,
             std::chrono::steady_clock::time_point deadline) {
    const auto manifests = attempt_prefix(attempt_) + "manifest/";
    std::vector<std::string> names;
    std::vector<std::byte> bytes;
    auto sleep = poll_.min;
    for (;;) {
      DCR_RETURN_ERROR_IF(stop.load(), aborted, "attempt " + std::to_string(attempt_) + " stopped");
      bool progress = false;
      ++polls_;
      // Payloads: one listing per required owner whose manifest has not come
      // yet, of the names after the last one delivered from it (S3
      // start-after where the store has it), so a poll costs the new names,
      // not the whole attempt again. Objects under no required owner's name
      // are never fetched. Once an owner's manifest is in, its remaining
      // payloads are fetched by name (below).
      for (auto o : owners_) {
        if (need_) break; // filtered: payloads are chosen from the manifests (finish)
        if (manifests_.count(manifest_name(attempt_, o))) continue;
        auto& last = last_seen_[o];
        ++listings_;
        DCR_TRY(list_names_after(*store_, owner_payload_prefix(o), last, names));
        for (auto& n : names) {
          last = n;
          if (delivered_.count(n)) continue;
          DCR_TRY(fetch(n, bytes));
          DCR_TRY(deliver(std::string_view(n), std::span<const std::byte>(bytes)));
          delivered_bytes_ += bytes.size();
          delivered_.emplace(n, digest(bytes));
          progress = true;
        }
      }
      ++listings_;
      DCR_TRY(store_->list(manifests, names));
      for (auto& n : names) {
        if (manifests_.count(n)) continue;
        DCR_TRY(fetch(n, bytes));
        manifest m;
        DCR_TRY(parse_manifest(
            std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), m,
            seal_key_of(*store_)));
        DCR_TRY(check_manifest(n, m));
        read_digests_[m.owner] = digest(bytes);
        manifests_.emplace(n, std::move(m));
        progress = true;
      }
      // Every owner whose manifest is in: the payloads it lists that this
      // reader needs and has not delivered, by name, in its sequence order,
      // checked against their entries before delivery. One payload is held
      // at a time; `deliver` is where a consumer bounds what waits.
      for (auto& [mname, m] : manifests_) {
        auto& next = drained_[m.owner];
        for (; next < m.payloads.size(); ++next) {
          const auto& e = m.payloads[next];
          if (!needed(e) || delivered_.count(e.name)) continue;
          DCR_RETURN_ERROR_IF(stop.load(), aborted,
                              "attempt " + std::to_string(attempt_) + " stopped");
          DCR_TRY(fetch(e.name, bytes));
          const auto d = digest(bytes);
          DCR_RETURN_ERROR_IF(d != e.digest, digest_mismatch,
                              e.name + ": fetched bytes differ from the manifest entry");
          DCR_TRY(deliver(std::string_view(e.name), std::span<const std::byte>(bytes)));
          delivered_bytes_ += bytes.size();
          delivered_.emplace(e.name, d);
          progress = true;
        }
      }
      bool all = true;
      for (auto o : owners_) all = all && manifests_.count(manifest_name(attempt_, o));
      if (all) return finish(deliver, bytes);
      if (std::chrono::steady_clock::now() > deadline)
        return fail(errc::aborted, "attempt " + std::to_string(attempt_) +
                                       ": deadline passed with " +
                                       std::to_string(manifests_.size()) + " of " +
                                       std::to_string(owners_.size()) + " manifests");
      if (progress)
        sleep = poll_.min;
      else
        sleep = std::min(sleep * 2, poll_.max);
      // Never sleep past the deadline: the caller is told promptly.
      std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(
          sleep, std::max<std::chrono::steady_clock::duration>(
                     deadline - std::chrono::steady_clock::now(),
                     std::chrono::steady_clock::duration::zero())));
    }
  }

  /// Payloads delivered so far, and their bytes.
  std::size_t delivered() const noexcept { return delivered_.size(); }
  std::uint64_t delivered_bytes() const noexcept { return delivered_bytes_; }
  /// Listed payloads a filter let this reader skip (never fetched), and their bytes.
  std::size_t skipped() const noexcept { return skipped_; }
  std::uint64_t skipped_bytes() const noexcept { return skipped_bytes_; }

  /// After a successful `run`: per required owner, the digest of the
  /// manifest bytes this reader took as that owner's (what the coordinator
  /// compares with the digest the owner reported writing).
  const std::map<std::uint32_t, digest128>& manifest_digests() const noexcept {
    return read_digests_;
  }

  /// After a successful `run`: the digests of every payload the manifests
  /// list that this reader needs (all of them without a filter), sorted:
  /// what each receiver must have staged, digest for digest.
  std::vector<digest128> listed() const {
    std::vector<digest128> d;
    for (auto& [mname, m] : manifests_)
      for (auto& e : m.payloads)
        if (needed(e)) d.push_back(e.digest);
    std::sort(d.begin(), d.end());
    return d;
  }

private:
  /// Whether this reader must fetch `e` (see `need_only`).
  bool needed(const manifest_entry& e) const {
    if (!need_ || !e.tensors) return true;
    for (auto& t : *e.tensors)
      if (need_(t)) return true;
    return false;
  }
  status fetch(const std::string& name, std::vector<std::byte>& out) {
    return store_->get(name, out);
  }
  std::string owner_payload_prefix(std::uint32_t owner) const {
    return attempt_prefix(attempt_) + "payload/o" + detail::pad(owner, 10) + "-s";
  }

  /// A manifest must be this attempt's, of this incarnation, of a required
  /// owner, under that owner's name, and list only that owner's payload names.
  status check_manifest(const std::string& name, const manifest& m) const {
    const auto here = incarnation_of(*store_);
    DCR_RETURN_ERROR_IF(m.incarnation != here, foreign_incarnation,
                        name + ": manifest of incarnation '" +
                            (m.incarnation.empty() ? "none" : m.incarnation) +
                            "', this commit history is '" + (here.empty() ? "none" : here) + "'");
    DCR_RETURN_ERROR_IF(m.attempt != attempt_, stale_attempt,
                        name + ": manifest of attempt " + std::to_string(m.attempt));
    DCR_RETURN_ERROR_IF(
        name != manifest_name(attempt_, m.owner) || !owners_.count(m.owner), verification,
        name + ": manifest of owner " + std::to_string(m.owner) +
            (owners_.count(m.owner) ? " under another owner's name" : ", not a required owner"));
    const auto own = owner_payload_prefix(m.owner);
    for (auto& e : m.payloads)
      DCR_RETURN_ERROR_IF(e.name.rfind(own, 0) != 0, verification,
                          name + ": lists '" + e.name + "', not a payload name of owner " +
                              std::to_string(m.owner));
    return status::success();
  }

  template <class Deliver>
  status finish(Deliver& deliver, std::vector<std::byte>& bytes) {
    // Each manifest is read once more: a different one under an owner's
    // name since the first read means two writers claim the owner (a stale
    // or second process, or a forgery), and keeping either could commit
    // what the owner never published, so the attempt fails.
    for (auto& [mname, m] : manifests_) {
      DCR_TRY(fetch(mname, bytes));
      DCR_RETURN_ERROR_IF(digest(bytes) != read_digests_[m.owner], verification,
                          "owner " + std::to_string(m.owner) + ": a second, different manifest " +
                              "under '" + mname + "' in attempt " + std::to_string(attempt_));
    }
    std::size_t listed = 0;
    skipped_ = 0;
    skipped_bytes_ = 0;
    for (auto& [mname, m] : manifests_) {
      for (auto& e : m.payloads) {
        if (!needed(e)) {
          ++skipped_;
          skipped_bytes_ += e.bytes;
          continue;
        }
        auto it = delivered_.find(e.name);
        if (it == delivered_.end()) {
          DCR_TRY(fetch(e.name, bytes)); // not yet listed when we looked: fetch now
          DCR_TRY(deliver(std::string_view(e.name), std::span<const std::byte>(bytes)));
          delivered_bytes_ += bytes.size();
          it = delivered_.emplace(e.name, digest(bytes)).first;
        }
        DCR_RETURN_ERROR_IF(it->second != e.digest, digest_mismatch,
                            e.name + ": fetched bytes differ from the manifest entry");
        ++listed;
      }
    }
    // Receivers apply before the manifests arrive, so whatever else appeared
    // under the prefix was delivered too: an object no manifest lists fails
    // the attempt (its retry overwrites what it applied).
    if (listed != delivered_.size())
      for (auto& [name, d] : delivered_) {
        bool found = false;
        for (auto& [mname, m] : manifests_)
          for (auto& e : m.payloads) found = found || e.name == name;
        DCR_RETURN_ERROR_IF(!found, verification,
                            name + ": payload object under attempt " + std::to_string(attempt_) +
                                " that no manifest lists (delivered " +
                                std::to_string(delivered_.size()) + ", listed " +
                                std::to_string(listed) + ")");
      }
    return status::success();
  }

  Store* store_;
  std::uint64_t attempt_;
  std::set<std::uint32_t> owners_;
  std::map<std::string, digest128> delivered_;
  std::map<std::string, manifest> manifests_;
  std::map<std::uint32_t, digest128> read_digests_; ///< per owner: digest of its manifest's bytes
  std::map<std::uint32_t, std::string> last_seen_;  ///< per owner: last payload name listed
  std::map<std::uint32_t, std::size_t> drained_;    ///< per owner: manifest entries looked at
  poll_policy poll_;
  std::size_t listings_ = 0, polls_ = 0;
  tensor_filter need_;
  std::uint64_t delivered_bytes_ = 0, skipped_bytes_ = 0;
  std::size_t skipped_ = 0;
};

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

/// The owner named by a manifest name of attempt τ, if it is one.
inline std::optional<std::uint32_t> manifest_owner(std::string_view name, std::uint64_t attempt) {
  const auto p = attempt_prefix(attempt) + "manifest/o";
  if (name.size() != p.size() + 10 || name.compare(0, p.size(), p) != 0) return std::nullopt;
  return detail::owner_digits(name, p.size());
}

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
