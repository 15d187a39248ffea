#pragma once
/// \file
/// `attempt_reader`: the receiver side of one attempt on an object store
/// (layout and manifest format: attempt_manifest.hpp).
///
/// A reader learns of each payload as soon as it is durable: unfiltered, by
/// listing the payload names of every owner whose manifest has not come; with
/// a filter (`need_only`), by listing the owners' index objects, whose entry
/// says which tensors the payload updates. It fetches what it needs right
/// away, while the owners still construct and upload, but delivers (applies)
/// a payload only once the owner's manifest is in and lists it with the
/// digest of the fetched bytes: what is delivered is exactly what the
/// manifests bind, and the coordinator binds those manifests to the digests
/// the owners reported writing (`manifest_digests`). A payload fetched early
/// that no manifest lists is held, never delivered; unfiltered, its presence
/// under a required owner's payload names fails the attempt (someone else
/// writes under the owner's names), filtered it is dropped. Objects under no
/// required owner's name are never fetched. A waiting reader lists, per
/// owner whose manifest it lacks, only the names after the last it saw
/// (`list_after`, S3's `start-after`), so polling costs the new names only.
/// Up to `requests_in_flight` GETs run at once (`request_window`). A retry
/// uploads its complete changed set again under its own attempt prefix; no
/// object is ever overwritten.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <concepts>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "dcr/core/error.hpp"
#include "dcr/core/hash.hpp"
#include "dcr/transport/attempt_manifest.hpp"
#include "dcr/transport/object_store.hpp"
#include "dcr/transport/request_window.hpp"

namespace dcr::transport {

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
/// fetching overlaps construction and upload), delivers each once its owner's
/// manifest binds it, and completes once every required owner's manifest is
/// present and every listed payload it needs was delivered exactly once.
template <object_store Store>
class attempt_reader {
public:
  attempt_reader(Store& store, std::uint64_t attempt, std::vector<std::uint32_t> owners)
      : attempt_reader(store, attempt, std::move(owners), default_poll_policy(store)) {}
  attempt_reader(Store& store, std::uint64_t attempt, std::vector<std::uint32_t> owners,
                 poll_policy poll)
      : store_(&store), attempt_(attempt), owners_(owners.begin(), owners.end()), poll_(poll),
        window_(requests_in_flight_of(store)) {
    if (poll_.min.count() <= 0 || poll_.max < poll_.min)
      throw error(errc::invalid_argument,
                  "attempt_reader: poll interval bounds must satisfy 0 < min <= max");
  }

  /// Fetch only what the index says this reader needs: a payload whose
  /// entry carries an index is fetched only when `need` accepts one of its
  /// tensors; a payload without an index is always fetched. The entries come
  /// from the owners' index objects as each payload is durable, so a
  /// filtered reader fetches while the owners upload; what it delivers is
  /// still checked against the manifests. Set before `run`; an empty
  /// function means no filter.
  void need_only(tensor_filter need) { need_ = std::move(need); }
  /// GETs in flight at once, >= 1 (default: `requests_in_flight_of(store)`;
  /// more than one needs a thread-safe store). Set before `run`; throws
  /// `dcr::error(invalid_argument)` for 0.
  void requests_in_flight(std::size_t n) {
    if (n == 0) throw error(errc::invalid_argument, "attempt_reader: 0 requests in flight");
    window_ = n;
  }
  std::size_t requests_in_flight() const noexcept { return window_; }
  /// Whether `run` reads every manifest once more before it completes (the
  /// default): a different manifest under an owner's name since the first
  /// read fails the read. A caller whose coordinator compares the reported
  /// `manifest_digests` with the digests the owners reported writing (as
  /// `protocol::coordinator` does) gets the same guarantee from that check,
  /// and may turn the second read, one GET per owner, off.
  void recheck_manifests(bool on) noexcept { recheck_ = on; }

  /// Listings made so far (each is one `list` or `list_after` call on the store).
  std::size_t listings() const noexcept { return listings_; }
  /// Poll rounds made so far (each lists every owner still pending once).
  std::size_t polls() const noexcept { return polls_; }

