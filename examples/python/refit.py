#!/usr/bin/env python3
"""A real torch training loop refitting torch receivers through their own loaders.

The trainer is a Hugging Face `transformers` model (random weights from a
small config; BF16 weights, FP32 AdamW master state) trained on real text
found on the machine with a byte-level causal LM loss. The trainer is
tensor-parallel over `--owners-tp` ranks whose parameters are the
Megatron-style TP shards themselves (`ShardedTrainer`), and each rank's
owner (`dcr.torch.Owner`) reads them as they are: views, no copy.
After every step the owners build payloads of what changed and every
receiver (a vLLM-like TP rank with vLLM's `load_weights`) applies them
through that loader under dcr's dispatch hook; a receiver whose loader path
cannot take a relative item fails the attempt and everyone gets the
overwrite retry. Each step ends with a byte-for-byte check of every
receiver against a dense `load_weights` of the trained weights.

With `--store URL` or `--commits URL` the transitions run as the C++
cluster programs run them: the library's coordinator publishes through the
object store (`memory:`, `fs:DIR`, `s3://HOST:PORT/BUCKET` with
`--s3-credentials` or DCR_S3_ACCESS_KEY / DCR_S3_SECRET_KEY) and commits
each version in the commit store (`file:DIR`, `etcd://HOST:PORT/prefix`)
once every receiver acknowledged it; `--transport relay_tree` streams the
payloads through a k-ary tree of the receivers instead of an object store.

    scripts/setup-python.sh && scripts/setup.sh    # once: .venv/ and the extension in build/
    .venv/bin/python3 examples/python/refit.py --model qwen3_moe --steps 5
    .venv/bin/python3 examples/python/refit.py --store s3://127.0.0.1:8080/refit \\
        --s3-credentials creds --commits etcd://127.0.0.1:2379/refit
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, HERE)

import torch  # noqa: E402

import dcr  # noqa: E402
import dcr.torch as dt  # noqa: E402
from refit_models import (ShardedTrainer, VllmLikeModel, hf_config, hf_model,  # noqa: E402
                          text_tokens)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=["llama", "qwen3", "qwen3_moe"], default="qwen3_moe")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--owners-tp", type=int, default=2)
    ap.add_argument("--receivers-tp", type=int, default=2)
    ap.add_argument("--enable-expert-parallel", action="store_true")
    ap.add_argument("--fp32-norms", action="store_true",
                    help="receivers keep norms in FP32 (a cast: overwrite-only paths)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--store", metavar="URL",
                    help="object store of a coordinated run: memory:, fs:DIR, s3://HOST:PORT/BUCKET")
    ap.add_argument("--s3-credentials", metavar="FILE",
                    help="lines 'access_key K' and 'secret_key S' (else DCR_S3_ACCESS_KEY, "
                         "DCR_S3_SECRET_KEY)")
    ap.add_argument("--s3-region", default="us-east-1")
    ap.add_argument("--transport", choices=["object_store", "relay_tree"], default="object_store",
                    help="how a coordinated run's payloads travel (relay_tree: a k-ary tree of "
                         "the receivers, no object store)")
    ap.add_argument("--relay-fanout", type=int, default=2)
    ap.add_argument("--relay-tcp", action="store_true", help="relay tree links over loopback TCP")
    ap.add_argument("--commits", metavar="URL",
                    help="commit store of a coordinated run: file:DIR, etcd://HOST:PORT/prefix "
                         "(default with --store: file: in a temporary directory)")
    a = ap.parse_args()
    torch.set_num_threads(min(2, torch.get_num_threads()))

    cfg = hf_config(a.model, layers=a.layers)
    model = hf_model(cfg, a.seed)
    plan = dt.TrainerPlan(cfg, tp=a.owners_tp, vocab_block=16 if cfg.vocab_size % a.owners_tp
                          else 0)
    names = [m.name for m in plan.canonical]
    ckpt_bytes = sum(m.nbytes for m in plan.canonical)
    trainer = ShardedTrainer(model, plan, a.lr, text_tokens(), seed=a.seed)
    canon = trainer.canonical()
    shards = trainer.shards  # the trainer's parameters: what each owner reads
    owners = [dt.Owner(plan, r, shards[r]) for r in range(plan.world)]

    def receivers():
        return [VllmLikeModel(cfg, r, a.receivers_tp,
                              enable_expert_parallel=a.enable_expert_parallel,
                              fp32_norms=a.fp32_norms) for r in range(a.receivers_tp)]

    models = receivers()
    rxs = [dt.Receiver(m, plan.canonical) for m in models]
    for rx in rxs:
        rx.dense_refit(canon)
    coordinator = None
    if a.store or a.commits or a.transport == "relay_tree":
        if a.transport == "relay_tree":
            store = dcr.RelayTree(fanout=a.relay_fanout, tcp=a.relay_tcp)
            where = f"a relay tree (fanout {a.relay_fanout}, {'TCP' if a.relay_tcp else 'pipes'})"
        else:
            store = dcr.ObjectStore(a.store or "memory:", region=a.s3_region,
                                    credentials=a.s3_credentials)
            store.create_bucket()
            where = store.url
        scratch = tempfile.TemporaryDirectory(prefix="dcr-commits-")  # removed at exit
        commits = dcr.CommitStore(a.commits or f"file:{scratch.name}")
        coordinator = dcr.Coordinator(commits, store, owners,
                                      {f"rx{i}": rx for i, rx in enumerate(rxs)})
        coordinator.take_over()
        for r, o in enumerate(owners):
            o.set_candidate(shards[r])
        coordinator.bootstrap()
        print(f"coordinated: payloads through {where}, commit record in {commits.url} "
              f"(version {commits.load()['version']} committed)")
    print(f"model {a.model}: {len(names)} tensors, {ckpt_bytes / 1e6:.2f} MB BF16; owners TP "
          f"{a.owners_tp}; {len(rxs)} vLLM-like receivers (TP {a.receivers_tp}"
          f"{', EP' if a.enable_expert_parallel else ''}{', FP32 norms' if a.fp32_norms else ''})"
          f"; AdamW lr {a.lr:g}\n")
    head = (f"{'step':>4}  {'loss':>6}  {'attempts':>8}  {'change %':>8}  {'payload KB':>10}  "
            f"{'% of ckpt':>9}  {'build s':>7}  {'apply s':>7}  {'dense s':>7}  "
            f"{'vs dense':>8}  bytes equal")
    print(head)
    print("-" * len(head))
    attempt = 0
    all_ok = True
    for step in range(1, a.steps + 1):
        loss = trainer.step()
        canon = trainer.canonical()
        for r, o in enumerate(owners):
            o.set_candidate(shards[r])
        changed = sum(o.changed_words for o in owners)
        attempts, build_s, apply_s, payload_bytes = 0, 0.0, 0.0, 0
        overwrite = False
        failed = False
        if coordinator is not None:
            rep = coordinator.transition()  # raises the typed error of a failed transition
            attempt = rep["attempts"][-1]["attempt"]
            attempts = len(rep["attempts"])
            build_s = sum(x["construct_seconds"] for x in rep["attempts"])
            apply_s = sum(x["apply_seconds"] for x in rep["attempts"])
            payload_bytes = sum(x["payload_bytes"] for x in rep["attempts"])
        while coordinator is None:
            attempt += 1
            attempts += 1
            t0 = time.perf_counter()
            payloads = [p for o in owners
                        for p in o.build(attempt, step, overwrite_all=overwrite)]
            build_s += time.perf_counter() - t0
            payload_bytes += sum(len(p) for p in payloads)
            failed = False
            t0 = time.perf_counter()
            for rx in rxs:
                rx.begin_attempt(attempt)
                try:
                    for p in payloads:
                        rx.stage(p)
                    rx.apply()
                except dcr.Error:
                    failed = True
            apply_s += time.perf_counter() - t0
            if not failed or overwrite:
                break
            overwrite = True  # the retry: every record an absolute overwrite
        # The reference: a dense load_weights of the trained weights, timed.
        refs = receivers()
        t0 = time.perf_counter()
        for ref in refs:
            ref.load_weights(list(canon.items()))
        dense_s = time.perf_counter() - t0
        ok = all(dt.state_bytes(x) == dt.state_bytes(y) for x, y in zip(refs, models))
        all_ok &= ok and not failed
        if coordinator is None:  # the coordinator committed the owners itself
            for o in owners:
                o.commit()
        total = sum(m.numel for m in plan.canonical)
        print(f"{step:>4}  {loss:>6.3f}  {attempts:>8}  {100 * changed / total:>8.3f}  "
              f"{payload_bytes / 1e3:>10.1f}  {100 * payload_bytes / ckpt_bytes:>9.3f}  "
              f"{build_s:>7.3f}  {apply_s:>7.3f}  {dense_s:>7.3f}  "
              f"{dense_s / max(apply_s, 1e-9):>7.2f}x  {'yes' if ok else 'NO'}")
    print(f"\nverification: {len(rxs)} receivers equal a dense load_weights of version "
          f"{a.steps} byte for byte: {'PASS' if all_ok else 'FAIL'}")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
