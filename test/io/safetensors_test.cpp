// safetensors: round trips through files, a hand-built image in the layout
// the reference (Python/Rust) writer produces, every malformation giving
// bad_format with the tensor named, unaligned tensors, dense refit from a file.
#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>
#include <random>

#include "dcr/io/safetensors.hpp"
#include "dcr/loaders/vllm_style.hpp"
#include "dcr/receiver/receiver.hpp"
#include "receiver/workload.hpp"

using namespace dcr;
using namespace dcr::io;

namespace {

std::vector<std::byte> image(const std::string& header, std::size_t data_bytes,
                             std::uint64_t declared_len = ~0ull) {
  const std::uint64_t n = declared_len == ~0ull ? header.size() : declared_len;
  std::vector<std::byte> v(8 + header.size() + data_bytes);
  for (int i = 0; i < 8; ++i)
    v[static_cast<std::size_t>(i)] = static_cast<std::byte>((n >> (8 * i)) & 0xFF);
  std::memcpy(v.data() + 8, header.data(), header.size());
  for (std::size_t i = 0; i < data_bytes; ++i)
    v[8 + header.size() + i] = static_cast<std::byte>(i * 7 + 1);
  return v;
}

status parse(const std::vector<std::byte>& img, safetensors_index& idx) {
  return parse_safetensors_header(img, img.size(), idx);
}

std::string temp_path(const std::string& stem) {
  return (std::filesystem::temp_directory_path() /
          ("dcr_st_" + stem + "_" + std::to_string(::getpid())))
      .string();
}

} // namespace

static_assert(canonical_source<safetensors_file>);

TEST_CASE("an image laid out like the reference writer's parses to the declared tensors") {
  // serde_json output of the reference writer: metadata first, no spaces,
  // header padded with spaces to a multiple of 8.
  std::string h =
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]},)"
      R"("a":{"dtype":"F32","shape":[],"data_offsets":[12,16]},"e":{"dtype":"F8_E4M3","shape":[0],"data_offsets":[16,16]}})";
  while ((8 + h.size()) % 8) h += ' ';
  auto img = image(h, 16);
  safetensors_index idx;
  REQUIRE(parse(img, idx).ok());
  REQUIRE(idx.entries.size() == 3);
  CHECK(idx.metadata.at("format") == "pt");
  CHECK(idx.entries[0].meta == tensor_meta{"b", {2, 3}, dtype_id::bf16});
  CHECK(idx.entries[1].meta == tensor_meta{"a", {}, dtype_id::f32});
  CHECK(idx.entries[1].begin == 12);
  CHECK(idx.entries[2].meta.numel() == 0);
  CHECK(idx.data_offset == 8 + h.size());
  // Pretty-printed JSON with escapes and unknown keys is fine too.
  std::string h2 = "{\n  \"w\\u00e9\\ud83d\\ude00\\n\" : { \"shape\" : [ 1 ] , \"extra\": [true, "
                   "null, -1.5e3, {\"x\": []}],"
                   " \"dtype\" : \"F16\", \"data_offsets\" : [0, 2] }\n}";
  auto img2 = image(h2, 2);
  REQUIRE(parse(img2, idx).ok());
  CHECK(idx.entries[0].meta.name == "w\xc3\xa9\xf0\x9f\x98\x80\n");
}