  /// Poll until complete, `stop` becomes true (`errc::aborted`) or `deadline`
  /// passes (`errc::aborted`). `deliver(name, bytes)` is called once per
  /// payload, on this thread, only after its owner's manifest lists it with
  /// the digest of those bytes; its failure ends the read with that status.
  /// Each owner's payloads are delivered in its sequence order, an owner's
  /// as soon as its manifest is in (not after the last owner's), so a slow
  /// owner delays only its own payloads. A listed payload that is missing
  /// (`not_found`) or differs from its manifest entry (`digest_mismatch`)
  /// fails the read.
  template <class Deliver>
  status run(Deliver&& deliver, const std::atomic<bool>& stop,
             std::chrono::steady_clock::time_point deadline) {
    const auto manifests = attempt_prefix(attempt_) + "manifest/";
    std::vector<std::byte> bytes;
    // GETs in flight report here; the window is declared after what its
    // jobs touch, so it is destroyed (and waits for them) first.
    struct fetched {
      std::string name;
      bool index = false;
      status st;
      std::vector<std::byte> bytes;
    };
    std::mutex m;
    std::condition_variable ready;
    std::deque<fetched> done;
    std::deque<std::pair<std::string, bool>> wanted; // (name, index object?) not yet sent
    request_window window(window_);
    auto want = [&](const std::string& name, bool index) {
      if (requested_.insert(name).second) wanted.emplace_back(name, index);
    };
    auto send = [&] {
      while (!wanted.empty()) {
        auto [name, index] = wanted.front();
        const bool sent = window.try_submit([&, name = name, index = index] {
          fetched f{name, index, status::success(), {}};
          f.st = store_->get(f.name, f.bytes);
          std::lock_guard l(m);
          done.push_back(std::move(f));
          ready.notify_one();
        });
        if (!sent) break;
        wanted.pop_front();
      }
    };
    auto sleep = poll_.min;
    for (;;) {
      DCR_RETURN_ERROR_IF(stop.load(), aborted, "attempt " + std::to_string(attempt_) + " stopped");
      bool progress = false;
      ++polls_;
      // What is durable of each owner whose manifest has not come: one
      // listing per such owner, of the names after the last one seen, and
      // one of the manifests. On S3 each listing costs a round trip, so
      // they run at once (up to the window), not one after the other.
      std::vector<std::uint32_t> pending;
      for (auto o : owners_)
        if (!manifests_.count(manifest_name(attempt_, o))) pending.push_back(o);
      std::vector<std::vector<std::string>> listed_names(pending.size() + 1);
      std::vector<status> listed_st(pending.size() + 1, status::success());
      {
        request_window lists(window_);
        for (std::size_t k = 0; k < pending.size(); ++k) {
          const auto o = pending[k];
          lists.submit([&, k, o, prefix = need_ ? owner_index_prefix(o) : owner_payload_prefix(o),
                        after = last_seen_[o]] {
            listed_st[k] = list_names_after(*store_, prefix, after, listed_names[k]);
          });
        }
        lists.submit([&] { listed_st.back() = store_->list(manifests, listed_names.back()); });
      }
      listings_ += pending.size() + 1;
      for (std::size_t k = 0; k < pending.size(); ++k) {
        DCR_TRY(listed_st[k]);
        for (auto& n : listed_names[k]) {
          last_seen_[pending[k]] = n;
          want(n, bool(need_));
        }
      }
      DCR_TRY(listed_st.back());
      // The new manifests, read at once as well.
      std::vector<std::string> fresh;
      for (auto& n : listed_names.back())
        if (!manifests_.count(n)) fresh.push_back(n);
      std::vector<std::vector<std::byte>> texts(fresh.size());
      std::vector<status> read_st(fresh.size(), status::success());
      {
        request_window reads(window_);
        for (std::size_t k = 0; k < fresh.size(); ++k)
          reads.submit([&, k] { read_st[k] = store_->get(fresh[k], texts[k]); });
      }
      for (std::size_t k = 0; k < fresh.size(); ++k) {
        const auto& n = fresh[k];
        DCR_TRY(read_st[k]);
        manifest mf;
        DCR_TRY(parse_manifest(
            std::string_view(reinterpret_cast<const char*>(texts[k].data()), texts[k].size()), mf,
            seal_key_of(*store_)));
        DCR_TRY(check_manifest(n, mf));
        read_digests_[mf.owner] = digest(texts[k]);
        for (auto& e : mf.payloads) {
          if (!needed(e)) continue;
          if (auto h = held_.find(e.name); h != held_.end())
            DCR_RETURN_ERROR_IF(h->second.digest != e.digest, digest_mismatch,
                                e.name + ": fetched bytes differ from the manifest entry");
          want(e.name, false);
        }
        listed_by_.emplace(mf.owner, &manifests_.emplace(n, std::move(mf)).first->second);
        progress = true;
      }
      send();
      // What came back: index entries say what to fetch, payloads are held
      // until their manifest binds them.
      for (;;) {
        fetched f;
        {
          std::lock_guard l(m);
          if (done.empty()) break;
          f = std::move(done.front());
          done.pop_front();
        }
        DCR_TRY(take(f.name, f.index, f.st, f.bytes, want));
        progress = true;
      }
      send();
      // Every owner whose manifest is in: its needed payloads that are held,
      // in sequence order, each checked against its entry before delivery.
      for (auto& [o, mf] : listed_by_) {
        auto& next = drained_[o];
        for (; next < mf->payloads.size(); ++next) {
          const auto& e = mf->payloads[next];
          if (!needed(e)) continue;
          auto h = held_.find(e.name);
          if (h == held_.end()) break; // still in flight
          DCR_RETURN_ERROR_IF(stop.load(), aborted,
                              "attempt " + std::to_string(attempt_) + " stopped");
          DCR_RETURN_ERROR_IF(h->second.digest != e.digest, digest_mismatch,
                              e.name + ": fetched bytes differ from the manifest entry");
          DCR_TRY(deliver(std::string_view(e.name), std::span<const std::byte>(h->second.bytes)));
          delivered_bytes_ += h->second.bytes.size();
          delivered_.emplace(e.name, e.digest);
          held_.erase(h);
          progress = true;
        }
      }
      bool all = listed_by_.size() == owners_.size();
      for (auto& [o, mf] : listed_by_) all = all && drained_[o] == mf->payloads.size();
      if (all) return finish(bytes);
      if (std::chrono::steady_clock::now() > deadline)
        return fail(errc::aborted, "attempt " + std::to_string(attempt_) +
                                       ": deadline passed with " +
                                       std::to_string(manifests_.size()) + " of " +
                                       std::to_string(owners_.size()) + " manifests");
      if (progress)
        sleep = poll_.min;
      else
        sleep = std::min(sleep * 2, poll_.max);
      // Never sleep past the deadline: the caller is told promptly. A GET
      // that comes back ends the wait.
      const auto wait = std::min<std::chrono::steady_clock::duration>(
          sleep, std::max<std::chrono::steady_clock::duration>(
                     deadline - std::chrono::steady_clock::now(),
                     std::chrono::steady_clock::duration::zero()));
      std::unique_lock l(m);
      ready.wait_for(l, wait, [&] { return !done.empty(); });
    }
  }

