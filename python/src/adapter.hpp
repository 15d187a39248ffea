#pragma once
/// \file
/// The one layer between the Python module and the dcr library. Everything the
/// bindings (module.cpp) use of dcr goes through here, in plain types (names,
/// shapes, byte spans, byte vectors), so a change of the library's internal
/// names is a change of this file only. Entry points used: the Megatron source
/// plan (`megatron_plan` from an HF config.json and a `trainer_layout`), the
/// in-process owner (`protocol::training_round`: `set_candidate`, build,
/// `commit_baseline`), shard projection (`shard_from_tensor_bytes`) and payload
/// decoding (`read_payload_id`, `decode_payload`), and attempt objects in an
/// object store (`attempt_writer`, `read_listed` over `incarnation_scope`).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "dcr/assembly/adapters.hpp"
#include "dcr/codec/payload_decode.hpp"
#include "dcr/io/safetensors.hpp"
#include "dcr/model/hf_config.hpp"
#include "dcr/model/trainer_layout.hpp"
#include "dcr/source/builder.hpp"
#include "dcr/source/dim0_shard_plan.hpp"
#include "dcr/source/plan.hpp"
#include "dcr/source/row_split_plan.hpp"
#include "dcr/source/state.hpp"
#include "dcr/transport/attempt_objects.hpp"
#include "dcr/transport/object_store.hpp"
#include "dcr/twin/scatter.hpp"

#include "cluster.hpp"

namespace dcr_py {

using bytes_view = std::span<const std::byte>;

/// Dtype names as the Python side spells them (torch's short names).
inline std::string dtype_name(dcr::dtype_id d) {
  switch (d) {
  case dcr::dtype_id::bf16:
    return "bfloat16";
  case dcr::dtype_id::f16:
    return "float16";
  case dcr::dtype_id::f32:
    return "float32";
  case dcr::dtype_id::f8e4m3fn:
    return "float8_e4m3fn";
  case dcr::dtype_id::f8e5m2:
    return "float8_e5m2";
  }
  return "unknown";
}

/// The dtype of a Python-side name (`dtype_name`'s inverse); `bad_dtype`
/// naming `tensor` for any other.
inline dcr::dtype_id dtype_of_name(const std::string& name, const std::string& tensor) {
  for (auto d : {dcr::dtype_id::bf16, dcr::dtype_id::f16, dcr::dtype_id::f32,
                 dcr::dtype_id::f8e4m3fn, dcr::dtype_id::f8e5m2})
    if (dtype_name(d) == name) return d;
  throw dcr::error(dcr::errc::bad_dtype, "tensor " + tensor + ": dtype " + name);
}

inline std::string hex(const dcr::digest128& d) {
  static const char* x = "0123456789abcdef";
  std::string s;
  for (auto b : d) {
    s += x[b >> 4];
    s += x[b & 15];
  }
  return s;
}

struct tensor_info {
  std::string name;
  std::vector<std::uint64_t> shape;
  std::string dtype;
};

struct shard_info {
  std::uint32_t id = 0;
  std::string key, param;
  std::vector<std::uint64_t> shape;
  std::string dtype;
  std::vector<std::uint32_t> replicas;
  std::uint32_t owner = 0;
  std::uint64_t nbytes = 0;
};

struct layout_args {
  std::uint64_t tp = 1, pp = 1, ep = 1, etp = 1, dp = 1, vocab_block = 0;
};

/// A trainer's source plan: canonical tensors and the unique shards of every rank.
class plan {
public:
  plan(const std::string& config_json, const layout_args& a)
      : config_(dcr::model_config_from_hf_json(config_json)),
        layout_(a.tp, a.pp, a.ep, a.etp, a.dp, a.vocab_block),
        plan_(std::make_shared<const dcr::source_plan>(dcr::megatron_plan(config_, layout_))) {}

  /// The row-split plan of a safetensors checkpoint's tensors, in the
  /// file's order (`row_split_plan`): what the C++ cluster programs use for
  /// `--checkpoints`, so a Python owner and `dcr-owner` agree shard by shard.
  static plan row_split_checkpoint(const std::string& path, std::uint32_t tp, std::uint32_t dp) {
    auto file = dcr::io::safetensors_file::open_or_throw(path);
    const auto metas = file.tensors();
    return plan(std::make_shared<const dcr::source_plan>(dcr::row_split_plan(metas, tp, dp)));
  }

