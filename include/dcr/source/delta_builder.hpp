#pragma once
/// \file
/// The delta builder of one owner: per attempt, the walk over the owner's
/// units in plan order (owned affine and blockwise shards, then owned
/// required residual tasks), grouped into chunks of whole units (byte target:
/// local shard bytes for shards, converted canonical bytes for residual
/// tasks), and per chunk the records of every unit:
///
///   affine shard     stages::delta<compare<D>, project<piecewise_map>,
///                    encode<E, by_scheme>> against the shard's tracker;
///   blockwise shard  quantise the candidate shard, then the same
///                    composition over its codes (E4M3) and its scales (F32),
///                    each through its own map;
///   residual task    stages::residual<residual_rule>: convert, then
///                    delta<compare<D>, project<identity_map>, encode<E>>
///                    against the task's residual baseline.
///
/// The composition is the only per-element code; which instantiation runs
/// for a shard (its dtype, the item encoding, whether add words are recorded
/// alongside XOR masks) is picked once per shard from a table built at
/// compile time over the policy lists (`dispatched`, pipeline/dispatch.hpp),
/// or fixed to one statically composed `stages::refit_pipeline`
/// (`composed<P>`), which refuses anything outside its configuration.
/// Chunk boundaries depend on the plan only, so chunks are built
/// independently (on `builder_options::threads` threads, at most
/// `chunks_in_flight` at a time) and delivered in chunk order.

#include <string>
#include <type_traits>
#include <vector>

#include "dcr/codec/locations.hpp"
#include "dcr/codec/values.hpp"
#include "dcr/core/dtype.hpp"
#include "dcr/core/error.hpp"
#include "dcr/pipeline/dispatch.hpp"
#include "dcr/pipeline/parallel.hpp"
#include "dcr/source/baseline.hpp"
#include "dcr/source/options.hpp"
#include "dcr/source/stages.hpp"

namespace dcr {

/// The delta builder of one owner over its baseline (see the file comment).
class delta_builder {
public:
  /// `pool`: record memory kept between builds (the owner's), or null to
  /// allocate every chunk's records afresh.
  explicit delta_builder(const baseline& base, stages::record_pool* pool = nullptr)
      : base_(base), pool_(pool) {}

  /// The records of one chunk under construction, and the changed local
  /// indices of the shard being projected when they are known (else the
  /// compare stage finds them); new records start in vectors from `pool`
  /// when there is one (empty, their capacity kept from an earlier build).
  struct chunk_state {
    std::vector<stages::tensor_records> records;
    const std::vector<std::uint64_t>* changed = nullptr;
    stages::record_pool* pool = nullptr;
    stages::record_buffer& get(std::uint32_t tensor, value_encoding e) {
      for (auto it = records.rbegin(); it != records.rend(); ++it)
        if (it->tensor == tensor && it->enc == e) return *it;
      auto& r = records.emplace_back();
      r.tensor = tensor;
      r.enc = e;
      // Add words are recorded alongside XOR masks only.
      if (pool) pool->take(tensor, r, e == value_encoding::xor_mask);
      return r;
    }
  };

  /// compare<D> -> project<M> -> encode<E> (or encode_either<E, A> when `A`
  /// is not void) of one shard into the open chunk: the one place the
  /// builder instantiates the stage composition.
  template <class D, class M, class E, class A = void>
  static void project_shard(const M& map, std::span<const std::byte> old_b,
                            std::span<const std::byte> new_b, chunk_state& st) {
    using W = word_t<D>;
    using Enc = std::conditional_t<
        std::is_void_v<A>, stages::encode<E, codec::by_scheme>,
        stages::encode_either<E, std::conditional_t<std::is_void_v<A>, E, A>, codec::by_scheme>>;
    const stages::delta<stages::compare<D>, stages::project<M>, Enc> run{stages::project<M>{map}};
    auto target = [&](std::uint32_t tensor) -> stages::record_buffer& {
      return st.get(tensor, E::id);
    };
    const auto o = baseline::as_words<W>(old_b), c = baseline::as_words<W>(new_b);
    if (st.changed)
      run(o, c, std::span<const std::uint64_t>(*st.changed), target);
    else
      run(o, c, target);
  }

