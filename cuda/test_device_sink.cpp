// receiver<L, cuda::device_sink>: the refit through the receiver's own path
// with the CUDA scatter kernels writing device storage. After a dense refit
// and after each delta (XOR, overwrite, add, mixed), the device copy of every
// parameter, downloaded, must equal a dense refit of the new version byte for
// byte (and the host store must too). Compiled by the host compiler (the
// receiver's dispatch table uses Boost.Hana, which nvcc must not see) and
// linked with the nvcc-compiled device sink. Without a device it prints why
// and exits 77 (SKIP).
#include <cstdio>
#include <string>
#include <vector>

#include "dcr/gpu/device_sink.hpp"
#include "dcr/loaders/cast_transpose.hpp"
#include "dcr/loaders/vllm_style.hpp"
#include "dcr/receiver/receiver.hpp"
#include "receiver/workload.hpp"

using namespace dcr;

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
  if (!ok) {
    ++failures;
    std::fprintf(stderr, "FAIL: %s\n", what.c_str());
  }
}

template <class R>
std::string device_difference(const R& r, const parameter_store& expected) {
  const auto& sink = r.sink();
  if (sink.size() != expected.size()) return "parameter count differs";
  for (std::size_t p = 0; p < expected.size(); ++p)
    if (sink.bytes(p) != expected[p].bytes) return "parameter " + expected[p].meta.name;
  return "";
}

template <class L>
void run_case(const std::string& name, const std::vector<L>& ranks,
              const std::vector<tensor_meta>& metas, const tensor_set& v, const tensor_set& v1,
              test::delta_mode mode, std::uint64_t seed) {
  using rx = receiver<L, cuda::device_sink>;
  std::vector<rx> rs;
  for (auto& l : ranks) rs.emplace_back(l, metas);
  auto xor_ok = [&](const std::string& n) {
    for (auto& r : rs)
      if (!r.xor_allowed(n)) return false;
    return true;
  };
  const auto items = test::diff_items(v, v1, mode, xor_ok, 2);
  for (std::size_t k = 0; k < rs.size(); ++k) {
    auto& r = rs[k];
    r.dense_refit(v);
    check(device_difference(r, r.storage()) == "", name + ": device copy after dense refit");
    for (auto& it : items) {
      auto s = r.apply_item(it);
      check(s.ok(), name + ": apply: " + s.message);
    }
    receiver<L> ref(ranks[k], metas);
    ref.dense_refit(v1);
    check(first_difference(r.storage(), ref.storage()) == "", name + ": host store vs dense refit");
    check(device_difference(r, ref.storage()) == "", name + ": device copy vs dense refit");
    check(r.sink().entries() > 0 || test::changed_count(items) == 0,
          name + ": no entry reached the kernels");
  }
  (void)seed;
}

} // namespace

int main() {
  if (auto s = cuda::device_sink::available(); !s.ok()) {
    std::printf("SKIP: receiver<L, cuda::device_sink> needs a CUDA device: %s\n",
                s.message.c_str());
    return 77;
  }
  std::uint64_t seed = 500;
  for (auto mode : {test::delta_mode::mixed, test::delta_mode::xor_only,
                    test::delta_mode::overwrite_only, test::delta_mode::add_only}) {
    for (auto c : {tiny_llama(), tiny_qwen3_moe()}) {
      const auto metas = canonical_tensors(c);
      auto v = test::random_model(metas, seed);
      auto v1 = test::clone(v);
      test::stress(v1, 0.03, 0.05, seed + 1);
      const std::string name = c.family + " mode " + std::to_string(static_cast<int>(mode));
      run_case(name + " tp2",
               loaders::vllm_style_loaders(c,
                                           [] {
                                             loaders::vllm_parallel_config p;
                                             p.tensor_parallel_size = 2;
                                             return p;
                                           }()),
               metas, v, v1, mode, seed);
      if (mode != test::delta_mode::xor_only && mode != test::delta_mode::add_only)
        run_case(name + " cast", std::vector{loaders::cast_transpose_loader(c)}, metas, v, v1, mode,
                 seed);
      ++seed;
    }
  }
  if (failures) {
    std::printf("%d failures\n", failures);
    return 1;
  }
  std::printf("receiver<L, cuda::device_sink>: every device copy equals the dense refit\n");
  return 0;
}
