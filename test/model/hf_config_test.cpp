// model_config from published Hugging Face config.json files (values as
// released with the models), and the errors for what dcr does not model.
#include <doctest/doctest.h>

#include <string>

#include "dcr/model/hf_config.hpp"

using namespace dcr;

namespace {

// meta-llama/Llama-3.1-8B config.json
constexpr const char* llama31_8b = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
  "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072,
  "mlp_bias": false, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
  "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0", "use_cache": true, "vocab_size": 128256})";

// Qwen/Qwen2.5-7B config.json
constexpr const char* qwen25_7b = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 3584, "initializer_range": 0.02,
  "intermediate_size": 18944, "max_position_embeddings": 131072, "max_window_layers": 28,
  "model_type": "qwen2", "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
  "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "transformers_version": "4.43.1", "use_cache": true,
  "use_sliding_window": false, "vocab_size": 152064})";

// Qwen/Qwen3-30B-A3B config.json
constexpr const char* qwen3_30b_a3b = R"({
  "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
  "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144,
  "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [],
  "model_type": "qwen3_moe", "moe_intermediate_size": 768, "norm_topk_prob": true,
  "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
  "num_key_value_heads": 4, "output_router_logits": false, "rms_norm_eps": 1e-06, "rope_scaling": null,
  "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": null,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})";

// Qwen/Qwen3-0.6B config.json (tied embeddings; head_dim != hidden / heads)
constexpr const char* qwen3_06b = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
  "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
  "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
  "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null, "tie_word_embeddings": true,
  "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": true,
  "use_sliding_window": false, "vocab_size": 151936})";

std::uint64_t count_named(const std::vector<tensor_meta>& t, const std::string& part) {
  std::uint64_t n = 0;
  for (auto& m : t) n += m.name.find(part) != std::string::npos;
  return n;
}

errc code_of(const std::string& json, std::string* message = nullptr) {
  try {
    (void)model_config_from_hf_json(json);
  } catch (const error& e) {
    if (message) *message = e.what();
    return e.code();
  }
  return errc::ok;
}

} // namespace

TEST_CASE("hf config: Llama-3.1-8B") {
  auto c = model_config_from_hf_json(llama31_8b);
  CHECK(c.family == "llama");
  CHECK(c.hidden == 4096);
  CHECK(c.layers == 32);
  CHECK(c.heads == 32);
  CHECK(c.kv_heads == 8);
  CHECK(c.head_dim == 128);
  CHECK(c.ffn == 14336);
  CHECK(c.vocab == 128256);
  CHECK_FALSE(c.tied_embeddings);
  CHECK_FALSE(c.attention_bias);
  CHECK_FALSE(c.qk_norm);
  CHECK_FALSE(c.is_moe());
  CHECK(c.dtype == dtype_id::bf16);
  auto t = canonical_tensors(c);
  CHECK(t.size() == 2 + 32 * 9 + 1);
  std::uint64_t params = 0;
  for (auto& m : t) params += m.numel();
  CHECK(params == 8030261248ull); // the published parameter count of Llama-3.1-8B
}

TEST_CASE("hf config: Qwen2.5-7B has q/k/v biases without an attention_bias field") {
  auto c = model_config_from_hf_json(qwen25_7b);
  CHECK(c.family == "qwen2");
  CHECK(c.hidden == 3584);
  CHECK(c.heads == 28);
  CHECK(c.kv_heads == 4);
  CHECK(c.head_dim == 128);
  CHECK(c.ffn == 18944);
  CHECK(c.vocab == 152064);
  CHECK(c.attention_bias);
  CHECK_FALSE(c.qk_norm);
  auto t = canonical_tensors(c);
  CHECK(count_named(t, "_proj.bias") == 28 * 3);
  std::uint64_t params = 0;
  for (auto& m : t) params += m.numel();
  CHECK(params == 7615616512ull); // Qwen2.5-7B: 7.61B parameters
}