  /// The general path: one table lookup per shard (dtype x encoding) and per
  /// residual output (dtype).
  struct dispatched {
    void affine(const source_shard& sh, std::span<const std::byte> o, std::span<const std::byte> c,
                value_encoding e, bool either, chunk_state& st) const {
      using fn = void(const piecewise_map&, std::span<const std::byte>, std::span<const std::byte>,
                      chunk_state&);
      if (either) {
        static constexpr pipeline::dispatch_table<affine_either_fn, fn, pipeline::dtype_list>
            either_table{};
        auto* f = either_table(pipeline::position_of<pipeline::dtype_list>(sh.dtype));
        if (!f) throw error(errc::bad_dtype, sh.key + ": no pipeline for its dtype");
        f(*sh.map, o, c, st);
        return;
      }
      static constexpr pipeline::dispatch_table<affine_fn, fn, pipeline::dtype_list,
                                                pipeline::encoding_list>
          table{};
      auto* f = table(pipeline::position_of<pipeline::dtype_list>(sh.dtype),
                      pipeline::position_of<pipeline::encoding_list>(e));
      if (!f) throw error(errc::bad_dtype, sh.key + ": no pipeline for its dtype");
      f(*sh.map, o, c, st);
    }
    void residual(const tensor_meta& meta, std::uint32_t tensor, std::span<const std::byte> o,
                  std::span<const std::byte> c, value_encoding e, chunk_state& st) const {
      static constexpr pipeline::dispatch_table<residual_fn,
                                                void(const tensor_meta&, std::uint32_t,
                                                     std::span<const std::byte>,
                                                     std::span<const std::byte>, chunk_state&),
                                                pipeline::dtype_list, pipeline::encoding_list>
          table{};
      auto* f = table(pipeline::position_of<pipeline::dtype_list>(meta.dtype),
                      pipeline::position_of<pipeline::encoding_list>(e));
      if (!f) throw error(errc::bad_dtype, meta.name + ": no pipeline for its dtype");
      f(meta, tensor, o, c, st);
    }
    void blockwise(const source_shard& sh, std::span<const std::byte> oc,
                   std::span<const std::byte> nc, std::span<const std::byte> os,
                   std::span<const std::byte> ns, value_encoding e, chunk_state& st) const {
      const auto& b = *sh.blockwise;
      if (e == value_encoding::xor_mask) {
        project_shard<f8e4m3fn, piecewise_map, codec::xor_mask>(b.codes, oc, nc, st);
        project_shard<f32, piecewise_map, codec::xor_mask>(b.scales, os, ns, st);
      } else {
        project_shard<f8e4m3fn, piecewise_map, codec::overwrite>(b.codes, oc, nc, st);
        project_shard<f32, piecewise_map, codec::overwrite>(b.scales, os, ns, st);
      }
    }
  };

  /// A statically composed pipeline: P's instantiation or a typed error.
  template <class P>
  struct composed {
    static_assert(std::is_same_v<typename P::map_type, piecewise_map>,
                  "an owner's shards carry piecewise maps");
    using D = typename P::dtype;
    using E = typename P::encoding;
    void affine(const source_shard& sh, std::span<const std::byte> o, std::span<const std::byte> c,
                value_encoding e, bool either, chunk_state& st) const {
      if (sh.dtype != dtype_traits<D>::id)
        throw error(errc::bad_dtype, sh.key + ": " + std::string(name_of(sh.dtype)) +
                                         " shard, pipeline for " +
                                         std::string(name_of(dtype_traits<D>::id)));
      if (e != E::id)
        throw error(errc::invalid_argument, sh.key + ": needs " + std::string(to_string(e)) +
                                                " items, pipeline encodes " +
                                                std::string(to_string(E::id)));
      if constexpr (E::id == value_encoding::xor_mask)
        if (either) {
          project_shard<D, piecewise_map, E, codec::add_delta>(*sh.map, o, c, st);
          return;
        }
      project_shard<D, piecewise_map, E>(*sh.map, o, c, st);
    }
    void residual(const tensor_meta& meta, std::uint32_t tensor, std::span<const std::byte> o,
                  std::span<const std::byte> c, value_encoding e, chunk_state& st) const {
      if (e != value_encoding::overwrite)
        throw error(errc::invalid_argument,
                    meta.name + ": residual_xor needs the dispatched builder (a composed "
                                "pipeline encodes residual outputs as overwrites)");
      if (meta.dtype != dtype_traits<D>::id)
        throw error(errc::bad_dtype, meta.name + ": " + std::string(name_of(meta.dtype)) +
                                         " output, pipeline for " +
                                         std::string(name_of(dtype_traits<D>::id)));
      project_shard<D, stages::identity_map, codec::overwrite>(
          stages::identity_map{tensor, meta.numel()}, o, c, st);
    }
    void blockwise(const source_shard& sh, std::span<const std::byte>, std::span<const std::byte>,
                   std::span<const std::byte>, std::span<const std::byte>, value_encoding,
                   chunk_state&) const {
      throw error(errc::invalid_argument,
                  sh.key + ": a blockwise FP8 shard emits codes and scales of two dtypes; "
                           "build it with the dispatched builder");
    }
  };