  std::uint32_t world() const { return plan_->world; }
  std::vector<tensor_info> canonical() const {
    std::vector<tensor_info> v;
    for (auto& m : plan_->canonical) v.push_back({m.name, m.shape, dtype_name(m.dtype)});
    return v;
  }
  std::vector<shard_info> shards() const {
    std::vector<shard_info> v;
    for (std::uint32_t s = 0; s < plan_->shards.size(); ++s) {
      auto& sh = plan_->shards[s];
      v.push_back({s, sh.key, sh.param, sh.shape, dtype_name(sh.dtype), sh.replicas, sh.owner,
                   sh.nbytes()});
    }
    return v;
  }
  std::vector<std::uint32_t> rank_shards(std::uint32_t rank) const {
    if (rank >= plan_->world)
      throw dcr::error(dcr::errc::invalid_argument, "rank " + std::to_string(rank) +
                                                        " outside a world of " +
                                                        std::to_string(plan_->world));
    return plan_->rank_shards[rank];
  }
  std::size_t residual_tasks() const { return plan_->tasks.size(); }

  /// The plan of a trainer sharding every tensor by dim-0 row ranges
  /// (`dim0_shard_plan`; FSDP2): `tensors` in canonical order, `rows[i]`
  /// what each rank holds of tensor i as (rank, begin, end).
  static plan dim0_shards(const std::vector<tensor_info>& tensors,
                          const std::vector<std::vector<dcr::dim0_rows>>& rows,
                          std::uint32_t world) {
    std::vector<dcr::tensor_meta> metas;
    for (auto& t : tensors) metas.push_back({t.name, t.shape, dtype_of_name(t.dtype, t.name)});
    return plan(std::make_shared<const dcr::source_plan>(dcr::dim0_shard_plan(metas, rows, world)));
  }

  /// Shard `s` from canonical tensors: `bytes_of(tensor id)` gives each
  /// tensor's stored bytes; written into `out` (the caller's buffer).
  template <class BytesOf>
  void project(std::uint32_t s, BytesOf&& bytes_of, std::span<std::byte> out) const {
    check_shard(s);
    const auto& sh = plan_->shards[s];
    if (out.size() != sh.nbytes())
      throw dcr::error(dcr::errc::shape_mismatch,
                       "shard " + sh.key + ": buffer of " + std::to_string(out.size()) +
                           " bytes, expected " + std::to_string(sh.nbytes()));
    std::vector<std::byte> tmp;
    dcr::shard_from_tensor_bytes(
        *plan_, s,
        [&](std::uint32_t t) -> bytes_view {
          bytes_view b = bytes_of(t);
          if (b.size() != plan_->canonical[t].nbytes())
            throw dcr::error(dcr::errc::shape_mismatch,
                             "tensor " + plan_->canonical[t].name + ": " +
                                 std::to_string(b.size()) + " bytes, expected " +
                                 std::to_string(plan_->canonical[t].nbytes()));
          return b;
        },
        tmp);
    std::copy(tmp.begin(), tmp.end(), out.begin());
  }

  void check_shard(std::uint32_t s) const {
    if (s >= plan_->shards.size())
      throw dcr::error(dcr::errc::not_found, "shard id " + std::to_string(s) + " out of range");
  }
  const std::shared_ptr<const dcr::source_plan>& inner() const { return plan_; }

private:
  explicit plan(std::shared_ptr<const dcr::source_plan> p) : plan_(std::move(p)) {}
  dcr::model_config config_;
  dcr::trainer_layout layout_;
  std::shared_ptr<const dcr::source_plan> plan_;
};

/// One training rank's owner: its baseline, the candidate and the payload build.
class owner {
public:
  /// `committed`: shard id -> bytes of every shard this rank owns (others ignored).
  /// `key`: the job key its payloads are sealed with (empty: unkeyed).
  owner(const plan& p, std::uint32_t rank, const std::map<std::uint32_t, bytes_view>& committed,
        const dcr::seal_key& key = {})
      : plan_(p.inner()), rank_(rank) {
    if (rank >= plan_->world)
      throw dcr::error(dcr::errc::invalid_argument, "owner rank " + std::to_string(rank) +
                                                        " outside a world of " +
                                                        std::to_string(plan_->world));
    dcr::builder_options bo;
    bo.encoding.key = key;
    round_ = std::make_unique<dcr::protocol::training_round>(plan_, view_of(committed), bo,
                                                             std::vector<std::uint32_t>{rank});
    member_ = std::make_unique<dcr::protocol::training_round::member>(*round_, 0);
  }