TEST_CASE("hf config: Qwen3-30B-A3B (128 experts, every layer MoE, q/k norms)") {
  auto c = model_config_from_hf_json(qwen3_30b_a3b);
  CHECK(c.family == "qwen3_moe");
  CHECK(c.hidden == 2048);
  CHECK(c.layers == 48);
  CHECK(c.heads == 32);
  CHECK(c.kv_heads == 4);
  CHECK(c.head_dim == 128);
  CHECK(c.experts == 128);
  CHECK(c.moe_ffn == 768);
  CHECK(c.vocab == 151936);
  CHECK(c.qk_norm);
  CHECK_FALSE(c.attention_bias);
  CHECK(c.decoder_sparse_step == 1);
  CHECK(c.mlp_only_layers.empty());
  for (std::uint64_t i = 0; i < c.layers; ++i) CHECK(c.is_moe_layer(i));
  auto t = canonical_tensors(c);
  CHECK(count_named(t, ".mlp.experts.") == 48 * 128 * 3);
  CHECK(count_named(t, ".mlp.gate_proj.") == 0);
  std::uint64_t params = 0;
  for (auto& m : t) params += m.numel();
  CHECK(params == 30532122624ull); // Qwen3-30B-A3B: 30.5B parameters in total
}

TEST_CASE("hf config: Qwen3-MoE's expert count as transformers 5 writes it (num_local_experts)") {
  auto with = [](std::string j, const std::string& from, const std::string& to) {
    j.replace(j.find(from), from.size(), to);
    return j;
  };
  const auto reference = model_config_from_hf_json(qwen3_30b_a3b);
  const auto local = model_config_from_hf_json(
      with(qwen3_30b_a3b, "\"num_experts\": 128", "\"num_local_experts\": 128"));
  CHECK(local.experts == 128);
  CHECK(canonical_tensors(local) == canonical_tensors(reference));
  // Both names, agreeing: accepted.
  CHECK(model_config_from_hf_json(with(qwen3_30b_a3b, "\"num_experts\": 128",
                                       "\"num_experts\": 128, \"num_local_experts\": 128"))
            .experts == 128);
  // Both names, disagreeing: a typed error naming both.
  std::string msg;
  CHECK(code_of(with(qwen3_30b_a3b, "\"num_experts\": 128",
                     "\"num_experts\": 128, \"num_local_experts\": 64"),
                &msg) == errc::invalid_argument);
  CHECK(msg.find("'num_local_experts'") != std::string::npos);
  CHECK(msg.find("num_experts = 128") != std::string::npos);
  // Neither: the count is required.
  CHECK(code_of(with(qwen3_30b_a3b, "\"num_experts\": 128, ", ""), &msg) == errc::invalid_argument);
  CHECK(msg.find("'num_experts'") != std::string::npos);
}

TEST_CASE("hf config: Qwen3-0.6B ties embeddings and has head_dim 128 over hidden 1024") {
  auto c = model_config_from_hf_json(qwen3_06b);
  CHECK(c.family == "qwen3");
  CHECK(c.head_dim == 128);
  CHECK(c.heads * c.head_dim == 2048);
  CHECK(c.tied_embeddings);
  CHECK(c.qk_norm);
  auto t = canonical_tensors(c);
  CHECK(count_named(t, "lm_head") == 0);
  CHECK(count_named(t, "q_norm") == 28);
  for (auto& m : t)
    if (m.name == "model.layers.0.self_attn.q_proj.weight")
      CHECK(m.shape == std::vector<std::uint64_t>{2048, 1024});
}

TEST_CASE("hf config: decoder_sparse_step and mlp_only_layers give a mixed dense/MoE stack") {
  std::string j = qwen3_30b_a3b;
  auto put = [&](const std::string& from, const std::string& to) {
    j.replace(j.find(from), from.size(), to);
  };
  put("\"decoder_sparse_step\": 1", "\"decoder_sparse_step\": 2");
  put("\"mlp_only_layers\": []", "\"mlp_only_layers\": [3, 47]");
  auto c = model_config_from_hf_json(j);
  for (std::uint64_t i = 0; i < c.layers; ++i) {
    INFO("layer " << i);
    CHECK(c.is_moe_layer(i) == ((i + 1) % 2 == 0 && i != 3 && i != 47));
  }
  auto t = canonical_tensors(c);
  // Dense layers: 24 by the step plus layers 3 and 47.
  CHECK(count_named(t, ".mlp.gate_proj.weight") == 26);
  CHECK(count_named(t, ".mlp.gate.weight") == 22);
  for (auto& m : t)
    if (m.name == "model.layers.3.mlp.gate_proj.weight")
      CHECK(m.shape == std::vector<std::uint64_t>{6144, 2048});
}

