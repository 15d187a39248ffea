// dcr-plan: where does each weight go? For a Hugging Face config.json and a
// rollout (vLLM) or training (Megatron) layout, prints every rank's
// parameters and, for each canonical tensor, which box of it lands in which
// box of which parameter. Rollout ranks come from a dry run of the vLLM-style
// loader (the receiver's prewarm), training ranks from the Megatron source
// plan. Ranks are listed DP-major, then PP, then TP.
//
//   dcr-plan CONFIG.json rollout [--tensor-parallel-size N] [--pipeline-parallel-size N]
//            [--data-parallel-size N] [--enable-expert-parallel]
//            [--expert-placement-strategy linear|round_robin] [--pp-layer-partition A,B,..]
//            [--json]
//   dcr-plan CONFIG.json training [--tp N] [--pp N] [--ep N] [--etp N] [--dp N] [--vocab-block N]
//            [--first-stage-layers N] [--last-stage-layers N] [--json]
//
// VLLM_PP_LAYER_PARTITION is honoured when --pp-layer-partition is not given.
// Without --etp a MoE model's expert-tensor-parallel size is --tp, as in
// Megatron-Core (expert_tensor_parallel_size defaults to the TP size).
// The rollout dry run records the loader's copies against metadata-only
// storage (`plan_store`): no parameter or input bytes are allocated, so any
// model size plans in the memory of its plan.
// Exit status: 0 success, 1 a configuration or layout dcr refuses, 2 usage.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "dcr/loaders/vllm_style.hpp"
#include "dcr/model/hf_config.hpp"
#include "dcr/model/trainer_layout.hpp"
#include "dcr/receiver/plan.hpp"
#include "dcr/source/plan.hpp"

using namespace dcr;

namespace {

using box = std::vector<std::pair<std::uint64_t, std::uint64_t>>; // [start, len] per dimension

struct param_out {
  std::string name;
  std::vector<std::uint64_t> shape;
  dtype_id dtype;
};
struct copy_out {
  std::string tensor, param;
  box from, to;
};
struct rank_out {
  std::uint64_t rank = 0, tp_rank = 0, pp_rank = 0, dp_rank = 0, ep_rank = 0;
  std::vector<param_out> params;
  std::vector<copy_out> copies;
  std::vector<std::string> skipped;
};

[[noreturn]] void usage(const std::string& why) {
  std::cerr << "dcr-plan: " << why << "\n"
            << "usage: dcr-plan CONFIG.json rollout|training [layout flags] [--json]\n";
  std::exit(2);
}

/// The box of a row-major tensor of `shape` that a strided view (element
/// `offset`, `layout`) covers, or nothing when the view is not a box (a
/// transposed or strided view). View dimensions of extent 1 and tensor
/// dimensions the view drops (an expert index) become [start, 1].
std::optional<box> box_of(const std::vector<std::uint64_t>& shape, std::int64_t offset,
                          const strided_layout& l) {
  const std::size_t n = shape.size();
  std::vector<std::int64_t> stride(n, 1);
  for (std::size_t d = n; d-- > 1;) stride[d - 1] = stride[d] * static_cast<std::int64_t>(shape[d]);
  box b(n);
  std::int64_t rest = offset;
  for (std::size_t d = 0; d < n; ++d) {
    b[d] = {static_cast<std::uint64_t>(rest / stride[d]), 1};
    rest %= stride[d];
  }
  std::vector<bool> used(n, false);
  for (std::size_t k = 0; k < l.rank; ++k) {
    if (l.extents[k] == 1) continue;
    bool found = false;
    for (std::size_t d = 0; d < n && !found; ++d)
      if (!used[d] && shape[d] > 1 && stride[d] == l.strides[k]) {
        used[d] = found = true;
        b[d].second = static_cast<std::uint64_t>(l.extents[k]);
        if (b[d].first + b[d].second > shape[d]) return std::nullopt;
      }
    if (!found) return std::nullopt;
  }
  return b;
}

std::vector<rank_out> rollout(const model_config& c, const loaders::vllm_parallel_config& p) {
  const auto metas = canonical_tensors(c);
  std::vector<rank_out> out;
  for (std::uint64_t r = 0; r < p.world_size(); ++r) {
    const auto lay = loaders::vllm_layout::of_rank(p, r);
    loaders::vllm_style_loader loader(c, lay);
    plan_store store; // shapes and address ranges only: no parameter bytes
    const copy_plan plan = plan_copies(loader, store, metas);
    rank_out ro{r,  lay.tp_rank, lay.pp_rank, lay.dp_rank, loader.moe_parallel().ep_rank,
                {}, {},          {}};
    for (std::size_t i = 0; i < store.size(); ++i)
      ro.params.push_back({store[i].meta.name, store[i].meta.shape, store[i].meta.dtype});
    for (auto& tp : plan.tensors) {
      if (tp.skipped) ro.skipped.push_back(tp.meta.name);
      for (auto& cp : tp.copies) {
        const auto& pm = store[cp.param].meta;
        auto from = cp.alias ? box_of(tp.meta.shape, cp.src_offset, cp.src_layout) : std::nullopt;
        auto to = box_of(pm.shape, cp.dst_offset, cp.dst_layout);
        if (!from || !to)
          throw error(errc::unsupported_loader,
                      "tensor " + tp.meta.name + ": a copy is not box to box");
        ro.copies.push_back({tp.meta.name, pm.name, *from, *to});
      }
    }
    out.push_back(std::move(ro));
  }
  return out;
}

std::vector<rank_out> training(const model_config& c, const trainer_layout& l) {
  const auto plan = megatron_plan(c, l);
  std::vector<rank_out> out;
  const auto T = l.ranks_per_stage();
  for (std::uint64_t dp = 0; dp < l.dp; ++dp)
    for (std::uint64_t pp = 0; pp < l.pp; ++pp)
      for (std::uint64_t tp = 0; tp < l.tp; ++tp) {
        const auto r = static_cast<std::uint32_t>(l.rank(pp, dp, tp));
        const auto i = r % T;
        rank_out ro{r, tp, pp, dp, (i / l.etp) % l.ep, {}, {}, {}};
        std::vector<bool> held(plan.canonical.size(), false);
        for (auto s : plan.rank_shards[r]) {
          const auto& sh = plan.shards[s];
          const auto& name = sh.param_on(r);
          ro.params.push_back({name, sh.shape, sh.dtype});
          if (!sh.map) continue;
          const auto lc = sh.map->local_cols();
          for (auto& pc : sh.map->pieces()) {
            const auto& cm = plan.canonical[pc.tensor];
            held[pc.tensor] = true;
            copy_out co{cm.name, name, {}, {}};
            if (cm.shape.size() == 1)
              co.from = {{pc.canonical_row, pc.rows}};
            else
              co.from = {{pc.canonical_row, pc.rows}, {pc.canonical_col, lc}};
            if (sh.shape.size() == 1)
              co.to = {{pc.local_row, pc.rows}};
            else
              co.to = {{pc.local_row, pc.rows}, {0, lc}};
            ro.copies.push_back(std::move(co));
          }
        }
        for (std::size_t t = 0; t < plan.canonical.size(); ++t)
          if (!held[t]) ro.skipped.push_back(plan.canonical[t].name);
        out.push_back(std::move(ro));
      }
  return out;
}

std::string json_string(const std::string& s) {
  std::string o = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') o += '\\';
    if (static_cast<unsigned char>(ch) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", ch);
      o += buf;
    } else {
      o += ch;
    }
  }
  return o + "\"";
}

