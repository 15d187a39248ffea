#pragma once
/// \file
/// The intercepting sinks used after prewarm: dense (plain strided copy),
/// delta (`delta_sink<E, W>`: XOR masks XORed or zigzag differences added
/// into storage through aliasing views, or overwrites of only the active
/// positions, each through
/// `codec::delta_encoding::apply`) and compare (post-apply check). Each one first
/// checks that the loader repeats its planned path: the k-th copy must have
/// the k-th planned destination, layouts and aliasing. A copy that does not
/// is not performed and fails the apply with `errc::loader_condition`.
///
/// Cost: for mapped copies (source aliases the scratch through a unique
/// view) the XOR and overwrite sinks visit only the item's active indices
/// that fall inside the source view (found by binary search, since indices
/// are sorted), map each through `view_inverse` and write one element. Only
/// copies whose source is a loader temporary (a cast) are scanned whole.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "dcr/codec/values.hpp"
#include "dcr/core/dtype.hpp"
#include "dcr/core/error.hpp"
#include "dcr/core/set_digest.hpp"
#include "dcr/core/tensor.hpp"
#include "dcr/receiver/loader.hpp"
#include "dcr/receiver/plan.hpp"
#include "dcr/receiver/stages.hpp"
#include "dcr/receiver/storage.hpp"
#include "dcr/receiver/view_map.hpp"

namespace dcr {

/// Base of the post-prewarm sinks: plan matching, skip checks, report check,
/// agreement of overlapping writes.
class checked_sink : public copy_sink {
public:
  /// `digest_into`: where the digest change of this sink's writes goes (the
  /// store's state digest when null). Sinks that run on several threads at
  /// once each add into their thread's partial sum, which the receiver adds
  /// to the store after the threads joined (the digest is a lane-wise sum,
  /// so the partial sums combine exactly, in any order).
  checked_sink(parameter_store& store, const tensor_plan& plan, const tensor_view& input,
               set_digest* digest_into = nullptr)
      : store_(store), plan_(plan), input_(input), digest_into_(digest_into) {}
  checked_sink(const checked_sink&) = delete;
  checked_sink& operator=(const checked_sink&) = delete;
  /// Every write this sink made reaches the state digest, also when the load
  /// failed part way (storage then holds exactly those writes).
  ~checked_sink() {
    hash_pending();
    if (digest_into_)
      *digest_into_ += digest_delta_;
    else
      store_.add_digest(digest_delta_);
  }

  void skip(std::string_view canonical) override {
    if (canonical != plan_.meta.name)
      violate("skip names " + std::string(canonical));
    else if (!plan_.skipped)
      violate("skip of a tensor the plan copies");
    skipped_ = true;
  }

  /// Status after the loader returned: the path repeated the plan exactly.
  status finish(const load_report& rep) {
    if (error_.empty()) {
      if (n_ != plan_.copies.size())
        error_ = "loader made " + std::to_string(n_) + " copies, plan has " +
                 std::to_string(plan_.copies.size());
      else if (skipped_ != plan_.skipped)
        error_ = "loader did not repeat its skip";
      else if (!reports_plan(rep)) {
        std::vector<std::size_t> r;
        auto why = detail::resolve_report(store_, rep, r);
        if (!why.empty())
          error_ = why;
        else if (r != plan_.reported)
          error_ = "parameters reported as loaded differ from the plan";
      }
    }
    if (error_.empty()) return status::success();
    return fail(errc::loader_condition, "tensor " + plan_.meta.name + ": " + error_);
  }
  bool failed() const noexcept { return !error_.empty(); }

protected:
  /// True when the report names exactly the planned parameters in plan order
  /// (what `resolve_report` would turn into `plan_.reported`), checked
  /// without lookups or allocation; otherwise `finish` resolves it in full.
  bool reports_plan(const load_report& rep) const noexcept {
    if (rep.loaded.size() != plan_.reported.size()) return false;
    for (std::size_t i = 0; i < rep.loaded.size(); ++i)
      if (rep.loaded[i] != store_[plan_.reported[i]].meta.name) return false;
    return true;
  }
  /// The planned copy this call must be, or nullptr after recording why not.
  const planned_copy* next(const tensor_view& dst, const tensor_view& src) {
    const std::size_t k = n_++;
    if (!error_.empty()) return nullptr;
    if (k >= plan_.copies.size()) {
      violate("copy " + std::to_string(k) + " is not in the plan");
      return nullptr;
    }
    if (repeats_alias(plan_.copies[k], dst, src)) return &plan_.copies[k];
    planned_copy c;
    auto why = classify_copy(store_, input_, dst, src, c);
    if (!why.empty()) {
      violate("copy " + std::to_string(k) + ": " + why);
      return nullptr;
    }
    if (!c.same_path(plan_.copies[k])) {
      violate("copy " + std::to_string(k) + " differs from the planned path");
      return nullptr;
    }
    return &plan_.copies[k];
  }
  void violate(std::string why) {
    if (error_.empty()) error_ = std::move(why);
  }
  /// True when the loader's copy is planned aliasing copy `c` again, bit for
  /// bit: same dtype, layouts, destination address and source offset in the
  /// input. `classify_copy` would then classify it exactly as at prewarm
  /// (parameters never move, the input has the planned dtype and shape), so
  /// the per-item path skips its storage lookups and view inversion. Any
  /// other copy (a temporary source, a changed address) is classified in full.
  bool repeats_alias(const planned_copy& c, const tensor_view& dst,
                     const tensor_view& src) const noexcept {
    if (!c.alias || dst.dtype != c.dtype || src.dtype != c.dtype || input_.dtype != c.dtype)
      return false;
    const auto w = static_cast<std::int64_t>(width_of(c.dtype));
    return dst.data == store_[c.param].bytes.data() + c.dst_offset * w &&
           src.data == input_.data + c.src_offset * w && dst.layout == c.dst_layout &&
           src.layout == c.src_layout;
  }
  std::byte* param_data(std::size_t p) { return store_[p].bytes.data(); }

