#pragma once
/// \file
/// Payload grouping of one owner's build: the records of each chunk, in
/// chunk order, are merged into the open bucket (one item per canonical
/// tensor and encoding); a bucket whose chunks reach the byte target is
/// closed: each relative item takes the smaller of its two exact codings
/// (`stages::choose_smaller`) and the bucket goes to the sink whole, or as
/// one bucket per expert (block) under `payload_grouping::by_expert`.
/// `bucket_assembler` does this on the calling thread; chunks arrive from
/// the delta builder in chunk order whatever the thread count, so the
/// buckets, and the payload bytes, are the same.

#include <map>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "dcr/codec/item.hpp"
#include "dcr/core/tensor.hpp"
#include "dcr/source/options.hpp"
#include "dcr/source/stages.hpp"

namespace dcr {

/// The group of canonical tensor `name` under `by_expert`: 0 for a tensor of
/// no expert, 1 + E for a name containing `.experts.<E>.` (decimal E, the
/// canonical MoE naming, model/config.hpp).
inline std::uint64_t expert_group(std::string_view name) noexcept {
  constexpr std::string_view key = ".experts.";
  for (auto at = name.find(key); at != std::string_view::npos; at = name.find(key, at + 1)) {
    std::size_t i = at + key.size();
    std::uint64_t e = 0;
    std::size_t digits = 0;
    while (i < name.size() && name[i] >= '0' && name[i] <= '9' && digits < 18) {
      e = e * 10 + static_cast<std::uint64_t>(name[i] - '0');
      ++i;
      ++digits;
    }
    if (digits > 0 && i < name.size() && name[i] == '.') return 1 + e;
  }
  return 0;
}

/// The records one bucket carries, before encoding.
struct delta_bucket {
  std::uint32_t owner = 0, sequence = 0;
  std::vector<item> items;
  std::uint64_t input_bytes = 0; ///< full input bytes of the chunks that emitted records
};

/// The open bucket of one owner's build and the grouping of closed buckets
/// into what the sink receives (see the file comment).
class bucket_assembler {
public:
  /// `canonical`: the plan's canonical tensors; `experts`: the model's
  /// expert count (0: dense), for `expert_blocks`; `pool`: where vectors
  /// whose records were merged or dropped go back (null: freed).
  bucket_assembler(std::uint32_t owner, std::span<const tensor_meta> canonical,
                   std::uint64_t experts, const builder_options& opt,
                   stages::record_pool* pool = nullptr)
      : owner_(owner), canonical_(canonical), experts_(experts), opt_(opt), pool_(pool) {}

  /// The expert count of a plan's canonical tensors (1 + the largest expert
  /// index; 0 for a dense model).
  static std::uint64_t experts_of(std::span<const tensor_meta> canonical) noexcept {
    std::uint64_t e = 0;
    for (auto& m : canonical) e = std::max(e, expert_group(m.name));
    return e;
  }

  /// Merges the records of the next chunk (`bytes`: its input bytes, each
  /// tensor's records sorted) into the open bucket; closes the bucket into
  /// `sink` when it reaches the target.
  template <class Sink>
  void add_chunk(std::vector<stages::tensor_records>&& chunk, std::uint64_t bytes, Sink& sink) {
    bool emitted = false;
    for (auto& b : chunk) {
      if (b.indices.empty()) {
        give_back(b);
        continue;
      }
      emitted = true;
      const auto& meta = canonical_[b.tensor];
      const std::size_t w = width_of(meta.dtype);
      const std::uint64_t key = (std::uint64_t{b.tensor} << 8) | static_cast<std::uint8_t>(b.enc);
      auto [pos, fresh] = slot_.try_emplace(key, items_.size());
      if (fresh) {
        items_.push_back(item{meta, b.enc, std::move(b.indices), std::move(b.values)});
        alt_.push_back(std::move(b.alt_values));
        tensors_.push_back(b.tensor);
      } else {
        merge_into(items_[pos->second], alt_[pos->second], b, w);
        give_back(b);
      }
    }
    if (emitted) bytes_ += bytes;
    if (emitted && bytes_ >= opt_.bucket_bytes) flush(sink);
  }