  /// The shard ids this owner compares and emits.
  std::vector<std::uint32_t> owned_shards() const { return plan_->owned_shards(rank_); }

  /// The candidate: must stay valid until `commit` (the caller holds it).
  void set_candidate(const std::map<std::uint32_t, bytes_view>& candidate) {
    round_->set_candidate(view_of(candidate));
  }
  /// Payloads of attempt `attempt` for version `target_version`.
  std::vector<std::vector<std::byte>> build(std::uint64_t attempt, std::uint64_t target_version,
                                            bool overwrite_all) {
    std::vector<std::vector<std::byte>> out;
    dcr::protocol::build_request rq{attempt, target_version,
                                    overwrite_all ? dcr::refit_mode::overwrite_all
                                                  : dcr::refit_mode::mixed};
    dcr::throw_if_failed(member_->build(rq, [&](std::vector<std::byte>&& b) {
      out.push_back(std::move(b));
      return dcr::status::success();
    }));
    return out;
  }
  std::uint64_t changed_words() const { return round_->changes(rank_).count(); }
  void commit() { member_->commit_baseline(); }
  std::string baseline_digest() const { return hex(member_->baseline_digest()); }
  std::string candidate_digest() const { return hex(member_->candidate_digest()); }
  std::uint32_t rank() const noexcept { return rank_; }
  /// The committed bytes of owned shard `s` (a dense export's contents).
  std::span<const std::byte> committed_shard(std::uint32_t s) const {
    return round_->baseline(rank_).committed_shard(s);
  }
  /// The protocol member (`owner_role`) a coordinator drives.
  dcr::protocol::training_round::member& member() { return *member_; }

private:
  dcr::source_view view_of(const std::map<std::uint32_t, bytes_view>& given) const {
    dcr::source_view v;
    v.shards.resize(plan_->shards.size());
    for (auto s : dcr::owned_inputs(*plan_, std::span<const std::uint32_t>(&rank_, 1))) {
      auto it = given.find(s);
      if (it == given.end())
        throw dcr::error(dcr::errc::not_found, "owner " + std::to_string(rank_) + ": shard " +
                                                   plan_->shards[s].key +
                                                   " (owned by this rank) not given");
      if (it->second.size() != plan_->shards[s].nbytes())
        throw dcr::error(dcr::errc::shape_mismatch, "shard " + plan_->shards[s].key + ": " +
                                                        std::to_string(it->second.size()) +
                                                        " bytes, expected " +
                                                        std::to_string(plan_->shards[s].nbytes()));
      v.shards[s] = it->second;
    }
    return v;
  }

  std::shared_ptr<const dcr::source_plan> plan_;
  std::uint32_t rank_;
  std::unique_ptr<dcr::protocol::training_round> round_;
  std::unique_ptr<dcr::protocol::training_round::member> member_;
};

/// Attempt objects of one commit history (incarnation) in an object store
/// named by URL (cluster.hpp: "memory:" (this process), "fs:<directory>",
/// "s3://host:port/bucket"). Owners publish each attempt's payloads and
/// their manifest; receivers fetch what the manifests of an attempt list,
/// digests checked. The store itself (`store()`) is what a coordinator runs
/// over: it scopes it by the committed record's incarnation.
class object_store {
public:
  /// `key`: the job key manifests are sealed with (empty: unkeyed).
  object_store(const std::string& url, std::string incarnation, const s3_args& s3 = {},
               const dcr::seal_key& key = {})
      : store_(std::make_shared<any_store>(url, s3, key)) {
    if (incarnation.empty()) incarnation = dcr::new_incarnation();
    scope_ = std::make_unique<dcr::transport::incarnation_scope<any_store>>(*store_, incarnation);
    incarnation_ = std::move(incarnation);
  }
  const std::string& incarnation() const { return incarnation_; }
  const std::shared_ptr<any_store>& store() const { return store_; }

