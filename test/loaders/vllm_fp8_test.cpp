// vLLM's block-FP8 loading, modelled: parameter shapes of Fp8LinearMethod /
// Fp8MoEMethod under TP / EP, where each scale tile lands (checked against
// closed-form expectations written from vLLM's rules, not against the
// loader), the layouts vLLM refuses rejected at prewarm with the tensor and
// the reason, and the overwrite path for 1-byte codes through a transform.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "dcr/loaders/vllm_style.hpp"
#include "dcr/receiver/receiver.hpp"
#include "dcr/receiver/tensor_set.hpp"

using namespace dcr;
using loaders::vllm_layout;
using loaders::vllm_parallel_config;
using loaders::vllm_style_loader;

namespace {

model_config qwen3_like(std::uint64_t block_n, std::uint64_t block_k) {
  model_config c;
  c.family = "qwen3";
  c.hidden = 64;
  c.layers = 1;
  c.heads = 8;
  c.kv_heads = 2;
  c.head_dim = 16;
  c.ffn = 64;
  c.vocab = 128;
  c.qk_norm = true;
  c.fp8 = fp8_block_quantization{block_n, block_k, {}};
  return c;
}

/// A checkpoint whose every F32 scale element holds its own flat index plus
/// a per-tensor offset (so a misplaced tile is visible), codes their index.
tensor_set labelled(const model_config& c) {
  tensor_set set;
  float tensor_no = 0;
  for (auto& m : fp8_checkpoint_tensors(c)) {
    host_tensor t(m);
    if (m.dtype == dtype_id::f32) {
      tensor_no += 1000;
      for (std::uint64_t k = 0; k < m.numel(); ++k) {
        const float v = tensor_no + static_cast<float>(k);
        std::memcpy(t.bytes.data() + 4 * k, &v, 4);
      }
    } else {
      for (std::uint64_t k = 0; k < t.bytes.size(); ++k)
        t.bytes[k] = static_cast<std::byte>(k * 7 + 1);
    }
    set.add(std::move(t));
  }
  return set;
}

float scale_at(const tensor_set& s, const std::string& name, std::uint64_t row, std::uint64_t col) {
  auto v = s.find(name);
  REQUIRE(v);
  const auto cols = static_cast<std::uint64_t>(v->layout.extents[1]);
  float f;
  std::memcpy(&f, static_cast<const std::byte*>(v->data) + 4 * (row * cols + col), 4);
  return f;
}

const parameter& param(const parameter_store& st, const std::string& name) {
  for (std::size_t i = 0; i < st.size(); ++i)
    if (st[i].meta.name == name) return st[i];
  FAIL("no parameter " << name);
  return st[0];
}

float param_f32(const parameter_store& st, const std::string& name, std::uint64_t flat) {
  float f;
  std::memcpy(&f, param(st, name).bytes.data() + 4 * flat, 4);
  return f;
}

std::string prewarm_error(const model_config& c, const vllm_parallel_config& p,
                          std::uint64_t rank = 0) {
  try {
    receiver<vllm_style_loader> rx(vllm_style_loader(c, vllm_layout::of_rank(p, rank)),
                                   fp8_checkpoint_tensors(c));
  } catch (const error& e) {
    CHECK(e.code() == errc::unsupported_loader);
    return e.what();
  }
  return {};
}

} // namespace