TEST_CASE("encode_safetensors round trip through a file, zero-copy views") {
  auto metas = canonical_tensors(tiny_qwen3_moe());
  auto model = test::random_model(metas, 41);
  std::vector<std::span<const std::byte>> data;
  for (auto& t : model.tensors()) data.emplace_back(t.bytes);
  const auto path = temp_path("rt");
  REQUIRE(write_safetensors(path, metas, data, {{"version", "7"}, {"quote\"", "\x01"}}).ok());
  safetensors_file f;
  REQUIRE(safetensors_file::open(path, f).ok());
  CHECK(f.tensors() == metas);
  CHECK(f.metadata().at("version") == "7");
  CHECK(f.metadata().at("quote\"") == "\x01");
  for (auto& t : model.tensors()) {
    auto v = f.find(t.meta.name);
    REQUIRE(v);
    CHECK(v->layout == strided_layout::row_major(t.meta.shape));
    CHECK(v->data == f.bytes(t.meta.name).data()); // a view into the mapping
    CHECK(std::memcmp(v->data, t.bytes.data(), t.bytes.size()) == 0);
  }
  CHECK(!f.find("nope"));
  // Dense refit from the file equals dense refit from memory.
  loaders::vllm_parallel_config
      deployment; // TP 2, DP 2, expert parallel: rank 1 is (dp 0, tp 1), EP rank 1 of 4
  deployment.tensor_parallel_size = 2;
  deployment.data_parallel_size = 2;
  deployment.enable_expert_parallel = true;
  loaders::vllm_style_loader l(tiny_qwen3_moe(), loaders::vllm_layout::of_rank(deployment, 1));
  receiver<loaders::vllm_style_loader> a(l, metas), b(l, metas);
  a.dense_refit(model);
  b.dense_refit(f);
  CHECK(a.state_digest() == b.state_digest());
  auto moved = std::move(f);
  CHECK(moved.find(metas[0].name));
  std::filesystem::remove(path);
}

TEST_CASE("unaligned tensors are served from an aligned copy") {
  std::string h =
      R"({"x":{"dtype":"F8_E5M2","shape":[3],"data_offsets":[0,3]},"y":{"dtype":"BF16","shape":[2],"data_offsets":[3,7]}})";
  while ((8 + h.size()) % 8) h += ' ';
  auto img = image(h, 7);
  const auto path = temp_path("unaligned");
  {
    FILE* fp = std::fopen(path.c_str(), "wb");
    REQUIRE(fp);
    std::fwrite(img.data(), 1, img.size(), fp);
    std::fclose(fp);
  }
  auto f = safetensors_file::open_or_throw(path);
  auto y = f.find("y");
  REQUIRE(y);
  CHECK(reinterpret_cast<std::uintptr_t>(y->data) % 2 == 0);
  CHECK(std::memcmp(y->data, f.bytes("y").data(), 4) == 0);
  CHECK(f.find("y")->data == y->data); // copied once
  std::filesystem::remove(path);
}