TEST_CASE("hf config: unsupported or malformed fields are named in a typed error") {
  std::string msg;
  auto with = [](std::string j, const std::string& from, const std::string& to) {
    j.replace(j.find(from), from.size(), to);
    return j;
  };
  CHECK(code_of(with(llama31_8b, "\"model_type\": \"llama\"", "\"model_type\": \"gpt2\""), &msg) ==
        errc::invalid_argument);
  CHECK(msg.find("'model_type'") != std::string::npos);
  CHECK(code_of(with(llama31_8b, "\"mlp_bias\": false", "\"mlp_bias\": true"), &msg) ==
        errc::invalid_argument);
  CHECK(msg.find("'mlp_bias'") != std::string::npos);
  CHECK(code_of(with(llama31_8b, "\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\""), &msg) ==
        errc::invalid_argument);
  CHECK(msg.find("'hidden_act'") != std::string::npos);
  CHECK(code_of(with(llama31_8b, "\"hidden_size\": 4096", "\"hidden_size\": \"4096\""), &msg) ==
        errc::bad_format);
  CHECK(msg.find("'hidden_size'") != std::string::npos);
  CHECK(code_of(with(llama31_8b, "\"vocab_size\": 128256", "\"vocab_size\": -1"), &msg) ==
        errc::bad_format);
  CHECK(msg.find("'vocab_size'") != std::string::npos);
  CHECK(code_of(with(llama31_8b, "\"num_key_value_heads\": 8", "\"num_key_value_heads\": 5"),
                &msg) == errc::invalid_argument);
  CHECK(msg.find("'num_key_value_heads'") != std::string::npos);
  CHECK(code_of(with(llama31_8b, "\"num_hidden_layers\": 32,", ""), &msg) ==
        errc::invalid_argument);
  CHECK(msg.find("'num_hidden_layers' is required") != std::string::npos);
  CHECK(code_of(with(llama31_8b, "\"torch_dtype\": \"bfloat16\"", "\"torch_dtype\": \"int8\""),
                &msg) == errc::invalid_argument);
  CHECK(msg.find("'torch_dtype'") != std::string::npos);
  CHECK(code_of(with(llama31_8b, "\"use_cache\": true",
                     "\"use_cache\": true, \"quantization_config\": {}"),
                &msg) == errc::invalid_argument);
  CHECK(msg.find("'quantization_config.quant_method'") != std::string::npos);
  CHECK(code_of(with(qwen3_30b_a3b, "\"mlp_only_layers\": []", "\"mlp_only_layers\": [48]"),
                &msg) == errc::invalid_argument);
  CHECK(msg.find("'mlp_only_layers'") != std::string::npos);
  CHECK(code_of(with(llama31_8b, "\"LlamaForCausalLM\"", "\"LlamaForSequenceClassification\""),
                &msg) == errc::invalid_argument);
  CHECK(msg.find("'architectures'") != std::string::npos);
  CHECK(code_of("{\"model_type\": ", &msg) == errc::bad_format);
  CHECK(code_of("[1]", &msg) == errc::bad_format);
}

namespace {
// The quantization_config form of the block-FP8 Qwen3 / DeepSeek-V3 checkpoints.
const std::string fp8_qc = R"("quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
  "quant_method": "fp8", "weight_block_size": [128, 128],
  "modules_to_not_convert": ["lm_head", "model.layers.0.mlp.gate"]}, "use_cache": true)";
std::string with(std::string j, const std::string& from, const std::string& to) {
  j.replace(j.find(from), from.size(), to);
  return j;
}
} // namespace

