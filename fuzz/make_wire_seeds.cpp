// Writes seeds for fuzz_locations, fuzz_config and fuzz_net into three
// directories (and, given two more, for fuzz_relay and fuzz_control_reply),
// one valid input per case in the layout each target reads, so
// the fuzzers start from inputs that decode and mutate them into the
// interesting invalid ones. Every seed is checked to decode here: a seed its
// decoder refuses would start the fuzzer nowhere useful.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "dcr/codec/locations.hpp"
#include "dcr/codec/payload_encode.hpp"
#include "dcr/core/error.hpp"
#include "dcr/model/hf_config.hpp"
#include "dcr/net/base64.hpp"
#include "dcr/protocol/control_channel.hpp"
#include "dcr/protocol/etcd_response.hpp"
#include "dcr/transport/relay_frame.hpp"

namespace {

void put(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

void require(bool ok, const std::string& what) {
  if (ok) return;
  std::fprintf(stderr, "seed %s does not decode\n", what.c_str());
  std::exit(1);
}

std::string u16(std::uint64_t v) {
  return {static_cast<char>(v & 0xff), static_cast<char>((v >> 8) & 0xff)};
}

// Small models of each supported type, so that fuzz_config also lists tensors.
const char* const configs[] = {
    R"({"architectures": ["LlamaForCausalLM"], "hidden_act": "silu", "hidden_size": 64,
 "intermediate_size": 128, "model_type": "llama", "num_attention_heads": 4, "num_hidden_layers": 2,
 "num_key_value_heads": 2, "tie_word_embeddings": false, "torch_dtype": "bfloat16", "vocab_size": 100})",
    R"({"architectures": ["Qwen2ForCausalLM"], "hidden_size": 64, "intermediate_size": 96,
 "model_type": "qwen2", "num_attention_heads": 4, "num_hidden_layers": 3, "num_key_value_heads": 1,
 "tie_word_embeddings": true, "torch_dtype": "float16", "vocab_size": 50})",
    R"({"architectures": ["Qwen3ForCausalLM"], "head_dim": 32, "hidden_size": 64,
 "intermediate_size": 128, "model_type": "qwen3", "num_attention_heads": 4, "num_hidden_layers": 2,
 "num_key_value_heads": 2, "torch_dtype": "float32", "vocab_size": 80,
 "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
 "weight_block_size": [16, 16], "modules_to_not_convert": ["lm_head"]}})",
    R"({"architectures": ["Qwen3MoeForCausalLM"], "decoder_sparse_step": 2, "head_dim": 16,
 "hidden_size": 32, "intermediate_size": 64, "mlp_only_layers": [0], "model_type": "qwen3_moe",
 "moe_intermediate_size": 24, "num_attention_heads": 2, "num_experts": 4, "num_hidden_layers": 4,
 "num_key_value_heads": 1, "torch_dtype": "bfloat16", "vocab_size": 40})",
};