std::string json_box(const box& b) {
  std::string o = "[";
  for (std::size_t i = 0; i < b.size(); ++i)
    o += (i ? ",[" : "[") + std::to_string(b[i].first) + "," + std::to_string(b[i].second) + "]";
  return o + "]";
}

std::string text_box(const box& b) {
  std::string o = "[";
  for (std::size_t i = 0; i < b.size(); ++i)
    o += (i ? ", " : "") + std::to_string(b[i].first) + ":" +
         std::to_string(b[i].first + b[i].second);
  return o + "]";
}

std::string shape_text(const std::vector<std::uint64_t>& s, const char* sep) {
  std::string o = "[";
  for (std::size_t i = 0; i < s.size(); ++i) o += (i ? sep : "") + std::to_string(s[i]);
  return o + "]";
}

void print_json(const std::string& side, const std::vector<rank_out>& ranks) {
  std::ostream& o = std::cout;
  o << "{\"side\":" << json_string(side) << ",\"ranks\":[";
  for (std::size_t k = 0; k < ranks.size(); ++k) {
    const auto& r = ranks[k];
    o << (k ? "," : "") << "{\"rank\":" << r.rank << ",\"tp_rank\":" << r.tp_rank
      << ",\"pp_rank\":" << r.pp_rank << ",\"dp_rank\":" << r.dp_rank
      << ",\"ep_rank\":" << r.ep_rank << ",\"params\":[";
    for (std::size_t i = 0; i < r.params.size(); ++i)
      o << (i ? "," : "") << "{\"name\":" << json_string(r.params[i].name)
        << ",\"shape\":" << shape_text(r.params[i].shape, ",")
        << ",\"dtype\":" << json_string(std::string(name_of(r.params[i].dtype))) << "}";
    o << "],\"copies\":[";
    for (std::size_t i = 0; i < r.copies.size(); ++i) {
      const auto& c = r.copies[i];
      o << (i ? "," : "") << "{\"tensor\":" << json_string(c.tensor)
        << ",\"from\":" << json_box(c.from) << ",\"param\":" << json_string(c.param)
        << ",\"to\":" << json_box(c.to) << "}";
    }
    o << "],\"skipped\":[";
    for (std::size_t i = 0; i < r.skipped.size(); ++i)
      o << (i ? "," : "") << json_string(r.skipped[i]);
    o << "]}";
  }
  o << "]}\n";
}

