// Checks dcr-plan: runs it on a small Qwen3-MoE-shaped config.json (uneven
// experts, a dense layer among MoE layers, odd vocabulary) for a rollout and
// a training layout, parses --json with dcr's JSON reader and checks the
// documented shape, the rank order (DP-major, then PP, then TP), that every
// box lies inside its tensor and parameter with equal element counts, that
// each rank lists every canonical tensor as copied or skipped (never both),
// and that the copies cover every canonical element; then the error exits.
// Usage: dcr-plan-check PATH/TO/dcr-plan
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "dcr/core/json.hpp"
#include "dcr/model/hf_config.hpp"

using namespace dcr;

namespace {

int failures = 0;
void check(bool ok, const std::string& what) {
  if (!ok) {
    ++failures;
    std::cerr << "FAIL: " << what << "\n";
  }
}

constexpr const char* config = R"({
  "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 64,
  "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
  "intermediate_size": 96, "moe_intermediate_size": 32, "num_experts": 6, "num_experts_per_tok": 2,
  "decoder_sparse_step": 1, "mlp_only_layers": [1], "vocab_size": 777, "tie_word_embeddings": false,
  "hidden_act": "silu", "torch_dtype": "bfloat16", "rms_norm_eps": 1e-06})";

struct run_result {
  int status = -1;
  std::string out;
};