  /// Builds the chunks of one attempt through `select` (`dispatched` or
  /// `composed<P>`) and passes each chunk's records, each tensor's sorted,
  /// with the chunk's input bytes to `consume(records&&, bytes)` on the
  /// calling thread, in chunk order. `ch`: the changed words found before
  /// (`baseline::changes`), or null to compare.
  template <class Select, class Consume>
  void run(const Select& select, const source_view& candidate, const required_set& req,
           const builder_options& opt, const owner_changes* ch, Consume&& consume) const {
    const auto& plan = base_.plan();
    const auto shards = base_.owned_shards();
    const auto tasks = base_.owned_tasks();
    std::vector<unit> units;
    std::vector<chunk_span> chunks;
    auto add = [&](unit u, std::uint64_t b) {
      if (chunks.empty() || chunks.back().bytes >= opt.chunk_bytes)
        chunks.push_back({units.size(), units.size(), 0});
      units.push_back(u);
      chunks.back().last = units.size();
      chunks.back().bytes += b;
    };
    for (std::size_t i = 0; i < shards.size(); ++i) {
      const auto& sh = plan.shards[shards[i]];
      if (sh.blockwise || sh.affine()) add({false, static_cast<std::uint32_t>(i)}, sh.nbytes());
    }
    for (std::size_t i = 0; i < tasks.size(); ++i)
      if (req.contains(tasks[i]))
        add({true, static_cast<std::uint32_t>(i)}, plan.tasks[tasks[i]].output_bytes);

    const auto solo = solo_tensors(opt, units, chunks);
    pipeline::for_each_ordered(
        chunks.size(), pipeline::resolve_threads(opt.threads), opt.chunks_in_flight,
        [&](std::size_t c) {
          chunk_state st;
          st.pool = pool_;
          build_chunk(select, candidate, opt, ch, units, chunks[c], st);
          // The per-item encoding choice (grouping.hpp) of a tensor no other
          // chunk touches is made here, on the worker: its records in this
          // chunk are the whole item the bucket would choose on, so the choice
          // and the payload bytes are the same; the bucket's choice then finds
          // no alternative words left.
          if (!solo.empty())
            for (auto& b : st.records)
              if (!b.alt_values.empty() && solo[b.tensor])
                stages::choose_smaller(b.values, b.enc, b.alt_values, value_encoding::add,
                                       width_of(plan.canonical[b.tensor].dtype),
                                       opt.encoding.filter);
          return std::move(st.records);
        },
        [&](std::size_t c, std::vector<stages::tensor_records>&& records) {
          consume(std::move(records), chunks[c].bytes);
        });
  }

private:
  /// The instantiations a table entry runs.
  struct affine_fn {
    template <class D, class E>
    static void call(const piecewise_map& m, std::span<const std::byte> o,
                     std::span<const std::byte> c, chunk_state& st) {
      project_shard<D, piecewise_map, E>(m, o, c, st);
    }
  };
  /// XOR masks with add differences alongside (the per-item choice).
  struct affine_either_fn {
    template <class D>
    static void call(const piecewise_map& m, std::span<const std::byte> o,
                     std::span<const std::byte> c, chunk_state& st) {
      project_shard<D, piecewise_map, codec::xor_mask, codec::add_delta>(m, o, c, st);
    }
  };
  struct residual_fn {
    template <class D, class E>
    static void call(const tensor_meta& meta, std::uint32_t tensor, std::span<const std::byte> o,
                     std::span<const std::byte> c, chunk_state& st) {
      project_shard<D, stages::identity_map, E>(stages::identity_map{tensor, meta.numel()}, o, c,
                                                st);
    }
  };

  /// One unit of the walk: an owned shard (affine or blockwise) or an owned
  /// required residual task, by its position in the owned shards / tasks.
  struct unit {
    bool residual;
    std::uint32_t at;
  };
  /// Whole units, in walk order, whose bytes reach the chunk target (the
  /// last may be short).
  struct chunk_span {
    std::size_t first, last;
    std::uint64_t bytes;
  };

