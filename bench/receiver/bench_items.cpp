// dcr-bench-items: per-item cost of a receiver's stage + apply on a model
// with many small tensors.
//
// Input: a Qwen3-MoE-shaped BF16 model with Qwen3-30B-A3B's layer count (48)
// and a varying expert count, all dimensions small (hidden 64, 2 query / 1
// KV heads of 32, expert FFN 32, vocab 256), so that items are many and
// each one is small: at 128 experts the model has 18,867 canonical tensors,
// the count of Qwen3-30B-A3B (48 layers x 128 experts x 3 projections plus
// attention, norms, router, embeddings). A delta changes a uniform random
// 1 % of every tensor's values (XOR items, one per tensor with a change),
// encoded as payloads of 256 items. The receiver is a vLLM-style TP 1 rank
// with expert parallelism off (experts fused into per-layer parameters).
// Timed: `stage` of every payload + `apply_staged` (decode + scatter/apply of
// every item), best of 5 rounds, each from the old version (a dense refit,
// untimed). Reported: cost per item, as wall time and as the thread's CPU
// time (on a shared machine the wall time of a short region is mostly
// waiting for a core); target <= 2 us and flat in the item count. Verified: after every timed
// round, outside the timed region, the receiver's storage equals a dense refit of the new version
// byte for byte.

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "dcr/codec/payload.hpp"
#include "dcr/loaders/vllm_style.hpp"
#include "dcr/model/config.hpp"
#include "dcr/receiver/receiver.hpp"
#include "dcr/receiver/tensor_set.hpp"