  /// The one place a sink stores a word: element `e` of parameter `p`
  /// (whose words start at `base`) becomes `w`, and the state digest sees
  /// the word before and after. The hashing is deferred to a batch: a write
  /// loop whose iterations wait on nothing but their own cache line keeps
  /// many misses in flight, and the element hashes (eight AES rounds per
  /// write) in the same loop would hold it to a few; in a batch they also
  /// run two writes at a time (`set_digest::replace_batch`).
  template <class W>
  void store(W* base, std::size_t p, std::int64_t e, W w) noexcept {
    const W before = base[e];
    if (before == w) return;
    base[e] = w;
    if (n_pending_ == pending_cap) hash_pending();
    const auto i = n_pending_++;
    pending_param_[i] = p;
    pending_element_[i] = static_cast<std::uint64_t>(e);
    pending_before_[i] = before;
    pending_after_[i] = w;
  }
  /// Fold the pending writes into the sink's digest change: one
  /// `set_digest::replace_batch` per run of writes to the same parameter
  /// (a copy writes one parameter, so runs are long).
  void hash_pending() noexcept {
    for (std::size_t a = 0; a < n_pending_;) {
      const auto p = pending_param_[a];
      std::size_t b = a + 1;
      while (b < n_pending_ && pending_param_[b] == p) ++b;
      digest_delta_.replace_batch(store_.digest_key(p), pending_element_ + a, pending_before_ + a,
                                  pending_after_ + a, b - a);
      a = b;
    }
    n_pending_ = 0;
  }

  /// Write word `w` at element `e` of parameter `p`; for tensors whose copies
  /// overlap, a second write of the same element must carry the same bits.
  template <class W>
  void put(W* base, std::size_t p, std::int64_t e, W w) {
    if (plan_.self_overlap) {
      const auto key = (static_cast<std::uint64_t>(p) << 44) | static_cast<std::uint64_t>(e);
      auto [it, fresh] = written_.emplace(key, w);
      if (!fresh && it->second != w) {
        violate("overlapping writes disagree at element " + std::to_string(e) + " of " +
                store_[p].meta.name);
        return;
      }
    }
    store(base, p, e, w);
  }

