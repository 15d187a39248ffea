#pragma once
/// \file
/// Source state: the stored bytes of every unique source shard of a plan.
///
/// How a candidate reaches an owner: a `source_view` is one span per shard id
/// (empty where the caller does not provide it). In one process (tests,
/// benches, the demo) a `source_state` owns all shards and its `view()` serves
/// every owner. On a real trainer rank the view holds spans into the rank's
/// own parameter storage for the shards it owns, plus the gathered inputs of
/// the residual tasks whose baseline it owns. Owners only read their owned
/// shards (and their residual tasks' inputs) from it.
///
/// The simulator side: `source_from_canonical` produces each shard bit-exactly
/// from canonical tensors (the inverse of the affine maps; padding rows hold
/// `padding` words), so a "trainer" can be driven by canonical tensors and its
/// state is consistent across layouts. `export_canonical` is the other
/// direction (full conversion of every task).

#include <algorithm>
#include <cstring>
#include <map>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "dcr/core/tensor.hpp"
#include "dcr/source/plan.hpp"

namespace dcr {

/// Non-owning candidate: one byte span per shard id.
struct source_view {
  std::vector<std::span<const std::byte>> shards;
};

/// Owning source state of a plan (one copy per unique shard).
struct source_state {
  std::vector<std::vector<std::byte>> shards;