  /// Upload owner `owner`'s payloads of attempt `attempt` (each indexed by
  /// the tensors it updates), then its manifest; returns the manifest digest.
  std::string publish(std::uint64_t attempt, std::uint32_t owner,
                      const std::vector<bytes_view>& payloads) {
    dcr::transport::attempt_writer<dcr::transport::incarnation_scope<any_store>> w(*scope_, attempt,
                                                                                   owner);
    std::vector<std::string> tensors;
    for (auto p : payloads) {
      dcr::throw_if_failed(dcr::codec::payload_tensors(p, tensors));
      dcr::throw_if_failed(w.put_payload(p, tensors));
    }
    dcr::throw_if_failed(w.finish());
    return hex(w.manifest_digest());
  }
  /// The payloads the manifests of attempt `attempt` list, in name order
  /// (owner, then sequence), each checked against its listed digest;
  /// `owners` receives the owners whose manifest is there.
  std::vector<std::vector<std::byte>> fetch(std::uint64_t attempt,
                                            std::vector<std::uint32_t>& owners) {
    dcr::transport::listed_payloads listed;
    dcr::throw_if_failed(dcr::transport::read_listed(*scope_, attempt, listed));
    owners.assign(listed.owners.begin(), listed.owners.end());
    std::vector<std::vector<std::byte>> out;
    for (auto& [name, d] : listed.entries) {
      auto& bytes = out.emplace_back();
      dcr::throw_if_failed(scope_->get(name, bytes));
      if (dcr::digest(bytes) != d)
        throw dcr::error(dcr::errc::digest_mismatch,
                         "object " + name + ": bytes differ from the manifest's digest");
    }
    return out;
  }
  /// Remove the objects of every attempt up to `attempt` (after its commit).
  std::size_t collect(std::uint64_t attempt) {
    std::size_t n = 0;
    dcr::throw_if_failed(dcr::transport::collect_attempts(*scope_, attempt, &n));
    return n;
  }

private:
  std::shared_ptr<any_store> store_;
  std::unique_ptr<dcr::transport::incarnation_scope<any_store>> scope_;
  std::string incarnation_;
};

struct payload_id {
  std::uint64_t attempt = 0, source_version = 0;
  std::uint32_t owner = 0, sequence = 0;
};

/// The id of a payload whose header digest checks (keyed by `key`, if any).
inline payload_id read_id(bytes_view bytes, const dcr::seal_key& key = {}) {
  dcr::payload_id id;
  dcr::throw_if_failed(dcr::read_payload_id(bytes, id, key));
  return {id.attempt, id.source_version, id.owner, id.sequence};
}

struct decoded_item {
  tensor_info tensor;
  std::string encoding; ///< "xor", "overwrite" or "add"
  std::vector<std::uint64_t> indices;
  std::vector<std::byte> values;
};

/// Decode and validate every byte of a payload.
/// `key`: the job key its digest must be sealed with (empty: unkeyed).
inline std::vector<decoded_item> decode(bytes_view bytes, payload_id& id,
                                        const dcr::seal_key& key = {}) {
  dcr::decoded_payload p;
  dcr::codec::decode_limits lim;
  lim.key = key;
  dcr::throw_if_failed(dcr::codec::decode_payload(bytes, p, lim));
  id = {p.id.attempt, p.id.source_version, p.id.owner, p.id.sequence};
  std::vector<decoded_item> out;
  out.reserve(p.items.size());
  for (auto& it : p.items)
    out.push_back({{it.tensor.name, it.tensor.shape, dtype_name(it.tensor.dtype)},
                   std::string(dcr::to_string(it.encoding)),
                   std::move(it.indices),
                   std::move(it.values)});
  return out;
}

// ---------------------------------------------------------------------------
// Hook apply (dcr.torch.Receiver): the per-entry work of one item on raw
// pointers of CPU tensors, through the host twin's scatter (`twin::scatter`:
// locations checked strictly increasing and inside the storage before the
// first write, then `scatter_word` per entry, the element code the CUDA
// kernels share). The caller holds the tensors and checked their device,
// dtype and bounds; these run without the GIL.

/// `base[at[k] - minus] = scatter_word(base[at[k] - minus], w[k], op)` for
/// every k: the twin scatter's loop over a contiguous destination, with the
/// op a constant of each loop (the locations were checked by the caller).
template <dcr::twin::word W>
void land(W* base, const std::uint64_t* at, std::uint64_t minus, const W* w, std::size_t n,
          dcr::twin::scatter_op op) {
  auto run = [&](auto c) {
    for (std::size_t k = 0; k < n; ++k) {
      W& d = base[at[k] - minus];
      d = dcr::twin::scatter_word(d, w[k], decltype(c)::value);
    }
  };
  using dcr::twin::scatter_op;
  switch (op) {
  case scatter_op::xor_mask:
    return run(std::integral_constant<scatter_op, scatter_op::xor_mask>{});
  case scatter_op::add:
    return run(std::integral_constant<scatter_op, scatter_op::add>{});
  default:
    return run(std::integral_constant<scatter_op, scatter_op::overwrite>{});
  }
}

/// Writes `values[k]` at flat index `idx[k]` of a contiguous buffer of
/// `numel` words (the scratch). As `twin::scatter`: every index is checked
/// (strictly increasing, in range) before the first write.
template <dcr::twin::word W>
void scatter_words(W* data, std::uint64_t numel, std::span<const std::uint64_t> idx,
                   std::span<const W> values) {
  if (idx.size() != values.size())
    throw dcr::error(dcr::errc::invalid_argument, std::to_string(idx.size()) + " locations but " +
                                                      std::to_string(values.size()) + " values");
  dcr::throw_if_failed(dcr::twin::check_locations(idx, numel));
  land(data, idx.data(), 0, values.data(), idx.size(), dcr::twin::scatter_op::overwrite);
}

/// Sets the words at `idx` back to 0 (the scratch after an item); indices
/// out of range are left alone (the scatter refused them before writing).
/// Where the entries average one or more per cache line, clearing the whole
/// range they span is cheaper than a store per entry (and the scratch is
/// zero outside the entries).
template <dcr::twin::word W>
void zero_words(W* data, std::uint64_t numel, std::span<const std::uint64_t> idx) {
  if (idx.empty()) return;
  const std::uint64_t lo = idx.front(), hi = idx.back();
  if (lo <= hi && hi < numel && (hi - lo + 1) * sizeof(W) <= idx.size() * 64) {
    std::fill(data + lo, data + hi + 1, W{0});
    return;
  }
  for (auto i : idx)
    if (i < numel) data[i] = 0;
}

/// One planned `copy_` of a loader whose source is an invertible view of
/// the scratch (offset, extents, strides in elements) and whose destination
/// is a view of the same extents into a registered storage: maps an item's
/// canonical flat indices through the source view to destination element
/// offsets, and lands the item's words there.
class mapped_copy {
public:
  mapped_copy(std::int64_t src_offset, const std::vector<std::int64_t>& extents,
              const std::vector<std::int64_t>& src_strides, std::int64_t dst_offset,
              const std::vector<std::int64_t>& dst_strides)
      : src_off_(src_offset), dst_off_(dst_offset) {
    if (extents.size() != src_strides.size() || extents.size() != dst_strides.size() ||
        extents.size() > static_cast<std::size_t>(dcr::twin::layout_max_rank))
      throw dcr::error(dcr::errc::invalid_argument, "mapped copy: rank mismatch");
    if (src_offset < 0 || dst_offset < 0)
      throw dcr::error(dcr::errc::invalid_argument, "mapped copy: negative offset");
    const auto rank = static_cast<int>(extents.size());
    src_ = dcr::twin::strided(extents.data(), src_strides.data(), rank);
    dst_ = dcr::twin::strided(extents.data(), dst_strides.data(), rank);
    if (!src_.is_non_negative() || !dst_.is_non_negative())
      throw dcr::error(dcr::errc::invalid_argument, "mapped copy: negative extent or stride");
    for (int i = 0; i < rank; ++i) {
      if (extents[i] == 0) empty_ = true;
      if (extents[i] > 1) {
        order_.push_back(i);
        reach_ += (extents[i] - 1) * src_strides[i];
      }
    }
    // Greedy decomposition by decreasing source stride (`_invertible` on the
    // Python side proved it unique).
    std::stable_sort(order_.begin(), order_.end(),
                     [&](int a, int b) { return src_.strides[a] > src_.strides[b]; });
    block_ = src_.contiguous && dst_.contiguous;
  }