  parameter_store& store_;
  const tensor_plan& plan_;
  tensor_view input_;
  std::size_t n_ = 0;
  bool skipped_ = false;
  std::string error_;
  std::unordered_map<std::uint64_t, std::uint64_t> written_;
  set_digest* digest_into_;
  set_digest digest_delta_;
  // Pending writes, one array per field so that `replace_batch` loads
  // positions and words 8 at a time.
  static constexpr std::size_t pending_cap = 256; // 8 KiB: stays in L1
  std::size_t n_pending_ = 0;
  std::size_t pending_param_[pending_cap];
  std::uint64_t pending_element_[pending_cap], pending_before_[pending_cap],
      pending_after_[pending_cap];
};

/// Dense refit: every planned copy is a plain strided copy. Its writes do
/// not go through `store` (a dense refit rewrites everything, so the caller
/// recomputes the digest once: `parameter_store::recompute_digest`).
class dense_sink final : public checked_sink {
public:
  using checked_sink::checked_sink;
  void copy(const tensor_view& dst, const tensor_view& src) override {
    const planned_copy* c = next(dst, src);
    if (!c) return;
    if (!plan_.self_overlap) {
      strided_copy(dst, src);
      return;
    }
    visit_word(dst.width(), [&](auto word) {
      using W = decltype(word);
      auto* D = reinterpret_cast<W*>(param_data(c->param));
      auto* S = reinterpret_cast<const W*>(src.data);
      for_each_offset_pair(dst.layout, src.layout, [&](std::int64_t d, std::int64_t s) {
        put(D, c->param, c->dst_offset + d, S[s]);
      });
    });
  }
};

/// Range of sorted `active` indices inside a mapped copy's source span.
inline std::span<const std::uint64_t> active_in(std::span<const std::uint64_t> active,
                                                const planned_copy& c) {
  const auto lo = static_cast<std::uint64_t>(c.inverse.src_base);
  const auto hi = lo + static_cast<std::uint64_t>(c.inverse.span);
  auto b = std::lower_bound(active.begin(), active.end(), lo);
  auto e = std::lower_bound(b, active.end(), hi);
  return {b, e};
}

/// The item's entries as the sinks see them: sorted active canonical indices
/// and their words. For a mapped copy the source aliases the scratch bit for
/// bit, so the word the copy would read at active index `indices[k]` is
/// `values[k]`: the sinks read it there and never touch the scratch.
struct active_entries {
  std::span<const std::uint64_t> indices;
  std::span<const std::byte> values;
};

/// Visit (value index, destination element) of every active entry a mapped copy reaches.
template <class F>
void for_each_active(const active_entries& a, const planned_copy& c, F&& f) {
  auto sub = active_in(a.indices, c);
  const auto first = static_cast<std::size_t>(sub.data() - a.indices.data());
  c.inverse.for_each_sorted(sub.data(), sub.size(),
                            [&](std::size_t j, std::int64_t e) { f(first + j, e); });
}

/// How the overwrite sink finds the active positions of unmapped copies.
enum class overwrite_pass {
  placeholder, ///< active = source word is not NaN (scratch filled with the NaN placeholder)
  capture, ///< first of two runs (scratch filled with zeros): remember source words, write nothing
  compare, ///< second run (NaN fill): active = source word equals the captured word
};

/// The apply stage's sink: each mapped copy updates storage at the
/// destinations of the item's active indices with `E::apply(resident, value)`
/// (`codec::delta_encoding`; `W` is the tensor's stored word).
///
/// XOR (`codec::xor_mask`) and add (`codec::add`), the relative
/// encodings, require `xor_allowed`: every copy mapped, no destination
/// written twice. Overwrite (`codec::overwrite`): mapped copies
/// write the values at the item's active indices (no placeholder involved,
/// so any value, NaN included, is exact). Unmapped copies (loader
/// temporaries) see the placeholder at inactive positions: with
/// `placeholder`, positions whose source is NaN are inactive; when the item's
/// values contain NaN, the receiver runs the loader twice with different
/// fills and a position is active exactly when its source bits do not depend
/// on the fill (elementwise deterministic transforms, and distinct images of
/// the two fills).
///
/// Mapped copies of tensors without overlapping copies go through the apply
/// stage `stages::apply<E, Sink>` (the one write loop, which also feeds a
/// mirroring `Sink`); parameters written any other way (unmapped or
/// overlapping copies) are listed in `unmirrored()` for the receiver to
/// `Sink::refresh` after the load.
template <codec::delta_encoding E, class W, storage_sink Sink = host_sink>
class delta_sink final : public checked_sink {
public:
  delta_sink(parameter_store& store, const tensor_plan& plan, const tensor_view& input,
             active_entries active, overwrite_pass pass = overwrite_pass::placeholder,
             std::vector<std::vector<std::byte>>* captures = nullptr,
             set_digest* digest_into = nullptr, Sink* sink = nullptr)
      : checked_sink(store, plan, input, digest_into), active_(active), pass_(pass),
        captures_(captures), apply_(sink_or_default(sink)) {}

  /// Parameters this sink wrote outside the apply stage (to refresh in a
  /// mirroring sink), possibly repeated.
  const std::vector<std::size_t>& unmirrored() const noexcept { return unmirrored_; }
  /// The first failure of the mirroring sink, if any.
  const status& sink_status() const noexcept { return sink_status_; }