  /// Zero-filled state shaped like `p`.
  static source_state zeros(const source_plan& p) {
    source_state s;
    for (auto& sh : p.shards) s.shards.emplace_back(sh.nbytes());
    return s;
  }
  source_view view() const {
    source_view v;
    for (auto& b : shards) v.shards.emplace_back(b);
    return v;
  }
};

/// `shard_from_canonical` over `bytes_of(tensor id)`, which returns the
/// stored bytes of a canonical tensor as a `std::span<const std::byte>` of
/// its full size (the caller checks sizes).
template <class BytesOf>
void shard_from_tensor_bytes(const source_plan& p, std::uint32_t s, BytesOf&& bytes_of,
                             std::vector<std::byte>& out, std::byte padding = std::byte{0}) {
  const auto& sh = p.shards[s];
  out.resize(sh.nbytes());
  if (!sh.map) return;
  const std::uint64_t w = width_of(sh.dtype);
  std::memset(out.data(), static_cast<int>(padding), out.size());
  sh.map->map_run(0, sh.map->domain_size(), [&](const canonical_run& r) {
    const std::span<const std::byte> b = bytes_of(r.tensor);
    std::memcpy(out.data() + r.local_start * w, b.data() + r.canonical_start * w, r.count * w);
  });
}

/// Shard `s` of `p` from canonical tensors (indexed by plan tensor id), by the
/// inverse of its affine map: `shard[j] = canonical[map(j)]`; unmapped
/// (padding) elements are filled with the byte `padding`. Shards without a map
/// (inputs such as scales that no canonical tensor holds) are left unchanged. Throws
/// `errc::shape_mismatch` when a canonical tensor has the wrong size.
inline void shard_from_canonical(const source_plan& p, std::uint32_t s,
                                 std::span<const host_tensor> canonical,
                                 std::vector<std::byte>& out, std::byte padding = std::byte{0}) {
  shard_from_tensor_bytes(
      p, s,
      [&](std::uint32_t t) -> std::span<const std::byte> {
        if (canonical[t].bytes.size() != p.canonical[t].nbytes())
          throw error(errc::shape_mismatch,
                      "source_from_canonical: " + p.canonical[t].name + " has the wrong size");
        return canonical[t].bytes;
      },
      out, padding);
}

/// Every shard of `p` from canonical tensors (see `shard_from_canonical`);
/// residual-input shards without a map are taken from `residual_inputs` when
/// given (by shard id), else zero.
inline source_state source_from_canonical(const source_plan& p,
                                          std::span<const host_tensor> canonical,
                                          const source_state* residual_inputs = nullptr,
                                          std::byte padding = std::byte{0}) {
  if (canonical.size() != p.canonical.size())
    throw error(errc::shape_mismatch, "source_from_canonical: tensor count differs from plan");
  source_state st = source_state::zeros(p);
  for (std::uint32_t s = 0; s < p.shards.size(); ++s) {
    if (!p.shards[s].map && residual_inputs)
      st.shards[s] = residual_inputs->shards.at(s);
    else
      shard_from_canonical(p, s, canonical, st.shards[s], padding);
  }
  return st;
}

/// The shard ids owners `owners` read (see `owned_view`): the shards they
/// own and the declared inputs of the residual tasks whose baseline they
/// own, sorted and unique.
inline std::vector<std::uint32_t> owned_inputs(const source_plan& p,
                                               std::span<const std::uint32_t> owners) {
  std::vector<std::uint8_t> need(p.shards.size(), 0);
  for (auto o : owners) {
    for (auto s : p.owned_shards(o)) need[s] = 1;
    for (auto t : p.owned_tasks(o))
      for (auto s : p.tasks[t].inputs) need[s] = 1;
  }
  std::vector<std::uint32_t> ids;
  for (std::uint32_t s = 0; s < need.size(); ++s)
    if (need[s]) ids.push_back(s);
  return ids;
}

/// A source state that holds only the shards owners `owners` read
/// (`owned_inputs`); every other shard is empty. This is what one training
/// rank holds for the refit: an owner process never needs the rest of the
/// model. Each shard is produced from canonical tensors as
/// `shard_from_canonical` does, and the canonical tensors come one at a time
/// from `tensor(id)`, which returns anything a `std::span<const std::byte>`
/// can view (a `std::vector<std::byte>` it made, or a span into a mapped
/// file: then only the pages of the owned slices are read). A tensor is
/// asked for once and dropped after the last owned shard that reads it, so
/// the state costs the owned shards plus the canonical tensors that one
/// shard spans. `errc::shape_mismatch` when a tensor has the wrong size.
template <class Tensor>
source_state owned_source_from_canonical(const source_plan& p,
                                         std::span<const std::uint32_t> owners, Tensor&& tensor,
                                         std::byte padding = std::byte{0}) {
  using held_t = std::decay_t<decltype(tensor(std::uint32_t{}))>;
  const auto ids = owned_inputs(p, owners);
  // The canonical tensors each shard reads, and the last shard reading each.
  std::vector<std::vector<std::uint32_t>> reads(ids.size());
  std::vector<std::size_t> last_use(p.canonical.size(), 0);
  for (std::size_t k = 0; k < ids.size(); ++k) {
    const auto& sh = p.shards[ids[k]];
    if (!sh.map) continue;
    sh.map->map_run(0, sh.map->domain_size(), [&](const canonical_run& r) {
      if (reads[k].empty() || reads[k].back() != r.tensor) reads[k].push_back(r.tensor);
    });
    std::sort(reads[k].begin(), reads[k].end());
    reads[k].erase(std::unique(reads[k].begin(), reads[k].end()), reads[k].end());
    for (auto t : reads[k]) last_use[t] = k;
  }
  source_state st;
  st.shards.resize(p.shards.size());
  std::map<std::uint32_t, held_t> held;
  for (std::size_t k = 0; k < ids.size(); ++k) {
    const auto s = ids[k];
    const auto& sh = p.shards[s];
    auto& out = st.shards[s];
    out.assign(sh.nbytes(), std::byte{0}); // an unmapped input (e.g. scales) stays zero
    for (auto t : reads[k]) {
      if (held.count(t)) continue;
      held.emplace(t, tensor(t));
      const std::span<const std::byte> b(held.at(t));
      if (b.size() != p.canonical[t].nbytes())
        throw error(errc::shape_mismatch, "owned_source_from_canonical: " + p.canonical[t].name +
                                              " has " + std::to_string(b.size()) +
                                              " bytes, expected " +
                                              std::to_string(p.canonical[t].nbytes()));
    }
    shard_from_tensor_bytes(
        p, s, [&](std::uint32_t t) { return std::span<const std::byte>(held.at(t)); }, out,
        padding);
    for (auto t : reads[k])
      if (last_use[t] == k) held.erase(t);
  }
  return st;
}

/// What one owner needs from a candidate: spans for the shards it owns and
/// for the declared inputs of the residual tasks whose baseline it owns;
/// every other span is empty. (On a real rank this is what its own storage
/// plus the residual-part gather provide.)
inline source_view owned_view(const source_plan& p, const source_view& all, std::uint32_t owner) {
  source_view v;
  v.shards.resize(p.shards.size());
  for (auto s : p.owned_shards(owner)) v.shards[s] = all.shards.at(s);
  for (auto t : p.owned_tasks(owner))
    for (auto s : p.tasks[t].inputs) v.shards[s] = all.shards.at(s);
  return v;
}

/// The shards rank `rank` holds (its replicas of each unique shard), by shard id.
inline source_view rank_view(const source_plan& p, const source_view& all, std::uint32_t rank) {
  source_view v;
  v.shards.resize(p.shards.size());
  for (auto s : p.rank_shards.at(rank)) v.shards[s] = all.shards.at(s);
  return v;
}

/// Inputs of residual task `t` from a view.
inline std::vector<residual_input> task_inputs(const source_plan& p, std::uint32_t t,
                                               const source_view& v) {
  std::vector<residual_input> in;
  for (auto s : p.tasks[t].inputs) in.push_back({v.shards.at(s), p.shards[s].dtype});
  return in;
}

/// Full conversion: canonical tensors of a source state (affine shards placed
/// through their maps, residual tasks converted). Checks coverage and overlap
/// agreement of every canonical tensor (`errc::coverage`, `errc::parts_disagree`).
inline status export_canonical(const source_plan& p, const source_view& v,
                               std::vector<host_tensor>& out) {
  out.clear();
  for (auto& m : p.canonical) out.emplace_back(m);
  std::vector<host_tensor> produced;
  std::vector<std::uint8_t> by_task(p.canonical.size(), 0);
  for (std::uint32_t t = 0; t < p.tasks.size(); ++t) {
    DCR_TRY(run_rule(p.tasks[t].rule, task_inputs(p, t, v), produced));
    for (std::size_t k = 0; k < produced.size(); ++k) {
      const auto id = p.tasks[t].outputs[k];
      DCR_RETURN_ERROR_IF(by_task[id], parts_disagree,
                          p.canonical[id].name + ": produced by two residual tasks");
      by_task[id] = 1;
      out[id].bytes = std::move(produced[k].bytes);
    }
  }
  // Affine parts, assembled per canonical tensor with the same checks.
  std::vector<std::uint32_t> affine_ids;
  for (std::uint32_t id = 0; id < p.canonical.size(); ++id)
    if (!by_task[id]) affine_ids.push_back(id);
  std::vector<std::uint32_t> slot(p.canonical.size(), nowhere);
  for (std::uint32_t i = 0; i < affine_ids.size(); ++i) slot[affine_ids[i]] = i;
  std::vector<host_tensor> work;
  for (auto id : affine_ids) work.push_back(std::move(out[id]));
  part_assembler a(work);
  std::vector<std::byte> converted;
  for (std::uint32_t s = 0; s < p.shards.size(); ++s) {
    const auto& sh = p.shards[s];
    if (sh.blockwise) { // shard-local FP8: its own codes and scales
      const auto& b = *sh.blockwise;
      DCR_RETURN_ERROR_IF(v.shards.at(s).size() != sh.nbytes(), shape_mismatch,
                          sh.key + ": source view has the wrong size");
      converted.resize(b.converted_bytes());
      b.convert(v.shards.at(s), converted);
      DCR_TRY(
          a.add(b.codes.retargeted(slot), {b.code_part(converted), dtype_id::f8e4m3fn}, sh.key));
      DCR_TRY(a.add(b.scales.retargeted(slot), {b.scale_part(converted), dtype_id::f32}, sh.key));
      continue;
    }
    if (!sh.affine()) continue;
    for (auto& pc : sh.map->pieces())
      DCR_RETURN_ERROR_IF(slot[pc.tensor] == nowhere, parts_disagree,
                          sh.key + ": writes " + p.canonical[pc.tensor].name +
                              ", which a residual task produces");
    DCR_TRY(a.add(sh.map->retargeted(slot), {v.shards.at(s), sh.dtype}, sh.key));
  }
  DCR_TRY(a.finish());
  for (std::uint32_t i = 0; i < affine_ids.size(); ++i) out[affine_ids[i]] = std::move(work[i]);
  return status::success();
}

} // namespace dcr
