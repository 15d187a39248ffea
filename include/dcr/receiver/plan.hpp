#pragma once
/// \file
/// Prewarm: a dry run of the native loader over every canonical tensor with a
/// recording sink yields the copy plan (destinations, whether each copy's
/// source aliases the loader input bit for bit, explicit skips), checks the
/// loader conditions that can be checked in advance, and decides per tensor
/// whether XOR items are allowed. Paths that cannot satisfy the conditions
/// are rejected here with `errc::unsupported_loader`.
///
/// The same dry run over `plan_store`, storage that holds each parameter's
/// name, shape and dtype and an address range but no bytes (`plan_copies`),
/// yields the identical plan for any deployment size: what `dcr-plan` runs.

#include <algorithm>
#include <cerrno>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <sys/mman.h>

#include "dcr/core/error.hpp"
#include "dcr/core/hash.hpp"
#include "dcr/core/tensor.hpp"
#include "dcr/receiver/loader.hpp"
#include "dcr/receiver/storage.hpp"
#include "dcr/receiver/view_map.hpp"

namespace dcr {

/// One intercepted copy as the plan knows it. Offsets are in elements: of the
/// destination from its parameter's start, of an aliasing source from the
/// start of the loader's input tensor.
struct planned_copy {
  std::size_t param = 0;
  std::int64_t dst_offset = 0;
  strided_layout dst_layout;
  dtype_id dtype = dtype_id::bf16; ///< of source and destination
  bool alias = false;              ///< source lies in the loader input, same dtype
  std::int64_t src_offset = 0;     ///< alias only
  strided_layout src_layout;
  bool mapped = false;  ///< alias with a unique source layout: `inverse` is valid
  view_inverse inverse; ///< input offset -> destination offset (when `mapped`)

  /// Same destination, layouts and aliasing (what must repeat at every apply).
  bool same_path(const planned_copy& o) const noexcept {
    return param == o.param && dst_offset == o.dst_offset && dst_layout == o.dst_layout &&
           dtype == o.dtype && alias == o.alias && src_layout == o.src_layout &&
           (!alias || src_offset == o.src_offset);
  }
};

/// The plan of one canonical tensor on this rank.
struct tensor_plan {
  tensor_meta meta;
  std::vector<planned_copy> copies;
  std::vector<std::size_t> reported; ///< parameter indices the loader reports, sorted, unique
  bool skipped = false;
  /// Every copy aliases the input with a unique source layout: delta apply
  /// maps active indices through the views and never scans a tensor.
  bool direct = false;
  /// Direct, and no destination element is written twice: XOR items allowed.
  bool xor_allowed = false;
  /// Two copies of this tensor write a common element (overwrites must agree).
  bool self_overlap = false;
};

/// Copy plan of a rank: one entry per canonical tensor, in canonical order.
struct copy_plan {
  std::vector<tensor_plan> tensors;
  detail::name_map<std::size_t> index;
  std::uint64_t scratch_bytes = 0; ///< the largest canonical tensor

  const tensor_plan* find(std::string_view name) const {
    auto it = index.find(name);
    return it == index.end() ? nullptr : &tensors[it->second];
  }
};

/// Address space without memory: `n` bytes mapped read-only, anonymous and
/// unreserved, so no page is ever committed; every read sees zero (the
/// kernel's shared zero page) and a write faults. What a dry run needs of a
/// buffer it must address but never fill.
class reserved_bytes {
public:
  reserved_bytes() = default;
  explicit reserved_bytes(std::uint64_t n) : n_(static_cast<std::size_t>(n)) {
    if (n_ == 0) return;
    void* p = ::mmap(nullptr, n_, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      const int e = errno;
      throw error(errc::io, "reserving " + std::to_string(n) +
                                " bytes of address space: " + std::strerror(e));
    }
    p_ = static_cast<std::byte*>(p);
  }
  reserved_bytes(const reserved_bytes&) = delete;
  reserved_bytes& operator=(const reserved_bytes&) = delete;
  reserved_bytes(reserved_bytes&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr; }
  reserved_bytes& operator=(reserved_bytes&& o) noexcept {
    if (this != &o) {
      release();
      p_ = o.p_;
      n_ = o.n_;
      o.p_ = nullptr;
    }
    return *this;
  }
  ~reserved_bytes() { release(); }
  std::byte* data() const noexcept { return p_; }
  std::size_t size() const noexcept { return n_; }

private:
  void release() noexcept {
    if (p_) ::munmap(p_, n_);
    p_ = nullptr;
  }
  std::byte* p_ = nullptr;
  std::size_t n_ = 0;
};

/// Metadata-only parameter storage for planning: each parameter has its
/// name, shape, dtype and an address range of its own (`reserved_bytes`),
/// and no bytes. A loader declares into it and takes views of it exactly as
/// of a `parameter_store` (same `add`, `view`, `index_of`), so the recording
/// sink sees the same destinations; planning a rank costs its metadata, not
/// its parameters. Storage reads as zero and must not be written (a write
/// faults): loaders write storage only through the sink.
class plan_store {
public:
  /// One parameter: what a `parameter_store` entry holds, less the bytes.
  struct entry {
    tensor_meta meta;
    reserved_bytes range;
    std::byte* data() const noexcept { return range.data(); }
    tensor_view view() const {
      return {range.data(), meta.dtype, strided_layout::row_major(meta.shape)};
    }
  };

