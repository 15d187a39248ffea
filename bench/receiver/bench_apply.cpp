// dcr-bench-apply: receiver apply time of a delta versus a dense refit
// through the same native loader, measured in the same run.
//
// Input: a Llama-style BF16 model (hidden 1024, 8 layers, 16 query / 4 KV
// heads of 64, FFN 2816, vocab 32000: 155M values, 310 MB; --quick: the
// tiny test model). A delta changes a uniform random fraction (1.2, 3, 5 %)
// of every canonical tensor's values; one item per canonical tensor. The
// receiver is a vLLM-style rank (TP 1 and TP 2 rank 0); every receiver
// gets every item, as when payloads are broadcast.
// Reference: `dense_refit` of full canonical tensors through the same loader
// into the same storage. Also shown: memcpy of the rank's storage bytes, the
// apply of overwrite items, and ingestion of the same delta as zstd payloads
// (stage + decode + apply).
// Floor: the line traffic an apply cannot avoid, measured in the same run:
// a read-modify-write (or, when faster, a store) of one 64-bit word in every
// 64-byte line of the rank's storage that holds a change (found by diffing
// the storage before and after the XOR apply; lines of a scratch buffer laid
// out like the storage), plus a streaming read of every item's value bytes. "x floor" = apply /
// floor. A second table uses the cast/transpose loader, whose FP32 casts make overwrite items
// O(tensor) (measured separately).
// The floor is the target's measure only for storage well beyond the last-level
// cache: lines of a rank that fits in it are touched at cache latency, so the
// floor of the --quick model (3.3 MB) is a few cache hits and its "x floor"
// compares the apply's CPU work (state digest, per-item loader calls) with
// them. Each row reports storage / LLC; rows under 2 are marked "(in cache)"
// and `floor_in_cache` in --json.
// --change-pct P runs one change rate only.
// Thread scaling: the XOR and overwrite applies (vLLM-style) and the mixed
// apply (cast/transpose) again with `receiver_options::apply_threads` = 0
// (every hardware thread; items of one storage group stay on one thread)
// against 1 thread, interleaved in the same rounds; scaling = 1-thread time /
// all-thread time (`threads`, `scaling`, `overwrite_scaling` in --json).
// Verified: after every timed apply (XOR, overwrite, mixed, on one and on all
// threads, and every staged ingestion), outside its timed region, the
// receiver's storage is compared byte for byte with a dense refit of the new
// version through the same loader; any difference fails the bench (exit 1).

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "bench_common.hpp"
#include "dcr/codec/payload.hpp"
#include "dcr/loaders/cast_transpose.hpp"
#include "dcr/loaders/vllm_style.hpp"
#include "dcr/model/config.hpp"
#include "dcr/pipeline/parallel.hpp"
#include "dcr/receiver/receiver.hpp"
#include "dcr/receiver/tensor_set.hpp"
#include "examples/common/simulator.hpp"

