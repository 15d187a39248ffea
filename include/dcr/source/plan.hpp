#pragma once
/// \file
/// Source plan: the canonical tensors of a model, the unique source shards of
/// a trainer (each with its replicas, owner and conversion task) and the
/// residual tasks. A shard with a `map` is an affine task (direct projection);
/// a shard listed in `feeds` is a declared input of residual tasks (its change
/// sets a flag). `megatron_plan` derives the plan of a Megatron-style trainer
/// from a `model_config` and a `trainer_layout`; other trainers build plans
/// with `add_canonical` / `add_shard` / `add_task` / `finalize`.

#include <algorithm>
#include <cstdint>
#include <map>
#include <numeric>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "dcr/core/tensor.hpp"
#include "dcr/map/blockwise.hpp"
#include "dcr/map/index_map.hpp"
#include "dcr/map/residual.hpp"
#include "dcr/model/config.hpp"
#include "dcr/model/trainer_layout.hpp"
#include "dcr/source/ownership.hpp"

namespace dcr {

/// One unique source shard (DP replicas of it are one shard).
struct source_shard {
  std::string
      key; ///< unique: parameter name plus shard coordinates, e.g. "...linear_qkv.weight@tp1/4"
  std::string param; ///< parameter name on the ranks (Megatron naming)
  std::vector<std::uint64_t> shape;
  dtype_id dtype = dtype_id::bf16;
  std::vector<std::uint32_t> replicas; ///< ranks holding a bitwise-identical copy
  std::uint32_t owner = 0;             ///< the replica that compares and emits it
  std::optional<piecewise_map>
      map; ///< geometry: local -> canonical (plan tensor ids), when it has one
  std::vector<std::uint32_t> feeds; ///< residual tasks this shard is an input of
  bool direct = true;               ///< affine task: changes are projected through `map`
  /// Shard-local block-FP8 conversion (an FP8 rollout's shard holding whole
  /// tiles): the owner quantises the shard itself and projects its codes and
  /// scales directly (`map` is then empty and the shard is not affine).
  std::optional<blockwise_fp8> blockwise;
  /// Replicas that hold this shard under another parameter name (Megatron's
  /// last stage holds a tied embedding as `output_layer.weight`).
  std::vector<std::pair<std::uint32_t, std::string>> renamed;

  /// The parameter name of this shard on replica `rank`.
  const std::string& param_on(std::uint32_t rank) const noexcept {
    for (auto& [r, n] : renamed)
      if (r == rank) return n;
    return param;
  }

  /// True when changes of this shard are projected directly through its map.
  bool affine() const noexcept { return direct && map.has_value(); }

  std::uint64_t numel() const noexcept {
    return std::accumulate(shape.begin(), shape.end(), std::uint64_t{1}, std::multiplies<>());
  }
  std::uint64_t nbytes() const noexcept { return numel() * width_of(dtype); }
};

/// A residual task: a rule, its declared inputs (shard ids), its outputs
/// (canonical tensor ids) and its residual-baseline owner (hash of the first
/// output's canonical name over all owners; one owner converts the whole rule).
struct residual_task {
  residual_rule rule;
  std::vector<std::uint32_t> inputs;
  std::vector<std::uint32_t> outputs;
  std::uint32_t owner = 0;
  std::uint64_t output_bytes = 0;
};

/// Canonical tensors, unique source shards and residual tasks of one trainer.
class source_plan {
public:
  std::uint32_t world = 1;                             ///< number of ranks = owners
  std::vector<tensor_meta> canonical;                  ///< canonical tensors (ids are positions)
  std::vector<source_shard> shards;                    ///< unique shards (ids are positions)
  std::vector<residual_task> tasks;                    ///< residual tasks (ids are positions)
  std::vector<std::vector<std::uint32_t>> rank_shards; ///< per rank: shard ids it holds
  ownership_policy ownership = ownership_policy::key_hash; ///< how `finalize` assigns owners