  void copy(const tensor_view& dst, const tensor_view& src) override {
    const std::size_t k = n_;
    const planned_copy* c = next(dst, src);
    if (!c) return;
    if (c->mapped) {
      if (pass_ == overwrite_pass::capture) return;
      if (dst.width() != sizeof(W)) { // a mapped copy aliases the input: same dtype
        violate("mapped copy of " + std::to_string(dst.width()) + "-byte words from a " +
                std::to_string(sizeof(W)) + "-byte tensor");
        return;
      }
      auto* D = reinterpret_cast<W*>(param_data(c->param));
      auto* V = reinterpret_cast<const W*>(active_.values.data());
      const auto p = c->param;
      if (plan_.self_overlap) {
        for_each_active(active_, *c,
                        [&](std::size_t j, std::int64_t e) { put(D, p, e, E::apply(D[e], V[j])); });
        unmirrored_.push_back(p);
      } else {
        status st =
            apply_(D, p, c->inverse, active_.indices, std::span<const W>(V, active_.indices.size()),
                   digest_delta_, store_.digest_key(p));
        if (!st.ok() && sink_status_.ok()) sink_status_ = std::move(st);
      }
      return;
    }
    if constexpr (E::relative) {
      violate(std::string(to_string(E::id)) + " through a copy whose source is not the scratch");
    } else {
      unmapped(*c, k, dst, src);
    }
  }

private:
  void unmapped(const planned_copy& cp, std::size_t k, const tensor_view& dst,
                const tensor_view& src) {
    const planned_copy* c = &cp;
    if (pass_ != overwrite_pass::capture) unmirrored_.push_back(c->param);
    visit_word(dst.width(), [&](auto word) {
      using U = decltype(word);
      auto* D = reinterpret_cast<U*>(param_data(c->param));
      auto* S = reinterpret_cast<const U*>(src.data);
      const auto d0 = c->dst_offset;
      switch (pass_) {
      case overwrite_pass::placeholder:
        for_each_offset_pair(dst.layout, src.layout, [&](std::int64_t d, std::int64_t s) {
          if (!is_nan_bits(c->dtype, S[s])) put(D, c->param, d0 + d, S[s]);
        });
        break;
      case overwrite_pass::capture: {
        if (captures_->size() <= k) captures_->resize(k + 1);
        auto& cap = (*captures_)[k];
        cap.resize(static_cast<std::size_t>(src.size()) * sizeof(U));
        auto* C = reinterpret_cast<U*>(cap.data());
        std::size_t j = 0;
        for_each_offset_pair(dst.layout, src.layout,
                             [&](std::int64_t, std::int64_t s) { C[j++] = S[s]; });
        break;
      }
      case overwrite_pass::compare: {
        if (captures_->size() <= k ||
            (*captures_)[k].size() != static_cast<std::size_t>(src.size()) * sizeof(U)) {
          violate("second run made a copy the first run did not");
          return;
        }
        const auto* C = reinterpret_cast<const U*>((*captures_)[k].data());
        std::size_t j = 0;
        for_each_offset_pair(dst.layout, src.layout, [&](std::int64_t d, std::int64_t s) {
          if (S[s] == C[j]) put(D, c->param, d0 + d, S[s]);
          ++j;
        });
        break;
      }
      }
    });
  }

  /// `*sink`; a sink that mirrors nothing may be omitted (a shared stateless one).
  static Sink& sink_or_default(Sink* sink) {
    if constexpr (Sink::mirrors) {
      return *sink;
    } else {
      static Sink none;
      return sink ? *sink : none;
    }
  }

  active_entries active_;
  overwrite_pass pass_;
  std::vector<std::vector<std::byte>>* captures_;
  stages::apply<E, Sink> apply_;
  std::vector<std::size_t> unmirrored_;
  status sink_status_;
};

/// The sinks of the wire's encodings.
template <class W>
using xor_sink = delta_sink<codec::xor_mask, W>;
template <class W>
using add_sink = delta_sink<codec::add, W>;
template <class W>
using overwrite_sink = delta_sink<codec::overwrite, W>;

/// Post-apply check: compares stored bits with what a dense copy of the
/// expected tensor would store, at every `stride`-th coordinate of each copy
/// (1 = full comparison). Writes nothing.
class compare_sink final : public checked_sink {
public:
  compare_sink(parameter_store& store, const tensor_plan& plan, const tensor_view& input,
               std::uint64_t stride)
      : checked_sink(store, plan, input), stride_(stride == 0 ? 1 : stride) {}
  void copy(const tensor_view& dst, const tensor_view& src) override {
    const planned_copy* c = next(dst, src);
    if (!c || !mismatch_.empty()) return;
    visit_word(dst.width(), [&](auto word) {
      using W = decltype(word);
      auto* D = reinterpret_cast<const W*>(param_data(c->param));
      auto* S = reinterpret_cast<const W*>(src.data);
      std::uint64_t j = 0;
      for_each_offset_pair(dst.layout, src.layout, [&](std::int64_t d, std::int64_t s) {
        if (j++ % stride_ != 0 || !mismatch_.empty()) return;
        const auto e = c->dst_offset + d;
        if (D[e] != S[s])
          mismatch_ = "parameter " + store_[c->param].meta.name + " element " + std::to_string(e) +
                      " (tensor " + plan_.meta.name +
                      "): stored bits differ from the expected target";
      });
    });
  }
  const std::string& mismatch() const noexcept { return mismatch_; }

private:
  std::uint64_t stride_;
  std::string mismatch_;
};

} // namespace dcr
