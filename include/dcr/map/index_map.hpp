#pragma once
/// \file
/// Index maps: functions from a source shard's local row-major flat index to a
/// canonical destination (tensor id, canonical row-major flat index), or to
/// "nowhere" for elements that are not canonical (vocabulary padding).
///
/// Every Megatron-style mapping class reduces to a `piecewise_map`: the local
/// shard is a matrix `[local_rows, local_cols]` whose rows are cut into pieces;
/// piece `p` sends local `(i, j)` with `p.local_row <= i < p.local_row + p.rows`
/// to tensor `p.tensor`, canonical row `p.canonical_row + (i - p.local_row)`,
/// column `p.canonical_col + j` of a canonical matrix with `p.canonical_cols`
/// columns. Rows outside every piece map nowhere. The named classes below
/// (column-parallel, row-parallel, fused QKV, ...) state their law in closed
/// form (`operator()`), and build the pieces the delta builder runs on; the
/// tests check that both agree on every element.

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "dcr/core/error.hpp"

namespace dcr {

/// Tensor id meaning "not canonical" (padding).
inline constexpr std::uint32_t nowhere = 0xFFFFFFFFu;

/// Canonical destination of one local element.
struct destination {
  std::uint32_t tensor = nowhere; ///< canonical tensor id, or `nowhere`
  std::uint64_t index = 0;        ///< canonical row-major flat index (0 when nowhere)
  constexpr bool is_nowhere() const noexcept { return tensor == nowhere; }
  friend constexpr bool operator==(const destination&, const destination&) = default;
};

/// A local run `[local_start, local_start + count)` that maps onto the
/// canonical run `[canonical_start, canonical_start + count)` of `tensor`.
struct canonical_run {
  std::uint64_t local_start = 0, count = 0;
  std::uint32_t tensor = nowhere;
  std::uint64_t canonical_start = 0;
  friend constexpr bool operator==(const canonical_run&, const canonical_run&) = default;
};

/// An index map. Minimal complete definition: `domain_size()`, `operator()`,
/// `map_run(start, count, out)`, `is_unique()`. Laws (tested for every model
/// over its whole domain on small shapes):
///  - `m(j)` is defined for `0 <= j < domain_size()`;
///  - `map_run(s, n, out)` calls `out(canonical_run)` with runs, in increasing
///    local order, that cover exactly the mapped (not nowhere) elements of
///    `[s, s+n)`, and `run.canonical_start + o == m(run.local_start + o).index`;
///  - `is_unique()` is true iff no two local elements share a destination
///    (XOR items require it: a repeated XOR cancels itself).
template <class M>
concept index_map = requires(const M& m, std::uint64_t j, void (*out)(const canonical_run&)) {
  { m.domain_size() } -> std::convertible_to<std::uint64_t>;
  { m(j) } -> std::same_as<destination>;
  { m.is_unique() } -> std::convertible_to<bool>;
  m.map_run(j, j, out);
};

namespace maps {
/// A mapping class of the affine kind: a type whose objects send a shard's
/// local indices to canonical destinations, in runs of constant shift
/// (`index_map`'s laws). Every named class below is one (the box of a
/// replicated tensor, row / column splits, vocabulary padding, the
/// piecewise fused QKV and gate-up maps; per-expert slices are column /
/// row splits of an expert's tensor), as are `piecewise_map`, their runtime
/// form, and `flat_map` over an application's own index function;
/// `stages::project<M>` is instantiated per type.
template <class M>
concept affine_map = index_map<M>;
} // namespace maps

/// One row block of a piecewise map (see the file comment).
struct map_piece {
  std::uint64_t local_row = 0, rows = 0;
  std::uint32_t tensor = nowhere;
  std::uint64_t canonical_row = 0, canonical_col = 0, canonical_cols = 1;
  friend constexpr bool operator==(const map_piece&, const map_piece&) = default;
};

/// General row-block piecewise map; the runtime form of every mapping class.
class piecewise_map {
public:
  piecewise_map() = default;
  /// Pieces must be sorted by `local_row`, disjoint, inside `local_rows`, and
  /// each canonical column range `[canonical_col, canonical_col + local_cols)`
  /// must lie inside `canonical_cols`; throws `errc::invalid_argument` otherwise.
  piecewise_map(std::uint64_t local_rows, std::uint64_t local_cols, std::vector<map_piece> pieces)
      : rows_(local_rows), cols_(local_cols), pieces_(std::move(pieces)) {
    std::uint64_t next = 0;
    for (auto& p : pieces_) {
      if (p.local_row < next || p.local_row + p.rows > rows_ || p.rows == 0)
        throw error(errc::invalid_argument,
                    "piecewise_map: pieces unsorted, overlapping, empty or out of range");
      if (p.canonical_col + cols_ > p.canonical_cols)
        throw error(errc::invalid_argument,
                    "piecewise_map: piece columns exceed canonical columns");
      if (p.tensor == nowhere)
        throw error(errc::invalid_argument, "piecewise_map: piece without tensor");
      next = p.local_row + p.rows;
    }
    unique_ = compute_unique();
  }

