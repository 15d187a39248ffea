// dcr-make-payload OUT [SEED] [N_ITEMS] [VERSION]: writes a small valid
// payload with items of every dtype, every encoding of the format version
// (default 2; version 1 has no `add` items), runs and scattered locations.
// Used by the dcr-inspect tests, the fuzz seed corpus and the wire-format
// example.
#include <fstream>
#include <iostream>
#include <random>
#include <string>

#include "dcr/codec/payload.hpp"

int main(int argc, char** argv) {
  using namespace dcr;
  if (argc < 2) {
    std::cerr << "usage: dcr-make-payload OUT [SEED] [N_ITEMS] [VERSION]\n";
    return 2;
  }
  const std::uint64_t seed = argc > 2 ? std::stoull(argv[2]) : 1;
  const int n = argc > 3 ? std::stoi(argv[3]) : 3;
  const auto version = static_cast<std::uint16_t>(argc > 4 ? std::stoi(argv[4]) : 2);
  std::mt19937_64 rng(seed);
  const dtype_id dts[] = {dtype_id::bf16, dtype_id::f16, dtype_id::f32, dtype_id::f8e4m3fn,
                          dtype_id::f8e5m2};
  std::vector<item> items;
  for (int i = 0; i < n; ++i) {
    item it;
    const std::uint64_t rows = 1 + rng() % 8, cols = 1 + rng() % 64;
    it.tensor = {
        "model.layers." + std::to_string(i) + ".mlp.weight", {rows, cols}, dts[(seed + i) % 5]};
    const value_encoding encodings[] = {value_encoding::xor_mask, value_encoding::overwrite,
                                        value_encoding::add};
    it.encoding = encodings[(seed + i) % (version >= 2 ? 3 : 2)];
    const std::uint64_t numel = rows * cols;
    if (i % 3 == 1) { // a run
      const auto a = rng() % numel;
      for (std::uint64_t k = a; k < numel && k < a + 5; ++k) it.indices.push_back(k);
    } else if (i % 3 == 2) {
      for (std::uint64_t k = rng() % 3; k < numel; k += 1 + rng() % (i == 5 ? 400 : 9))
        it.indices.push_back(k);
    } else {
      for (std::uint64_t k = 0; k < numel; ++k)
        if (rng() % 7 == 0) it.indices.push_back(k);
    }
    it.values.resize(it.indices.size() * width_of(it.tensor.dtype));
    for (auto& b : it.values) b = static_cast<std::byte>(rng() & (rng() % 2 ? 0x0F : 0xFF));
    items.push_back(std::move(it));
  }
  encode_options opt;
  opt.locations = static_cast<codec::location_scheme>(seed % 4);
  opt.format_version = version;
  const auto bytes =
      encode_payload({seed, seed + 1, static_cast<std::uint32_t>(seed % 8), 0}, items, opt);
  std::ofstream out(argv[1], std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  return out ? 0 : 1;
}