  explicit source_plan(std::uint32_t world_size = 1) : world(world_size) {}

  /// Registers a canonical tensor; returns its id. Names are unique.
  std::uint32_t add_canonical(tensor_meta m) {
    if (tensor_ids_.count(m.name))
      throw error(errc::invalid_argument, "duplicate canonical tensor " + m.name);
    tensor_ids_[m.name] = static_cast<std::uint32_t>(canonical.size());
    canonical.push_back(std::move(m));
    return static_cast<std::uint32_t>(canonical.size() - 1);
  }
  /// Registers a unique shard held by `replicas`; `map` (plan tensor ids)
  /// makes it an affine task.
  std::uint32_t add_shard(std::string key, std::string param, std::vector<std::uint64_t> shape,
                          dtype_id dtype, std::vector<std::uint32_t> replicas,
                          std::optional<piecewise_map> map = std::nullopt) {
    if (shard_ids_.count(key)) throw error(errc::invalid_argument, "duplicate shard key " + key);
    shard_ids_[key] = static_cast<std::uint32_t>(shards.size());
    shards.push_back({std::move(key),
                      std::move(param),
                      std::move(shape),
                      dtype,
                      std::move(replicas),
                      0,
                      std::move(map),
                      {},
                      true,
                      {},
                      {}});
    return static_cast<std::uint32_t>(shards.size() - 1);
  }
  /// Registers a residual task over `inputs` (shard ids). Outputs are added
  /// as canonical tensors, or must equal an existing one of the same name.
  std::uint32_t add_task(residual_rule rule, std::vector<std::uint32_t> inputs) {
    if (inputs.size() != rule.inputs)
      throw error(errc::invalid_argument, rule.name + ": declared " + std::to_string(rule.inputs) +
                                              " inputs, given " + std::to_string(inputs.size()));
    residual_task t;
    for (auto& m : rule.outputs) {
      auto it = tensor_ids_.find(m.name);
      if (it == tensor_ids_.end())
        t.outputs.push_back(add_canonical(m));
      else if (canonical[it->second] != m)
        throw error(errc::shape_mismatch,
                    rule.name + ": output " + m.name + " differs from the canonical tensor");
      else
        t.outputs.push_back(it->second);
      t.output_bytes += m.nbytes();
    }
    const auto id = static_cast<std::uint32_t>(tasks.size());
    for (auto s : inputs) {
      if (s >= shards.size())
        throw error(errc::invalid_argument, rule.name + ": input shard id out of range");
      shards[s].feeds.push_back(id);
    }
    t.inputs = std::move(inputs);
    t.rule = std::move(rule);
    tasks.push_back(std::move(t));
    return id;
  }

  /// Validates the plan and assigns owners; call once after adding everything.
  void finalize() {
    rank_shards.assign(world, {});
    for (std::uint32_t s = 0; s < shards.size(); ++s) {
      auto& sh = shards[s];
      for (auto r : sh.replicas) {
        if (r >= world) throw error(errc::invalid_argument, sh.key + ": replica rank out of range");
        rank_shards[r].push_back(s);
      }
      if (sh.replicas.empty()) throw error(errc::invalid_argument, sh.key + ": no replicas");
      if (ownership == ownership_policy::key_hash) sh.owner = owner_of(sh.key, sh.replicas);
      if (sh.blockwise) {
        const auto& b = *sh.blockwise;
        if (sh.map || b.codes.domain_size() != sh.numel())
          throw error(errc::invalid_argument,
                      sh.key + ": blockwise shard with a map or of another size");
        for (auto* m : {&b.codes, &b.scales})
          for (auto& pc : m->pieces()) {
            if (pc.tensor >= canonical.size())
              throw error(errc::invalid_argument, sh.key + ": blockwise tensor id out of range");
            const auto want = m == &b.codes ? dtype_id::f8e4m3fn : dtype_id::f32;
            if (canonical[pc.tensor].dtype != want)
              throw error(errc::bad_dtype, sh.key + ": blockwise output " +
                                               canonical[pc.tensor].name + " has the wrong dtype");
          }
      }
      if (!sh.map) continue;
      if (sh.map->domain_size() != sh.numel())
        throw error(errc::shape_mismatch, sh.key + ": map domain " +
                                              std::to_string(sh.map->domain_size()) +
                                              " != shard numel " + std::to_string(sh.numel()));
      for (auto& p : sh.map->pieces()) {
        if (p.tensor >= canonical.size())
          throw error(errc::invalid_argument, sh.key + ": map tensor id out of range");
        const auto& c = canonical[p.tensor];
        if (c.dtype != sh.dtype)
          throw error(errc::bad_dtype,
                      sh.key + ": affine task must preserve the dtype of " + c.name);
        if ((p.canonical_row + p.rows) * p.canonical_cols > c.numel())
          throw error(errc::index_out_of_range, sh.key + ": map piece outside " + c.name);
      }
    }
    if (ownership == ownership_policy::key_hash)
      for (auto& t : tasks) t.owner = residual_owner_of(canonical[t.outputs.at(0)].name, world);
    else
      assign_balanced();
  }