  std::uint64_t domain_size() const noexcept { return rows_ * cols_; }
  std::uint64_t local_rows() const noexcept { return rows_; }
  std::uint64_t local_cols() const noexcept { return cols_; }
  std::span<const map_piece> pieces() const noexcept { return pieces_; }
  bool is_unique() const noexcept { return unique_; }
  /// Number of local elements with a destination.
  std::uint64_t image_size() const noexcept {
    std::uint64_t n = 0;
    for (auto& p : pieces_) n += p.rows * cols_;
    return n;
  }

  destination operator()(std::uint64_t j) const noexcept {
    const std::uint64_t i = j / cols_, c = j % cols_;
    auto it =
        std::upper_bound(pieces_.begin(), pieces_.end(), i,
                         [](std::uint64_t row, const map_piece& p) { return row < p.local_row; });
    if (it == pieces_.begin()) return {};
    const auto& p = *--it;
    if (i >= p.local_row + p.rows) return {};
    return {p.tensor,
            (p.canonical_row + (i - p.local_row)) * p.canonical_cols + p.canonical_col + c};
  }

  /// Calls `out(canonical_run)` for the mapped parts of `[start, start+count)`,
  /// merging adjacent runs that continue each other.
  template <class Out>
  void map_run(std::uint64_t start, std::uint64_t count, Out&& out) const {
    const std::uint64_t end = start + count;
    canonical_run cur{};
    auto emit = [&](std::uint64_t ls, std::uint64_t n, std::uint32_t t, std::uint64_t cs) {
      if (n == 0) return;
      if (cur.count && cur.tensor == t && cur.local_start + cur.count == ls &&
          cur.canonical_start + cur.count == cs) {
        cur.count += n;
        return;
      }
      if (cur.count) out(std::as_const(cur));
      cur = {ls, n, t, cs};
    };
    for (const auto& p : pieces_) {
      const std::uint64_t plo = p.local_row * cols_, phi = (p.local_row + p.rows) * cols_;
      const std::uint64_t lo = std::max(start, plo), hi = std::min(end, phi);
      if (lo >= hi) continue;
      if (cols_ == p.canonical_cols) { // rows are contiguous in the canonical tensor too
        emit(lo, hi - lo, p.tensor, p.canonical_row * p.canonical_cols + (lo - plo));
        continue;
      }
      for (std::uint64_t a = lo; a < hi;) {
        const std::uint64_t i = a / cols_, c = a % cols_;
        const std::uint64_t b = std::min(hi, (i + 1) * cols_);
        emit(a, b - a, p.tensor,
             (p.canonical_row + (i - p.local_row)) * p.canonical_cols + p.canonical_col + c);
        a = b;
      }
    }
    if (cur.count) out(std::as_const(cur));
  }

