// Device change detection against its host twin dcr/twin/detect.hpp:
// the same indices in the same order, across word types, densities,
// lengths (including > 2^31 words where memory allows) and bases.

#include <cstdint>
#include <string>
#include <vector>

#include "dcr/gpu/detect.cuh"
#include "dcr/twin/detect.hpp"
#include "test_common.cuh"

using namespace dcr;
using namespace dcr::gpu::test;

namespace {

/// `old` with `density` of its words changed (each changed word differs).
template <class W>
std::vector<W> changed_copy(const std::vector<W>& old, double density, std::uint64_t seed) {
  auto v = old;
  const auto flips = random_words<W>(old.size(), seed);
  for (auto i : random_locations(old.size(), density, seed + 1))
    v[i] = static_cast<W>(v[i] ^ (flips[i] | 1));
  return v;
}

template <twin::word W>
void host_side_checks() {
  std::vector<W> a(8), b(8);
  std::uint64_t out[8];
  std::uint64_t changed = 7;
  DCR_EXPECT_CODE(dcr::gpu::detect_changes<W>(a.data(), nullptr, 8, 0, out, changed),
                  invalid_argument, "null new");
  DCR_EXPECT(changed == 0, "count reset on failure");
  DCR_EXPECT_CODE(dcr::gpu::detect_changes<W>(a.data(), b.data(), 8, ~0ull - 3, out, changed),
                  length_overflow, "base overflow");
  std::vector<std::uint64_t> idx;
  DCR_EXPECT_CODE(twin::detect_changes<W>(a, b, ~0ull - 3, idx), length_overflow,
                  "twin: base overflow");
  DCR_EXPECT_CODE(twin::detect_changes<W>(a, std::span<const W>(b).first(7), 0, idx),
                  invalid_argument, "twin: lengths differ");
  if (dcr::gpu::device_count() == 0)
    DCR_EXPECT_CODE(dcr::gpu::detect_changes<W>(a.data(), b.data(), 8, 0, out, changed), device,
                    "no device");
}

template <twin::word W>
void run_case(std::uint64_t n, double density, std::uint64_t base, std::uint64_t seed,
              dcr::gpu::workspace& ws) {
  const auto old = random_words<W>(n, seed);
  const auto neu = changed_copy(old, density, seed + 5);
  std::vector<std::uint64_t> want = {42}; // appends: the prefix stays
  DCR_EXPECT(twin::detect_changes<W>(old, neu, base, want).ok() && !want.empty() && want[0] == 42,
             "twin append");
  want.erase(want.begin());
  dbuf<W> d_old(old), d_new(neu);
  dbuf<std::uint64_t> d_out(n);
  std::uint64_t changed = 0;
  const status s =
      dcr::gpu::detect_changes<W>(d_old.get(), d_new.get(), n, base, d_out.get(), changed, ws);
  const std::string what = "n=" + std::to_string(n) + " W=" + std::to_string(sizeof(W)) +
                           " density=" + std::to_string(density) + " base=" + std::to_string(base);
  DCR_EXPECT(s.ok(), what + ": " + s.message);
  const auto got = d_out.download_prefix(changed);
  DCR_EXPECT(changed == want.size() && got == want, what + ": indices");
}

void large_case(dcr::gpu::workspace& ws) {
  const std::uint64_t n = (1ull << 31) + 13;
  const std::size_t need = 2 * n + 8 * n + (1ull << 30);
  if (free_device_bytes() < need) {
    std::printf("large case (2^31+13 u8 words) not run: %zu bytes free, %zu needed\n",
                free_device_bytes(), need);
    return;
  }
  run_case<std::uint8_t>(n, 0.001, 1ull << 40, 77, ws);
}

} // namespace

int main() {
  host_side_checks<std::uint8_t>();
  host_side_checks<std::uint16_t>();
  host_side_checks<std::uint32_t>();
  skip_without_device("test_detect");
  dcr::gpu::workspace ws;
  std::uint64_t seed = 300;
  for (std::uint64_t n : {0ull, 1ull, 7ull, 4097ull, 1000003ull})
    for (double d : densities)
      for (std::uint64_t base : {0ull, 123456789ull}) {
        run_case<std::uint8_t>(n, d, base, seed++, ws);
        run_case<std::uint16_t>(n, d, base, seed++, ws);
        run_case<std::uint32_t>(n, d, base, seed++, ws);
      }
  large_case(ws);
  return finish("test_detect");
}
