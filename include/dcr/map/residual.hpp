#pragma once
/// \file
/// Residual conversion: rules that build canonical tensors from source parts
/// with declared inputs, for conversions outside direct projection (scale and
/// cast, FP8 block quantisation with scales, tied outputs, stacking, custom).
///
/// A rule sees its declared inputs' bytes (by position) and fills its output
/// tensors. Geometry (which part lands where) belongs to the rule: parts are
/// placed through `piecewise_map`s whose tensor ids are the rule's output
/// slots, by a `part_assembler` that checks that the parts cover every output
/// element (`errc::coverage`) and agree bit for bit where they overlap
/// (`errc::parts_disagree`).

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstring>
#include <functional>
#include <iterator>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "dcr/core/rounding.hpp"
#include "dcr/core/tensor.hpp"
#include "dcr/map/fp8.hpp"
#include "dcr/map/index_map.hpp"

namespace dcr {

/// One declared input of a residual rule: a source shard's stored bytes.
struct residual_input {
  std::span<const std::byte> bytes;
  dtype_id dtype = dtype_id::bf16;
};

/// A residual conversion task. `convert(inputs, outputs)` receives exactly
/// `inputs` inputs and `outputs.size()` tensors allocated with the metas of
/// `outputs` (zero-filled); it must be deterministic (same inputs, same bits).
struct residual_rule {
  std::string name;
  std::vector<tensor_meta> outputs;
  std::size_t inputs = 0;
  std::function<status(std::span<const residual_input>, std::span<host_tensor>)> convert;
};

/// Runs `r` on `in`: allocates outputs, checks the input count, converts.
inline status run_rule(const residual_rule& r, std::span<const residual_input> in,
                       std::vector<host_tensor>& out) {
  DCR_RETURN_ERROR_IF(in.size() != r.inputs, invalid_argument,
                      r.name + ": expected " + std::to_string(r.inputs) + " inputs, got " +
                          std::to_string(in.size()));
  out.clear();
  for (auto& m : r.outputs) out.emplace_back(m);
  return r.convert(in, out);
}

namespace maps {
/// A mapping class of the residual kind: a type whose objects turn the
/// candidate's inputs into canonical outputs that are then compared with a
/// residual baseline (`stages::residual<R>`): `run_rule(r, inputs, outputs)`
/// (found by argument-dependent lookup) and a name for errors.
/// `dcr::residual_rule` (gather, tied, stack, cast and FP8 rules) is one.
template <class R>
concept residual_rule = requires(const R& r, std::span<const residual_input> in,
                                 std::vector<host_tensor>& out) {
  { run_rule(r, in, out) } -> std::same_as<status>;
  { r.name } -> std::convertible_to<std::string>;
};
static_assert(residual_rule<dcr::residual_rule>);
} // namespace maps

/// Assembles parts into output tensors with coverage and overlap checks.
class part_assembler {
public:
  explicit part_assembler(std::span<host_tensor> outputs) : out_(outputs), cover_(outputs.size()) {}

  /// Copies `count` elements from `src` to `[start, start+count)` of slot
  /// `slot`. Elements already written must hold the same bits.
  status add_run(std::uint32_t slot, std::uint64_t start, const std::byte* src, std::uint64_t count,
                 std::string_view part) {
    DCR_RETURN_ERROR_IF(slot >= out_.size(), invalid_argument,
                        std::string(part) + ": output slot out of range");
    auto& t = out_[slot];
    const std::uint64_t w = width_of(t.meta.dtype), n = t.meta.numel();
    DCR_RETURN_ERROR_IF(start > n || count > n - start, index_out_of_range,
                        std::string(part) + ": run outside " + t.meta.name);
    if (count == 0) return status::success();
    const std::uint64_t end = start + count;
    auto& iv = cover_[slot]; // disjoint, non-adjacent intervals: start -> end
    if (iv.empty() || start > std::prev(iv.end())->second) { // common case: parts arrive in order
      iv.emplace_hint(iv.end(), start, end);
    } else if (start == std::prev(iv.end())->second) {
      std::prev(iv.end())->second = end;
    } else {
      auto it = iv.upper_bound(start);
      if (it != iv.begin() && std::prev(it)->second > start) --it;
      std::uint64_t lo = start, hi = end;
      for (auto j = it; j != iv.end() && j->first < end;
           ++j) { // compare every overlap before writing
        const std::uint64_t a = std::max(j->first, start), b = std::min(j->second, end);
        if (a < b && std::memcmp(t.bytes.data() + a * w, src + (a - start) * w, (b - a) * w) != 0) {
          std::uint64_t k = a;
          while (std::memcmp(t.bytes.data() + k * w, src + (k - start) * w, w) == 0) ++k;
          return fail(errc::parts_disagree,
                      std::string(part) + ": disagrees with an earlier part of " + t.meta.name +
                          " at flat index " + std::to_string(k));
        }
      }
      if (it != iv.begin() && std::prev(it)->second == start)
        --it; // merge with an adjacent left neighbour
      while (it != iv.end() && it->first <= hi) {
        lo = std::min(lo, it->first);
        hi = std::max(hi, it->second);
        it = iv.erase(it);
      }
      iv.emplace(lo, hi);
    }
    std::memcpy(t.bytes.data() + start * w, src, count * w);
    return status::success();
  }

