// Interop with the reference CLIs: the body is a plain zstd frame that
// `zstd -d` decompresses to our body, and the digest equals `b2sum -l 128` of
// header bytes 0..79 and the body (v2) or of the body alone (v1).
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include "codec/fixtures.hpp"
#include "dcr/codec/payload.hpp"

using namespace dcr;
namespace fs = std::filesystem;

namespace {

std::vector<std::byte> read_all(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(f)), {});
  std::vector<std::byte> b(c.size());
  if (!c.empty()) std::memcpy(b.data(), c.data(), c.size());
  return b;
}
void write_all(const fs::path& p, std::span<const std::byte> b) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}
std::string run(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[256];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  REQUIRE(pclose(p) == 0);
  return out;
}

} // namespace

TEST_CASE("zstd -d and b2sum -l 128 agree with the payload body and digest") {
  const fs::path dir =
      fs::temp_directory_path() / ("dcr_codec_interop_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::mt19937_64 rng(21);
  for (int r = 0; r < 6; ++r) {
    std::vector<item> items;
    for (int i = 0; i < 1 + r; ++i) {
      const std::uint64_t numel = 1000 + rng() % 100000;
      auto idx = test::random_indices(rng, numel, 0.001 * (1 + r * 10), i % 3 == 0);
      items.push_back(test::make_item("t" + std::to_string(i), {numel},
                                      r % 2 ? dtype_id::f32 : dtype_id::bf16,
                                      value_encoding::xor_mask, std::move(idx), rng));
    }
    encode_options opt;
    opt.zstd_level = 1 + r;
    opt.format_version = r % 3 == 2 ? 1 : 2;
    CAPTURE(opt.format_version);
    const auto payload = encode_payload({1, 2, 3, static_cast<std::uint32_t>(r)}, items, opt);
    codec::payload_info pi;
    REQUIRE(codec::inspect_payload(payload, pi).ok());
    write_all(dir / "body.zst", codec::compressed_body(payload));
    run("zstd -q -d -f '" + (dir / "body.zst").string() + "' -o '" + (dir / "body.raw").string() +
        "'");
    CHECK(read_all(dir / "body.raw") == pi.body);
    // v2 signs header bytes 0..79 then the body; v1 the body alone.
    std::vector<std::byte> signed_bytes;
    if (opt.format_version == 2) signed_bytes.assign(payload.begin(), payload.begin() + 80);
    signed_bytes.insert(signed_bytes.end(), payload.begin() + 96, payload.end());
    write_all(dir / "signed.bin", signed_bytes);
    const auto sum = run("b2sum -l 128 '" + (dir / "signed.bin").string() + "'");
    CHECK(sum.substr(0, 32) == to_hex(pi.header.digest));
    CHECK(pi.header.version == opt.format_version);
    // And the other way: a frame made by the CLI is a body we accept.
    run("zstd -q -1 -f '" + (dir / "body.raw").string() + "' -o '" + (dir / "cli.zst").string() +
        "'");
    const auto cli = read_all(dir / "cli.zst");
    std::vector<std::byte> p(payload.begin(), payload.begin() + 96);
    test::poke<std::uint64_t>(p, 72, cli.size());
    const auto d = codec::payload_digest(opt.format_version, p, cli);
    std::memcpy(p.data() + 80, d.data(), 16);
    p.insert(p.end(), cli.begin(), cli.end());
    CHECK(decode_payload_or_throw(p).items == items);
  }
  fs::remove_all(dir);
}