TEST_CASE("vllm fp8: qkv_proj and gate_up_proj scale rows, row-parallel scale columns (TP 2)") {
  // block 16: q = 4 heads x 16 = 64 rows per rank (4 tiles), k/v = 1 head = 16 rows (1 tile).
  const auto c = qwen3_like(16, 16);
  const auto ckpt = labelled(c);
  vllm_parallel_config p;
  p.tensor_parallel_size = 2;
  for (std::uint64_t r = 0; r < 2; ++r) {
    receiver<vllm_style_loader> rx(vllm_style_loader(c, vllm_layout::of_rank(p, r)),
                                   fp8_checkpoint_tensors(c));
    rx.dense_refit(ckpt);
    const auto& st = rx.storage();
    const std::string L = "model.layers.0.";
    const auto& qkv = param(st, L + "self_attn.qkv_proj.weight_scale_inv");
    CHECK(qkv.meta.shape == std::vector<std::uint64_t>{6, 4}); // (64 + 16 + 16) / 16, 64 / 16
    CHECK(qkv.meta.dtype == dtype_id::f32);
    CHECK(param(st, L + "self_attn.qkv_proj.weight").meta.dtype == dtype_id::f8e4m3fn);
    for (std::uint64_t j = 0; j < 4; ++j) {
      for (std::uint64_t i = 0; i < 4; ++i) // q tiles: canonical rows 4r + i
        CHECK(param_f32(st, qkv.meta.name, i * 4 + j) ==
              scale_at(ckpt, L + "self_attn.q_proj.weight_scale_inv", 4 * r + i, j));
      CHECK(param_f32(st, qkv.meta.name, 4 * 4 + j) == // k head r (2 KV heads, TP 2)
            scale_at(ckpt, L + "self_attn.k_proj.weight_scale_inv", r, j));
      CHECK(param_f32(st, qkv.meta.name, 5 * 4 + j) ==
            scale_at(ckpt, L + "self_attn.v_proj.weight_scale_inv", r, j));
    }
    const auto& gu = param(st, L + "mlp.gate_up_proj.weight_scale_inv");
    CHECK(gu.meta.shape == std::vector<std::uint64_t>{4, 4}); // 2 x (64/2) / 16
    for (std::uint64_t i = 0; i < 2; ++i)
      for (std::uint64_t j = 0; j < 4; ++j) {
        CHECK(param_f32(st, gu.meta.name, i * 4 + j) ==
              scale_at(ckpt, L + "mlp.gate_proj.weight_scale_inv", 2 * r + i, j));
        CHECK(param_f32(st, gu.meta.name, (2 + i) * 4 + j) ==
              scale_at(ckpt, L + "mlp.up_proj.weight_scale_inv", 2 * r + i, j));
      }
    const auto& o = param(st, L + "self_attn.o_proj.weight_scale_inv");
    CHECK(o.meta.shape == std::vector<std::uint64_t>{4, 4}); // 64 / 16, (128 / 2) / 16
    for (std::uint64_t i = 0; i < 4; ++i)
      for (std::uint64_t j = 0; j < 4; ++j)
        CHECK(param_f32(st, o.meta.name, i * 4 + j) ==
              scale_at(ckpt, L + "self_attn.o_proj.weight_scale_inv", i, 4 * r + j));
    // Unquantised tensors keep their dtype.
    CHECK(param(st, "model.embed_tokens.weight").meta.dtype == dtype_id::bf16);
    CHECK(param(st, L + "input_layernorm.weight").meta.dtype == dtype_id::bf16);
    for (auto& m : rx.canonical()) CHECK(rx.xor_allowed(m.name));
  }
}

TEST_CASE("vllm fp8: KV heads replicated over TP 4 read the same scale rows") {
  const auto c = qwen3_like(16, 16); // 2 KV heads over TP 4: ranks 0,1 head 0; 2,3 head 1
  const auto ckpt = labelled(c);
  vllm_parallel_config p;
  p.tensor_parallel_size = 4;
  for (std::uint64_t r = 0; r < 4; ++r) {
    receiver<vllm_style_loader> rx(vllm_style_loader(c, vllm_layout::of_rank(p, r)),
                                   fp8_checkpoint_tensors(c));
    rx.dense_refit(ckpt);
    const std::string n = "model.layers.0.self_attn.qkv_proj.weight_scale_inv";
    CHECK(param(rx.storage(), n).meta.shape == std::vector<std::uint64_t>{4, 4}); // 2 + 1 + 1
    CHECK(param_f32(rx.storage(), n, 2 * 4) ==
          scale_at(ckpt, "model.layers.0.self_attn.k_proj.weight_scale_inv", r / 2, 0));
  }
}

