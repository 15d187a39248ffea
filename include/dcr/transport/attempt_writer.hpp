#pragma once
/// \file
/// `attempt_writer`: the owner side of one attempt on an object store
/// (layout and manifest format: attempt_manifest.hpp). Each payload is
/// uploaded once, then its index object; the manifest goes last, after every
/// payload it lists is durable. Up to `requests_in_flight` payloads are
/// uploaded at once (`request_window`): an owner that waited for each PUT
/// before constructing on would pay the store's per-object latency once per
/// payload.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dcr/core/error.hpp"
#include "dcr/core/hash.hpp"
#include "dcr/transport/attempt_manifest.hpp"
#include "dcr/transport/object_store.hpp"
#include "dcr/transport/request_window.hpp"

namespace dcr::transport {

/// Owner side of one attempt: uploads payloads once each, then the manifest.
template <object_store Store>
class attempt_writer {
public:
  /// As many uploads in flight as the store allows (`requests_in_flight_of`).
  attempt_writer(Store& store, std::uint64_t attempt, std::uint32_t owner)
      : attempt_writer(store, attempt, owner, requests_in_flight_of(store)) {}
  /// `in_flight` >= 1 uploads at once (more than one needs a thread-safe
  /// store); each one in flight holds a copy of its payload.
  attempt_writer(Store& store, std::uint64_t attempt, std::uint32_t owner, std::size_t in_flight)
      : store_(&store), m_{incarnation_of(store), attempt, owner, {}},
        window_(std::make_unique<request_window>(in_flight)) {}
  attempt_writer(attempt_writer&&) noexcept = default;
  /// Waits for the uploads still in flight: their outcome is lost (no
  /// manifest lists them), their bytes never are half-written.
  ~attempt_writer() {
    if (window_) window_->drain();
  }

  /// Upload the next payload (sequence numbers 0, 1, ...), listed without
  /// an index (every reader fetches it). With more than one upload in
  /// flight it returns once the upload is under way; a failure is returned
  /// by a later call or by `finish`, never dropped.
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
  /// Wait for every upload, then publish the manifest; after this the
  /// owner's part of the attempt is complete. The first failed upload is
  /// returned instead, and no manifest is written.
  status finish() {
    window_->drain();
    DCR_TRY(first_failure());
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
  /// Uploads this writer keeps in flight at most.
  std::size_t requests_in_flight() const noexcept { return window_->capacity(); }

private:
  status put(std::span<const std::byte> bytes, std::optional<std::vector<std::string>> tensors) {
    DCR_TRY(first_failure());
    const auto seq = static_cast<std::uint32_t>(m_.payloads.size());
    manifest_entry e{payload_name(m_.attempt, m_.owner, seq), bytes.size(), digest(bytes),
                     std::move(tensors)};
    // The index object: this entry alone, sealed as the manifest is.
    const auto index =
        serialize_manifest({m_.incarnation, m_.attempt, m_.owner, {e}}, seal_key_of(*store_));
    // The uploads capture no `this`: a writer may be moved while they run.
    auto upload = [store = store_, failed = failed_, iname = index_name(m_.attempt, m_.owner, seq),
                   index, with_index = index_objects_of(*store_)](const std::string& name,
                                                                  std::span<const std::byte> b) {
      auto s = store->put(name, b);
      // Written only once the payload is durable: a reader that sees it
      // finds the payload.
      if (s && with_index) s = store->put(iname, std::as_bytes(std::span(index)));
      if (!s) failed->set(std::move(s));
    };
    if (window_->capacity() == 1) {
      upload(e.name, bytes);
    } else {
      auto copy = std::make_shared<std::vector<std::byte>>(bytes.begin(), bytes.end());
      window_->submit([upload, name = e.name, copy] { upload(name, *copy); });
    }
    m_.payloads.push_back(std::move(e));
    return first_failure();
  }
  status first_failure() const { return failed_->get(); }

  /// The first failed upload, shared with the uploads in flight.
  struct failure_slot {
    std::mutex m;
    std::optional<status> first;
    void set(status s) {
      std::lock_guard l(m);
      if (!first) first = std::move(s);
    }
    status get() {
      std::lock_guard l(m);
      return first ? *first : status::success();
    }
  };

  Store* store_;
  manifest m_;
  digest128 manifest_digest_{};
  std::uint64_t indexed_ = 0; ///< tensor names in the index so far
  std::unique_ptr<request_window> window_;
  std::shared_ptr<failure_slot> failed_ = std::make_shared<failure_slot>();
};

} // namespace dcr::transport