  std::uint32_t tensor_id(const std::string& name) const {
    auto it = tensor_ids_.find(name);
    if (it == tensor_ids_.end()) throw error(errc::not_found, "no canonical tensor " + name);
    return it->second;
  }
  std::uint32_t shard_id(const std::string& key) const {
    auto it = shard_ids_.find(key);
    if (it == shard_ids_.end()) throw error(errc::not_found, "no source shard " + key);
    return it->second;
  }
  /// Shards owned by `owner`, in plan order (the order the builder scans).
  std::vector<std::uint32_t> owned_shards(std::uint32_t owner) const {
    std::vector<std::uint32_t> v;
    for (std::uint32_t s = 0; s < shards.size(); ++s)
      if (shards[s].owner == owner) v.push_back(s);
    return v;
  }
  /// Residual tasks whose baseline `owner` holds, in plan order.
  std::vector<std::uint32_t> owned_tasks(std::uint32_t owner) const {
    std::vector<std::uint32_t> v;
    for (std::uint32_t t = 0; t < tasks.size(); ++t)
      if (tasks[t].owner == owner) v.push_back(t);
    return v;
  }
  /// Bytes of the canonical checkpoint.
  std::uint64_t checkpoint_bytes() const noexcept {
    std::uint64_t b = 0;
    for (auto& c : canonical) b += c.nbytes();
    return b;
  }
  /// Bytes of one copy of the unique source shards.
  std::uint64_t source_bytes() const noexcept {
    std::uint64_t b = 0;
    for (auto& s : shards) b += s.nbytes();
    return b;
  }
  /// Source bytes owned per owner.
  balance_report ownership_balance() const {
    std::vector<std::uint64_t> b(world, 0);
    for (auto& s : shards) b[s.owner] += s.nbytes();
    return make_balance_report(std::move(b));
  }

private:
  // LPT greedy (see ownership_policy::balanced). Sorting by content, not by
  // id, makes the result independent of the order the plan was built in.
  void assign_balanced() {
    std::vector<std::uint64_t> load(world, 0);
    std::vector<std::uint32_t> order(shards.size());
    std::iota(order.begin(), order.end(), 0u);
    std::vector<std::uint64_t> key_hash(shards.size());
    for (std::uint32_t s = 0; s < shards.size(); ++s) key_hash[s] = name_hash(shards[s].key);
    std::sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) {
      const auto na = shards[a].nbytes(), nb = shards[b].nbytes();
      if (na != nb) return na > nb;
      if (key_hash[a] != key_hash[b]) return key_hash[a] < key_hash[b];
      return shards[a].key < shards[b].key;
    });
    auto tie = [](std::string_view key, std::uint32_t rank) {
      return name_hash(std::string(key) + "#" + std::to_string(rank));
    };
    for (auto s : order) {
      auto& sh = shards[s];
      std::uint32_t best = sh.replicas.front();
      for (auto r : sh.replicas)
        if (load[r] < load[best] || (load[r] == load[best] && tie(sh.key, r) < tie(sh.key, best)))
          best = r;
      sh.owner = best;
      load[best] += sh.nbytes();
    }
    std::vector<std::uint32_t> torder(tasks.size());
    std::iota(torder.begin(), torder.end(), 0u);
    auto tname = [&](std::uint32_t t) -> const std::string& {
      return canonical[tasks[t].outputs.at(0)].name;
    };
    std::sort(torder.begin(), torder.end(), [&](std::uint32_t a, std::uint32_t b) {
      if (tasks[a].output_bytes != tasks[b].output_bytes)
        return tasks[a].output_bytes > tasks[b].output_bytes;
      return tname(a) < tname(b);
    });
    for (auto t : torder) {
      std::uint32_t best = 0;
      for (std::uint32_t r = 1; r < world; ++r)
        if (load[r] < load[best] ||
            (load[r] == load[best] && tie(tname(t), r) < tie(tname(t), best)))
          best = r;
      tasks[t].owner = best;
      load[best] += tasks[t].output_bytes;
    }
  }

  std::unordered_map<std::string, std::uint32_t> tensor_ids_, shard_ids_;
};