  /// Per canonical tensor: whether exactly one chunk's units reach it (from
  /// the plan, before any chunk runs). Empty when no item records an
  /// alternative encoding (nothing to choose).
  std::vector<std::uint8_t> solo_tensors(const builder_options& opt, const std::vector<unit>& units,
                                         const std::vector<chunk_span>& chunks) const {
    if (opt.relative != relative_choice::smallest || opt.encoding.format_version < 2 ||
        opt.mode != refit_mode::mixed)
      return {};
    const auto& plan = base_.plan();
    const auto shards = base_.owned_shards();
    const auto tasks = base_.owned_tasks();
    constexpr std::size_t none = ~std::size_t{0};
    std::vector<std::size_t> chunk_of(plan.canonical.size(), none);
    std::vector<std::uint8_t> solo(plan.canonical.size(), 0);
    auto touch = [&](std::uint32_t t, std::size_t c) {
      if (chunk_of[t] == none) {
        chunk_of[t] = c;
        solo[t] = 1;
      } else if (chunk_of[t] != c) {
        solo[t] = 0;
      }
    };
    for (std::size_t c = 0; c < chunks.size(); ++c)
      for (std::size_t u = chunks[c].first; u < chunks[c].last; ++u) {
        if (units[u].residual) {
          for (auto t : plan.tasks[tasks[units[u].at]].outputs) touch(t, c);
          continue;
        }
        const auto& sh = plan.shards[shards[units[u].at]];
        if (sh.blockwise) {
          for (auto& p : sh.blockwise->codes.pieces()) touch(p.tensor, c);
          for (auto& p : sh.blockwise->scales.pieces()) touch(p.tensor, c);
        } else {
          for (auto& p : sh.map->pieces()) touch(p.tensor, c);
        }
      }
    return solo;
  }

  /// The records of one chunk, each tensor's sorted (on the worker, so the
  /// merge in chunk order only concatenates or merges sorted lists).
  template <class Select>
  void build_chunk(const Select& select, const source_view& candidate, const builder_options& opt,
                   const owner_changes* ch, const std::vector<unit>& units, const chunk_span& span,
                   chunk_state& st) const {
    const auto& plan = base_.plan();
    const auto shards = base_.owned_shards();
    const auto tasks = base_.owned_tasks();
    // add items need format v2: a v1 payload offers XOR only.
    const bool either =
        opt.relative == relative_choice::smallest && opt.encoding.format_version >= 2;
    std::vector<std::byte> converted;
    std::vector<host_tensor> produced;
    const auto residual_enc = opt.mode == refit_mode::mixed && opt.residual_xor
                                  ? value_encoding::xor_mask
                                  : value_encoding::overwrite;
    for (std::size_t u = span.first; u < span.last; ++u) {
      const std::size_t i = units[u].at;
      if (units[u].residual) {
        const auto& task = plan.tasks[tasks[i]];
        const stages::residual<residual_rule> run{task.rule};
        run(task_inputs(plan, tasks[i], candidate), base_.residual(i), task.outputs, plan.canonical,
            produced,
            [&](const tensor_meta& meta, std::uint32_t tensor, std::span<const std::byte> o,
                std::span<const std::byte> c) {
              select.residual(meta, tensor, o, c, residual_enc, st);
            });
        continue;
      }
      const auto& sh = plan.shards[shards[i]];
      if (sh.blockwise) {
        // Shard-local FP8: quantise the candidate shard, diff codes and
        // scales against the converted tracker, project both directly.
        const auto& b = *sh.blockwise;
        converted.resize(b.converted_bytes());
        b.convert(base_.view_of(candidate, shards[i]), converted);
        const auto enc =
            opt.mode == refit_mode::mixed ? value_encoding::xor_mask : value_encoding::overwrite;
        std::span<const std::byte> old_b = base_.tracker(i), new_b = converted;
        select.blockwise(sh, b.code_part(old_b), b.code_part(new_b), b.scale_part(old_b),
                         b.scale_part(new_b), enc, st);
        continue;
      }
      auto cand = base_.view_of(candidate, shards[i]);
      const bool relative_ok = opt.mode == refit_mode::mixed && sh.map->is_unique();
      const value_encoding e = !relative_ok ? value_encoding::overwrite
                               : opt.relative == relative_choice::add_only
                                   ? value_encoding::add
                                   : value_encoding::xor_mask;
      st.changed = ch ? &ch->changed[i] : nullptr;
      select.affine(sh, base_.tracker(i), cand, e, relative_ok && either, st);
      st.changed = nullptr;
    }
    for (auto& b : st.records)
      if (!b.indices.empty())
        visit_dtype(plan.canonical[b.tensor].dtype,
                    [&](auto tag) { stages::sort_records<word_t<decltype(tag)>>(b); });
  }

  const baseline& base_;
  stages::record_pool* pool_ = nullptr;
};

} // namespace dcr