  /// Places a whole part through `m` (tensor ids = output slots).
  status add(const piecewise_map& m, const residual_input& in, std::string_view part) {
    const std::uint64_t dom = m.domain_size();
    for (auto& p : m.pieces()) {
      DCR_RETURN_ERROR_IF(p.tensor >= out_.size(), invalid_argument,
                          std::string(part) + ": map slot out of range");
      DCR_RETURN_ERROR_IF(out_[p.tensor].meta.dtype != in.dtype, bad_dtype,
                          std::string(part) + ": dtype differs from " + out_[p.tensor].meta.name);
    }
    const std::uint64_t w = width_of(in.dtype);
    DCR_RETURN_ERROR_IF(in.bytes.size() != dom * w, shape_mismatch,
                        std::string(part) + ": " + std::to_string(in.bytes.size()) +
                            " bytes, map expects " + std::to_string(dom * w));
    status st;
    m.map_run(0, dom, [&](const canonical_run& r) {
      if (st.ok())
        st = add_run(r.tensor, r.canonical_start, in.bytes.data() + r.local_start * w, r.count,
                     part);
    });
    return st;
  }

  /// Fails with `errc::coverage` naming the first uncovered element.
  status finish() {
    for (std::size_t s = 0; s < out_.size(); ++s) {
      const auto& iv = cover_[s];
      const std::uint64_t n = out_[s].meta.numel();
      if (n == 0) continue;
      const std::uint64_t first_gap = iv.empty() || iv.begin()->first != 0 ? 0 : iv.begin()->second;
      if (first_gap < n)
        return fail(errc::coverage, out_[s].meta.name + ": parts leave flat index " +
                                        std::to_string(first_gap) + " (of " + std::to_string(n) +
                                        ") uncovered");
    }
    return status::success();
  }

private:
  std::span<host_tensor> out_;
  std::vector<std::map<std::uint64_t, std::uint64_t>> cover_;
};

namespace detail {
inline status assemble_all(const std::string& name, std::span<const piecewise_map> maps,
                           std::span<const residual_input> in, std::span<host_tensor> out) {
  part_assembler a(out);
  for (std::size_t i = 0; i < maps.size(); ++i)
    DCR_TRY(a.add(maps[i], in[i], name + " input " + std::to_string(i)));
  return a.finish();
}

/// Stored word of dtype `d` at element `k` widened to f32 (bf16, f16, f32).
inline float load_f32(dtype_id d, const std::byte* p, std::uint64_t k) noexcept {
  switch (d) {
  case dtype_id::bf16: {
    std::uint16_t w;
    std::memcpy(&w, p + 2 * k, 2);
    return bf16_to_f32(w);
  }
  case dtype_id::f16: {
    std::uint16_t w;
    std::memcpy(&w, p + 2 * k, 2);
    return f16_to_f32(w);
  }
  case dtype_id::f32: {
    float f;
    std::memcpy(&f, p + 4 * k, 4);
    return f;
  }
  case dtype_id::f8e4m3fn:
    return e4m3_to_f32(static_cast<std::uint8_t>(p[k]));
  default:
    return std::nanf("");
  }
}
/// Casts `x` to dtype `d` (RNE) and stores it at element `k`.
inline void store_cast(dtype_id d, std::byte* p, std::uint64_t k, float x) noexcept {
  switch (d) {
  case dtype_id::bf16: {
    const std::uint16_t w = f32_to_bf16_rne(x);
    std::memcpy(p + 2 * k, &w, 2);
    break;
  }
  case dtype_id::f16: {
    const std::uint16_t w = f32_to_f16_rne(x);
    std::memcpy(p + 2 * k, &w, 2);
    break;
  }
  case dtype_id::f32:
    std::memcpy(p + 4 * k, &x, 4);
    break;
  case dtype_id::f8e4m3fn:
    p[k] = static_cast<std::byte>(f32_to_e4m3_rne(x));
    break;
  default:
    break;
  }
}
inline bool castable(dtype_id d) {
  return d == dtype_id::bf16 || d == dtype_id::f16 || d == dtype_id::f32 || d == dtype_id::f8e4m3fn;
}
} // namespace detail

/// Identity assembly: input `i` is placed through `maps[i]` (slots index
/// `outputs`). Used for fused layouts left to residual conversion and for
/// full conversion (assemble whole canonical tensors, then diff).
inline residual_rule gather_rule(std::string name, std::vector<tensor_meta> outputs,
                                 std::vector<piecewise_map> maps) {
  residual_rule r{std::move(name), std::move(outputs), maps.size(), {}};
  r.convert = [maps = std::move(maps), nm = r.name](std::span<const residual_input> in,
                                                    std::span<host_tensor> out) {
    return detail::assemble_all(nm, maps, in, out);
  };
  return r;
}

/// Tied outputs: one source placed through `maps` into `a`, and the same bits
/// under a second canonical name `b` (same shape and dtype).
inline residual_rule tied_rule(std::string name, tensor_meta a, tensor_meta b,
                               std::vector<piecewise_map> maps) {
  if (a.shape != b.shape || a.dtype != b.dtype)
    throw error(errc::shape_mismatch, name + ": tied outputs differ in shape or dtype");
  residual_rule r{std::move(name), {std::move(a), std::move(b)}, maps.size(), {}};
  r.convert = [maps = std::move(maps), nm = r.name](std::span<const residual_input> in,
                                                    std::span<host_tensor> out) {
    DCR_TRY(detail::assemble_all(nm, maps, in, out.first(1)));
    out[1].bytes = out[0].bytes;
    return status::success();
  };
  return r;
}

/// Stacking: `n` whole source tensors of `output.numel() / n` elements each
/// become slices `[i]` of `output` along a new leading dimension.
inline residual_rule stack_rule(std::string name, tensor_meta output, std::size_t n) {
  if (n == 0 || output.numel() % n) throw error(errc::invalid_argument, name + ": numel % n != 0");
  residual_rule r{std::move(name), {std::move(output)}, n, {}};
  r.convert = [n, nm = r.name](std::span<const residual_input> in, std::span<host_tensor> out) {
    part_assembler a(out);
    const std::uint64_t each = out[0].meta.numel() / n, w = width_of(out[0].meta.dtype);
    for (std::size_t i = 0; i < n; ++i) {
      const std::string part = nm + " input " + std::to_string(i);
      DCR_RETURN_ERROR_IF(in[i].dtype != out[0].meta.dtype, bad_dtype,
                          part + ": dtype differs from output");
      DCR_RETURN_ERROR_IF(in[i].bytes.size() != each * w, shape_mismatch,
                          part + ": wrong size for a stack slice");
      DCR_TRY(a.add_run(0, i * each, in[i].bytes.data(), each, part));
    }
    return a.finish();
  };
  return r;
}

/// Scale and cast: input 0 is the scale λ (a one-element bf16/f16/f32 source
/// tensor); inputs 1.. are parts of `x` placed through `maps` into a tensor of
/// `output`'s shape and dtype `source_dtype`; then `out = cast(λ · x)` (FP32
/// product, RNE cast to `output.dtype`). A change of λ changes many outputs.
inline residual_rule scale_cast_rule(std::string name, tensor_meta output, dtype_id source_dtype,
                                     std::vector<piecewise_map> maps) {
  if (!detail::castable(source_dtype) || !detail::castable(output.dtype))
    throw error(errc::bad_dtype, name + ": unsupported dtype for scale_cast");
  residual_rule r{std::move(name), {std::move(output)}, maps.size() + 1, {}};
  r.convert = [maps = std::move(maps), source_dtype,
               nm = r.name](std::span<const residual_input> in, std::span<host_tensor> out) {
    DCR_RETURN_ERROR_IF(!detail::castable(in[0].dtype) ||
                            in[0].bytes.size() != width_of(in[0].dtype),
                        shape_mismatch, nm + ": scale must be one bf16/f16/f32 element");
    const float lambda = detail::load_f32(in[0].dtype, in[0].bytes.data(), 0);
    tensor_meta xm = out[0].meta;
    xm.dtype = source_dtype;
    host_tensor x(xm);
    DCR_TRY(detail::assemble_all(nm, maps, in.subspan(1), std::span<host_tensor>(&x, 1)));
    const std::uint64_t n = xm.numel();
    for (std::uint64_t k = 0; k < n; ++k)
      detail::store_cast(out[0].meta.dtype, out[0].bytes.data(), k,
                         lambda * detail::load_f32(source_dtype, x.bytes.data(), k));
    return status::success();
  };
  return r;
}

/// Name of the FP8 inverse-scale tensor of a weight ("x.weight" -> "x.weight_scale_inv").
inline std::string scale_inv_name(const std::string& weight) { return weight + "_scale_inv"; }

/// Tile shape of block-wise FP8 quantisation (`weight_block_size = [rows, cols]`).
struct fp8_block_shape {
  std::uint64_t rows = 128, cols = 128;
};

/// Block-wise FP8 quantisation of one `rows x cols` matrix `x` (stored words
/// of `source_dtype`, row-major): per tile, with `amax` the largest |x| of the
/// tile in FP32, `scales[tile] = quantizer.scale_inv(amax)` and each
/// `codes[i] = e4m3_rne(quantizer.scaled(x[i], amax))`. Tiles are `block`
/// sized, edge tiles partial; `scales` is `[ceil(rows/block.rows),
/// ceil(cols/block.cols)]` row-major. This is the one quantiser both the
/// delta path (residual rules) and a dense FP8 checkpoint use, so their bits
/// agree by construction of the function, not by accident of two copies.
namespace detail {
/// `quantize_fp8_blocks` for one source dtype: `load(k)` widens element k.
template <class Load, class Quantizer>
void quantize_fp8_tiles(Load load, std::uint64_t rows, std::uint64_t cols, fp8_block_shape block,
                        std::byte* codes, float* scales, const Quantizer& quantizer) {
  const std::uint64_t br = (rows + block.rows - 1) / block.rows,
                      bc = (cols + block.cols - 1) / block.cols;
  for (std::uint64_t bi = 0; bi < br; ++bi)
    for (std::uint64_t bj = 0; bj < bc; ++bj) {
      const std::uint64_t r0 = bi * block.rows, r1 = std::min(rows, r0 + block.rows),
                          c0 = bj * block.cols, c1 = std::min(cols, c0 + block.cols);
      float amax = 0;
      for (std::uint64_t i = r0; i < r1; ++i)
        for (std::uint64_t j = c0; j < c1; ++j)
          amax = std::max(amax, std::fabs(load(i * cols + j)));
      scales[bi * bc + bj] = quantizer.scale_inv(amax);
      for (std::uint64_t i = r0; i < r1; ++i)
        for (std::uint64_t j = c0; j < c1; ++j)
          codes[i * cols + j] =
              static_cast<std::byte>(f32_to_e4m3_rne(quantizer.scaled(load(i * cols + j), amax)));
    }
}
} // namespace detail

/// Block-wise FP8 quantisation of one `rows x cols` matrix `x` (stored words
/// of `source_dtype`, row-major): per tile, with `amax` the largest |x| of the
/// tile in FP32, `scales[tile] = quantizer.scale_inv(amax)` and each
/// `codes[i] = e4m3_rne(quantizer.scaled(x[i], amax))`. Tiles are `block`
/// sized, edge tiles partial; `scales` is `[ceil(rows/block.rows),
/// ceil(cols/block.cols)]` row-major. This is the one quantiser both the
/// delta path (residual rules) and a dense FP8 checkpoint use, so their bits
/// agree by construction of the function, not by accident of two copies.
/// The source dtype is dispatched once per call, not per element.
template <fp8_block_quantizer Quantizer = per_block_cast_to_fp8>
void quantize_fp8_blocks(dtype_id source_dtype, const std::byte* x, std::uint64_t rows,
                         std::uint64_t cols, fp8_block_shape block, std::byte* codes, float* scales,
                         const Quantizer& quantizer = {}) {
  auto words16 = [x](auto widen) {
    return [x, widen](std::uint64_t k) {
      std::uint16_t w;
      std::memcpy(&w, x + 2 * k, 2);
      return widen(w);
    };
  };
  switch (source_dtype) {
  case dtype_id::bf16:
    detail::quantize_fp8_tiles(words16([](std::uint16_t w) { return bf16_to_f32(w); }), rows, cols,
                               block, codes, scales, quantizer);
    break;
  case dtype_id::f16:
    detail::quantize_fp8_tiles(words16([](std::uint16_t w) { return f16_to_f32(w); }), rows, cols,
                               block, codes, scales, quantizer);
    break;
  default:
    detail::quantize_fp8_tiles(
        [&](std::uint64_t k) { return detail::load_f32(source_dtype, x, k); }, rows, cols, block,
        codes, scales, quantizer);
    break;
  }
}

/// FP8 E4M3 block quantisation of a `rows x cols` weight with one f32
/// `scale_inv` per `block.rows x block.cols` tile (DeepSeek-V3 style), by
/// `quantize_fp8_blocks`; the default quantizer is the reference
/// `per_block_cast_to_fp8` (amax clamped at 1e-4, x · 448/amax, amax/448
/// stored). Parts of x (dtype `source_dtype`) are placed through `maps`.
/// One changed element can rescale its whole tile, and a tile whose scale
/// changes re-encodes all of its codes.
template <fp8_block_quantizer Quantizer = per_block_cast_to_fp8>
residual_rule fp8_block_quant_rule(std::string name, std::string weight_name, std::uint64_t rows,
                                   std::uint64_t cols, dtype_id source_dtype,
                                   std::vector<piecewise_map> maps, fp8_block_shape block,
                                   Quantizer quantizer = {}) {
  if (!detail::castable(source_dtype) || block.rows == 0 || block.cols == 0)
    throw error(errc::invalid_argument, name + ": bad dtype or block");
  const std::uint64_t br = (rows + block.rows - 1) / block.rows,
                      bc = (cols + block.cols - 1) / block.cols;
  std::vector<tensor_meta> outs{{weight_name, {rows, cols}, dtype_id::f8e4m3fn},
                                {scale_inv_name(weight_name), {br, bc}, dtype_id::f32}};
  residual_rule r{std::move(name), std::move(outs), maps.size(), {}};
  r.convert = [maps = std::move(maps), source_dtype, rows, cols, block, quantizer,
               nm = r.name](std::span<const residual_input> in, std::span<host_tensor> out) {
    tensor_meta xm{"x", {rows, cols}, source_dtype};
    host_tensor x(xm);
    DCR_TRY(detail::assemble_all(nm, maps, in, std::span<host_tensor>(&x, 1)));
    quantize_fp8_blocks(source_dtype, x.bytes.data(), rows, cols, block, out[0].bytes.data(),
                        reinterpret_cast<float*>(out[1].bytes.data()), quantizer);
    return status::success();
  };
  return r;
}

/// Square tiles of `block x block` (the form of DeepSeek-V3's [128, 128]).
template <fp8_block_quantizer Quantizer = per_block_cast_to_fp8>
residual_rule fp8_block_quant_rule(std::string name, std::string weight_name, std::uint64_t rows,
                                   std::uint64_t cols, dtype_id source_dtype,
                                   std::vector<piecewise_map> maps, std::uint64_t block = 128,
                                   Quantizer quantizer = {}) {
  return fp8_block_quant_rule(std::move(name), std::move(weight_name), rows, cols, source_dtype,
                              std::move(maps), fp8_block_shape{block, block}, quantizer);
}

/// A user-defined rule: `fn` fills `outputs` from `inputs` declared inputs.
inline residual_rule
custom_rule(std::string name, std::vector<tensor_meta> outputs, std::size_t inputs,
            std::function<status(std::span<const residual_input>, std::span<host_tensor>)> fn) {
  return residual_rule{std::move(name), std::move(outputs), inputs, std::move(fn)};
}

} // namespace dcr