  plan_store() = default;
  plan_store(const plan_store&) = delete;
  plan_store& operator=(const plan_store&) = delete;
  plan_store(plan_store&&) noexcept = default;
  plan_store& operator=(plan_store&&) noexcept = default;

  /// Declare a parameter; throws `invalid_argument` on a duplicate name,
  /// `bad_dtype` on an unknown dtype (as `parameter_store::add`: both keep
  /// their parameters in one `detail::parameter_registry`).
  tensor_view add(std::string name, std::vector<std::uint64_t> shape, dtype_id dtype) {
    params_.check_new(name, dtype);
    auto p = std::make_unique<entry>();
    p->meta = {std::move(name), std::move(shape), dtype};
    p->range = reserved_bytes(p->meta.nbytes());
    const std::byte* data = p->range.data();
    const std::size_t size = p->range.size();
    return params_.push(std::move(p), data, size).view();
  }

  std::size_t size() const noexcept { return params_.size(); }
  const entry& operator[](std::size_t i) const { return params_[i]; }

  std::optional<std::size_t> index_of(std::string_view name) const {
    return params_.index_of(name);
  }
  /// Whole-parameter view by name; throws `not_found`.
  tensor_view view(std::string_view name) const {
    auto i = index_of(name);
    if (!i) throw error(errc::not_found, "no parameter named " + std::string(name));
    return params_[*i].view();
  }
  /// Index of the parameter whose range contains `[lo, hi)`, if any.
  std::optional<std::size_t> locate(const std::byte* lo, const std::byte* hi) const {
    return params_.locate(lo, hi);
  }
  /// Bytes the parameters would take (none is allocated).
  std::uint64_t nbytes() const noexcept {
    std::uint64_t n = 0;
    for (auto& p : params_) n += p->meta.nbytes();
    return n;
  }

private:
  detail::parameter_registry<entry> params_;
};

namespace detail {
inline const std::byte* param_data(const parameter_store& s, std::size_t i) {
  return s[i].bytes.data();
}
inline const std::byte* param_data(const plan_store& s, std::size_t i) { return s[i].data(); }
} // namespace detail

/// Storage a plan can be made against: `parameter_store` (the receiver's
/// prewarm) or `plan_store` (planning without bytes).
template <class S>
concept plan_storage = requires(const S& s, std::size_t i, const std::byte* p) {
  { s.size() } -> std::convertible_to<std::size_t>;
  { s[i].meta } -> std::convertible_to<const tensor_meta&>;
  { s.locate(p, p) } -> std::same_as<std::optional<std::size_t>>;
  { s.index_of(std::string_view{}) } -> std::same_as<std::optional<std::size_t>>;
  { detail::param_data(s, i) } -> std::same_as<const std::byte*>;
};

/// A native loader that also declares into and loads against a `plan_store`
/// (its `declare` / `load` take the store as a template parameter, or have
/// `plan_store` overloads): what `plan_copies` needs.
template <class L>
concept plannable_loader = native_loader<L> &&
    requires(L& l, plan_store& store, std::span<const tensor_meta> canonical, std::string_view name,
             const tensor_view& src, copy_sink& sink) {
  {l.declare(store, canonical)};
  { l.load(name, src, store, sink) } -> std::same_as<load_report>;
};

/// Classify one `copy(dst, src)` made while the loader ran over `input`.
/// Returns "" and fills `out`, or says which condition the copy breaks.
template <plan_storage Store>
std::string classify_copy(const Store& store, const tensor_view& input, const tensor_view& dst,
                          const tensor_view& src, planned_copy& out) {
  if (!info(dst.dtype) || !info(src.dtype)) return "copy with an unknown dtype";
  if (dst.dtype != src.dtype)
    return "copy changes dtype " + std::string(name_of(src.dtype)) + " -> " +
           std::string(name_of(dst.dtype)) + " (cast into a temporary first)";
  if (!same_extents(dst.layout, src.layout))
    return "copy extents differ: dst " + extents_string(dst.layout) + ", src " +
           extents_string(src.layout);
  if (!dst.layout.is_unique()) return "destination view writes some element twice (not unique)";
  const auto w = static_cast<std::int64_t>(dst.width());
  auto [dlo, dhi] = dst.byte_range();
  auto p = store.locate(dlo, dhi);
  if (!p) return "destination is not inside one parameter of rank storage";
  const auto& par = store[*p];
  const std::byte* base = detail::param_data(store, *p);
  if (par.meta.dtype != dst.dtype)
    return "destination view is " + std::string(name_of(dst.dtype)) + " but parameter " +
           par.meta.name + " is " + std::string(name_of(par.meta.dtype));
  if ((dlo - base) % w != 0) return "destination not aligned to an element of " + par.meta.name;
  auto [slo, shi] = src.byte_range();
  if (store.locate(slo, shi) || (src.size() > 0 && store.locate(slo, slo + 1)))
    return "source lies in rank storage (copies between parameters are not supported)";
  out = {};
  out.param = *p;
  out.dst_offset = (dlo - base) / w;
  out.dst_layout = dst.layout;
  out.dtype = dst.dtype;
  out.src_layout = src.layout;
  const std::byte* ilo = input.data;
  const std::byte* ihi = input.data + static_cast<std::int64_t>(input.layout.required_span_size()) *
                                          static_cast<std::int64_t>(input.width());
  const bool inside = src.size() > 0 && slo >= ilo && shi <= ihi;
  if (inside && src.dtype == input.dtype && (slo - ilo) % w == 0) {
    out.alias = true;
    out.src_offset = (slo - ilo) / w;
    out.mapped = src.layout.is_unique();
    if (out.mapped)
      out.inverse = view_inverse::make(src.layout, out.src_offset, dst.layout, out.dst_offset);
  }
  return {};
}

/// Dry-run sink: records the copies and skips of one tensor without writing.
template <plan_storage Store>
class basic_recording_sink final : public copy_sink {
public:
  basic_recording_sink(const Store& store, const tensor_view& input, std::string_view name)
      : store_(store), input_(input), name_(name) {}
  void copy(const tensor_view& dst, const tensor_view& src) override {
    planned_copy c;
    auto why = classify_copy(store_, input_, dst, src, c);
    if (!why.empty()) {
      if (error_.empty()) error_ = "copy " + std::to_string(copies_.size()) + ": " + why;
      return;
    }
    copies_.push_back(c);
  }
  void skip(std::string_view canonical) override {
    if (canonical != name_ && error_.empty()) error_ = "skip names " + std::string(canonical);
    skipped_ = true;
  }
  std::vector<planned_copy>& copies() { return copies_; }
  bool skipped() const noexcept { return skipped_; }
  const std::string& error_text() const noexcept { return error_; }

private:
  const Store& store_;
  tensor_view input_;
  std::string_view name_;
  std::vector<planned_copy> copies_;
  bool skipped_ = false;
  std::string error_;
};
using recording_sink = basic_recording_sink<parameter_store>;

namespace detail {

/// Sorted unique parameter indices of reported names; "" or an error.
template <plan_storage Store>
std::string resolve_report(const Store& store, const load_report& r,
                           std::vector<std::size_t>& out) {
  out.clear();
  for (auto& n : r.loaded) {
    auto i = store.index_of(n);
    if (!i) return "loader reports unknown parameter " + n;
    out.push_back(*i);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return {};
}

/// Parameters written by a set of copies, sorted unique.
inline std::vector<std::size_t> written_params(const std::vector<planned_copy>& copies) {
  std::vector<std::size_t> v;
  for (auto& c : copies) v.push_back(c.param);
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

inline std::vector<digest128> param_digests(const parameter_store& s) {
  std::vector<digest128> d;
  d.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) d.push_back(dcr::digest(s[i].bytes));
  return d;
}

/// Find elements written by more than one copy. Bounding byte ranges are
/// compared first; only groups whose ranges overlap are checked element by
/// element. Marks `self_overlap`; overlaps between different tensors are an
/// error (items apply in any order, so such writes could not match a dense
/// refit unless they always agree, which no receiver can check).
template <plan_storage Store>
std::string analyse_overlaps(const Store& store, std::vector<tensor_plan>& tensors) {
  struct span_rec {
    std::size_t param;
    std::int64_t lo, hi; // elements
    std::size_t tensor, copy;
  };
  std::vector<span_rec> spans;
  for (std::size_t t = 0; t < tensors.size(); ++t)
    for (std::size_t k = 0; k < tensors[t].copies.size(); ++k) {
      auto& c = tensors[t].copies[k];
      const auto n = c.dst_layout.required_span_size();
      if (n > 0) spans.push_back({c.param, c.dst_offset, c.dst_offset + n, t, k});
    }
  std::sort(spans.begin(), spans.end(), [](const span_rec& a, const span_rec& b) {
    return a.param != b.param ? a.param < b.param : a.lo < b.lo;
  });
  for (std::size_t i = 0; i < spans.size();) {
    std::size_t j = i + 1;
    std::int64_t hi = spans[i].hi;
    while (j < spans.size() && spans[j].param == spans[i].param && spans[j].lo < hi)
      hi = std::max(hi, spans[j++].hi);
    if (j - i > 1) {
      // Element-level check of this group: owner = tensor*2^20 + copy + 1.
      const std::int64_t lo = spans[i].lo;
      std::vector<std::int64_t> owner(static_cast<std::size_t>(hi - lo), -1);
      for (std::size_t g = i; g < j; ++g) {
        auto& c = tensors[spans[g].tensor].copies[spans[g].copy];
        std::string err;
        for_each_offset_pair(c.dst_layout, c.dst_layout, [&](std::int64_t d, std::int64_t) {
          auto& o = owner[static_cast<std::size_t>(c.dst_offset + d - lo)];
          const auto t = static_cast<std::int64_t>(spans[g].tensor);
          if (o < 0)
            o = t;
          else if (o == t)
            tensors[spans[g].tensor].self_overlap = true;
          else if (err.empty())
            err = "tensors " + tensors[static_cast<std::size_t>(o)].meta.name + " and " +
                  tensors[spans[g].tensor].meta.name + " both write element " +
                  std::to_string(c.dst_offset + d) + " of parameter " +
                  store[spans[g].param].meta.name;
        });
        if (!err.empty()) return err;
      }
    }
    i = j;
  }
  return {};
}

} // namespace detail

/// Storage groups of a plan: `group[t]` for every tensor, dense ids in the
/// order of each group's first tensor. Tensors that write a common parameter
/// (fused qkv or gate_up, experts fused into one parameter) are one group,
/// so are tensors linked through a chain of such parameters; a skipped
/// tensor writes nothing and is a group of its own. Items of different
/// groups write disjoint storage, which is what lets a receiver apply them
/// on different threads; items of one group apply in item order.
inline std::vector<std::size_t> storage_groups(const copy_plan& plan, std::size_t params) {
  const std::size_t n = plan.tensors.size();
  std::vector<std::size_t> parent(n);
  for (std::size_t t = 0; t < n; ++t) parent[t] = t;
  auto find = [&](std::size_t x) {
    while (parent[x] != x) x = parent[x] = parent[parent[x]];
    return x;
  };
  constexpr auto none = static_cast<std::size_t>(-1);
  std::vector<std::size_t> owner(params, none);
  for (std::size_t t = 0; t < n; ++t)
    for (auto& c : plan.tensors[t].copies) {
      if (owner[c.param] == none) {
        owner[c.param] = t;
        continue;
      }
      const auto a = find(owner[c.param]), b = find(t);
      if (a != b) parent[std::max(a, b)] = std::min(a, b);
    }
  std::vector<std::size_t> id(n, none), group(n);
  std::size_t next = 0;
  for (std::size_t t = 0; t < n; ++t) {
    auto& g = id[find(t)];
    if (g == none) g = next++;
    group[t] = g;
  }
  return group;
}

namespace detail {

/// The plan's tensors from the canonical metadata (checked); `scratch_bytes` set.
inline copy_plan plan_skeleton(std::span<const tensor_meta> canonical) {
  copy_plan plan;
  for (auto& m : canonical) {
    if (!info(m.dtype))
      throw error(errc::bad_dtype, "canonical tensor " + m.name + ": unknown dtype");
    if (m.shape.size() > max_rank)
      throw error(errc::invalid_argument, "canonical tensor " + m.name + ": rank too large");
    if (!plan.index.emplace(m.name, plan.tensors.size()).second)
      throw error(errc::invalid_argument, "canonical tensor listed twice: " + m.name);
    plan.tensors.push_back({});
    plan.tensors.back().meta = m;
    plan.scratch_bytes = std::max(plan.scratch_bytes, m.nbytes());
  }
  return plan;
}

[[noreturn]] inline void reject_tensor(const std::string& tensor, const std::string& why) {
  throw error(errc::unsupported_loader, "tensor " + tensor + ": " + why);
}

/// The dry run proper: the loader over every tensor of `plan` with the input
/// at `scratch` (holding the largest canonical tensor), each copy recorded
/// and checked against `store`. The same code for either storage, so a plan
/// made without bytes is the plan the receiver makes.
template <class L, plan_storage Store>
void record_loads(L& loader, Store& store, copy_plan& plan, std::byte* scratch) {
  for (auto& tp : plan.tensors) {
    tensor_view input{scratch, tp.meta.dtype, strided_layout::row_major(tp.meta.shape)};
    basic_recording_sink<Store> sink(store, input, tp.meta.name);
    load_report rep = loader.load(tp.meta.name, input, store, sink);
    if (!sink.error_text().empty()) reject_tensor(tp.meta.name, sink.error_text());
    tp.copies = std::move(sink.copies());
    tp.skipped = sink.skipped();
    if (tp.copies.empty() && !tp.skipped)
      reject_tensor(tp.meta.name, "loader made no copy and declared no skip");
    if (!tp.copies.empty() && tp.skipped)
      reject_tensor(tp.meta.name, "loader both copied and skipped the tensor");
    if (auto why = resolve_report(store, rep, tp.reported); !why.empty())
      reject_tensor(tp.meta.name, why);
    if (tp.reported != written_params(tp.copies))
      reject_tensor(tp.meta.name,
                    "parameters reported as loaded differ from the parameters its copies wrote");
    tp.direct = !tp.copies.empty();
    for (auto& c : tp.copies) tp.direct = tp.direct && c.mapped;
  }
}

/// Overlaps and the XOR decision, once every tensor is recorded.
template <plan_storage Store>
void finish_plan(const Store& store, copy_plan& plan) {
  if (auto why = analyse_overlaps(store, plan.tensors); !why.empty())
    throw error(errc::unsupported_loader, why);
  for (auto& tp : plan.tensors) tp.xor_allowed = tp.direct && !tp.self_overlap;
}

} // namespace detail

/// Prewarm: declare the loader's parameters into `store`, dry-run the loader
/// over every canonical tensor and build the copy plan. Throws
/// `dcr::error(unsupported_loader)` naming the tensor when a path breaks a
/// loader condition, `invalid_argument` for bad canonical metadata.
template <native_loader L>
copy_plan prewarm(L& loader, parameter_store& store, std::span<const tensor_meta> canonical) {
  copy_plan plan = detail::plan_skeleton(canonical);
  loader.declare(store, canonical);
  const auto before = detail::param_digests(store);
  std::vector<std::uint64_t> scratch_words((plan.scratch_bytes + 7) / 8 + 1, 0);
  detail::record_loads(loader, store, plan, reinterpret_cast<std::byte*>(scratch_words.data()));
  const auto after = detail::param_digests(store);
  for (std::size_t i = 0; i < store.size(); ++i)
    if (before[i] != after[i])
      throw error(errc::unsupported_loader,
                  "parameter " + store[i].meta.name + " was written outside the copy sink");
  for (std::size_t i = 0; i < scratch_words.size(); ++i)
    if (scratch_words[i] != 0)
      throw error(errc::unsupported_loader, "loader wrote into its input tensor");
  detail::finish_plan(store, plan);
  return plan;
}

/// The plan `prewarm` makes, made without parameter bytes: the loader
/// declares into the metadata-only `store` and runs over an input that is
/// address space only (`reserved_bytes`), so memory is the plan and the
/// metadata, whatever the model's size. Same checks and errors as `prewarm`
/// except the two that need bytes: a loader that writes its input or storage
/// outside the sink faults here instead (both are read-only mappings); the
/// receiver's `prewarm` reports them as `unsupported_loader`.
template <plannable_loader L>
copy_plan plan_copies(L& loader, plan_store& store, std::span<const tensor_meta> canonical) {
  copy_plan plan = detail::plan_skeleton(canonical);
  loader.declare(store, canonical);
  const reserved_bytes input(plan.scratch_bytes + 8);
  detail::record_loads(loader, store, plan, input.data());
  detail::finish_plan(store, plan);
  return plan;
}

} // namespace dcr