  /// Projects strictly increasing local indices: calls `out(tensor, canonical,
  /// position)` for each mapped index, where `position` is its place in `local`.
  /// Unmapped (padding) indices are skipped. The hot path of direct projection.
  template <class Out>
  void project(std::span<const std::uint64_t> local, Out&& out) const {
    std::size_t pi = 0;
    const std::size_t np = pieces_.size();
    for (std::size_t n = 0; n < local.size(); ++n) {
      const std::uint64_t j = local[n];
      const std::uint64_t i = j / cols_;
      while (pi < np && i >= pieces_[pi].local_row + pieces_[pi].rows) ++pi;
      if (pi == np) break;
      const auto& p = pieces_[pi];
      if (i < p.local_row) continue;
      out(p.tensor,
          (p.canonical_row + (i - p.local_row)) * p.canonical_cols + p.canonical_col +
              (j - i * cols_),
          n);
    }
  }

  /// True when, for each tensor, canonical indices come out increasing as
  /// local indices increase (items can then be built without sorting).
  bool is_monotone() const noexcept {
    for (std::size_t a = 0; a < pieces_.size(); ++a)
      for (std::size_t b = a + 1; b < pieces_.size(); ++b)
        if (pieces_[a].tensor == pieces_[b].tensor &&
            pieces_[b].canonical_row < pieces_[a].canonical_row + pieces_[a].rows)
          return false;
    return true;
  }

  /// The map over the row-wise concatenation of `parts` (each part's local
  /// rows follow the previous part's): the TP-gathered map of a row-split
  /// parameter. All parts must have the same `local_cols`.
  static piecewise_map concat_rows(std::span<const piecewise_map> parts) {
    if (parts.empty()) return {};
    std::vector<map_piece> all;
    std::uint64_t off = 0;
    for (auto& m : parts) {
      if (m.cols_ != parts[0].cols_)
        throw error(errc::invalid_argument, "concat_rows: column counts differ");
      for (auto p : m.pieces_) {
        p.local_row += off;
        all.push_back(p);
      }
      off += m.rows_;
    }
    return {off, parts[0].cols_, std::move(all)};
  }

  /// Renames tensor ids: each piece's `tensor` becomes `ids[tensor]`.
  piecewise_map retargeted(std::span<const std::uint32_t> ids) const {
    piecewise_map m = *this;
    for (auto& p : m.pieces_) {
      if (p.tensor >= ids.size())
        throw error(errc::invalid_argument, "retargeted: tensor slot out of range");
      p.tensor = ids[p.tensor];
    }
    return m;
  }

  friend bool operator==(const piecewise_map& a, const piecewise_map& b) {
    return a.rows_ == b.rows_ && a.cols_ == b.cols_ && a.pieces_ == b.pieces_;
  }

private:
  bool compute_unique() const noexcept {
    for (std::size_t a = 0; a < pieces_.size(); ++a)
      for (std::size_t b = a + 1; b < pieces_.size(); ++b) {
        const auto &x = pieces_[a], &y = pieces_[b];
        if (x.tensor != y.tensor) continue;
        const bool rows_overlap = x.canonical_row < y.canonical_row + y.rows &&
                                  y.canonical_row < x.canonical_row + x.rows;
        const bool cols_overlap =
            x.canonical_col < y.canonical_col + cols_ && y.canonical_col < x.canonical_col + cols_;
        if (x.canonical_cols != y.canonical_cols || (rows_overlap && cols_overlap)) return false;
      }
    return true;
  }