  /// Lands the entries of (`idx`, `words`) that the source view covers:
  /// `op` is XOR, overwrite or add (`twin::scatter_op`). `storage` holds
  /// `storage_numel` words. Returns the number of entries written.
  template <dcr::twin::word W>
  std::size_t apply(W* storage, std::uint64_t storage_numel, std::span<const std::uint64_t> idx,
                    std::span<const W> words, dcr::twin::scatter_op op) const {
    if (empty_ || idx.empty()) return 0;
    const auto first = static_cast<std::uint64_t>(src_off_);
    const auto last = first + static_cast<std::uint64_t>(reach_);
    const auto lo =
        static_cast<std::size_t>(std::lower_bound(idx.begin(), idx.end(), first) - idx.begin());
    const auto hi = static_cast<std::size_t>(
        std::upper_bound(idx.begin() + static_cast<std::ptrdiff_t>(lo), idx.end(), last) -
        idx.begin());
    if (lo == hi) return 0;
    if (block_) {
      // A block: destination offset = index + shift. The scatter's checks
      // (indices strictly increasing, inside the block, the block inside
      // the storage) run before the first write, without a location list.
      const auto sub = idx.subspan(lo, hi - lo);
      dcr::throw_if_failed(dcr::twin::check_locations(sub, last + 1));
      if (static_cast<std::uint64_t>(dst_off_ + reach_) >= storage_numel)
        throw dcr::error(dcr::errc::index_out_of_range, "mapped copy: destination outside storage");
      land(storage + dst_off_, sub.data(), first, words.data() + lo, sub.size(), op);
      return sub.size();
    }
    std::vector<std::uint64_t> loc;
    std::vector<W> val;
    loc.reserve(hi - lo);
    val.reserve(hi - lo);
    bool increasing = true;
    for (std::size_t k = lo; k < hi; ++k) {
      auto rem = static_cast<std::int64_t>(idx[k] - first);
      std::int64_t out = dst_off_;
      bool inside = true;
      for (int d : order_) {
        const std::int64_t q = rem / src_.strides[d];
        if (q >= src_.extents[d]) {
          inside = false;
          break;
        }
        rem -= q * src_.strides[d];
        out += q * dst_.strides[d];
      }
      if (!inside || rem != 0) continue;
      const auto o = static_cast<std::uint64_t>(out);
      if (!loc.empty() && o <= loc.back()) increasing = false;
      loc.push_back(o);
      val.push_back(words[k]);
    }
    if (!increasing) { // a permuted view: the scatter takes locations in order
      std::vector<std::size_t> perm(loc.size());
      std::iota(perm.begin(), perm.end(), std::size_t{0});
      std::sort(perm.begin(), perm.end(), [&](auto a, auto b) { return loc[a] < loc[b]; });
      std::vector<std::uint64_t> l2(loc.size());
      std::vector<W> v2(loc.size());
      for (std::size_t j = 0; j < perm.size(); ++j) {
        l2[j] = loc[perm[j]];
        v2[j] = val[perm[j]];
      }
      loc.swap(l2);
      val.swap(v2);
    }
    dcr::throw_if_failed(dcr::twin::check_locations(loc, storage_numel));
    land(storage, loc.data(), 0, val.data(), loc.size(), op);
    return loc.size();
  }

private:
  std::int64_t src_off_ = 0, dst_off_ = 0, reach_ = 0;
  dcr::twin::layout src_, dst_;
  std::vector<int> order_;
  bool empty_ = false, block_ = false;
};

} // namespace dcr_py