/// Which parts of a Megatron trainer go through residual conversion.
struct megatron_options {
  bool qkv_residual = false; ///< fused QKV assembled and diffed instead of projected
  bool full_conversion =
      false; ///< every tensor assembled and diffed (the reference the paper calls F)
  ownership_policy ownership = ownership_policy::key_hash; ///< see `ownership_policy`
};

namespace detail {
inline std::string mg_layer(std::uint64_t l, const std::string& s) {
  return "decoder.layers." + std::to_string(l) + "." + s;
}

/// Turns affine shards selected by `pick` into gather rules, one per connected
/// group of canonical tensors they write (e.g. all TP shards of one fused QKV).
template <class Pick>
void convert_to_residual(source_plan& p, Pick&& pick) {
  std::vector<std::uint32_t> sel;
  for (std::uint32_t s = 0; s < p.shards.size(); ++s)
    if (p.shards[s].affine() && !p.shards[s].map->pieces().empty() && pick(p.shards[s]))
      sel.push_back(s);
  std::vector<std::uint32_t> parent(p.canonical.size());
  std::iota(parent.begin(), parent.end(), 0u);
  auto find = [&](std::uint32_t x) {
    while (parent[x] != x) x = parent[x] = parent[parent[x]];
    return x;
  };
  for (auto s : sel) {
    auto ps = p.shards[s].map->pieces();
    for (auto& pc : ps) parent[find(pc.tensor)] = find(ps[0].tensor);
  }
  std::map<std::uint32_t, std::vector<std::uint32_t>>
      groups; // root -> shards (ordered by smallest tensor id)
  for (auto s : sel) groups[find(p.shards[s].map->pieces()[0].tensor)].push_back(s);
  std::vector<std::pair<std::uint32_t, std::vector<std::uint32_t>>> ordered;
  for (auto& [root, ss] : groups) {
    std::uint32_t lo = root;
    for (auto s : ss)
      for (auto& pc : p.shards[s].map->pieces()) lo = std::min(lo, pc.tensor);
    ordered.emplace_back(lo, ss);
  }
  std::sort(ordered.begin(), ordered.end());
  for (auto& [lo, ss] : ordered) {
    std::vector<std::uint32_t> outs;
    for (auto s : ss)
      for (auto& pc : p.shards[s].map->pieces()) outs.push_back(pc.tensor);
    std::sort(outs.begin(), outs.end());
    outs.erase(std::unique(outs.begin(), outs.end()), outs.end());
    std::vector<std::uint32_t> slot(p.canonical.size(), 0);
    std::vector<tensor_meta> metas;
    for (std::uint32_t i = 0; i < outs.size(); ++i) {
      slot[outs[i]] = i;
      metas.push_back(p.canonical[outs[i]]);
    }
    std::vector<piecewise_map> maps;
    for (auto s : ss) {
      maps.push_back(p.shards[s].map->retargeted(slot));
      p.shards[s].direct = false; // the map stays: it is the geometry the simulator inverts
    }
    std::string name = "gather:" + metas[0].name;
    p.add_task(gather_rule(std::move(name), std::move(metas), std::move(maps)), ss);
  }
}
} // namespace detail