namespace {

using namespace dcr;

using splitmix = dcr::sim::splitmix64;

/// Bytes of the last-level cache, from sysfs (sysconf's figure is the
/// hypervisor's guess on some virtual machines); 0 when unknown.
std::uint64_t llc_bytes() {
  std::uint64_t best_level = 0, bytes = 0;
  for (int i = 0; i < 8; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    std::ifstream lv(dir + "level"), sz(dir + "size");
    std::uint64_t level = 0, n = 0;
    std::string unit;
    if (!(lv >> level) || !(sz >> n)) continue;
    if (sz.peek() == 'K') n <<= 10;
    if (sz.peek() == 'M') n <<= 20;
    if (level >= best_level) {
      best_level = level;
      bytes = n;
    }
  }
  return bytes;
}

/// Whether a storage of `bytes` fits in the last-level cache (the floor then
/// measures cache hits, see the file comment).
bool in_cache(std::uint64_t bytes, std::uint64_t llc) { return llc && bytes < 2 * llc; }

/// "x floor" cell: the ratio, marked when the storage fits in the cache.
std::string floor_cell(double ratio, std::uint64_t bytes, std::uint64_t llc) {
  return bench::fmt(ratio, 2) + (in_cache(bytes, llc) ? " (in cache)" : "");
}

model_config bench_model(bool quick) {
  if (quick) return tiny_llama();
  model_config c;
  c.hidden = 1024;
  c.layers = 8;
  c.heads = 16;
  c.kv_heads = 4;
  c.head_dim = 64;
  c.ffn = 2816;
  c.vocab = 32000;
  return c;
}

tensor_set random_set(const std::vector<tensor_meta>& metas, splitmix& g) {
  tensor_set s(metas);
  for (auto& t : s.tensors())
    for (auto& w : t.words<bf16>())
      w = static_cast<std::uint16_t>(0x3C00 | (g.next() & 0x03FF)); // finite values
  return s;
}

/// One XOR and one overwrite item per tensor at a uniform `pct` % of positions.
void make_delta(const tensor_set& v, double pct, splitmix& g, std::vector<item>& xors,
                std::vector<item>& ows) {
  const auto threshold = static_cast<std::uint64_t>(pct / 100.0 * 0x1p53);
  xors.clear();
  ows.clear();
  for (auto& t : v.tensors()) {
    item x, o;
    x.tensor = o.tensor = t.meta;
    x.encoding = value_encoding::xor_mask;
    o.encoding = value_encoding::overwrite;
    const auto* w = reinterpret_cast<const std::uint16_t*>(t.bytes.data());
    for (std::uint64_t i = 0; i < t.meta.numel(); ++i) {
      const auto r = g.next();
      if ((r >> 11) >= threshold) continue;
      const auto mask = static_cast<std::uint16_t>(1u << (r & 7)); // a low mantissa/exponent bit
      const auto nw = static_cast<std::uint16_t>(w[i] ^ mask);
      x.indices.push_back(i);
      o.indices.push_back(i);
      const std::byte mb[2] = {static_cast<std::byte>(mask & 0xFF),
                               static_cast<std::byte>(mask >> 8)};
      const std::byte nb[2] = {static_cast<std::byte>(nw & 0xFF), static_cast<std::byte>(nw >> 8)};
      x.values.insert(x.values.end(), mb, mb + 2);
      o.values.insert(o.values.end(), nb, nb + 2);
    }
    if (!x.indices.empty()) {
      xors.push_back(std::move(x));
      ows.push_back(std::move(o));
    }
  }
}

std::vector<std::vector<std::byte>> to_payloads(const std::vector<item>& items,
                                                std::uint64_t attempt) {
  std::vector<std::vector<std::byte>> out;
  std::uint32_t seq = 0;
  for (std::size_t k = 0; k < items.size(); k += 4) {
    const auto n = std::min<std::size_t>(4, items.size() - k);
    out.push_back(
        encode_payload({attempt, 1, 0, seq++}, std::span<const item>(items.data() + k, n)));
  }
  return out;
}

void must(const status& s) {
  if (!s.ok()) {
    std::cerr << "bench failed: " << s.message << "\n";
    std::exit(1);
  }
}

/// Best wall time of each function over `reps` rounds that run them in turn
/// (after one warm-up round), so that all see the same machine conditions.
/// `setup[k]`, when set, runs untimed before each run of `fs[k]` (an apply
/// starts from the old version: an overwrite applied to the state it writes
/// stores nothing and would time a no-op).
/// `check[k]`, when set, runs untimed after each run of `fs[k]` (the
/// byte-for-byte comparison of what it applied with a dense refit).
void interleaved(int reps, std::vector<std::function<void()>> fs, std::vector<double*> out,
                 std::vector<std::function<void()>> setup = {},
                 std::vector<std::function<void()>> check = {}) {
  for (auto* o : out) *o = 1e300;
  setup.resize(fs.size());
  check.resize(fs.size());
  for (int r = 0; r <= reps; ++r)
    for (std::size_t k = 0; k < fs.size(); ++k) {
      if (setup[k]) setup[k]();
      const auto t0 = std::chrono::steady_clock::now();
      fs[k]();
      const auto t1 = std::chrono::steady_clock::now();
      if (r > 0) *out[k] = std::min(*out[k], std::chrono::duration<double>(t1 - t0).count());
      if (check[k]) check[k]();
    }
}

/// `v` with the XOR items applied: the new version every delta of the bench
/// leads to (its overwrite items write the same values).
tensor_set apply_xors(const tensor_set& v, const std::vector<item>& xors) {
  tensor_set out = v;
  std::map<std::string, std::size_t> at;
  for (std::size_t i = 0; i < out.tensors().size(); ++i) at[out.tensors()[i].meta.name] = i;
  for (const auto& it : xors) {
    auto& t = out.tensors()[at.at(it.tensor.name)];
    const std::size_t w = width_of(it.tensor.dtype);
    for (std::size_t k = 0; k < it.indices.size(); ++k)
      for (std::size_t b = 0; b < w; ++b) t.bytes[it.indices[k] * w + b] ^= it.values[k * w + b];
  }
  return out;
}

/// Exit 1 unless `r`'s storage equals `ref`'s byte for byte (`what` names the
/// apply for the message).
template <class Receiver>
void must_equal(const Receiver& r, const Receiver& ref, const std::string& what) {
  const auto diff = bench::storage_difference(r.storage(), ref.storage());
  if (diff.empty()) return;
  std::cerr << "dcr-bench-apply: " << what << ": " << diff << "\n";
  std::exit(1);
}

struct row {
  std::string loader;
  std::uint64_t tp;
  double pct;
  std::uint64_t entries, storage_bytes;
  double dense_s, xor_s, ow_s, ingest_s, memcpy_s;
  double xor_all_s = 0, ow_all_s = 0; ///< the same applies on every hardware thread
  double floor_s = 0;
  double touched_pct = 0; ///< % of the storage's 64-byte lines that hold a change
};

/// The apply floor of one receiver and one delta (see the file comment).
class touched_line_floor {
public:
  /// `r` must hold the state the delta applies to; `apply` applies it (the
  /// constructor applies it and then `restore`s the storage).
  template <class Receiver>
  touched_line_floor(Receiver& r, const std::function<void()>& apply,
                     const std::function<void()>& restore, const std::vector<item>& items)
      : items_(&items) {
    const auto& st = r.storage();
    std::vector<std::vector<std::byte>> before;
    for (std::size_t i = 0; i < st.size(); ++i) before.push_back(st[i].bytes);
    apply();
    std::size_t all = 0, touched = 0;
    for (std::size_t i = 0; i < st.size(); ++i) {
      const auto& b = st[i].bytes;
      const auto head = static_cast<std::size_t>(reinterpret_cast<std::uintptr_t>(b.data()) % 64);
      auto ls = bench::line_set::diff(before[i].data(), b.data(), b.size(), head);
      all += ls.lines;
      touched += ls.count;
      scratch_.emplace_back(
          static_cast<std::byte*>(std::aligned_alloc(64, 64 * std::max<std::size_t>(ls.lines, 1))));
      std::memset(scratch_.back().get(), 0, 64 * ls.lines);
      lines_.push_back(std::move(ls));
    }
    restore();
    touched_pct = all ? 100.0 * static_cast<double>(touched) / static_cast<double>(all) : 0;
  }