TEST_CASE("vllm fp8: fused MoE w13 / w2 scales under EP and under expert TP") {
  model_config c = qwen3_like(8, 16);
  c.family = "qwen3_moe";
  c.experts = 4;
  c.moe_ffn = 32;
  c.ffn = 0;
  const auto ckpt = labelled(c);
  const std::string L = "model.layers.0.mlp.experts.";
  { // EP over 2 ranks: rank 1 holds experts 2, 3 whole.
    vllm_parallel_config p;
    p.tensor_parallel_size = 2;
    p.enable_expert_parallel = true;
    receiver<vllm_style_loader> rx(vllm_style_loader(c, vllm_layout::of_rank(p, 1)),
                                   fp8_checkpoint_tensors(c));
    rx.dense_refit(ckpt);
    const auto& w13 = param(rx.storage(), L + "w13_weight_scale_inv");
    CHECK(w13.meta.shape == std::vector<std::uint64_t>{2, 8, 4}); // 2 x 32/8, 64/16
    const auto& w2 = param(rx.storage(), L + "w2_weight_scale_inv");
    CHECK(w2.meta.shape == std::vector<std::uint64_t>{2, 8, 2}); // 64/8, 32/16
    CHECK(param(rx.storage(), L + "w13_weight").meta.dtype == dtype_id::f8e4m3fn);
    // local expert 1 = global 3: gate tile rows 0..3, up tile rows 4..7.
    CHECK(param_f32(rx.storage(), w13.meta.name, (1 * 8 + 5) * 4 + 2) ==
          scale_at(ckpt, "model.layers.0.mlp.experts.3.up_proj.weight_scale_inv", 1, 2));
    CHECK(param_f32(rx.storage(), w2.meta.name, (1 * 8 + 7) * 2 + 1) ==
          scale_at(ckpt, "model.layers.0.mlp.experts.3.down_proj.weight_scale_inv", 7, 1));
  }
  { // No EP: experts TP-split over 2 ranks (16 intermediate rows each).
    vllm_parallel_config p;
    p.tensor_parallel_size = 2;
    receiver<vllm_style_loader> rx(vllm_style_loader(c, vllm_layout::of_rank(p, 1)),
                                   fp8_checkpoint_tensors(c));
    rx.dense_refit(ckpt);
    const auto& w13 = param(rx.storage(), L + "w13_weight_scale_inv");
    CHECK(w13.meta.shape == std::vector<std::uint64_t>{4, 4, 4});        // 2 x 16/8, 64/16
    CHECK(param_f32(rx.storage(), w13.meta.name, (0 * 4 + 1) * 4 + 3) == // expert 0 gate tile 2+1
          scale_at(ckpt, "model.layers.0.mlp.experts.0.gate_proj.weight_scale_inv", 3, 3));
    const auto& w2 = param(rx.storage(), L + "w2_weight_scale_inv");
    CHECK(w2.meta.shape == std::vector<std::uint64_t>{4, 8, 1}); // 64/8, 16/16
    CHECK(param_f32(rx.storage(), w2.meta.name, (2 * 8 + 6) * 1 + 0) ==
          scale_at(ckpt, "model.layers.0.mlp.experts.2.down_proj.weight_scale_inv", 6, 1));
  }
}

TEST_CASE("vllm fp8: layouts vLLM refuses are rejected at prewarm naming the tensor and reason") {
  vllm_parallel_config tp2;
  tp2.tensor_parallel_size = 2;
  { // K/V partition of one 16-row head over 32-row tiles: k's and v's scale rows would share a
    // tile.
    const auto why = prewarm_error(qwen3_like(32, 16), tp2);
    CHECK(why.find("model.layers.0.self_attn.qkv_proj.weight_scale_inv") != std::string::npos);
    CHECK(why.find("output partition k of 16 rows is not divisible by weight quantization "
                   "block_n 32") != std::string::npos);
  }
  { // o_proj input partition 64 columns over 48-column tiles.
    auto c = qwen3_like(16, 48);
    const auto why = prewarm_error(c, tp2);
    CHECK(why.find("self_attn.o_proj.weight_scale_inv") != std::string::npos);
    CHECK(why.find("input partition of 64 columns is not divisible by weight quantization "
                   "block_k 48") != std::string::npos);
  }
  { // one rank, merged: q and k must be whole tiles, v (the last) may be partial.
    vllm_parallel_config one;
    auto c = qwen3_like(32, 16); // q = 128 rows, k = v = 32 rows: accepted
    CHECK(prewarm_error(c, one).empty());
    c.kv_heads = 1; // k = v = 16 rows over 32-row tiles: k refused
    c.heads = 8;
    const auto why = prewarm_error(c, one);
    CHECK(why.find("output partition k of 16 rows") != std::string::npos);
    auto d = qwen3_like(16, 16);
    d.head_dim = 12; // v partial is fine on one rank only when q and k are whole: 96, 24 rows
    CHECK(prewarm_error(d, one).find("output partition q of 96 rows") == std::string::npos);
    CHECK(prewarm_error(d, one).find("output partition k of 24 rows") != std::string::npos);
  }
  { // fused MoE: per-rank intermediate size not a multiple of block_n.
    model_config c = qwen3_like(16, 16);
    c.family = "qwen3_moe";
    c.experts = 4;
    c.moe_ffn = 24;
    c.ffn = 0;
    const auto why = prewarm_error(c, vllm_parallel_config{});
    CHECK(why.find("mlp.experts.w13_weight_scale_inv") != std::string::npos);
    CHECK(
        why.find("gate's and up's weight 24 is not divisible by weight quantization block_n 16") !=
        std::string::npos);
  }
  { // a fused module quantised in part is refused like vLLM's is_layer_skipped.
    auto c = qwen3_like(16, 16);
    c.fp8->modules_to_not_convert = {"self_attn.k_proj"};
    CHECK_THROWS_WITH_AS(vllm_style_loader(c, loaders::vllm_tp_rank(1, 0)),
                         doctest::Contains("some but not all of q_proj, k_proj, v_proj"), error);
    c.fp8->modules_to_not_convert = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"};
    CHECK(prewarm_error(c, vllm_parallel_config{}).empty()); // whole qkv_proj left in BF16
  }
}