TEST_CASE("malformed safetensors give bad_format naming what is wrong") {
  struct bad_case {
    std::string header;
    std::size_t data;
    std::string needle;
    std::uint64_t declared = ~0ull;
  };
  const std::string ok_b = R"("b":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]})";
  std::vector<bad_case> cases = {
      {"{" + ok_b + "}", 4, "exceeds the file", 1u << 20},
      {"{" + ok_b + "}", 4, "exceeds the limit", safetensors_max_header + 1},
      {"{" + ok_b, 4, "header JSON"},
      {"[" + ok_b + "]", 4, "does not start with '{'"},
      {"{" + ok_b + "} x", 4, "bytes after the header object"},
      {R"({"t":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", 8,
       "tensor t: unsupported dtype 'I64'"},
      {R"({"t":{"dtype":"BF16","shape":[2],"data_offsets":[0]}})", 4,
       "tensor t: data_offsets must hold two"},
      {R"({"t":{"dtype":"BF16","shape":[2],"data_offsets":[4,0]}})", 4,
       "tensor t: data_offsets end before"},
      {R"({"t":{"dtype":"BF16","shape":[2],"data_offsets":[0,40]}})", 4,
       "tensor t: data_offsets end 40 beyond"},
      {R"({"t":{"dtype":"BF16","shape":[3],"data_offsets":[0,4]}})", 4,
       "tensor t: shape needs 6 bytes"},
      {R"({"t":{"dtype":"BF16","shape":[-2],"data_offsets":[0,4]}})", 4, "non-negative integer"},
      {R"({"t":{"dtype":"BF16","shape":[2.5],"data_offsets":[0,4]}})", 4, "expected an integer"},
      {R"({"t":{"dtype":"BF16","shape":[4294967296,4294967296,4],"data_offsets":[0,4]}})", 4,
       "tensor t: shape overflows"},
      {R"({"t":{"dtype":"BF16","data_offsets":[0,4]}})", 4, "tensor t: entry lacks"},
      {R"({"t":[1]})", 4, "tensor t: entry is not an object"},
      {"{" + ok_b + R"(,"c":{"dtype":"BF16","shape":[2],"data_offsets":[2,6]}})", 6,
       "tensors b and c overlap"},
      {"{" + ok_b + R"(,"c":{"dtype":"BF16","shape":[2],"data_offsets":[6,10]}})", 10,
       "tensor c: hole of 2 bytes"},
      {"{" + ok_b + "}", 6, "2 bytes after the last tensor"},
      {"{" + ok_b + "," + ok_b + "}", 4, "tensor b: listed twice"},
      {R"({"__metadata__":{"k":1}})", 0, "__metadata__ value is not a string"},
      {R"({"t":{"dtype":"BF16","shape":[1,1,1,1,1,1,1],"data_offsets":[0,2]}})", 2,
       "tensor t: rank 7"},
      {R"({"t\q":{}})", 0, "bad escape"},
      {"{\"t\x01\":{}}", 0, "control character"},
      {R"({"\ud800":{}})", 0, "lone surrogate"},
      {"", 0, "empty header"},
  };
  for (auto& c : cases) {
    INFO(c.header);
    auto img = image(c.header, c.data, c.declared);
    safetensors_index idx;
    auto s = parse(img, idx);
    CHECK(s.code == errc::bad_format);
    CHECK_MESSAGE(s.message.find(c.needle) != std::string::npos, s.message);
  }
  safetensors_index idx;
  std::vector<std::byte> tiny(5);
  CHECK(parse_safetensors_header(tiny, tiny.size(), idx).code == errc::bad_format);
  // Through the file API: the path is named; a missing file is an I/O error.
  const auto path = temp_path("bad");
  {
    auto img = image("{" + ok_b + "}", 6);
    FILE* fp = std::fopen(path.c_str(), "wb");
    std::fwrite(img.data(), 1, img.size(), fp);
    std::fclose(fp);
  }
  safetensors_file f;
  auto s = safetensors_file::open(path, f);
  CHECK(s.code == errc::bad_format);
  CHECK(s.message.find(path) != std::string::npos);
  CHECK(safetensors_file::open(path + ".missing", f).code == errc::io);
  CHECK_THROWS_AS(safetensors_file::open_or_throw(path + ".missing"), error);
  std::filesystem::remove(path);
}

TEST_CASE("encode_safetensors rejects inconsistent input") {
  std::vector<tensor_meta> m = {{"a", {2}, dtype_id::bf16}, {"a", {2}, dtype_id::bf16}};
  std::vector<std::byte> four(4);
  std::vector<std::span<const std::byte>> d = {four, four};
  CHECK_THROWS_AS(encode_safetensors(m, d), error);
  m[1].name = "b";
  CHECK_NOTHROW(encode_safetensors(m, d));
  std::vector<std::byte> three(3);
  d[1] = three;
  CHECK_THROWS_AS(encode_safetensors(m, d), error);
  CHECK(write_safetensors("/nonexistent-dir/x.safetensors", m,
                          std::vector<std::span<const std::byte>>{four, four})
            .code == errc::io);
}

TEST_CASE("random truncations and byte flips never crash the parser") {
  auto metas = canonical_tensors(tiny_llama());
  metas.resize(6);
  std::vector<std::vector<std::byte>> bufs;
  std::vector<std::span<const std::byte>> data;
  for (auto& m : metas) bufs.emplace_back(m.nbytes(), std::byte{3});
  for (auto& b : bufs) data.emplace_back(b);
  const auto img = encode_safetensors(metas, data);
  safetensors_index idx;
  REQUIRE(parse(img, idx).ok());
  const std::size_t header_end = 8 + static_cast<std::size_t>(idx.data_offset - 8);
  std::mt19937_64 rng(43);
  int rejected = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    auto v = img;
    if (trial % 3 == 0)
      v.resize(rng() % header_end);
    else
      v[rng() % header_end] = static_cast<std::byte>(rng());
    auto s = parse(v, idx);
    if (!s.ok()) {
      ++rejected;
      CHECK(s.code == errc::bad_format);
    }
  }
  CHECK(rejected > 1000);
}