/// Plan of a Megatron-style trainer (Megatron-Core parameter names, TE fused
/// layer norms, grouped experts `linear_fc1.weight{L}`):
/// - `embedding.word_embeddings.weight` / `output_layer.weight`: vocab-padded
///   (`trainer_layout::vocab_block`, none by default) column-parallel on the
///   first / last stage; tied embeddings with PP > 1: the last stage holds a
///   replica of the embedding named `output_layer.weight`, as Megatron's
///   `LanguageModule.setup_embeddings_and_output_layer` allocates it there;
/// - `linear_qkv.weight|bias`: fused QKV interleaved per query group;
/// - `linear_proj.weight`, `linear_fc2.weight`: row-parallel;
/// - `linear_proj.bias` (Llama's `o_proj` bias, `model_config::o_proj_bias`):
///   whole on every TP rank of the stage, as `RowParallelLinear` holds it;
/// - `linear_fc1.weight`: gated [G_r; U_r];
/// - norms and router: replicated over TP;
/// - MoE layers (`model_config::is_moe_layer`; other layers of a MoE model
///   have a dense MLP): EP rank k holds global experts [k E/S, (k+1) E/S),
///   expert-TP splitting fc1 (gated) and fc2 (row-parallel) inside;
/// - PP stage s holds the layers `megatron_stage_layers` gives it (uneven
///   first / last stage included) and names them by their stage-local index
///   (global layer - stage offset), as `TransformerBlock` numbers its modules.
/// Shard keys are the parameter name plus coordinates (`@tp1/4`, `@ep0/2.etp0/1`,
/// and `.pp1/2` / `@pp1/2` for layers when PP > 1, where local names repeat).
inline source_plan megatron_plan(const model_config& c, const trainer_layout& l,
                                 const megatron_options& o = {}) {
  throw_if_failed(validate(c, l));
  source_plan p(static_cast<std::uint32_t>(l.world()));
  for (auto& m : canonical_tensors(c)) p.add_canonical(m);
  const auto T = l.ranks_per_stage();
  auto tp_group = [&](std::uint64_t s, std::uint64_t r) {
    std::vector<std::uint32_t> v;
    for (std::uint64_t d = 0; d < l.dp; ++d)
      v.push_back(static_cast<std::uint32_t>(l.rank(s, d, r)));
    return v;
  };
  auto stage_group = [&](std::uint64_t s) {
    std::vector<std::uint32_t> v;
    for (std::uint64_t i = 0; i < T; ++i) v.push_back(static_cast<std::uint32_t>(s * T + i));
    return v;
  };
  auto expert_group = [&](std::uint64_t s, std::uint64_t k, std::uint64_t r) {
    std::vector<std::uint32_t> v;
    for (std::uint64_t i = 0; i < T; ++i)
      if (i % l.etp == r && (i / l.etp) % l.ep == k)
        v.push_back(static_cast<std::uint32_t>(s * T + i));
    return v;
  };
  auto tid = [&](const std::string& n) { return p.tensor_id(n); };
  auto tpc = [](std::uint64_t r, std::uint64_t t) {
    return "tp" + std::to_string(r) + "/" + std::to_string(t);
  };
  // Key of a shard: parameter name, then its coordinates; layer shards of
  // different stages share local names, so their keys carry the stage.
  std::uint64_t stage = 0;
  auto key = [&](const std::string& n, const std::string& coords, bool layer) {
    std::string k = n;
    if (!coords.empty()) k += "@" + coords;
    if (layer && l.pp > 1)
      k += (coords.empty() ? "@pp" : ".pp") + std::to_string(stage) + "/" + std::to_string(l.pp);
    return k;
  };
  const auto H = c.hidden, d = c.head_dim, nh = c.heads, ng = c.kv_heads, t = l.tp;
  const auto fused = ng * (nh / ng + 2) * d;
  const auto vp = padded_vocab(c.vocab, t, l.vocab_block);
  auto replicated = [&](const std::string& param, const std::string& canon, std::uint64_t s,
                        bool layer) {
    const auto id = tid(canon);
    const auto& m = p.canonical[id];
    const std::uint64_t rows = m.shape[0], cols = m.numel() / std::max<std::uint64_t>(rows, 1);
    p.add_shard(key(param, "", layer), param, m.shape, c.dtype, stage_group(s),
                replicated_map(id, rows, cols).pieces());
  };

  for (std::uint64_t s = 0; s < l.pp; ++s) {
    stage = s;
    const bool first = s == 0, last = s + 1 == l.pp;
    if (first)
      for (std::uint64_t r = 0; r < t; ++r) {
        auto reps = tp_group(0, r);
        std::vector<std::pair<std::uint32_t, std::string>> renamed;
        if (c.tied_embeddings && l.pp > 1)
          for (auto x : tp_group(l.pp - 1, r)) {
            reps.push_back(x);
            renamed.emplace_back(x, "output_layer.weight");
          }
        const std::string n = "embedding.word_embeddings.weight";
        const auto id = p.add_shard(
            key(n, tpc(r, t), false), n, {vp / t, H}, c.dtype, reps,
            vocab_padded_map(tid("model.embed_tokens.weight"), c.vocab, H, t, r, l.vocab_block)
                .pieces());
        p.shards[id].renamed = std::move(renamed);
      }
    const auto [l0, l1] = megatron_stage_layers(c, l, s);
    for (std::uint64_t i = l0; i < l1; ++i) {
      auto L = [&](const std::string& x) { return layer_name(i, x); };
      auto M = [&](const std::string& x) { return detail::mg_layer(i - l0, x); };
      replicated(M("self_attention.linear_qkv.layer_norm_weight"), L("input_layernorm.weight"), s,
                 true);
      for (std::uint64_t r = 0; r < t; ++r) {
        const auto n = M("self_attention.linear_qkv.weight");
        p.add_shard(key(n, tpc(r, t), true), n, {fused / t, H}, c.dtype, tp_group(s, r),
                    fused_qkv_map(tid(L("self_attn.q_proj.weight")),
                                  tid(L("self_attn.k_proj.weight")),
                                  tid(L("self_attn.v_proj.weight")), nh, ng, d, H, t, r)
                        .pieces());
        if (c.attention_bias) {
          const auto b = M("self_attention.linear_qkv.bias");
          p.add_shard(key(b, tpc(r, t), true), b, {fused / t}, c.dtype, tp_group(s, r),
                      fused_qkv_map(tid(L("self_attn.q_proj.bias")),
                                    tid(L("self_attn.k_proj.bias")),
                                    tid(L("self_attn.v_proj.bias")), nh, ng, d, 1, t, r)
                          .pieces());
        }
        const auto o = M("self_attention.linear_proj.weight");
        p.add_shard(key(o, tpc(r, t), true), o, {H, nh * d / t}, c.dtype, tp_group(s, r),
                    row_parallel_map(tid(L("self_attn.o_proj.weight")), H, nh * d, t, r).pieces());
      }
      // `RowParallelLinear`'s bias is added after the all-reduce, so every TP
      // rank holds the whole [hidden] vector (Megatron-Core allocates it with
      // `output_size`, not the per-partition size): replicated over the stage.
      if (c.o_proj_bias)
        replicated(M("self_attention.linear_proj.bias"), L("self_attn.o_proj.bias"), s, true);
      if (c.qk_norm) {
        replicated(M("self_attention.q_layernorm.weight"), L("self_attn.q_norm.weight"), s, true);
        replicated(M("self_attention.k_layernorm.weight"), L("self_attn.k_norm.weight"), s, true);
      }
      if (!c.is_moe_layer(i)) {
        replicated(M("mlp.linear_fc1.layer_norm_weight"), L("post_attention_layernorm.weight"), s,
                   true);
        for (std::uint64_t r = 0; r < t; ++r) {
          const auto f1 = M("mlp.linear_fc1.weight"), f2 = M("mlp.linear_fc2.weight");
          p.add_shard(key(f1, tpc(r, t), true), f1, {2 * c.ffn / t, H}, c.dtype, tp_group(s, r),
                      gated_fc1_map(tid(L("mlp.gate_proj.weight")), tid(L("mlp.up_proj.weight")),
                                    c.ffn, H, t, r)
                          .pieces());
          p.add_shard(key(f2, tpc(r, t), true), f2, {H, c.ffn / t}, c.dtype, tp_group(s, r),
                      row_parallel_map(tid(L("mlp.down_proj.weight")), H, c.ffn, t, r).pieces());
        }
      } else {
        replicated(M("pre_mlp_layernorm.weight"), L("post_attention_layernorm.weight"), s, true);
        replicated(M("mlp.router.weight"), L("mlp.gate.weight"), s, true);
        const auto per = c.experts / l.ep, te = l.etp, F = c.moe_ffn;
        for (std::uint64_t k = 0; k < l.ep; ++k)
          for (std::uint64_t loc = 0; loc < per; ++loc) {
            const auto e = global_expert(loc, k, c.experts, l.ep);
            for (std::uint64_t r = 0; r < te; ++r) {
              const auto coord = "ep" + std::to_string(k) + "/" + std::to_string(l.ep) + ".etp" +
                                 std::to_string(r) + "/" + std::to_string(te);
              const auto f1 = M("mlp.experts.linear_fc1.weight" + std::to_string(loc));
              const auto f2 = M("mlp.experts.linear_fc2.weight" + std::to_string(loc));
              p.add_shard(key(f1, coord, true), f1, {2 * F / te, H}, c.dtype, expert_group(s, k, r),
                          gated_fc1_map(tid(expert_name(i, e, "gate_proj.weight")),
                                        tid(expert_name(i, e, "up_proj.weight")), F, H, te, r)
                              .pieces());
              p.add_shard(key(f2, coord, true), f2, {H, F / te}, c.dtype, expert_group(s, k, r),
                          row_parallel_map(tid(expert_name(i, e, "down_proj.weight")), H, F, te, r)
                              .pieces());
            }
          }
      }
    }
    if (last) {
      replicated("decoder.final_layernorm.weight", "model.norm.weight", s, false);
      if (!c.tied_embeddings)
        for (std::uint64_t r = 0; r < t; ++r) {
          const std::string n = "output_layer.weight";
          p.add_shard(
              key(n, tpc(r, t), false), n, {vp / t, H}, c.dtype, tp_group(s, r),
              vocab_padded_map(tid("lm_head.weight"), c.vocab, H, t, r, l.vocab_block).pieces());
        }
    }
  }
  if (o.full_conversion)
    detail::convert_to_residual(p, [](const source_shard&) { return true; });
  else if (o.qkv_residual)
    detail::convert_to_residual(p, [](const source_shard& s) {
      return s.param.find("linear_qkv.weight") != std::string::npos ||
             s.param.find("linear_qkv.bias") != std::string::npos;
    });
  p.ownership = o.ownership;
  p.finalize();
  return p;
}

} // namespace dcr