  /// Payloads delivered so far, and their bytes.
  std::size_t delivered() const noexcept { return delivered_.size(); }
  std::uint64_t delivered_bytes() const noexcept { return delivered_bytes_; }
  /// Payloads fetched before their owner's manifest was in (then held until
  /// it bound them, or dropped).
  std::size_t fetched_early() const noexcept { return early_; }
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
  struct held_payload {
    digest128 digest{};
    std::vector<std::byte> bytes;
  };

  /// Whether this reader must fetch `e` (see `need_only`).
  bool needed(const manifest_entry& e) const {
    if (!need_ || !e.tensors) return true;
    for (auto& t : *e.tensors)
      if (need_(t)) return true;
    return false;
  }
  std::string owner_payload_prefix(std::uint32_t owner) const {
    return attempt_prefix(attempt_) + "payload/o" + detail::pad(owner, 10) + "-s";
  }
  std::string owner_index_prefix(std::uint32_t owner) const {
    return attempt_prefix(attempt_) + "index/o" + detail::pad(owner, 10) + "-s";
  }
  /// The manifest entry of payload `name`, if its owner's manifest is in
  /// and lists it.
  const manifest_entry* entry_of(const std::string& name) const {
    const auto o = payload_owner(name, attempt_);
    if (!o) return nullptr;
    const auto it = listed_by_.find(*o);
    if (it == listed_by_.end()) return nullptr;
    for (auto& e : it->second->payloads)
      if (e.name == name) return &e;
    return nullptr;
  }

