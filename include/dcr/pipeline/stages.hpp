#pragma once
/// \file
/// Refit stages as compile-time policies, composable with `|` (stage.hpp):
///
/// ```cpp
/// auto trainer = compare<bf16>() | project<my_map>() | encode<value_encoding::xor_mask>()
///              | compress<zstd>(ids) | send(writer);
/// run<bucket<bf16, my_map>>(trainer, produce_buckets, [](std::string name) {});
/// auto rollout = decode();
/// run<fetched>(as_chain(rollout), receive(store, attempt, owners), apply(my_receiver));
/// ```
/// The unit that flows is a bucket: the shards (or decoded payloads) one
/// payload carries. The dtype, the map class, the value encoding, the codec
/// and the store are template parameters; shapes, names and ids are runtime
/// values. Each stage says what it consumes and produces; failures throw
/// `dcr::error` with the typed code, which `run` rethrows after stopping
/// every stage.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "dcr/codec/payload.hpp"
#include "dcr/pipeline/stage.hpp"
#include "dcr/source/detect.hpp"
#include "dcr/transport/attempt_objects.hpp"
#include "dcr/transport/object_store.hpp"

namespace dcr::pipeline {

/// A map from a source shard's local flat index to its canonical tensor's
/// flat index. Contract: injective when used with XOR (an XOR record through
/// a non-injective map would cancel itself).
template <class M>
concept flat_index_map = requires(const M& m, std::uint64_t j) {
  { m(j) } -> std::convertible_to<std::uint64_t>;
};

/// One source shard of a canonical tensor: its committed and candidate words.
template <storage_dtype D, flat_index_map Map> struct shard_update {
  tensor_meta tensor; ///< canonical tensor the shard maps into
  Map map;
  std::span<const word_t<D>> old_words, new_words;
  std::vector<std::uint64_t> changed; ///< local indices, filled by `compare`
};
/// What one payload carries, before encoding.
template <storage_dtype D, flat_index_map Map> using bucket = std::vector<shard_update<D, Map>>;

/// compare<D>: bucket → bucket with `changed` = local indices whose bits differ.
template <storage_dtype D> auto compare() {
  return stage{[](auto b) {
    for (auto& s : b) {
      if (s.old_words.size() != s.new_words.size())
        throw error(errc::shape_mismatch, "compare: shard of " + s.tensor.name + " changed size");
      s.changed.clear();
      detect_changes<word_t<D>>(s.old_words, s.new_words, 0, s.changed);
    }
    return b;
  }};
}

/// A changed canonical element: where, old bits, new bits (words of type W).
template <class W> struct record {
  std::uint64_t index;
  W old_word, new_word;
};
/// Records of one canonical tensor, in canonical order.
template <class W> struct tensor_records {
  tensor_meta tensor;
  std::vector<record<W>> records;
};

/// project<Map>: bucket → records per canonical tensor, through each shard's
/// map, sorted by canonical index (maps may permute).
template <flat_index_map Map> auto project() {
  return stage{[](auto b) {
    using shard_t = typename decltype(b)::value_type;
    static_assert(std::is_same_v<decltype(shard_t::map), Map>, "project<Map>: the bucket's shards use another map");
    using W = std::remove_cv_t<typename decltype(shard_t::old_words)::element_type>;
    std::vector<tensor_records<W>> out;
    for (auto& s : b) {
      auto it = std::find_if(out.begin(), out.end(), [&](auto& t) { return t.tensor.name == s.tensor.name; });
      if (it == out.end()) it = out.insert(out.end(), tensor_records<W>{s.tensor, {}});
      const auto n = s.tensor.numel();
      for (auto j : s.changed) {
        const std::uint64_t k = s.map(j);
        if (k >= n) throw error(errc::index_out_of_range, "project: " + s.tensor.name + " local " + std::to_string(j) + " maps to " + std::to_string(k));
        it->records.push_back({k, s.old_words[j], s.new_words[j]});
      }
    }
    for (auto& t : out) {
      std::sort(t.records.begin(), t.records.end(), [](auto& x, auto& y) { return x.index < y.index; });
      for (std::size_t i = 1; i < t.records.size(); ++i)
        if (t.records[i].index == t.records[i - 1].index)
          throw error(errc::parts_disagree, "project: two shards write " + t.tensor.name + "[" + std::to_string(t.records[i].index) + "]");
    }
    return out;
  }};
}

/// encode<E>: records → items with values `old ^ new` (xor_mask) or `new` (overwrite).
template <value_encoding E> auto encode() {
  return stage{[](auto tensors) {
    std::vector<item> items;
    for (auto& t : tensors) {
      if (t.records.empty()) continue;
      item it;
      it.tensor = t.tensor;
      it.encoding = E;
      const auto w = width_of(t.tensor.dtype);
      it.values.resize(t.records.size() * w);
      for (std::size_t k = 0; k < t.records.size(); ++k) {
        auto& r = t.records[k];
        const auto v = static_cast<decltype(r.new_word)>(E == value_encoding::xor_mask ? (r.old_word ^ r.new_word) : r.new_word);
        std::memcpy(it.values.data() + k * w, &v, w); // little-endian host
        it.indices.push_back(r.index);
      }
      items.push_back(std::move(it));
    }
    return items;
  }};
}

/// The payload codec of the wire format v1 (zstd frame + BLAKE2b-128 digest).
struct zstd {
  int level = 1;
  std::vector<std::byte> operator()(const payload_id& id, std::span<const item> items) const {
    encode_options o;
    o.zstd_level = level;
    return encode_payload(id, items, o);
  }
};
/// A payload codec: items and an id → payload bytes.
template <class C>
concept payload_codec = requires(const C& c, const payload_id& id, std::span<const item> items) {
  { c(id, items) } -> std::same_as<std::vector<std::byte>>;
};
static_assert(payload_codec<zstd>);

/// compress<C>: items → one payload; sequence numbers count up from `first.sequence`.
template <payload_codec C> auto compress(payload_id first, C codec = {}) {
  return stage{[id = first, codec](std::vector<item> items) mutable {
    auto bytes = codec(id, items);
    ++id.sequence;
    return bytes;
  }};
}

/// send: payload → its object name, uploaded once through `writer` (call
/// `writer->finish()` after the run to publish the manifest).
template <transport::object_store Store> auto send(std::shared_ptr<transport::attempt_writer<Store>> writer) {
  return stage{[w = std::move(writer)](std::vector<std::byte> bytes) {
    throw_if_failed(w->put_payload(bytes));
    return w->listed().payloads.back().name;
  }};
}

/// A fetched payload (what `receive` produces).
struct fetched {
  std::string name;
  std::vector<std::byte> bytes;
};

/// receive: a source for `run<fetched>` that streams every payload of attempt
/// τ as it is published (see `attempt_reader`).
template <transport::object_store Store>
auto receive(Store& store, std::uint64_t attempt, std::vector<std::uint32_t> owners,
             std::chrono::milliseconds deadline = std::chrono::milliseconds(60000)) {
  return [&store, attempt, owners = std::move(owners), deadline](auto&& emit) {
    std::atomic<bool> stop{false};
    transport::attempt_reader<Store> reader(store, attempt, owners);
    throw_if_failed(reader.run(
        [&](std::string_view name, std::span<const std::byte> b) {
          DCR_RETURN_ERROR_IF(!emit(fetched{std::string(name), {b.begin(), b.end()}}), aborted, "pipeline stopped");
          return status::success();
        },
        stop, std::chrono::steady_clock::now() + deadline));
  };
}

/// decode: fetched payload → validated decoded payload (typed errors thrown).
/// Rejects payloads of any other attempt (`stale_attempt`).
inline auto decode(std::uint64_t attempt) {
  return stage{[attempt](fetched f) {
    decoded_payload d;
    auto s = decode_payload(f.bytes, d);
    if (!s) throw error(s.code, f.name + ": " + s.message);
    if (d.id.attempt != attempt)
      throw error(errc::stale_attempt, f.name + ": payload of attempt " + std::to_string(d.id.attempt));
    return d;
  }};
}

/// apply: a sink applying each decoded payload's items to `r`
/// (`r.apply_item(const item&) -> status`, e.g. `dcr::receiver<L>`).
template <class R> auto apply(R& r) {
  return [&r](decoded_payload d) {
    for (auto& it : d.items) throw_if_failed(r.apply_item(it));
  };
}

} // namespace dcr::pipeline
