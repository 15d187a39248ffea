#pragma once
// Model and weight setup shared by dcr-demo and the cluster programs
// (dcr-owner, dcr-rollout, dcr-coordinator): the synthetic Qwen3-MoE-style
// model sized by --size, its deterministic initial weights, reading a
// checkpoint, and the vLLM-style rollout layout. Every program of one job
// computes the same values from the same flags.

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "dcr/core/error.hpp"
#include "dcr/core/tensor.hpp"
#include "dcr/io/safetensors.hpp"
#include "dcr/loaders/vllm_style.hpp"
#include "dcr/model/config.hpp"
#include "examples/common/simulator.hpp"
#include "support/report.hpp"

namespace dcr::examples {

/// Bytes from "small", "800MB", "1GB", "1.5GB", "123456" (0: the small model).
/// `dcr::error(invalid_argument)` for anything else.
inline std::uint64_t parse_size(const std::string& s) {
  if (s == "small") return 0;
  char* end = nullptr;
  const double x = std::strtod(s.c_str(), &end);
  const std::string unit = end ? end : "";
  double mul = 1;
  if (unit == "GB" || unit == "G")
    mul = 1e9;
  else if (unit == "MB" || unit == "M")
    mul = 1e6;
  else if (unit == "KB" || unit == "K")
    mul = 1e3;
  else if (!unit.empty())
    throw error(errc::invalid_argument, "--size: unknown unit " + unit);
  if (!(x > 0)) throw error(errc::invalid_argument, "--size: not a positive size: " + s);
  return static_cast<std::uint64_t>(x * mul);
}

/// Qwen3-MoE-style config near `bytes` of BF16 weights (0: the small model).
inline model_config model_for(std::uint64_t bytes) {
  model_config c;
  c.family = "qwen3_moe";
  c.qk_norm = true;
  c.ffn = 0;
  if (bytes == 0) {
    c.hidden = 256, c.heads = 8, c.kv_heads = 2, c.head_dim = 32, c.experts = 8, c.moe_ffn = 128,
    c.vocab = 4096;
    c.layers = 2;
    return c;
  }
  c.hidden = 1024, c.heads = 16, c.kv_heads = 4, c.head_dim = 64, c.experts = 16, c.moe_ffn = 512,
  c.vocab = 32000;
  c.layers = 1;
  const auto one = [&] {
    std::uint64_t n = 0;
    for (auto& m : canonical_tensors(c)) n += m.nbytes();
    return n;
  };
  const auto b1 = one();
  c.layers = 2;
  const auto per_layer = one() - b1;
  const auto fixed = b1 - per_layer;
  c.layers =
      bytes > fixed ? std::max<std::uint64_t>(1, (bytes - fixed + per_layer / 2) / per_layer) : 1;
  return c;
}

/// The pool of normal BF16 values synthetic tensors are cut from.
inline std::vector<std::uint16_t> synthetic_pool(std::uint64_t seed) {
  return sim::normal_bf16(std::size_t{1} << 22, 0.02f, seed);
}

/// Tensor `i` of `synthetic_weights(metas, seed)`, alone (`pool`:
/// `synthetic_pool(seed)`): each tensor depends on its index and the seed
/// only, so a rank can make just the tensors its shards read.
inline host_tensor synthetic_tensor(const std::vector<tensor_meta>& metas, std::size_t i,
                                    std::span<const std::uint16_t> pool, std::uint64_t seed) {
  constexpr std::size_t window = 4096;
  host_tensor h(metas[i]);
  auto* w = reinterpret_cast<std::uint16_t*>(h.bytes.data());
  const auto n = metas[i].numel();
  if (metas[i].shape.size() == 1) {
    std::fill_n(w, n, std::uint16_t{0x3F80}); // norms start at 1.0
  } else {
    sim::xoshiro256ss rng(seed * 7919 + i);
    for (std::size_t k = 0; k < n; k += window)
      std::memcpy(w + k, pool.data() + rng.below(pool.size() - window),
                  std::min(window, n - k) * 2);
  }
  return h;
}

/// Deterministic initial weights of `metas` for `seed`: N(0, 0.02) BF16
/// words (random windows of one pool of normals: realistic magnitudes, not
/// independent draws per element), norms at 1.0.
inline std::vector<host_tensor> synthetic_weights(const std::vector<tensor_meta>& metas,
                                                  std::uint64_t seed) {
  std::vector<host_tensor> initial(metas.size());
  const auto pool = synthetic_pool(seed);
  support::parallel_for(
      metas.size(), [&](std::size_t i) { initial[i] = synthetic_tensor(metas, i, pool, seed); });
  return initial;
}

/// Every tensor of a safetensors checkpoint, in file order.
inline std::vector<host_tensor> read_checkpoint(const std::string& path) {
  auto file = io::safetensors_file::open_or_throw(path);
  std::vector<host_tensor> out;
  for (auto& m : file.tensors()) {
    host_tensor h(m);
    auto b = file.bytes(m.name);
    std::memcpy(h.bytes.data(), b.data(), b.size());
    out.push_back(std::move(h));
  }
  return out;
}

/// Receiver id of a vLLM rank ("dp0-tp1").
inline std::string vllm_rank_id(const loaders::vllm_layout& rl) {
  return "dp" + std::to_string(rl.dp_rank) + "-tp" + std::to_string(rl.tp_rank);
}

/// vLLM's parallel config for `world` ranks serving `cfg`: MoE models "TP
/// world/dp, DP dp, expert parallel", dense ones TP world.
inline loaders::vllm_parallel_config vllm_config(const model_config& cfg, std::uint64_t tp,
                                                 std::uint64_t dp) {
  loaders::vllm_parallel_config vp;
  vp.tensor_parallel_size = tp;
  vp.data_parallel_size = cfg.is_moe() ? dp : 1;
  vp.enable_expert_parallel = cfg.is_moe();
  return vp;
}

} // namespace dcr::examples