run_result run(const std::string& cmd) {
  run_result r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[65536];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int st = ::pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

bool u64(const json_value* v, std::uint64_t& out) {
  return v && v->type == json_value::kind::number && v->as_u64(out);
}

/// A [[start, len], ...] box; empty on a malformed one.
std::vector<std::pair<std::uint64_t, std::uint64_t>> box(const json_value* v) {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> b;
  if (!v || !v->is_array()) return {};
  for (auto& d : v->items) {
    std::uint64_t s = 0, l = 0;
    if (!d.is_array() || d.items.size() != 2 || !u64(&d.items[0], s) || !u64(&d.items[1], l))
      return {};
    b.emplace_back(s, l);
  }
  return b;
}

void check_plan(const std::string& tool, const std::string& cfg_path, const std::string& side,
                const std::string& flags, std::uint64_t world) {
  const auto r = run("'" + tool + "' '" + cfg_path + "' " + side + " " + flags + " --json");
  check(r.status == 0, side + ": exit status " + std::to_string(r.status));
  json_value root;
  auto st = parse_json(r.out, root, "dcr-plan --json");
  check(st.ok(), side + ": output is JSON: " + st.message);
  if (!st.ok()) return;
  check(root.get("side") && root.get("side")->is_string() && root.get("side")->text == side,
        side + ": side");
  const auto* ranks = root.get("ranks");
  check(ranks && ranks->is_array() && ranks->items.size() == world, side + ": one entry per rank");
  if (!ranks || !ranks->is_array()) return;
  const auto c = model_config_from_hf_json(config);
  std::map<std::string, std::vector<std::uint64_t>> canon;
  std::map<std::string, std::vector<std::uint32_t>> covered;
  for (auto& m : canonical_tensors(c)) {
    canon[m.name] = m.shape;
    covered[m.name].assign(m.numel(), 0);
  }
  std::tuple<std::uint64_t, std::uint64_t, std::uint64_t> last{0, 0, 0};
  std::set<std::uint64_t> seen_ranks;
  for (std::size_t k = 0; k < ranks->items.size(); ++k) {
    const auto& rk = ranks->items[k];
    const std::string at = side + " rank entry " + std::to_string(k);
    std::uint64_t rank = 0, tp = 0, pp = 0, dp = 0, ep = 0;
    check(u64(rk.get("rank"), rank) && u64(rk.get("tp_rank"), tp) && u64(rk.get("pp_rank"), pp) &&
              u64(rk.get("dp_rank"), dp) && u64(rk.get("ep_rank"), ep),
          at + ": rank coordinates");
    check(seen_ranks.insert(rank).second && rank < world,
          at + ": rank numbers unique and in range");
    const std::tuple<std::uint64_t, std::uint64_t, std::uint64_t> key{dp, pp, tp};
    check(k == 0 || key > last, at + ": ranks listed DP-major, then PP, then TP");
    last = key;
    std::map<std::string, std::vector<std::uint64_t>> params;
    const auto* ps = rk.get("params");
    check(ps && ps->is_array() && !ps->items.empty(), at + ": params");
    if (ps && ps->is_array())
      for (auto& p : ps->items) {
        const auto* n = p.get("name");
        const auto* sh = p.get("shape");
        const auto* dt = p.get("dtype");
        check(n && n->is_string() && sh && sh->is_array() && dt && dt->is_string() &&
                  dt->text == "bf16",
              at + ": param entry");
        if (!n || !sh || !sh->is_array()) continue;
        std::vector<std::uint64_t> shape;
        for (auto& x : sh->items) {
          std::uint64_t v = 0;
          check(u64(&x, v), at + ": shape entries are integers");
          shape.push_back(v);
        }
        params[n->text] = shape;
      }
    std::set<std::string> copied, skipped;
    const auto* cs = rk.get("copies");
    check(cs && cs->is_array() && !cs->items.empty(), at + ": copies");
    if (cs && cs->is_array())
      for (auto& cp : cs->items) {
        const auto* t = cp.get("tensor");
        const auto* p = cp.get("param");
        auto from = box(cp.get("from")), to = box(cp.get("to"));
        const bool named = t && t->is_string() && p && p->is_string() && canon.count(t->text) &&
                           params.count(p->text);
        check(named, at + ": copy names a canonical tensor and a parameter of the rank");
        if (!named) continue;
        const auto& cshape = canon[t->text];
        const auto& pshape = params[p->text];
        check(from.size() == cshape.size(),
              at + ": from has one [start, len] per dimension of " + t->text);
        check(to.size() == pshape.size(),
              at + ": to has one [start, len] per dimension of " + p->text);
        if (from.size() != cshape.size() || to.size() != pshape.size()) continue;
        std::uint64_t nf = 1, nt = 1;
        for (std::size_t d = 0; d < from.size(); ++d) {
          check(from[d].first + from[d].second <= cshape[d], at + ": from inside " + t->text);
          nf *= from[d].second;
        }
        for (std::size_t d = 0; d < to.size(); ++d) {
          check(to[d].first + to[d].second <= pshape[d], at + ": to inside " + p->text);
          nt *= to[d].second;
        }
        check(nf == nt && nf > 0, at + ": from and to hold the same number of elements");
        copied.insert(t->text);
        // Count coverage of the canonical box (row-major walk over its coordinates).
        auto& cov = covered[t->text];
        std::vector<std::uint64_t> idx(from.size(), 0);
        for (std::uint64_t e = 0; e < nf; ++e) {
          std::uint64_t flat = 0;
          for (std::size_t d = 0; d < from.size(); ++d)
            flat = flat * cshape[d] + from[d].first + idx[d];
          if (flat < cov.size()) ++cov[flat];
          for (std::size_t d = from.size(); d-- > 0;)
            if (++idx[d] < from[d].second)
              break;
            else
              idx[d] = 0;
        }
      }
    const auto* sk = rk.get("skipped");
    check(sk && sk->is_array(), at + ": skipped");
    if (sk && sk->is_array())
      for (auto& s : sk->items) {
        check(s.is_string() && canon.count(s.text), at + ": skipped names a canonical tensor");
        skipped.insert(s.text);
      }
    for (auto& [n, shape] : canon)
      check(copied.count(n) + skipped.count(n) == 1,
            at + ": " + n + " is either copied or skipped");
  }
  for (auto& [n, cov] : covered) {
    std::uint64_t missing = 0;
    for (auto x : cov) missing += x == 0;
    check(missing == 0, side + ": every element of " + n + " lands somewhere (" +
                            std::to_string(missing) + " missing)");
  }
}

} // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: dcr-plan-check PATH/TO/dcr-plan\n";
    return 2;
  }
  const std::string tool = argv[1];
  const auto dir =
      std::filesystem::temp_directory_path() / ("dcr-plan-check-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto cfg = (dir / "config.json").string();
  std::ofstream(cfg) << config;
  // "TP 2, PP 2, DP 2, expert parallel": 8 ranks, 6 experts over EP 4 (2, 2, 1, 1).
  check_plan(tool, cfg, "rollout",
             "--tensor-parallel-size 2 --pipeline-parallel-size 2 --data-parallel-size 2 "
             "--enable-expert-parallel",
             8);
  // Megatron TP 2, PP 3, EP 2, DP 2 with Megatron-LM's vocabulary padding (expert TP 2 by default).
  check_plan(tool, cfg, "training", "--tp 2 --pp 3 --ep 2 --dp 2 --vocab-block 128", 12);
  check_plan(tool, cfg, "training",
             "--tp 2 --pp 2 --first-stage-layers 1 --ep 2 --etp 1 --dp 2 --vocab-block 128", 8);
  // vLLM vocabulary rows: pad 777 to 832 (a multiple of 64), then / TP 2 = 416 rows per rank.
  {
    const auto r = run("'" + tool + "' '" + cfg + "' rollout --tensor-parallel-size 2");
    check(r.status == 0 &&
              r.out.find("param model.embed_tokens.weight [416, 64] bf16") != std::string::npos,
          "text output lists the padded vocabulary shard");
  }
  // Errors: an unsupported field exits 1 naming it; a bad flag exits 2.
  const auto bad = (dir / "bad.json").string();
  std::ofstream(bad) << R"({"model_type": "gpt2", "hidden_size": 8})";
  auto r = run("'" + tool + "' '" + bad + "' rollout 2>&1");
  check(r.status == 1 && r.out.find("'model_type'") != std::string::npos,
        "unsupported model_type exits 1 naming it");
  r = run("'" + tool + "' '" + cfg + "' rollout --tensor-parallel-size 3 2>&1");
  check(r.status == 1, "a layout that does not divide the model exits 1");
  r = run("'" + tool + "' '" + cfg + "' training --tensor-parallel-size 2 2>&1");
  check(r.status == 2, "a rollout flag on the training side exits 2");
  std::filesystem::remove_all(dir);
  if (failures)
    std::cerr << failures << " checks failed\n";
  else
    std::cout << "dcr-plan checks passed\n";
  return failures ? 1 : 0;
}