  /// One floor run: the touched lines' read-modify-writes (`store`: stores
  /// only), then the values read.
  void run(std::uint64_t delta, bool store) {
    for (std::size_t i = 0; i < lines_.size(); ++i)
      if (store)
        bench::touch_lines<true>(scratch_[i].get(), lines_[i], delta);
      else
        bench::touch_lines<false>(scratch_[i].get(), lines_[i], delta);
    std::uint64_t acc = 0;
    for (const auto& it : *items_) acc |= bench::read_one(it.values.data(), it.values.size());
    bench::do_not_optimize(acc);
  }

  double touched_pct = 0;

private:
  struct free_deleter {
    void operator()(std::byte* p) const { std::free(p); }
  };
  const std::vector<item>* items_;
  std::vector<bench::line_set> lines_;
  std::vector<std::unique_ptr<std::byte, free_deleter>> scratch_;
};

} // namespace

/// `r.apply_items(items)` on `threads` apply threads (0 = every hardware thread).
template <class Receiver>
void apply_on(Receiver& r, const std::vector<item>& items, std::size_t threads) {
  r.set_apply_threads(threads);
  must(r.apply_items(items));
  r.set_apply_threads(1);
}

int main(int argc, char** argv) {
  const auto opt = bench::options::parse(argc, argv);
  const std::size_t all_threads = pipeline::resolve_threads(0);
  const std::uint64_t llc = llc_bytes();
  const int reps = opt.quick ? 2 : 5;
  const auto cfg = bench_model(opt.quick);
  const auto metas = canonical_tensors(cfg);
  splitmix g{0xA9917};
  const auto v = random_set(metas, g);
  std::uint64_t values = 0;
  for (auto& m : metas) values += m.numel();

  // Known only at run time, so the floor's stores cannot be folded away.
  const std::uint64_t delta = 1 + opt.rest.size();
  double store_floor_s = 0; // the floor's store-only variant; the floor is the better of the two
  std::vector<row> rows;
  std::vector<item> xors, ows;
  std::uint64_t attempt = 0;
  // --change-pct P: one change rate instead of 1.2, 3 and 5 %.
  std::vector<double> pcts = {1.2, 3.0, 5.0};
  for (std::size_t i = 0; i + 1 < opt.rest.size(); ++i)
    if (opt.rest[i] == "--change-pct") pcts = {std::stod(opt.rest[i + 1])};
  for (double pct : pcts) {
    make_delta(v, pct, g, xors, ows);
    const tensor_set next = apply_xors(v, xors);
    std::uint64_t entries = 0;
    for (auto& it : xors) entries += it.size();
    const auto payloads = to_payloads(xors, 0);
    for (std::uint64_t tp : {1, 2}) {
      receiver<loaders::vllm_style_loader> r(
          loaders::vllm_style_loader(cfg, loaders::vllm_tp_rank(tp, 0)), metas);
      row x{"vllm_style", tp, pct, entries, r.storage().nbytes(), 0, 0, 0, 0, 0};
      // The reference every apply must equal: a dense refit of the new version.
      receiver<loaders::vllm_style_loader> ref(
          loaders::vllm_style_loader(cfg, loaders::vllm_tp_rank(tp, 0)), metas);
      ref.dense_refit(next);
      const std::string rank =
          "vllm_style TP " + std::to_string(tp) + " at " + bench::fmt(pct, 1) + " %";
      auto verify = [&](const char* what) {
        return [&, what] { must_equal(r, ref, std::string(what) + ", " + rank); };
      };
      r.dense_refit(v);
      touched_line_floor fl(
          r, [&] { must(r.apply_items(xors)); }, [&] { r.dense_refit(v); }, xors);
      x.touched_pct = fl.touched_pct;
      const std::function<void()> old = [&] { r.dense_refit(v); };
      interleaved(
          reps,
          {[&] { r.dense_refit(v); }, [&] { must(r.apply_items(xors)); },
           [&] { must(r.apply_items(ows)); }, [&] { fl.run(delta, false); },
           [&] { fl.run(delta, true); }, [&] { apply_on(r, xors, 0); },
           [&] { apply_on(r, ows, 0); }},
          {&x.dense_s, &x.xor_s, &x.ow_s, &x.floor_s, &store_floor_s, &x.xor_all_s, &x.ow_all_s},
          {{}, old, old, {}, {}, old, old},
          {{},
           verify("XOR apply"),
           verify("overwrite apply"),
           {},
           {},
           verify("XOR apply on every thread"),
           verify("overwrite apply on every thread")});
      x.floor_s = std::min(x.floor_s, store_floor_s);
      // Ingestion: fresh payloads per run (a new attempt each), built outside the timed region.
      std::vector<std::vector<std::byte>> fresh;
      x.ingest_s = 1e300;
      for (int k = 0; k < reps + 1; ++k) {
        fresh = to_payloads(xors, ++attempt);
        r.dense_refit(v); // from the old version, as every timed apply
        const auto t0 = std::chrono::steady_clock::now();
        for (auto& p : fresh) must(r.stage(p));
        must(r.apply_staged());
        const auto t1 = std::chrono::steady_clock::now();
        if (k > 0)
          x.ingest_s = std::min(x.ingest_s, std::chrono::duration<double>(t1 - t0).count());
        must_equal(r, ref, "stage + decode + apply, " + rank);
      }
      x.memcpy_s = bench::memcpy_seconds(static_cast<std::size_t>(x.storage_bytes), reps);
      rows.push_back(x);
    }
    // Cast/transpose loader: XOR where allowed, overwrite on the FP32 casts.
    {
      receiver<loaders::cast_transpose_loader> r(loaders::cast_transpose_loader(cfg), metas);
      std::vector<item> mixed;
      for (std::size_t k = 0; k < xors.size(); ++k)
        mixed.push_back(r.xor_allowed(xors[k].tensor.name) ? xors[k] : ows[k]);
      row x{"cast_transpose", 1, pct, entries, r.storage().nbytes(), 0, 0, 0, 0, 0};
      receiver<loaders::cast_transpose_loader> ref(loaders::cast_transpose_loader(cfg), metas);
      ref.dense_refit(next);
      const std::string rank = "cast_transpose at " + bench::fmt(pct, 1) + " %";
      auto verify = [&](const char* what) {
        return [&, what] { must_equal(r, ref, std::string(what) + ", " + rank); };
      };
      r.dense_refit(v);
      touched_line_floor fl(
          r, [&] { must(r.apply_items(mixed)); }, [&] { r.dense_refit(v); }, mixed);
      x.touched_pct = fl.touched_pct;
      const std::function<void()> old = [&] { r.dense_refit(v); };
      interleaved(
          reps,
          {[&] { r.dense_refit(v); }, [&] { must(r.apply_items(mixed)); },
           [&] { must(r.apply_items(ows)); }, [&] { fl.run(delta, false); },
           [&] { fl.run(delta, true); }, [&] { apply_on(r, mixed, 0); },
           [&] { apply_on(r, ows, 0); }},
          {&x.dense_s, &x.xor_s, &x.ow_s, &x.floor_s, &store_floor_s, &x.xor_all_s, &x.ow_all_s},
          {{}, old, old, {}, {}, old, old},
          {{},
           verify("mixed apply"),
           verify("overwrite apply"),
           {},
           {},
           verify("mixed apply on every thread"),
           verify("overwrite apply on every thread")});
      x.floor_s = std::min(x.floor_s, store_floor_s);
      x.ingest_s = 0;
      x.memcpy_s = bench::memcpy_seconds(static_cast<std::size_t>(x.storage_bytes), reps);
      rows.push_back(x);
    }
  }

  if (opt.json) {
    std::cout << "{\"machine\":" << bench::json_string(bench::machine_description())
              << ",\"values\":" << values << ",\"rows\":[";
    bool first = true;
    for (auto& x : rows) {
      if (x.loader != "vllm_style" || x.tp != 1) continue;
      std::cout << (first ? "" : ",") << "{\"change_pct\":" << x.pct
                << ",\"ratio_to_dense\":" << x.xor_s / x.dense_s
                << ",\"overwrite_ratio_to_dense\":" << x.ow_s / x.dense_s
                << ",\"ingest_ratio_to_dense\":" << x.ingest_s / x.dense_s
                << ",\"apply_s\":" << x.xor_s << ",\"dense_s\":" << x.dense_s
                << ",\"entries\":" << x.entries << ",\"floor_s\":" << x.floor_s
                << ",\"ratio_to_floor\":" << x.xor_s / x.floor_s
                << ",\"overwrite_ratio_to_floor\":" << x.ow_s / x.floor_s
                << ",\"touched_lines_pct\":" << x.touched_pct
                << ",\"storage_bytes\":" << x.storage_bytes << ",\"llc_bytes\":" << llc
                << ",\"floor_in_cache\":" << (in_cache(x.storage_bytes, llc) ? "true" : "false")
                << ",\"threads\":" << all_threads << ",\"one_thread_s\":" << x.xor_s
                << ",\"all_threads_s\":" << x.xor_all_s
                << ",\"scaling\":" << bench::fmt(x.xor_s / x.xor_all_s, 3)
                << ",\"overwrite_all_threads_s\":" << x.ow_all_s
                << ",\"overwrite_scaling\":" << bench::fmt(x.ow_s / x.ow_all_s, 3) << "}";
      first = false;
    }
    std::cout << "]}\n";
    return 0;
  }
  std::ostream& os = std::cout;
  if (opt.markdown) os << "\n## Receiver apply vs dense refit (`dcr-bench-apply`)\n\n";
  os << "Model: Llama-style BF16, " << values << " values (" << bench::fmt(values * 2 / 1e6, 1)
     << " MB); uniform random changes, one item per canonical tensor, every item sent to every "
        "rank.\n"
     << "Machine: " << bench::machine_description() << ". Best of " << reps << " runs.\n"
     << (opt.markdown ? "\n" : "")
     << "Floor = a read-modify-write (or a store, when faster) of one 64-bit word in every 64-byte "
        "line of "
        "the rank's storage that holds a change, plus a streaming read of the items' value bytes "
        "(not their indices), measured in "
        "the same run; × floor = apply time / floor. Last-level cache: "
     << bench::fmt(static_cast<double>(llc) / 1e6, 1)
     << " MB; \"(in cache)\": storage under twice the cache, whose floor is cache hits, not "
        "memory traffic (the ≤ 2.5× target is for storage well beyond the cache).\n";
  if (opt.markdown) os << "\n";
  os << "\nvLLM-style loader (all paths representation preserving; XOR items):\n\n";
  bench::table t({"TP", "change %", "entries", "storage MB", "lines touched %", "dense ms",
                  "memcpy ms", "floor ms", "XOR apply ms", "XOR / dense", "XOR × floor",
                  "overwrite ms", "overwrite / dense", "overwrite × floor", "stage+decode+apply ms",
                  "ingest / dense"});
  for (auto& x : rows)
    if (x.loader == "vllm_style")
      t.add({std::to_string(x.tp), bench::fmt(x.pct, 1), std::to_string(x.entries),
             bench::fmt(x.storage_bytes / 1e6, 1), bench::fmt(x.touched_pct, 1),
             bench::fmt(x.dense_s * 1e3), bench::fmt(x.memcpy_s * 1e3), bench::fmt(x.floor_s * 1e3),
             bench::fmt(x.xor_s * 1e3), bench::fmt(x.xor_s / x.dense_s, 3),
             floor_cell(x.xor_s / x.floor_s, x.storage_bytes, llc), bench::fmt(x.ow_s * 1e3),
             bench::fmt(x.ow_s / x.dense_s, 3),
             floor_cell(x.ow_s / x.floor_s, x.storage_bytes, llc), bench::fmt(x.ingest_s * 1e3),
             bench::fmt(x.ingest_s / x.dense_s, 3)});
  t.print(os, opt.markdown);
  os << "\nCast/transpose loader (transposed fused QKV, o_proj, down_proj: XOR; FP32 norms and "
        "lm_head: overwrite, "
        "O(tensor) per item):\n\n";
  bench::table t2({"change %", "entries", "storage MB", "lines touched %", "dense ms", "floor ms",
                   "mixed apply ms", "mixed / dense", "mixed × floor", "all-overwrite ms",
                   "all-overwrite / dense", "all-overwrite × floor"});
  for (auto& x : rows)
    if (x.loader == "cast_transpose")
      t2.add({bench::fmt(x.pct, 1), std::to_string(x.entries), bench::fmt(x.storage_bytes / 1e6, 1),
              bench::fmt(x.touched_pct, 1), bench::fmt(x.dense_s * 1e3),
              bench::fmt(x.floor_s * 1e3), bench::fmt(x.xor_s * 1e3),
              bench::fmt(x.xor_s / x.dense_s, 3),
              floor_cell(x.xor_s / x.floor_s, x.storage_bytes, llc), bench::fmt(x.ow_s * 1e3),
              bench::fmt(x.ow_s / x.dense_s, 3),
              floor_cell(x.ow_s / x.floor_s, x.storage_bytes, llc)});
  t2.print(os, opt.markdown);

  os << "\n"
     << (opt.markdown ? "### Thread scaling\n\n" : "Thread scaling: ") << "the applies above on "
     << all_threads << " apply threads (`receiver_options::apply_threads` = 0; "
     << std::thread::hardware_concurrency()
     << " hardware threads) vs 1 thread, interleaved in the same rounds; items of one storage "
        "group (fused parameters) stay on one thread; scaling = 1-thread time / all-thread "
        "time; M entries/s = entries / apply time.\n\n";
  bench::table t3({"loader", "TP", "change %", "apply", "1 thread ms", "M entries/s (1)",
                   "all threads ms", "M entries/s (all)", "scaling"});
  for (auto& x : rows) {
    const bool cast = x.loader == "cast_transpose";
    auto add = [&](const char* what, double one, double all) {
      t3.add({x.loader, std::to_string(x.tp), bench::fmt(x.pct, 1), what, bench::fmt(one * 1e3),
              bench::fmt(static_cast<double>(x.entries) / one / 1e6, 1), bench::fmt(all * 1e3),
              bench::fmt(static_cast<double>(x.entries) / all / 1e6, 1), bench::fmt(one / all, 2)});
    };
    add(cast ? "mixed" : "XOR", x.xor_s, x.xor_all_s);
    add(cast ? "all-overwrite" : "overwrite", x.ow_s, x.ow_all_s);
  }
  t3.print(os, opt.markdown);
  return 0;
}