std::string text(std::span<const std::byte> b) {
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

/// fuzz_relay: its three paths (see fuzz/fuzz_relay.cpp for the layout; the
/// key and nonces here are the harness's).
void relay_seeds(const std::string& dir) {
  using namespace dcr;
  using namespace dcr::transport;
  seal_key key;
  require(seal_key::make(std::string_view("fuzz-relay-job-key-0123456789"), key).ok(), "key");
  item it;
  it.tensor = tensor_meta{"t", {8}, dtype_id::bf16};
  it.encoding = value_encoding::overwrite;
  it.indices = {3};
  it.values = {std::byte{1}, std::byte{2}};
  encode_options eo;
  eo.key = key;
  std::vector<std::byte> p;
  require(codec::encode_payload({3, 1, 1, 0}, std::span<const item>(&it, 1), eo, p).ok(),
          "relay payload");
  codec::payload_header ph;
  codec::decode_limits limits;
  limits.key = key;
  require(codec::read_payload_header(p, ph, limits).ok(), "keyed relay payload");
  const auto payload = encode_frame({frame_kind::payload, 3, 1, 0, 0}, p);
  const auto done = encode_frame({frame_kind::owner_done, 3, 1, 1, 0}, {});
  // 0: a hello, a proof made without the key, then a header announcing 1 GiB.
  std::string hello = "DCRA" + std::string(16, '\0');
  put(dir + "/keyed-no-proof",
      std::string(1, '\0') + hello + std::string(16, '\0') +
          text(encode_frame_header({frame_kind::payload, 3, 1, 0, std::uint64_t{1} << 30})));
  // 1: unkeyed frames as they come.
  put(dir + "/unkeyed", std::string(1, '\1') + text(payload) + text(done));
  // 2: frames on an authenticated link, tagged by the harness (odd byte) or
  // carrying their own tag (even byte, then the 16 tag bytes).
  relay_link_mac mac{key, {}, {}};
  for (std::size_t i = 0; i < 16; ++i) {
    mac.client_nonce[i] = static_cast<std::uint8_t>(i);
    mac.server_nonce[i] = static_cast<std::uint8_t>(0xF0 + i);
  }
  const auto hdr = std::span(done).first(frame_header_size);
  const auto t = relay_link_tag(mac, 0, 1, hdr, {});
  put(dir + "/keyed-frames", std::string(1, '\2') + text(payload) + '\1' + text(done) + '\0' +
                                 std::string(reinterpret_cast<const char*>(t.data()), t.size()));
}

/// fuzz_control_reply: the first byte picks the call (fuzz/fuzz_control_reply.cpp),
/// the rest is a well-formed reply to it.
void control_reply_seeds(const std::string& dir) {
  using namespace dcr;
  using namespace dcr::protocol;
  auto seed = [&](int call, const std::string& name, body_writer w) {
    put(dir + "/" + name, std::string(1, static_cast<char>(call)) + text(w.bytes()));
  };
  digest128 d{};
  for (std::size_t i = 0; i < d.size(); ++i) d[i] = static_cast<std::uint8_t>(i * 7);
  {
    body_writer w;
    w.u32(1);
    seed(0, "owner-hello", std::move(w));
  }
  {
    body_writer w;
    w.u64(2).u64(4096).f64(0.5).f64(0.25).u8(2).dig(d).u32(2).dig(d).dig(d);
    seed(1, "publish-stored", std::move(w));
  }
  {
    body_writer w;
    w.u64(1).u64(10).f64(0).f64(0).u8(1).dig(d).u32(0);
    seed(1, "publish-stream", std::move(w));
  }
  {
    body_writer w;
    w.dig(d);
    seed(3, "baseline-digest", std::move(w));
  }
  {
    body_writer w;
    w.u32(2).str("r0").str("r1");
    seed(6, "node-hello", std::move(w));
  }
  {
    body_writer w;
    w.u32(2).u8(1).dig(d).u8(0).dig(d);
    seed(9, "verify", std::move(w));
  }
  {
    body_writer w;
    w.u32(1).dig(d).f64(0.1).f64(0.2).f64(0.3).u32(1).u32(0).dig(d);
    seed(11, "refit", std::move(w));
  }
  {
    body_writer w;
    w.u32(2).dig(d).dig(d);
    seed(12, "acknowledge", std::move(w));
  }
  {
    body_writer w;
    w.u32(1).str("r0").u32(1).str("a3/o1/s0").dig(d);
    seed(13, "staged", std::move(w));
  }
  {
    body_writer w;
    w.u16(static_cast<std::uint16_t>(errc::stale_attempt)).str("replaced");
    seed(10, "error-body", std::move(w));
  }
}

} // namespace