  /// Closes the open bucket (if it holds anything) into `sink`.
  template <class Sink>
  void flush(Sink& sink) {
    if (items_.empty()) return;
    // The per-item choice, on whole items (after every chunk's records of a
    // tensor are merged), so it is the choice for exactly what travels.
    for (std::size_t i = 0; i < items_.size(); ++i) {
      stages::choose_smaller(items_[i], alt_[i], value_encoding::add, opt_.encoding.filter);
      // The words not chosen (left empty, their capacity kept).
      if (pool_) pool_->give(tensors_[i], {}, std::move(alt_[i]));
    }
    auto items = std::move(items_);
    const auto input = bytes_;
    items_.clear();
    alt_.clear();
    tensors_.clear();
    slot_.clear();
    bytes_ = 0;
    if (opt_.grouping == payload_grouping::none) {
      sink(delta_bucket{owner_, sequence_++, std::move(items), input});
      return;
    }
    // One payload per group, in group order, items in bucket order within
    // it; the first part carries the bucket's input bytes (their sum over
    // all buckets stays that of the chunks that emitted records).
    std::map<std::uint64_t, std::vector<item>> parts;
    for (auto& it : items) parts[group_of(it.tensor.name)].push_back(std::move(it));
    bool first = true;
    for (auto& [g, part] : parts) {
      sink(delta_bucket{owner_, sequence_++, std::move(part), first ? input : 0});
      first = false;
    }
  }

private:
  /// Merges two sorted record lists of one tensor (disjoint by construction:
  /// each destination has one owner); `dst_alt` and `src.alt_values` (add
  /// words, when recorded) follow the same order.
  static void merge_into(item& dst, std::vector<std::byte>& dst_alt,
                         const stages::tensor_records& src, std::size_t w) {
    if (dst.indices.empty() || src.indices.front() > dst.indices.back()) {
      dst.indices.insert(dst.indices.end(), src.indices.begin(), src.indices.end());
      dst.values.insert(dst.values.end(), src.values.begin(), src.values.end());
      dst_alt.insert(dst_alt.end(), src.alt_values.begin(), src.alt_values.end());
      return;
    }
    item m{dst.tensor, dst.encoding, {}, {}};
    std::vector<std::byte> m_alt;
    m.indices.reserve(dst.indices.size() + src.indices.size());
    m.values.reserve(dst.values.size() + src.values.size());
    m_alt.reserve(dst_alt.size() + src.alt_values.size());
    std::size_t a = 0, b = 0;
    auto take = [&](const std::vector<std::uint64_t>& ii, const std::vector<std::byte>& vv,
                    const std::vector<std::byte>& aa, std::size_t& k) {
      m.indices.push_back(ii[k]);
      const auto lo = static_cast<std::ptrdiff_t>(k * w),
                 hi = static_cast<std::ptrdiff_t>((k + 1) * w);
      m.values.insert(m.values.end(), vv.begin() + lo, vv.begin() + hi);
      if (!aa.empty()) m_alt.insert(m_alt.end(), aa.begin() + lo, aa.begin() + hi);
      ++k;
    };
    while (a < dst.indices.size() || b < src.indices.size()) {
      if (b == src.indices.size() || (a < dst.indices.size() && dst.indices[a] < src.indices[b]))
        take(dst.indices, dst.values, dst_alt, a);
      else
        take(src.indices, src.values, src.alt_values, b);
    }
    dst = std::move(m);
    dst_alt = std::move(m_alt);
  }

  /// Returns the vectors of records now copied into an item (or of none)
  /// to the pool.
  void give_back(stages::tensor_records& b) {
    if (pool_)
      pool_->give(b.tensor, std::move(b.indices), std::move(b.values), std::move(b.alt_values));
  }
  /// The payload group of tensor `name` (`builder_options::grouping`).
  std::uint64_t group_of(std::string_view name) const {
    const auto g = expert_group(name);
    if (g == 0 || opt_.expert_blocks == 0) return g;
    return 1 + (g - 1) * opt_.expert_blocks / experts_;
  }

  std::uint32_t owner_;
  std::span<const tensor_meta> canonical_;
  std::uint64_t experts_;
  const builder_options& opt_;
  stages::record_pool* pool_ = nullptr;
  std::vector<item> items_;                 // items of the open bucket
  std::vector<std::vector<std::byte>> alt_; // per item: add words (XOR items
                                            // under relative_choice::smallest)
  std::vector<std::uint32_t> tensors_;      // per item: its canonical tensor
  std::unordered_map<std::uint64_t, std::size_t> slot_;
  std::uint64_t bytes_ = 0;
  std::uint32_t sequence_ = 0;
};

} // namespace dcr