TEST_CASE("hf config: block-FP8 quantization_config and the checkpoint tensors it implies") {
  const auto c = model_config_from_hf_json(with(qwen3_30b_a3b, "\"use_cache\": true", fp8_qc));
  REQUIRE(c.fp8);
  CHECK(c.fp8->block_n == 128);
  CHECK(c.fp8->block_k == 128);
  CHECK(c.fp8->modules_to_not_convert ==
        std::vector<std::string>{"lm_head", "model.layers.0.mlp.gate"});
  CHECK(c.dtype == dtype_id::bf16);
  CHECK(fp8_quantized(c, "model.layers.3.self_attn.k_proj.weight"));
  CHECK(fp8_quantized(c, "model.layers.3.mlp.experts.7.down_proj.weight"));
  CHECK_FALSE(fp8_quantized(c, "model.layers.3.mlp.gate.weight")); // router
  CHECK_FALSE(fp8_quantized(c, "lm_head.weight"));
  CHECK_FALSE(fp8_quantized(c, "model.embed_tokens.weight"));
  CHECK_FALSE(fp8_quantized(c, "model.layers.3.input_layernorm.weight"));
  const auto t = fp8_checkpoint_tensors(c);
  // Per layer: q, k, v, o and 3 x 128 expert projections get codes + scales.
  CHECK(t.size() == canonical_tensors(c).size() + 48 * (4 + 3 * 128));
  auto find = [&](const std::string& n) {
    for (auto& m : t)
      if (m.name == n) return m;
    FAIL("missing " << n);
    return tensor_meta{};
  };
  // k_proj: 4 KV heads x 128 = 512 rows over hidden 2048.
  CHECK(find("model.layers.0.self_attn.k_proj.weight") ==
        tensor_meta{"model.layers.0.self_attn.k_proj.weight", {512, 2048}, dtype_id::f8e4m3fn});
  CHECK(find("model.layers.0.self_attn.k_proj.weight_scale_inv") ==
        tensor_meta{"model.layers.0.self_attn.k_proj.weight_scale_inv", {4, 16}, dtype_id::f32});
  // Experts' down_proj [2048, 768]: 768 / 128 = 6 tile columns.
  CHECK(find("model.layers.5.mlp.experts.9.down_proj.weight_scale_inv").shape ==
        std::vector<std::uint64_t>{16, 6});
  CHECK(find("lm_head.weight").dtype == dtype_id::bf16);

  // Edge tiles are partial: [100, 130] over [64, 64] tiles is [2, 3].
  model_config small = tiny_llama();
  small.fp8 = fp8_block_quantization{64, 64, {}};
  small.ffn = 100;
  small.hidden = 130;
  small.heads = 2;
  small.kv_heads = 1;
  small.head_dim = 65;
  for (auto& m : fp8_checkpoint_tensors(small))
    if (m.name == "model.layers.0.mlp.gate_proj.weight_scale_inv")
      CHECK(m.shape == std::vector<std::uint64_t>{2, 3});
  // A module listed by suffix stays unquantised.
  small.fp8->modules_to_not_convert = {"mlp.down_proj"};
  CHECK_FALSE(fp8_quantized(small, "model.layers.1.mlp.down_proj.weight"));
  CHECK(fp8_quantized(small, "model.layers.1.mlp.up_proj.weight"));
}

TEST_CASE("hf config: unsupported quantization configs are named in a typed error") {
  std::string msg;
  auto qc = [&](const std::string& body) {
    return with(llama31_8b, "\"use_cache\": true",
                "\"quantization_config\": " + body + ", \"use_cache\": true");
  };
  CHECK(code_of(qc(R"({"quant_method": "awq"})"), &msg) == errc::invalid_argument);
  CHECK(msg.find("quantization_config.quant_method") != std::string::npos);
  CHECK(code_of(qc(R"({"quant_method": "fp8", "fmt": "e5m2", "weight_block_size": [128, 128]})"),
                &msg) == errc::invalid_argument);
  CHECK(msg.find("quantization_config.fmt") != std::string::npos);
  CHECK(code_of(qc(R"({"quant_method": "fp8"})"), &msg) == errc::invalid_argument);
  CHECK(msg.find("per-tensor FP8") != std::string::npos);
  CHECK(code_of(qc(R"({"quant_method": "fp8", "weight_block_size": [128]})"), &msg) ==
        errc::bad_format);
  CHECK(code_of(qc(R"({"quant_method": "fp8", "weight_block_size": [0, 128]})"), &msg) ==
        errc::invalid_argument);
  CHECK(code_of(qc(R"({"quant_method": "fp8", "activation_scheme": "static",
                       "weight_block_size": [128, 128]})"),
                &msg) == errc::invalid_argument);
  CHECK(msg.find("activation_scheme") != std::string::npos);
  CHECK(code_of(qc(R"({"quant_method": "fp8", "weight_block_size": [128, 128],
                       "modules_to_not_convert": [1]})"),
                &msg) == errc::bad_format);
  CHECK(code_of(qc("[]"), &msg) == errc::bad_format);
}
