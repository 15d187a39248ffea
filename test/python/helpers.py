"""Shared test scaffolding: a training run refitting receivers, checked byte for byte."""

from __future__ import annotations

import dcr
import dcr.torch as dt
from refit_models import (ShardedTrainer, Trainer, VllmLikeModel, canonical_views, hf_config,
                          hf_model, text_tokens)

_TOKENS = None


def tokens():
    global _TOKENS
    if _TOKENS is None:
        _TOKENS = text_tokens(1 << 18)
    return _TOKENS


class Run:
    """A trainer (BF16 + FP32 AdamW), `owners` owner ranks (TP shards), and
    receivers built by `make_receivers()` (a list of models).

    `sharded=False`: the trainer is the `transformers` model itself and the
    owners' shards are projected from it after every step. `sharded=True`:
    the trainer's parameters are the TP shards (`ShardedTrainer`) and the
    owners read them as they are, views of the parameters, no copy."""

    def __init__(self, kind, *, lr=1e-6, owners_tp=2, make_receivers, tied=None, seed=0,
                 vocab_block=0, sharded=False):
        self.cfg = hf_config(kind, tied=tied)
        self.model = hf_model(self.cfg, seed)
        self.plan = dt.TrainerPlan(self.cfg, tp=owners_tp, vocab_block=vocab_block)
        self.names = [m.name for m in self.plan.canonical]
        self.make_receivers = make_receivers
        self.sharded = sharded
        if sharded:
            self.trainer = ShardedTrainer(self.model, self.plan, lr, tokens(), seed=seed)
            self.shards = self.trainer.shards
        else:
            self.trainer = Trainer(self.model, lr, tokens(), seed=seed)
            canon = self.canonical()
            self.shards = [self.plan.project(r, canon) for r in range(self.plan.world)]
        self.owners = [dt.Owner(self.plan, r, self.shards[r]) for r in range(self.plan.world)]
        self.rx_models = make_receivers(self.cfg)
        self.receivers = [dt.Receiver(m, self.plan.canonical) for m in self.rx_models]
        canon = self.canonical()
        for rx in self.receivers:
            rx.dense_refit(canon)
        self.version = 0
        self.attempt = 0

    def canonical(self):
        if self.sharded:
            return self.trainer.canonical()
        return canonical_views(self.model, self.names)

    def train(self):
        loss = self.trainer.step()
        canon = self.canonical()
        for r, o in enumerate(self.owners):
            if not self.sharded:
                self.plan.project(r, canon, self.shards[r])
            o.set_candidate(self.shards[r])
        self.version += 1
        return loss

    def build(self, overwrite_all=False):
        self.attempt += 1
        return [p for o in self.owners
                for p in o.build(self.attempt, self.version, overwrite_all=overwrite_all)]

    def apply(self, payloads, receivers=None):
        stats = []
        for rx in receivers or self.receivers:
            rx.begin_attempt(self.attempt)
            for p in payloads:
                rx.stage(p)
            stats.append(rx.apply())
        return stats

    def refit(self):
        """One transition as the protocol runs it: a mixed attempt; if any
        receiver fails it (e.g. an XOR item for a path through a cast), an
        overwrite_all retry to every receiver. Returns (attempts, entries)."""
        payloads = self.build()
        failed = 0
        entries = 0
        for rx in self.receivers:
            rx.begin_attempt(self.attempt)
            try:
                for p in payloads:
                    rx.stage(p)
                entries += rx.apply()["entries"]
            except dcr.Error:
                failed += 1
        if not failed:
            return 1, entries
        stats = self.apply(self.build(overwrite_all=True))
        return 2, sum(s["entries"] for s in stats)

    def commit(self):
        for o in self.owners:
            o.commit()

    def mismatches(self):
        """(receiver, tensor) pairs whose bytes differ from a dense load_weights."""
        canon = self.canonical()
        bad = []
        for i, (ref, got) in enumerate(zip(self.make_receivers(self.cfg), self.rx_models)):
            ref.load_weights(list(canon.items()))
            a, b = dt.state_bytes(ref), dt.state_bytes(got)
            assert a.keys() == b.keys()
            bad += [(i, k) for k in a if a[k] != b[k]]
        return bad


def vllm_receivers(tp=2, **kw):
    """`tp` vLLM-like TP ranks of the run's model (keyword options per VllmLikeModel)."""
    return lambda cfg: [VllmLikeModel(cfg, r, tp, **kw) for r in range(tp)]