  std::uint64_t rows_ = 0, cols_ = 1;
  std::vector<map_piece> pieces_;
  bool unique_ = true;
};
static_assert(index_map<piecewise_map>);

namespace detail {
inline void require(bool ok, const char* what) {
  if (!ok) throw error(errc::invalid_argument, what);
}
} // namespace detail

/// Shared part of the named mapping classes: they hold their pieces and
/// delegate runs and uniqueness to them; each states its own `operator()`.
class mapping_class_base {
public:
  std::uint64_t domain_size() const noexcept { return pm_.domain_size(); }
  bool is_unique() const noexcept { return pm_.is_unique(); }
  template <class Out>
  void map_run(std::uint64_t s, std::uint64_t n, Out&& out) const {
    pm_.map_run(s, n, out);
  }
  /// The runtime form.
  const piecewise_map& pieces() const noexcept { return pm_; }

protected:
  piecewise_map pm_;
};

/// Replicated tensor (norms, router): identity onto `tensor` of `rows x cols`.
class replicated_map : public mapping_class_base {
public:
  replicated_map(std::uint32_t tensor, std::uint64_t rows, std::uint64_t cols)
      : t_(tensor), n_(rows * cols) {
    pm_ = piecewise_map(rows, cols, {{0, rows, tensor, 0, 0, cols}});
  }
  destination operator()(std::uint64_t j) const noexcept { return {t_, j}; }

private:
  std::uint32_t t_;
  std::uint64_t n_;
};
static_assert(index_map<replicated_map>);

/// An index map from a callable `f(j) -> canonical flat index` that sends
/// every local element of a `domain`-element shard into one tensor: how an
/// application plugs in a layout the named classes do not cover (say a
/// transposed shard). Runs are the maximal stretches where `f` advances by 1.
/// `unique` states that `f` is injective (XOR records need it; a repeated XOR
/// cancels itself); it is the caller's promise, not checked.
template <class F>
requires std::is_invocable_r_v<std::uint64_t, const F&, std::uint64_t>
class flat_map {
public:
  flat_map(std::uint32_t tensor, std::uint64_t domain, F f, bool unique = true)
      : f_(std::move(f)), tensor_(tensor), n_(domain), unique_(unique) {}
  std::uint64_t domain_size() const noexcept { return n_; }
  destination operator()(std::uint64_t j) const { return {tensor_, f_(j)}; }
  bool is_unique() const noexcept { return unique_; }
  template <class Out>
  void map_run(std::uint64_t start, std::uint64_t count, Out&& out) const {
    canonical_run cur{start, 0, tensor_, 0};
    for (std::uint64_t j = start; j < start + count; ++j) {
      const std::uint64_t k = f_(j);
      if (cur.count && k == cur.canonical_start + cur.count) {
        ++cur.count;
        continue;
      }
      if (cur.count) out(std::as_const(cur));
      cur = {j, 1, tensor_, k};
    }
    if (cur.count) out(std::as_const(cur));
  }

private:
  F f_;
  std::uint32_t tensor_;
  std::uint64_t n_;
  bool unique_;
};

/// Column-parallel (split dim 0): rank `r` of `t` holds rows
/// `[r N/t, (r+1) N/t)` of an `N x K` tensor; local (i, j) -> (r N/t + i, j).
class column_parallel_map : public mapping_class_base {
public:
  column_parallel_map(std::uint32_t tensor, std::uint64_t n, std::uint64_t k, std::uint64_t t,
                      std::uint64_t r)
      : t_(tensor), base_((detail::require(t > 0 && r < t && n % t == 0,
                                           "column_parallel_map: N % t != 0 or r >= t"),
                           r * (n / t) * k)) {
    pm_ = piecewise_map(n / t, k, {{0, n / t, tensor, r * (n / t), 0, k}});
  }
  destination operator()(std::uint64_t j) const noexcept { return {t_, base_ + j}; }

private:
  std::uint32_t t_;
  std::uint64_t base_;
};
static_assert(index_map<column_parallel_map>);

/// Row-parallel (split dim 1): rank `r` holds columns `[r K/t, (r+1) K/t)`;
/// local (i, j) -> (i, r K/t + j).
class row_parallel_map : public mapping_class_base {
public:
  row_parallel_map(std::uint32_t tensor, std::uint64_t n, std::uint64_t k, std::uint64_t t,
                   std::uint64_t r)
      : t_(tensor), k_(k), kl_((detail::require(t > 0 && r < t && k % t == 0,
                                                "row_parallel_map: K % t != 0 or r >= t"),
                                k / t)),
        r_(r) {
    pm_ = piecewise_map(n, kl_, {{0, n, tensor, 0, r * kl_, k}});
  }
  destination operator()(std::uint64_t j) const noexcept {
    return {t_, (j / kl_) * k_ + r_ * kl_ + j % kl_};
  }

private:
  std::uint32_t t_;
  std::uint64_t k_, kl_, r_;
};
static_assert(index_map<row_parallel_map>);

/// Vocabulary rows padded to a multiple of `t * block` (Megatron's
/// make-vocab-size-divisible-by times TP).
inline std::uint64_t padded_vocab(std::uint64_t vocab, std::uint64_t t, std::uint64_t block) {
  const std::uint64_t m = t * std::max<std::uint64_t>(block, 1);
  return (vocab + m - 1) / m * m;
}

/// Vocab-padded column-parallel (embedding, output layer): rank `r` holds
/// padded rows `[r Vp/t, (r+1) Vp/t)`; local row i -> canonical row r Vp/t + i
/// when that is `< vocab`, else nowhere (padding is not canonical).
class vocab_padded_map : public mapping_class_base {
public:
  vocab_padded_map(std::uint32_t tensor, std::uint64_t vocab, std::uint64_t hidden, std::uint64_t t,
                   std::uint64_t r, std::uint64_t block)
      : t_(tensor), vocab_(vocab), hidden_(hidden) {
    detail::require(t > 0 && r < t && hidden > 0, "vocab_padded_map: r >= t or hidden == 0");
    rows_ = padded_vocab(vocab, t, block) / t;
    first_ = r * rows_;
    const std::uint64_t real = first_ >= vocab ? 0 : std::min(rows_, vocab - first_);
    std::vector<map_piece> p;
    if (real) p.push_back({0, real, tensor, first_, 0, hidden});
    pm_ = piecewise_map(rows_, hidden, std::move(p));
  }
  destination operator()(std::uint64_t j) const noexcept {
    const std::uint64_t row = first_ + j / hidden_;
    if (row >= vocab_) return {};
    return {t_, first_ * hidden_ + j};
  }
  std::uint64_t local_rows() const noexcept { return rows_; }

private:
  std::uint32_t t_;
  std::uint64_t vocab_, hidden_, rows_ = 0, first_ = 0;
};
static_assert(index_map<vocab_padded_map>);

/// Megatron fused QKV, interleaved per query group: `nh` query heads in `ng`
/// groups (p = nh/ng), head dim `d`, `cols` columns (hidden for weights, 1 for
/// biases). Fused row m: g = m div ((p+2)d), s = (m mod (p+2)d) div d,
/// j = m mod d; s < p -> q row (g p + s) d + j; s = p -> k row g d + j;
/// s = p+1 -> v row g d + j. TP rank r holds fused rows [r F/t, (r+1) F/t),
/// F = ng (p+2) d: whole groups when ng mod t = 0, raw row slices otherwise.
class fused_qkv_map : public mapping_class_base {
public:
  fused_qkv_map(std::uint32_t q, std::uint32_t k, std::uint32_t v, std::uint64_t nh,
                std::uint64_t ng, std::uint64_t d, std::uint64_t cols, std::uint64_t t,
                std::uint64_t r)
      : q_(q), k_(k), v_(v), p_(0), d_(d), cols_(cols) {
    detail::require(ng > 0 && d > 0 && cols > 0 && nh % ng == 0,
                    "fused_qkv_map: heads % groups != 0");
    p_ = nh / ng;
    const std::uint64_t f = ng * (p_ + 2) * d;
    detail::require(t > 0 && r < t && f % t == 0, "fused_qkv_map: fused rows not divisible by t");
    rows_ = f / t;
    first_ = r * rows_;
    std::vector<map_piece> pieces;
    auto clip = [&](std::uint64_t lo, std::uint64_t n, std::uint32_t tensor, std::uint64_t crow) {
      const std::uint64_t a = std::max(lo, first_), b = std::min(lo + n, first_ + rows_);
      if (a < b) pieces.push_back({a - first_, b - a, tensor, crow + (a - lo), 0, cols});
    };
    for (std::uint64_t g = 0; g < ng; ++g) {
      const std::uint64_t base = g * (p_ + 2) * d;
      clip(base, p_ * d, q, g * p_ * d);
      clip(base + p_ * d, d, k, g * d);
      clip(base + (p_ + 1) * d, d, v, g * d);
    }
    pm_ = piecewise_map(rows_, cols, std::move(pieces));
  }
  destination operator()(std::uint64_t j) const noexcept {
    const std::uint64_t m = first_ + j / cols_, c = j % cols_;
    const std::uint64_t g = m / ((p_ + 2) * d_), s = (m % ((p_ + 2) * d_)) / d_, jj = m % d_;
    if (s < p_) return {q_, ((g * p_ + s) * d_ + jj) * cols_ + c};
    if (s == p_) return {k_, (g * d_ + jj) * cols_ + c};
    return {v_, (g * d_ + jj) * cols_ + c};
  }

private:
  std::uint32_t q_, k_, v_;
  std::uint64_t p_, d_, cols_, rows_ = 0, first_ = 0;
};
static_assert(index_map<fused_qkv_map>);

/// Gated MLP fc1 on TP rank r (I = intermediate size): local row j < I/t ->
/// gate row r I/t + j, else up row r I/t + (j - I/t). The TP-gathered fc1 is
/// the concatenation over r of [G_r; U_r], not [G; U].
class gated_fc1_map : public mapping_class_base {
public:
  gated_fc1_map(std::uint32_t gate, std::uint32_t up, std::uint64_t ffn, std::uint64_t hidden,
                std::uint64_t t, std::uint64_t r)
      : g_(gate), u_(up),
        il_((detail::require(t > 0 && r < t && ffn % t == 0, "gated_fc1_map: ffn % t != 0"),
             ffn / t)),
        h_(hidden), r_(r) {
    pm_ = piecewise_map(2 * il_, hidden,
                        {{0, il_, gate, r * il_, 0, hidden}, {il_, il_, up, r * il_, 0, hidden}});
  }
  destination operator()(std::uint64_t j) const noexcept {
    const std::uint64_t row = j / h_, c = j % h_;
    if (row < il_) return {g_, (r_ * il_ + row) * h_ + c};
    return {u_, (r_ * il_ + row - il_) * h_ + c};
  }

private:
  std::uint32_t g_, u_;
  std::uint64_t il_, h_, r_;
};
static_assert(index_map<gated_fc1_map>);

/// Global expert index of local expert `local` on EP rank `ep_rank` of `ep`
/// with `experts` routed experts: `local + ep_rank * experts / ep`.
constexpr std::uint64_t global_expert(std::uint64_t local, std::uint64_t ep_rank,
                                      std::uint64_t experts, std::uint64_t ep) noexcept {
  return local + ep_rank * (experts / ep);
}

/// Layers `[s L/P, (s+1) L/P)` held by pipeline stage `s` of `P`.
inline std::pair<std::uint64_t, std::uint64_t> pp_stage_layers(std::uint64_t layers,
                                                               std::uint64_t pp, std::uint64_t s) {
  detail::require(pp > 0 && s < pp && layers % pp == 0,
                  "pp_stage_layers: layers % pp != 0 or s >= pp");
  return {s * (layers / pp), (s + 1) * (layers / pp)};
}

} // namespace dcr
