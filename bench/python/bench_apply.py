#!/usr/bin/env python3
"""Hook-based apply of one refit against a dense `load_weights` of the same
model, in the same run, at 1.2 / 3 / 5 % of the BF16 words changed.

The receiver is one vLLM-like rank (`examples/python/refit_models.py`,
Llama layout: fused QKV, merged gate/up, vocab-parallel embedding) holding
the whole model; the owner is one training rank (TP 1). Changes are spread
uniformly over every tensor (RL updates are). "apply s" is `stage` ("stage s": the C++
decoder over every byte) plus `apply` ("hook s": one `load_weights` call per
item under the dispatch hook, the item's entries mapped through the
loader's views and landed by the extension); "dense s" is the model's
`load_weights` over the full tensors without the hook. "per item ms" is
"apply s" over the items; in the `1/tensor` row (a payload changing one
element of every tensor) it is the fixed cost of running the loader under
the hook per item.
Every run ends with a byte comparison of the two models.

    .venv/bin/python3 bench/python/bench_apply.py [--hidden 1024 --layers 4 --vocab 32000]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples", "python"))

import torch  # noqa: E402

import dcr.torch as dt  # noqa: E402
from refit_models import VllmLikeModel  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--repeat", type=int, default=3, help="best of N for each timing")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    import transformers as tf

    cfg = tf.LlamaConfig(vocab_size=a.vocab, hidden_size=a.hidden, num_hidden_layers=a.layers,
                         num_attention_heads=a.hidden // 64, num_key_value_heads=a.hidden // 256,
                         intermediate_size=a.hidden * 11 // 4, max_position_embeddings=64)
    cfg.dtype = torch.bfloat16
    plan = dt.TrainerPlan(cfg, tp=1)
    g = torch.Generator().manual_seed(0)
    canon = {m.name: (torch.randn(m.shape, generator=g) * 0.02).to(torch.bfloat16)
             for m in plan.canonical}
    total = sum(m.numel for m in plan.canonical)
    nbytes = sum(m.nbytes for m in plan.canonical)
    model = VllmLikeModel(cfg, 0, 1)
    t0 = time.perf_counter()
    rx = dt.Receiver(model, plan.canonical)
    prewarm_s = time.perf_counter() - t0
    rx.dense_refit(canon)
    ref = VllmLikeModel(cfg, 0, 1)
    shards = plan.project(0, canon)
    owner = dt.Owner(plan, 0, shards)

    def dense_s():
        best = float("inf")
        for _ in range(a.repeat):
            t0 = time.perf_counter()
            ref.load_weights(list(canon.items()))
            best = min(best, time.perf_counter() - t0)
        return best

    def change(fraction):
        for t in canon.values():
            w = t.view(-1).view(torch.int16)
            n = max(1, int(round(w.numel() * fraction)))
            idx = torch.randperm(w.numel(), generator=g)[:n]
            w[idx] = w[idx] ^ torch.randint(1, 1 << 15, (n,), generator=g, dtype=torch.int16)

    attempt = 0
    print(f"model: Llama layout, hidden {a.hidden}, {a.layers} layers, vocab {a.vocab}: "
          f"{len(canon)} tensors, {total / 1e6:.1f} M BF16 words ({nbytes / 1e6:.0f} MB); "
          f"one vLLM-like receiver (TP 1); torch threads {a.threads}; best of {a.repeat}; "
          f"prewarm {prewarm_s:.2f} s\n")
    head = (f"{'change %':>8}  {'items':>5}  {'entries':>9}  {'payload MB':>10}  {'build s':>7}  "
            f"{'stage s':>7}  {'hook s':>7}  {'apply s':>7}  {'dense s':>7}  {'apply/dense':>11}  "
            f"{'hook/dense':>10}  {'per item ms':>11}  equal")
    print(head)
    print("-" * len(head))
    ok_all = True
    for pct in (0.0, 1.2, 3.0, 5.0):
        if pct == 0.0:  # one element of every tensor: the per-item overhead
            for t in canon.values():
                w = t.view(-1).view(torch.int16)
                w[0] = w[0] ^ 1
        else:
            change(pct / 100)
        plan.project(0, canon, shards)
        owner.set_candidate(shards)
        entries = owner.changed_words
        attempt += 1
        t0 = time.perf_counter()
        payloads = owner.build(attempt, attempt)
        build_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        rx.begin_attempt(attempt)
        for p in payloads:
            rx.stage(p)
        stage_s = time.perf_counter() - t0
        st = rx.apply()
        apply_s = time.perf_counter() - t0
        owner.commit()
        d = dense_s()
        ok = dt.state_bytes(ref) == dt.state_bytes(model)
        ok_all &= ok
        label = "1/tensor" if pct == 0.0 else f"{pct:.1f}"
        print(f"{label:>8}  {st['items']:>5}  {entries:>9}  "
              f"{sum(len(p) for p in payloads) / 1e6:>10.2f}  {build_s:>7.3f}  {stage_s:>7.3f}  "
              f"{st['seconds']:>7.3f}  {apply_s:>7.3f}  {d:>7.3f}  {apply_s / d:>10.2f}x  "
              f"{st['seconds'] / d:>9.2f}x  {1e3 * apply_s / st['items']:>11.2f}  "
              f"{'yes' if ok else 'NO'}")
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