namespace {

using namespace dcr;

/// splitmix64: a small deterministic generator.
struct splitmix {
  std::uint64_t s;
  std::uint64_t next() {
    std::uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
};

model_config small_moe(std::uint64_t experts) {
  model_config c = tiny_qwen3_moe();
  c.layers = 48;
  c.experts = experts;
  c.hidden = 64;
  c.heads = 2;
  c.kv_heads = 1;
  c.head_dim = 32;
  c.moe_ffn = 32;
  c.vocab = 256;
  return c;
}

/// CPU seconds of the calling thread: on a shared machine the wall time of a
/// short region mostly measures waiting for a core, so the table reports both.
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

void must(const status& s) {
  if (!s.ok()) {
    std::cerr << "dcr-bench-items: " << s.message << "\n";
    std::exit(1);
  }
}

struct row {
  std::uint64_t experts, tensors, items, entries, payloads;
  double stage_s, total_s, cpu_s;
};

} // namespace

int main(int argc, char** argv) {
  const auto opt = bench::options::parse(argc, argv);
  const int reps = opt.quick ? 1 : 5;
  std::vector<std::uint64_t> experts = {6, 40, 128, 690};
  if (opt.quick) experts = {6, 40};
  std::vector<row> rows;
  splitmix g{0x17E45};
  for (auto e : experts) {
    const auto cfg = small_moe(e);
    const auto metas = canonical_tensors(cfg);
    tensor_set v(metas);
    for (auto& t : v.tensors())
      for (auto& w : t.words<bf16>()) w = static_cast<std::uint16_t>(0x3C00 | (g.next() & 0x03FF));
    // 1 % XOR delta, one item per tensor with a change.
    tensor_set next = v;
    std::vector<item> items;
    std::uint64_t entries = 0;
    const auto threshold = static_cast<std::uint64_t>(0.01 * 0x1p53);
    for (std::size_t t = 0; t < v.tensors().size(); ++t) {
      auto& src = v.tensors()[t];
      auto dst = next.tensors()[t].words<bf16>();
      item it;
      it.tensor = src.meta;
      it.encoding = value_encoding::xor_mask;
      for (std::uint64_t i = 0; i < src.meta.numel(); ++i) {
        const auto r = g.next();
        if ((r >> 11) >= threshold) continue;
        const auto mask = static_cast<std::uint16_t>(1u << (r & 7));
        dst[i] = static_cast<std::uint16_t>(dst[i] ^ mask);
        it.indices.push_back(i);
        it.values.push_back(static_cast<std::byte>(mask & 0xFF));
        it.values.push_back(static_cast<std::byte>(mask >> 8));
      }
      if (it.indices.empty()) continue;
      entries += it.indices.size();
      items.push_back(std::move(it));
    }
    using rx = receiver<loaders::vllm_style_loader>;
    rx r(loaders::vllm_style_loader(cfg, {}), metas),
        ref(loaders::vllm_style_loader(cfg, {}), metas);
    ref.dense_refit(next);
    row x{e, metas.size(), items.size(), entries, 0, 1e300, 1e300, 1e300};
    for (int k = 0; k <= reps; ++k) {
      std::vector<std::vector<std::byte>> payloads;
      std::uint32_t seq = 0;
      for (std::size_t i = 0; i < items.size(); i += 256) {
        const auto n = std::min<std::size_t>(256, items.size() - i);
        payloads.push_back(encode_payload({static_cast<std::uint64_t>(k + 1), 1, 0, seq++},
                                          std::span<const item>(items.data() + i, n)));
      }
      x.payloads = payloads.size();
      r.dense_refit(v);
      const double c0 = thread_cpu_seconds();
      const auto t0 = std::chrono::steady_clock::now();
      for (auto& p : payloads) must(r.stage(p));
      const auto t1 = std::chrono::steady_clock::now();
      must(r.apply_staged());
      const auto t2 = std::chrono::steady_clock::now();
      const double c1 = thread_cpu_seconds();
      if (k > 0) {
        x.cpu_s = std::min(x.cpu_s, c1 - c0);
        x.stage_s = std::min(x.stage_s, std::chrono::duration<double>(t1 - t0).count());
        x.total_s = std::min(x.total_s, std::chrono::duration<double>(t2 - t0).count());
      }
      const auto diff = bench::storage_difference(r.storage(), ref.storage());
      if (!diff.empty()) {
        std::cerr << "dcr-bench-items: " << e << " experts: " << diff << "\n";
        return 1;
      }
    }
    rows.push_back(x);
  }
  if (opt.json) {
    std::cout << "{\"machine\":" << bench::json_string(bench::machine_description())
              << ",\"rows\":[";
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const auto& x = rows[i];
      std::cout << (i ? "," : "") << "{\"experts\":" << x.experts << ",\"tensors\":" << x.tensors
                << ",\"items\":" << x.items << ",\"entries\":" << x.entries
                << ",\"stage_s\":" << x.stage_s << ",\"total_s\":" << x.total_s
                << ",\"cpu_s\":" << x.cpu_s
                << ",\"us_per_item\":" << x.total_s / static_cast<double>(x.items) * 1e6
                << ",\"cpu_us_per_item\":" << x.cpu_s / static_cast<double>(x.items) * 1e6 << "}";
    }
    std::cout << "]}\n";
    return 0;
  }
  std::cout << "Per-item receiver cost (stage + decode + apply of XOR payloads), Qwen3-MoE shape, "
               "48 layers, small dimensions, 1 % change, vLLM-style TP 1; best of "
            << reps << " rounds, every round checked against a dense refit.\n"
            << bench::machine_description() << "\n\n";
  bench::table t({"experts", "canonical tensors", "items", "entries", "payloads", "stage ms",
                  "stage+apply ms", "us / item", "CPU ms", "CPU us / item"});
  for (auto& x : rows)
    t.add({std::to_string(x.experts), std::to_string(x.tensors), std::to_string(x.items),
           std::to_string(x.entries), std::to_string(x.payloads), bench::fmt(x.stage_s * 1e3),
           bench::fmt(x.total_s * 1e3),
           bench::fmt(x.total_s / static_cast<double>(x.items) * 1e6, 2), bench::fmt(x.cpu_s * 1e3),
           bench::fmt(x.cpu_s / static_cast<double>(x.items) * 1e6, 2)});
  t.print(std::cout, opt.markdown);
  return 0;
}
