// Payload size and speed of every coding against peer encodings.
//
// A synthetic BF16 checkpoint (20 tensors of 1024x1024 = 20.97M values,
// N(0, 0.02)) and two workloads: the paper's stress case (1.2/3/5% of
// elements chosen uniformly and scaled by 1 + 1e-2 N(0,1)), and realistic
// training (FP32 master + AdamW lr 1e-6, random gradients, BF16 RNE after
// each of 5 steps; the row sums the 5 consecutive refits). Items carry XOR
// masks ("xor" rows, the scheme+filter names without prefix) or zigzag
// integer differences ("add:" rows). Rows: each (location scheme, value
// filter) coding of both, "v1" being runs + smallest-word gaps without
// filter and XOR masks; "xor_default" / "add_default" the encoder defaults
// with one encoding; "default" what the builder sends by default: encoder
// defaults, per item XOR or add by the byte-plane entropy estimate
// (`stages::choose_smaller`); "best_per_item" the same with each item's
// encoding picked by compressing both (the reference for the estimate);
// full-buffer XOR + zstd-1; int32 index + BF16 value + zstd-1; the
// zeroth-order entropy of (gaps, masks) and of (gaps, add words).
// Throughput is checkpoint bytes per second, next to memcpy of the
// checkpoint measured in the same run.
#include <cmath>
#include <cstdint>
#include <iostream>
#include <map>
#include <unordered_map>
#include <vector>

#include "bench_common.hpp"
#include "dcr/codec/payload.hpp"
#include "dcr/core/detect.hpp"
#include "dcr/source/stages.hpp"
#include "examples/common/simulator.hpp"

namespace {

using namespace dcr;

struct checkpoint {
  std::vector<tensor_meta> tensors;
  std::vector<std::uint16_t> words; // all tensors back to back
  std::size_t per_tensor = 0;
};

/// One refit: old and new words of the whole checkpoint.
struct refit {
  std::vector<std::uint16_t> before, after;
};

/// Items of one refit, values of `enc` (XOR masks or add differences).
std::vector<item> make_items(const checkpoint& c, const refit& r, value_encoding enc) {
  std::vector<item> items;
  for (std::size_t t = 0; t < c.tensors.size(); ++t) {
    const auto o = std::span(r.before).subspan(t * c.per_tensor, c.per_tensor);
    const auto n = std::span(r.after).subspan(t * c.per_tensor, c.per_tensor);
    item it;
    it.tensor = c.tensors[t];
    it.encoding = enc;
    detect_changes<std::uint16_t>(o, n, 0, it.indices);
    it.values.resize(it.indices.size() * 2);
    auto* v = it.values.data();
    for (std::size_t k = 0; k < it.indices.size(); ++k) {
      const auto i = it.indices[k];
      const std::uint16_t m = enc == value_encoding::add ? codec::add_delta::make(o[i], n[i])
                                                         : static_cast<std::uint16_t>(o[i] ^ n[i]);
      std::memcpy(v + 2 * k, &m, 2);
    }
    items.push_back(std::move(it));
  }
  return items;
}

struct result {
  std::size_t bytes = 0;
  double encode_s = 0, decode_s = 0;
};

double entropy_bits(const std::unordered_map<std::uint64_t, std::uint64_t>& hist, std::uint64_t n) {
  double h = 0;
  for (const auto& [k, c] : hist) {
    const double p = static_cast<double>(c) / static_cast<double>(n);
    h -= static_cast<double>(c) * std::log2(p);
  }
  return h;
}

struct coding {
  std::string name;
  encode_options opt;
  int items = 0; ///< 0: XOR, 1: add, 2: per item by estimate, 3: per item by compression
};

/// Per item the smaller of `x[t]` (XOR) and `a[t]` (add): by the entropy
/// estimate the builder uses, or (`exact`) by compressing both values
/// streams as the encoder would (filter, zstd level).
std::vector<item> choose(const std::vector<item>& x, const std::vector<item>& a,
                         const encode_options& opt, bool exact) {
  std::vector<item> out;
  for (std::size_t t = 0; t < x.size(); ++t) {
    item it = x[t];
    std::vector<std::byte> alt = a[t].values;
    if (!exact) {
      stages::choose_smaller(it, alt, value_encoding::add, opt.filter);
    } else {
      auto size = [&](const std::vector<std::byte>& v) {
        std::vector<std::byte> f(v.size());
        codec::apply_filter(opt.filter, v, 2, f);
        return codec::zstd_size(f, opt.zstd_level);
      };
      if (size(alt) < size(it.values)) it = a[t];
    }
    out.push_back(std::move(it));
  }
  return out;
}

} // namespace