int main(int argc, char** argv) {
  if (argc != 4 && argc != 6) {
    std::fprintf(stderr,
                 "usage: %s LOCATIONS_DIR CONFIG_DIR NET_DIR [RELAY_DIR CONTROL_REPLY_DIR]\n",
                 argv[0]);
    return 2;
  }
  using namespace dcr;
  const std::string loc_dir = argv[1], cfg_dir = argv[2], net_dir = argv[3];

  // Locations: every coding of a few index sets (dense, sparse, wide gaps).
  const std::vector<std::vector<std::uint64_t>> sets = {
      {5, 6, 7, 8}, {0, 3, 300, 301, 1000}, {1, 40000, 60000}, {2}, {10, 20, 30, 300, 600}};
  int n = 0;
  for (std::uint8_t id = 1; id <= 10; ++id)
    for (const auto& idx : sets) {
      const auto lid = static_cast<codec::location_id>(id);
      if (lid == codec::location_id::run && idx.back() - idx.front() + 1 != idx.size()) continue;
      std::vector<std::byte> coded;
      codec::encode_locations(lid, idx, coded);
      std::vector<std::uint64_t> back(idx.size());
      if (!codec::decode_locations(lid, coded, idx.front(), 65535, back).ok() || back != idx)
        continue;
      std::string s(1, static_cast<char>(id));
      s += u16(idx.size()) + u16(idx.front()) + u16(65535);
      s.append(reinterpret_cast<const char*>(coded.data()), coded.size());
      put(loc_dir + "/loc-" + std::to_string(n++), s);
    }
  require(n > 0, "locations");

  for (std::size_t i = 0; i < std::size(configs); ++i) {
    try {
      (void)model_config_from_hf_json(configs[i]);
    } catch (const error& e) {
      std::fprintf(stderr, "config %zu: %s\n", i, e.what());
      require(false, "config " + std::to_string(i));
    }
    put(cfg_dir + "/config-" + std::to_string(i) + ".json", configs[i]);
  }

  // Net: a relay payload frame and a control frame, addresses, base64.
  transport::frame_header h;
  h.kind = transport::frame_kind::payload;
  h.attempt = 3;
  h.owner = 1;
  h.sequence = 2;
  const std::string body = "payload bytes";
  const auto f = transport::encode_frame(h, std::as_bytes(std::span(body)));
  transport::frame back;
  require(transport::decode_frame(f, 1u << 16, back).ok(), "relay frame");
  put(net_dir + "/relay-payload",
      std::string(1, '\0') + std::string(reinterpret_cast<const char*>(f.data()), f.size()));
  h.kind = transport::frame_kind::owner_done;
  const auto c = transport::encode_frame(h, {});
  require(transport::decode_frame(c, 1u << 16, back).ok(), "relay control frame");
  put(net_dir + "/relay-done",
      std::string(1, '\0') + std::string(reinterpret_cast<const char*>(c.data()), c.size()));
  for (const char* a : {"10.0.0.1:7000", ":65535", "node-3.example:1"}) {
    protocol::peer_address p;
    require(protocol::parse_peer_address(a, p).ok(), a);
    put(net_dir + "/peer-" + std::to_string(p.port), std::string(1, '\1') + a);
  }
  for (const char* t : {"aGVsbG8=", "YWI=", "AAECAwQFBgcICQ=="}) {
    std::string out;
    require(net::base64_decode(t, out).ok(), t);
    put(net_dir + "/base64-" + std::to_string(out.size()), std::string(1, '\2') + t);
  }
  // etcd: a load response of a never-committed store (counters only) and
  // one holding a commit record at version 1.
  auto kv = [](const std::string& key, const std::string& value, int version) {
    return R"({"response_range":{"header":{},"kvs":[{"key":")" + net::base64_encode(key) +
           R"(","version":")" + std::to_string(version) + R"(","value":")" +
           net::base64_encode(value) + R"("}],"count":"1"}})";
  };
  const std::string empty_range = R"({"response_range":{"header":{}}})";
  protocol::stored_record rec;
  rec.revision = 1;
  rec.epoch = 1;
  rec.attempt = 1;
  rec.record.incarnation = "0123456789abcdef0123456789abcdef";
  const std::vector<std::string> bodies = {
      R"({"header":{"revision":"3"},"succeeded":true,"responses":[)" + empty_range + "," +
          kv("dcr/epoch", "2", 1) + "," + kv("dcr/attempt", "5", 4) + "]}",
      R"({"header":{"revision":"9"},"succeeded":true,"responses":[)" +
          kv("dcr/record", protocol::serialize_commit_record(rec), 1) + "," +
          kv("dcr/epoch", "1", 1) + "," + kv("dcr/attempt", "1", 1) + "]}",
  };
  for (std::size_t i = 0; i < bodies.size(); ++i) {
    protocol::etcd::txn_result t;
    protocol::etcd::snapshot snap;
    protocol::stored_record r;
    require(
        protocol::etcd::parse_txn_response(bodies[i], "seed", t).ok() &&
            protocol::etcd::snapshot_of(t, 0, "dcr/record", "dcr/epoch", "dcr/attempt", snap, true)
                .ok() &&
            protocol::etcd::record_of(snap, "dcr/record", r).ok(),
        "etcd response " + std::to_string(i));
    put(net_dir + "/etcd-" + std::to_string(i), std::string(1, '\3') + bodies[i]);
  }
  if (argc == 6) {
    relay_seeds(argv[4]);
    control_reply_seeds(argv[5]);
  }
  return 0;
}
