#pragma once
/// \file
/// A second reference loader (single rank, full replica) whose placement is
/// not a plain slice of the canonical tensors, to exercise the overwrite path
/// and the loader conditions:
/// - `qkv_proj_t` stores fused [q | k | v] transposed ([hidden, (nh+2nkv)·d]),
///   `o_proj_t` and `down_proj_t` transposed: copies through transposed
///   destination views whose source is still the scratch (XOR allowed);
/// - every norm, the MoE router and `lm_head` are stored in FP32: the loader
///   widens BF16 into its own temporary and copies that (a cast; overwrite
///   only, O(tensor) per item);
/// - everything else is copied whole.

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dcr/core/error.hpp"
#include "dcr/core/tensor.hpp"
#include "dcr/loaders/views.hpp"
#include "dcr/model/config.hpp"
#include "dcr/receiver/loader.hpp"
#include "dcr/receiver/storage.hpp"

namespace dcr::loaders {

/// Transposing and casting loader for BF16 Llama / Qwen3-MoE configs.
class cast_transpose_loader {
public:
  /// Concurrent loads each lease their own cast temporary (receiver/loader.hpp).
  static constexpr bool concurrent_load = true;

  explicit cast_transpose_loader(model_config cfg) : c_(std::move(cfg)) {
    if (c_.dtype != dtype_id::bf16)
      throw error(errc::invalid_argument, "cast_transpose_loader: BF16 models only");
  }

  void declare(parameter_store& s, std::span<const tensor_meta> canonical) const {
    const auto d = c_.head_dim, h = c_.hidden;
    for (auto& m : canonical) {
      const auto& n = m.name;
      if (is_cast(n))
        s.add(n, m.shape, dtype_id::f32);
      else if (ends_with(n, "self_attn.q_proj.weight"))
        s.add(fused(n), {h, (c_.heads + 2 * c_.kv_heads) * d}, m.dtype);
      else if (ends_with(n, "self_attn.k_proj.weight") || ends_with(n, "self_attn.v_proj.weight"))
        continue;
      else if (is_transposed(n))
        s.add(n + ".t", {m.shape[1], m.shape[0]}, m.dtype);
      else
        s.add(n, m.shape, m.dtype);
    }
  }

  load_report load(std::string_view name_sv, const tensor_view& src, parameter_store& s,
                   copy_sink& sink) {
    const std::string name(name_sv);
    if (is_cast(name)) {
      auto tmp = tmp_->lease();
      sink.copy(s.view(name), widen_bf16_to_f32(src, *tmp));
      return {{name}};
    }
    const auto d = static_cast<std::int64_t>(c_.head_dim);
    const auto nq = static_cast<std::int64_t>(c_.heads) * d,
               nkv = static_cast<std::int64_t>(c_.kv_heads) * d;
    auto qkv = [&](std::int64_t start, std::int64_t count) {
      const auto p = fused(name);
      sink.copy(s.view(p).transposed(0, 1).slice(0, start, count), src);
      return load_report{{p}};
    };
    if (ends_with(name, "self_attn.q_proj.weight")) return qkv(0, nq);
    if (ends_with(name, "self_attn.k_proj.weight")) return qkv(nq, nkv);
    if (ends_with(name, "self_attn.v_proj.weight")) return qkv(nq + nkv, nkv);
    if (is_transposed(name)) {
      sink.copy(s.view(name + ".t").transposed(0, 1), src);
      return {{name + ".t"}};
    }
    sink.copy(s.view(name), src);
    return {{name}};
  }

private:
  static bool ends_with(std::string_view s, std::string_view suffix) {
    return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
  }
  static bool is_cast(std::string_view n) {
    return ends_with(n, "norm.weight") || ends_with(n, "mlp.gate.weight") || n == "lm_head.weight";
  }
  static bool is_transposed(std::string_view n) {
    return ends_with(n, "self_attn.o_proj.weight") || ends_with(n, "down_proj.weight");
  }
  /// "model.layers.3.self_attn.q_proj.weight" -> "model.layers.3.self_attn.qkv_proj_t.weight"
  static std::string fused(const std::string& n) {
    return n.substr(0, n.size() - std::string_view("q_proj.weight").size()) + "qkv_proj_t.weight";
  }

  /// Cast temporaries, reused across loads (a cast of the largest tensor
  /// would otherwise allocate and fault in its pages per item): one per load
  /// running at a time, shared by copies of the loader.
  class temporaries {
  public:
    using buffer = std::vector<std::uint32_t>;
    struct returner {
      temporaries* pool;
      void operator()(buffer* b) const {
        std::lock_guard l(pool->m_);
        pool->free_.emplace_back(b);
      }
    };
    std::unique_ptr<buffer, returner> lease() {
      std::unique_ptr<buffer> b;
      {
        std::lock_guard l(m_);
        if (!free_.empty()) {
          b = std::move(free_.back());
          free_.pop_back();
        }
      }
      if (!b) b = std::make_unique<buffer>();
      return {b.release(), returner{this}};
    }

  private:
    std::mutex m_;
    std::vector<std::unique_ptr<buffer>> free_;
  };

  model_config c_;
  std::shared_ptr<temporaries> tmp_ = std::make_shared<temporaries>();
};
static_assert(native_loader<cast_transpose_loader>);

} // namespace dcr::loaders