int main(int argc, char** argv) {
  const auto opt = bench::options::parse(argc, argv);
  const std::size_t tensors = opt.quick ? 4 : 20, side = opt.quick ? 512 : 1024;
  const int reps = opt.quick ? 1 : 3;
  checkpoint c;
  c.per_tensor = side * side;
  for (std::size_t t = 0; t < tensors; ++t)
    c.tensors.push_back({"model.layers." + std::to_string(t) + ".mlp.down_proj.weight",
                         {side, side},
                         dtype_id::bf16});
  c.words = sim::normal_bf16(tensors * c.per_tensor, 0.02f, 42);
  const double ckpt_bytes = static_cast<double>(c.words.size() * 2);
  const double memcpy_s = bench::memcpy_seconds(c.words.size() * 2);

  std::vector<std::pair<std::string, std::vector<refit>>> workloads;
  for (double f : {0.012, 0.03, 0.05}) {
    refit r{c.words, c.words};
    sim::stress_update(r.after, f, 1e-2, 7 + static_cast<std::uint64_t>(f * 1000));
    workloads.push_back({"stress_" + bench::fmt(100 * f, 1) + "%", {std::move(r)}});
  }
  {
    sim::adamw_trainer tr(c.words, 11);
    std::vector<refit> steps;
    std::vector<std::uint16_t> prev = c.words;
    for (int s = 0; s < 5; ++s) {
      tr.step();
      std::vector<std::uint16_t> now(tr.bf16().begin(), tr.bf16().end());
      steps.push_back({prev, now});
      prev = std::move(now);
    }
    workloads.push_back({"adamw_5_steps", std::move(steps)});
  }

  std::vector<coding> codings;
  codings.push_back({"v1", {1, codec::location_scheme::gaps, codec::value_filter::none}, 0});
  codings.push_back({"default", {}, 2});
  codings.push_back({"best_per_item", {}, 3});
  codings.push_back({"xor_default", {}, 0});
  codings.push_back({"add_default", {}, 1});
  for (int e = 0; e < 2; ++e)
    for (auto s : {codec::location_scheme::gaps, codec::location_scheme::planes,
                   codec::location_scheme::varint, codec::location_scheme::escape_u8})
      for (auto f : {codec::value_filter::none, codec::value_filter::byte_planes})
        codings.push_back({std::string(e ? "add:" : "") + std::string(codec::to_string(s)) + "+" +
                               std::string(codec::to_string(f)),
                           {1, s, f},
                           e});

  struct out_row {
    std::string workload, coding;
    double changed = 0, bytes = 0, enc_s = 0, dec_s = 0, refits = 0;
    double items = 0, add_items = 0; ///< items encoded, of which add
  };
  std::vector<out_row> rows;
  for (auto& [wname, refits] : workloads) {
    std::vector<std::vector<item>> items, add_items, chosen, best;
    double changed = 0;
    for (auto& r : refits) {
      items.push_back(make_items(c, r, value_encoding::xor_mask));
      add_items.push_back(make_items(c, r, value_encoding::add));
      chosen.push_back(choose(items.back(), add_items.back(), {}, false));
      best.push_back(choose(items.back(), add_items.back(), {}, true));
      for (auto& it : items.back()) changed += static_cast<double>(it.size());
    }
    for (auto& cd : codings) {
      out_row o{wname, cd.name, changed};
      const auto& set = cd.items == 0   ? items
                        : cd.items == 1 ? add_items
                        : cd.items == 2 ? chosen
                                        : best;
      for (std::size_t k = 0; k < refits.size(); ++k) {
        std::vector<std::byte> p;
        o.enc_s += bench::best_seconds(reps, [&] {
          p = encode_payload({1, 1, 0, 0}, set[k], cd.opt);
        });
        decoded_payload d;
        o.dec_s += bench::best_seconds(reps, [&] { throw_if_failed(decode_payload(p, d)); });
        if (d.items != set[k]) throw error(errc::verification, cd.name + ": decode differs");
        o.bytes += static_cast<double>(p.size());
        for (auto& it : set[k]) o.add_items += it.encoding == value_encoding::add;
        o.items += static_cast<double>(set[k].size());
      }
      rows.push_back(o);
    }
    // Full-buffer XOR + zstd-1 (one frame per tensor), as slime sends.
    {
      out_row o{wname, "full_xor_zstd", changed};
      for (auto& r : refits) {
        std::vector<std::uint16_t> x(r.before.size());
        std::vector<std::vector<std::byte>> frames(tensors);
        o.enc_s += bench::best_seconds(reps, [&] {
          for (std::size_t i = 0; i < x.size(); ++i) x[i] = r.before[i] ^ r.after[i];
          for (std::size_t t = 0; t < tensors; ++t)
            frames[t] = codec::zstd_compress_or_throw(
                std::as_bytes(std::span(x).subspan(t * c.per_tensor, c.per_tensor)), 1);
        });
        std::vector<std::byte> back(c.per_tensor * 2);
        o.dec_s += bench::best_seconds(reps, [&] {
          for (auto& f : frames) throw_if_failed(codec::zstd_decompress(f, back));
        });
        for (auto& f : frames) o.bytes += static_cast<double>(f.size());
      }
      rows.push_back(o);
    }
    // int32 index + BF16 value arrays per tensor + zstd-1, as verl / PULSE send.
    {
      out_row o{wname, "index_value_zstd", changed};
      for (auto& its : items) {
        std::vector<std::vector<std::byte>> frames(its.size());
        std::vector<std::size_t> raw(its.size());
        o.enc_s += bench::best_seconds(reps, [&] {
          for (std::size_t t = 0; t < its.size(); ++t) {
            const auto& it = its[t];
            std::vector<std::byte> buf(it.size() * 6);
            for (std::size_t k = 0; k < it.size(); ++k) {
              const auto i32 = static_cast<std::uint32_t>(it.indices[k]);
              std::memcpy(buf.data() + 4 * k, &i32, 4);
            }
            // New values (not masks): these encodings overwrite.
            const auto base = t * c.per_tensor;
            for (std::size_t k = 0; k < it.size(); ++k) {
              std::uint16_t v;
              std::memcpy(&v, it.values.data() + 2 * k, 2);
              v ^= c.words[base + it.indices[k]];
              std::memcpy(buf.data() + 4 * it.size() + 2 * k, &v, 2);
            }
            raw[t] = buf.size();
            frames[t] = codec::zstd_compress_or_throw(buf, 1);
          }
        });
        o.dec_s += bench::best_seconds(reps, [&] {
          for (std::size_t t = 0; t < its.size(); ++t) {
            std::vector<std::byte> back(raw[t]);
            throw_if_failed(codec::zstd_decompress(frames[t], back));
          }
        });
        for (auto& f : frames) o.bytes += static_cast<double>(f.size());
      }
      rows.push_back(o);
    }
    // Zeroth-order entropy of gaps (first index counts from -1) and of masks
    // (XOR) or add words.
    for (int e = 0; e < 2; ++e) {
      out_row o{wname, e ? "entropy_bound_add" : "entropy_bound", changed};
      for (auto& its : e ? add_items : items) {
        std::unordered_map<std::uint64_t, std::uint64_t> gaps, masks;
        std::uint64_t n = 0;
        for (auto& it : its) {
          std::uint64_t prev = ~std::uint64_t{0};
          for (std::size_t k = 0; k < it.size(); ++k) {
            ++gaps[it.indices[k] - prev - 1];
            prev = it.indices[k];
            std::uint16_t m;
            std::memcpy(&m, it.values.data() + 2 * k, 2);
            ++masks[m];
            ++n;
          }
        }
        o.bytes += (entropy_bits(gaps, n) + entropy_bits(masks, n)) / 8;
      }
      rows.push_back(o);
    }
  }

  auto find = [&](const std::string& w, const std::string& cd) -> const out_row& {
    for (auto& r : rows)
      if (r.workload == w && r.coding == cd) return r;
    throw error(errc::not_found, cd);
  };
  const auto nref = [&](const std::string& w) {
    for (auto& [n, r] : workloads)
      if (n == w) return static_cast<double>(r.size());
    return 1.0;
  };
  auto mbps = [&](const out_row& r, double s) {
    return s > 0 ? nref(r.workload) * ckpt_bytes / s / 1e6 : 0.0;
  };
  if (opt.json) {
    std::cout << "{\"values\":" << c.words.size()
              << ",\"machine\":" << bench::json_string(bench::machine_description())
              << ",\"memcpy_mb_s\":" << ckpt_bytes / memcpy_s / 1e6 << ",\"rows\":[";
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const auto& r = rows[i];
      const double pct = 100 * r.bytes / (nref(r.workload) * ckpt_bytes);
      std::cout << (i ? "," : "") << "{\"workload\":" << bench::json_string(r.workload)
                << ",\"coding\":" << bench::json_string(r.coding) << ",\"payload_pct\":" << pct
                << ",\"bytes_per_change\":" << r.bytes / r.changed
                << ",\"payload_bytes\":" << r.bytes << ",\"changed\":" << r.changed
                << ",\"encode_mb_s\":" << mbps(r, r.enc_s)
                << ",\"decode_mb_s\":" << mbps(r, r.dec_s)
                << ",\"to_entropy\":" << r.bytes / find(r.workload, "entropy_bound").bytes
                << ",\"to_full_xor\":" << r.bytes / find(r.workload, "full_xor_zstd").bytes << "}";
    }
    std::cout << "]}\n";
    return 0;
  }
  if (opt.markdown) std::cout << "\n## Payload size by coding (dcr-bench-payload)\n\n";
  const char* li = opt.markdown ? "- " : "";
  std::cout << li << "inputs: BF16 checkpoint of " << tensors << " tensors " << side << "x" << side
            << " = " << c.words.size()
            << " values N(0, 0.02); XOR-mask items (add: zigzag-difference items), one "
               "payload per refit; zstd level 1\n"
            << li
            << "workloads: stress_F = fraction F scaled by 1 + 1e-2 N(0,1); adamw_5_steps = 5 "
               "consecutive AdamW "
               "refits (lr 1e-6), summed\n"
            << li << "MB/s = checkpoint bytes per second (memcpy of the checkpoint: "
            << bench::fmt(ckpt_bytes / memcpy_s / 1e6, 0) << " MB/s)\n"
            << li << "machine: " << bench::machine_description() << "\n\n";
  bench::table t({"workload", "coding", "changed", "payload B", "payload %", "B/change",
                  "x entropy", "x full XOR", "encode MB/s", "decode MB/s"});
  for (const auto& r : rows) {
    const bool timed = r.coding.rfind("entropy_bound", 0) != 0;
    t.add({r.workload, r.coding, bench::fmt(r.changed, 0), bench::fmt(r.bytes, 0),
           bench::fmt(100 * r.bytes / (nref(r.workload) * ckpt_bytes), 3),
           bench::fmt(r.bytes / r.changed, 3),
           bench::fmt(r.bytes / find(r.workload, "entropy_bound").bytes, 3),
           bench::fmt(r.bytes / find(r.workload, "full_xor_zstd").bytes, 3),
           timed ? bench::fmt(mbps(r, r.enc_s), 0) : "-",
           timed ? bench::fmt(mbps(r, r.dec_s), 0) : "-"});
  }
  t.print(std::cout, opt.markdown);
  double worst_entropy = 0, worst_full = 0;
  for (const auto& [w, r] : workloads) {
    const auto& d = find(w, "default");
    worst_entropy = std::max(worst_entropy, d.bytes / find(w, "entropy_bound").bytes);
    worst_full = std::max(worst_full, d.bytes / find(w, "full_xor_zstd").bytes);
  }
  // The add encoding against XOR, and the estimate against compressing both.
  double worst_add = 0, best_add = 1e9, worst_est = 0, worst_gap = 0;
  std::string worst_gap_at;
  std::map<std::string, double> total; // payload bytes of each coding over all workloads
  for (const auto& x : rows)
    if (x.coding != "best_per_item" && x.coding.rfind("entropy", 0) != 0)
      total[x.coding] += x.bytes;
  for (const auto& [w, r] : workloads) {
    const auto& d = find(w, "default");
    const double a = d.bytes / find(w, "xor_default").bytes;
    worst_add = std::max(worst_add, a);
    best_add = std::min(best_add, a);
    worst_est = std::max(worst_est, d.bytes / find(w, "best_per_item").bytes);
    for (const auto& x : rows)
      if (x.workload == w && total.count(x.coding) && d.bytes / x.bytes - 1 > worst_gap) {
        worst_gap = d.bytes / x.bytes - 1;
        worst_gap_at = w + ", " + x.coding;
      }
  }
  std::string smallest = "default";
  for (const auto& [name, bytes] : total)
    if (bytes < total["default"]) smallest = name;
  std::cout << "\n";
  for (const auto& [w, r] : workloads) {
    const auto& d = find(w, "default");
    std::cout << li << w << ": default (per-item choice) = "
              << bench::fmt(100 * d.bytes / find(w, "xor_default").bytes, 1) << "% of XOR-only, "
              << bench::fmt(100 * d.bytes / find(w, "add_default").bytes, 1) << "% of add-only, "
              << bench::fmt(100 * d.bytes / find(w, "best_per_item").bytes, 2)
              << "% of the per-item choice by compression; "
              << bench::fmt(100 * d.add_items / d.items, 0) << "% of items add\n";
  }
  std::cout << li << "goal: default smaller than XOR-only on every workload: "
            << (worst_add < 1 ? "met" : "NOT met") << " (" << bench::fmt(100 * (1 - worst_add), 1)
            << "% to " << bench::fmt(100 * (1 - best_add), 1) << "% smaller)\n"
            << li << "goal: estimate within 1% of choosing by compression: "
            << (worst_est <= 1.01 ? "met" : "NOT met") << " (worst "
            << bench::fmt(100 * (worst_est - 1), 2) << "% larger)\n"
            << li << "goal: default is the smallest coding over all workloads together: "
            << (smallest == "default" ? std::string("met")
                                      : "NOT met (" + smallest + " is smaller)")
            << "; on single workloads at most " << bench::fmt(100 * worst_gap, 2)
            << "% above the smallest coding"
            << (worst_gap_at.empty() ? std::string() : " (" + worst_gap_at + ")") << "\n";
  std::cout << li << "goal: default <= 1.10x entropy bound: "
            << (worst_entropy <= 1.10 ? "met" : "NOT met") << " (worst "
            << bench::fmt(worst_entropy, 3) << "x)\n"
            << li
            << "goal: default <= 0.5x full-buffer XOR: " << (worst_full <= 0.5 ? "met" : "NOT met")
            << " (worst " << bench::fmt(worst_full, 3)
            << "x; the entropy bound itself is about 0.5x)\n";
  return 0;
}
