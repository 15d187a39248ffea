// Interop: safetensors files written by an independent implementation of the
// format rules (Python's json + struct, the way the reference Python writer
// lays files out) are read by dcr, and dcr's files are parsed and checked by
// Python. Skips (exit 77) when python3 is not installed.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "dcr/io/safetensors.hpp"

using namespace dcr;
using namespace dcr::io;

namespace {

const char* python = "/usr/bin/python3";

std::string tmp(const std::string& stem) {
  return (std::filesystem::temp_directory_path() /
          ("dcr_sti_" + stem + "_" + std::to_string(::getpid())))
      .string();
}

int run_python(const std::string& script, const std::string& arg) {
  const auto path = tmp("script.py");
  std::ofstream(path) << script;
  const int rc = std::system((std::string(python) + " " + path + " " + arg).c_str());
  std::filesystem::remove(path);
  return rc;
}

// Writes: bf16 "w" [3, 5] with words 0..14 * 257, f32 "b" [4] = 0.5 * i, f16 scalar "s",
// metadata {"format": "pt"}; json.dumps default separators, header padded to 8.
const char* writer = R"PY(
import json, struct, sys
tensors = [
  ("w", "BF16", [3, 5], struct.pack("<15H", *[(i * 257) & 0xFFFF for i in range(15)])),
  ("b", "F32", [4], struct.pack("<4f", *[0.5 * i for i in range(4)])),
  ("s", "F16", [], struct.pack("<H", 0x3C00)),
]
header, data = {"__metadata__": {"format": "pt"}}, b""
for name, dt, shape, raw in tensors:
    header[name] = {"dtype": dt, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
    data += raw
h = json.dumps(header).encode("utf-8")
h += b" " * ((8 - (8 + len(h)) % 8) % 8)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + data)
)PY";

// Reads a dcr file; checks the tiling and the bytes of tensor "x" (u16 words i*3).
const char* reader = R"PY(
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n].decode("utf-8"))
data = raw[8 + n:]
assert header["__metadata__"] == {"k": "v"}, header
entries = sorted((v["data_offsets"], k, v) for k, v in header.items() if k != "__metadata__")
at = 0
for (b, e), k, v in entries:
    assert b == at, (k, b, at)
    width = {"BF16": 2, "F16": 2, "F32": 4, "F8_E4M3": 1, "F8_E5M2": 1}[v["dtype"]]
    numel = 1
    for d in v["shape"]:
        numel *= d
    assert e - b == numel * width, k
    at = e
assert at == len(data)
x = header["x"]
b, e = x["data_offsets"]
assert list(struct.unpack("<%dH" % ((e - b) // 2), data[b:e])) == [i * 3 for i in range((e - b) // 2)]
assert header["y.\u00e9"]["dtype"] == "F8_E4M3"
)PY";

} // namespace

TEST_CASE("a file written by Python's json/struct is read exactly") {
  const auto path = tmp("py.safetensors");
  REQUIRE(run_python(writer, path) == 0);
  auto f = safetensors_file::open_or_throw(path);
  CHECK(f.metadata().at("format") == "pt");
  REQUIRE(f.tensors().size() == 3);
  CHECK(f.tensors()[0] == tensor_meta{"w", {3, 5}, dtype_id::bf16});
  CHECK(f.tensors()[2] == tensor_meta{"s", {}, dtype_id::f16});
  auto w = f.find("w")->as<bf16>();
  for (int i = 0; i < 15; ++i) CHECK(w.data[i] == static_cast<std::uint16_t>(i * 257));
  auto b = f.find("b")->as<f32>();
  for (int i = 0; i < 4; ++i) {
    float x;
    std::memcpy(&x, &b.data[i], 4);
    CHECK(x == 0.5f * static_cast<float>(i));
  }
  CHECK(f.find("s")->as<f16>().data[0] == 0x3C00);
  std::filesystem::remove(path);
}

TEST_CASE("a file written by dcr is parsed and checked by Python") {
  std::vector<tensor_meta> metas = {{"y.\xc3\xa9", {3}, dtype_id::f8e4m3fn},
                                    {"x", {2, 7}, dtype_id::bf16}};
  std::vector<std::byte> y(3, std::byte{0x38}), x(28);
  for (int i = 0; i < 14; ++i) {
    const auto v = static_cast<std::uint16_t>(i * 3);
    x[2 * i] = static_cast<std::byte>(v & 0xFF);
    x[2 * i + 1] = static_cast<std::byte>(v >> 8);
  }
  std::vector<std::span<const std::byte>> data = {y, x};
  const auto path = tmp("dcr.safetensors");
  REQUIRE(write_safetensors(path, metas, data, {{"k", "v"}}).ok());
  CHECK(run_python(reader, path) == 0);
  std::filesystem::remove(path);
}

int main(int argc, char** argv) {
  if (::access(python, X_OK) != 0) {
    std::printf("skip: %s not found\n", python);
    return 77;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