namespace {

/// A runtime that stores FP8 codes in the other E4M3 convention (E4M3fnuz,
/// as ROCm kernels read them) and converts every code through a temporary:
/// fn NaN 0x7F/0xFF -> fnuz NaN 0x80, fn -0 0x80 -> 0. Non-FP8 tensors are
/// copied. The conversion maps the fn NaN placeholder to a word that is not
/// NaN under the fn rule, so an activity test that asks "is this word NaN"
/// would mark every inactive position active.
struct fnuz_loader {
  void declare(parameter_store& s, std::span<const tensor_meta> canonical) {
    for (auto& m : canonical) s.add(m.name, m.shape, m.dtype);
  }
  load_report load(std::string_view name, const tensor_view& src, parameter_store& s,
                   copy_sink& sink) {
    auto dst = s.view(std::string(name));
    if (src.dtype != dtype_id::f8e4m3fn) {
      sink.copy(dst, src);
      return {{std::string(name)}};
    }
    tmp_.resize(static_cast<std::size_t>(src.size()));
    const auto* in = reinterpret_cast<const std::uint8_t*>(src.data);
    for (std::size_t k = 0; k < tmp_.size(); ++k) {
      const std::uint8_t w = in[k];
      tmp_[k] = (w & 0x7F) == 0x7F ? 0x80 : w == 0x80 ? 0x00 : w;
    }
    sink.copy(dst, tensor_view{reinterpret_cast<std::byte*>(tmp_.data()), src.dtype, src.layout});
    return {{std::string(name)}};
  }
  std::vector<std::uint8_t> tmp_;
};
static_assert(native_loader<fnuz_loader>);

} // namespace

TEST_CASE("vllm fp8: overwrite items of 1-byte codes through a transform stay exact") {
  const std::vector<tensor_meta> metas{{"w", {4, 8}, dtype_id::f8e4m3fn}};
  tensor_set v0, v1;
  host_tensor a(metas[0]), b(metas[0]);
  for (std::size_t k = 0; k < 32; ++k) a.bytes[k] = static_cast<std::byte>(k * 5 + 3);
  b.bytes = a.bytes;
  b.bytes[3] = std::byte{0x80};  // -0: converted to 0
  b.bytes[9] = std::byte{0x7F};  // a NaN code: converted to the fnuz NaN
  b.bytes[20] = std::byte{0x11}; // an ordinary code
  v0.add(a);
  v1.add(b);
  receiver<fnuz_loader> rx(fnuz_loader{}, metas), ref(fnuz_loader{}, metas);
  CHECK_FALSE(rx.xor_allowed("w"));
  rx.dense_refit(v0);
  ref.dense_refit(v1);
  for (bool with_nan : {false, true}) {
    item it{metas[0], value_encoding::overwrite, {3, 20}, {std::byte{0x80}, std::byte{0x11}}};
    if (with_nan)
      it = item{metas[0],
                value_encoding::overwrite,
                {3, 9, 20},
                {std::byte{0x80}, std::byte{0x7F}, std::byte{0x11}}};
    receiver<fnuz_loader> r2(fnuz_loader{}, metas);
    r2.dense_refit(v0);
    REQUIRE(r2.apply_item(it).ok());
    if (with_nan) {
      CHECK(first_difference(r2.storage(), ref.storage()) == "");
    } else { // only positions 3 and 20 changed; 9 stays at v0's code
      auto expect = b;
      expect.bytes[9] = a.bytes[9];
      tensor_set v;
      v.add(expect);
      receiver<fnuz_loader> r3(fnuz_loader{}, metas);
      r3.dense_refit(v);
      CHECK(first_difference(r2.storage(), r3.storage()) == "");
    }
  }
}