void print_text(const std::string& side, const std::vector<rank_out>& ranks) {
  for (auto& r : ranks) {
    std::cout << side << " rank " << r.rank << " (dp " << r.dp_rank << ", pp " << r.pp_rank
              << ", tp " << r.tp_rank << ", ep " << r.ep_rank << "): " << r.params.size()
              << " parameters, " << r.copies.size() << " copies, " << r.skipped.size()
              << " canonical tensors skipped\n";
    for (auto& p : r.params)
      std::cout << "  param " << p.name << " " << shape_text(p.shape, ", ") << " "
                << name_of(p.dtype) << "\n";
    for (auto& c : r.copies) { // rollout: canonical -> parameter; training: parameter -> canonical
      if (side == "rollout")
        std::cout << "  copy  " << c.tensor << text_box(c.from) << " -> " << c.param
                  << text_box(c.to) << "\n";
      else
        std::cout << "  copy  " << c.param << text_box(c.to) << " -> " << c.tensor
                  << text_box(c.from) << "\n";
    }
  }
}

std::uint64_t number(const std::string& flag, const char* v) {
  if (!v) usage(flag + " needs a value");
  const std::string s(v);
  if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string::npos)
    usage(flag + ": not a non-negative integer: " + s);
  return std::stoull(s);
}

} // namespace

int main(int argc, char** argv) {
  if (argc < 3) usage("a config.json and a side are required");
  const std::string path = argv[1], side = argv[2];
  if (side != "rollout" && side != "training")
    usage("side must be rollout or training, not " + side);
  loaders::vllm_parallel_config vp;
  if (const char* env = std::getenv("VLLM_PP_LAYER_PARTITION")) vp.pp_layer_partition = env;
  trainer_layout tl;
  bool json = false, etp_given = false;
  for (int i = 3; i < argc; ++i) {
    const std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    auto num = [&] {
      ++i;
      return number(a, v);
    };
    if (a == "--json")
      json = true;
    else if (side == "rollout" && a == "--tensor-parallel-size")
      vp.tensor_parallel_size = num();
    else if (side == "rollout" && a == "--pipeline-parallel-size")
      vp.pipeline_parallel_size = num();
    else if (side == "rollout" && a == "--data-parallel-size")
      vp.data_parallel_size = num();
    else if (side == "rollout" && a == "--enable-expert-parallel")
      vp.enable_expert_parallel = true;
    else if (side == "rollout" && a == "--expert-placement-strategy") {
      if (!v || (std::string(v) != "linear" && std::string(v) != "round_robin"))
        usage(a + ": linear or round_robin");
      vp.expert_placement_strategy = std::string(v) == "linear"
                                         ? loaders::expert_placement::linear
                                         : loaders::expert_placement::round_robin;
      ++i;
    } else if (side == "rollout" && a == "--pp-layer-partition") {
      if (!v) usage(a + " needs a value");
      vp.pp_layer_partition = v;
      ++i;
    } else if (side == "training" && a == "--tp")
      tl.tp = num();
    else if (side == "training" && a == "--pp")
      tl.pp = num();
    else if (side == "training" && a == "--ep")
      tl.ep = num();
    else if (side == "training" && a == "--etp") {
      tl.etp = num();
      etp_given = true;
    } else if (side == "training" && a == "--dp")
      tl.dp = num();
    else if (side == "training" && a == "--vocab-block")
      tl.vocab_block = num();
    else if (side == "training" && a == "--first-stage-layers")
      tl.first_stage_layers = num();
    else if (side == "training" && a == "--last-stage-layers")
      tl.last_stage_layers = num();
    else
      usage("unknown option for " + side + ": " + a);
  }
  try {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw error(errc::io, "cannot read " + path);
    std::stringstream text;
    text << in.rdbuf();
    const model_config c = model_config_from_hf_json(text.str());
    if (c.is_moe() && !etp_given) tl.etp = tl.tp;
    const auto ranks = side == "rollout" ? rollout(c, vp) : training(c, tl);
    if (json)
      print_json(side, ranks);
    else
      print_text(side, ranks);
  } catch (const error& e) {
    std::cerr << "dcr-plan: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