  /// One GET that came back. An index object's entry is a hint: a needed
  /// payload it names is fetched. A payload is checked at once against its
  /// manifest entry when that is in, else held until it is.
  template <class Want>
  status take(const std::string& name, bool index, const status& st, std::vector<std::byte>& bytes,
              Want& want) {
    DCR_TRY(st);
    if (index) {
      manifest one;
      DCR_TRY(parse_manifest(
          std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), one,
          seal_key_of(*store_)));
      const auto at = index_owner_sequence(name, attempt_);
      DCR_RETURN_ERROR_IF(
          !at || one.incarnation != incarnation_of(*store_) || one.attempt != attempt_ ||
              one.owner != at->first || one.payloads.size() != 1 ||
              one.payloads[0].name != payload_name(attempt_, at->first, at->second),
          verification, name + ": index object that is not the entry of its own payload");
      if (needed(one.payloads[0])) want(one.payloads[0].name, false);
      return status::success();
    }
    const auto d = digest(bytes);
    if (auto* e = entry_of(name))
      DCR_RETURN_ERROR_IF(d != e->digest, digest_mismatch,
                          name + ": fetched bytes differ from the manifest entry");
    else
      ++early_;
    held_[name] = held_payload{d, std::move(bytes)};
    return status::success();
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

  status finish(std::vector<std::byte>& bytes) {
    // Each manifest is read once more (unless the coordinator's binding
    // does the same, `recheck_manifests`): a different one under an owner's
    // name since the first read means two writers claim the owner (a stale
    // or second process, or a forgery), and keeping either could commit
    // what the owner never published, so the attempt fails.
    if (recheck_)
      for (auto& [mname, m] : manifests_) {
        DCR_TRY(store_->get(mname, bytes));
        DCR_RETURN_ERROR_IF(digest(bytes) != read_digests_[m.owner], verification,
                            "owner " + std::to_string(m.owner) + ": a second, different manifest " +
                                "under '" + mname + "' in attempt " + std::to_string(attempt_));
      }
    skipped_ = 0;
    skipped_bytes_ = 0;
    std::set<std::string> listed;
    for (auto& [mname, m] : manifests_)
      for (auto& e : m.payloads) {
        listed.insert(e.name);
        if (needed(e)) continue;
        ++skipped_;
        skipped_bytes_ += e.bytes;
      }
    // Unfiltered, this reader fetched every object under the required
    // owners' payload names it saw: one that no manifest lists (held, never
    // delivered) means someone else writes under an owner's names, and the
    // attempt fails. Filtered, such an object was named by an index object
    // no manifest backs; it is dropped.
    if (!need_)
      for (auto& n : requested_)
        DCR_RETURN_ERROR_IF(!listed.count(n), verification,
                            n + ": payload object under attempt " + std::to_string(attempt_) +
                                " that no manifest lists (delivered " +
                                std::to_string(delivered_.size()) + ", listed " +
                                std::to_string(listed.size()) + "); it was not applied");
    held_.clear();
    return status::success();
  }

  Store* store_;
  std::uint64_t attempt_;
  std::set<std::uint32_t> owners_;
  std::map<std::string, digest128> delivered_;
  std::map<std::string, manifest> manifests_;
  std::map<std::uint32_t, const manifest*> listed_by_; ///< per owner: its manifest, once in
  std::map<std::uint32_t, digest128> read_digests_; ///< per owner: digest of its manifest's bytes
  std::map<std::uint32_t, std::string> last_seen_;  ///< per owner: last name listed
  std::map<std::uint32_t, std::size_t> drained_;    ///< per owner: manifest entries looked at
  std::set<std::string> requested_;                 ///< every name a GET was asked for
  std::map<std::string, held_payload> held_;        ///< fetched, not yet delivered
  poll_policy poll_;
  std::size_t window_ = 1;
  bool recheck_ = true;
  std::size_t listings_ = 0, polls_ = 0, early_ = 0;
  tensor_filter need_;
  std::uint64_t delivered_bytes_ = 0, skipped_bytes_ = 0;
  std::size_t skipped_ = 0;
};

} // namespace dcr::transport
