"""Property tests over random layouts: owners of a random TP size (with and
without vocabulary padding), vLLM-like receivers of a random TP size, expert
placement and norm dtype, random sparse bit changes (NaN and infinity
included) sent mixed or overwrite-only: every receiver ends byte-equal to a
dense load_weights of the new weights."""

import random

import pytest
import torch

import dcr.torch as dt
from refit_models import VllmLikeModel, canonical_views, hf_config, hf_model

SEEDS = list(range(8))


def mutate(canon, rng, fraction):
    """Random new stored words at a random `fraction` of every tensor's elements."""
    g = torch.Generator().manual_seed(rng.randrange(1 << 30))
    for t in canon.values():
        w = t.view(-1).view(torch.int16)
        n = max(1, int(w.numel() * fraction)) if rng.random() < 0.8 else 0
        if n == 0:
            continue
        idx = torch.randperm(w.numel(), generator=g)[:n]
        new = torch.randint(-(1 << 15), 1 << 15, (n,), generator=g, dtype=torch.int32)
        new = new.to(torch.int16)
        new[: max(1, n // 50)] = 0x7FC0  # NaN
        w[idx] = new


@pytest.mark.parametrize("seed", SEEDS)
def test_random_layouts(seed):
    rng = random.Random(seed)
    kind = rng.choice(["llama", "qwen3", "qwen3_moe"])
    cfg = hf_config(kind, tied=rng.choice([True, False]), layers=rng.choice([1, 2]))
    model = hf_model(cfg, seed)
    owners_tp = rng.choice([1, 2, 4])
    plan = dt.TrainerPlan(cfg, tp=owners_tp, vocab_block=16 if owners_tp == 4 else
                          rng.choice([0, 64]) if owners_tp < 4 else 16)
    names = [m.name for m in plan.canonical]
    canon = canonical_views(model, names)
    shards = [plan.project(r, canon) for r in range(plan.world)]
    owners = [dt.Owner(plan, r, shards[r]) for r in range(plan.world)]
    rx_tp = rng.choice([1, 2, 4])
    opts = dict(enable_expert_parallel=rng.random() < 0.5, fp32_norms=rng.random() < 0.4)

    def make():
        return [VllmLikeModel(cfg, r, rx_tp, **opts) for r in range(rx_tp)]

    models = make()
    rxs = [dt.Receiver(m, plan.canonical) for m in models]
    for rx in rxs:
        rx.dense_refit(canon)
    for version in range(1, 3):
        mutate(canon, rng, rng.choice([0.012, 0.03, 0.05]))
        for r, o in enumerate(owners):
            plan.project(r, canon, shards[r])
            o.set_candidate(shards[r])
        overwrite = rng.random() < 0.3
        attempt = 2 * version
        payloads = [p for o in owners for p in o.build(attempt, version, overwrite_all=overwrite)]
        rng.shuffle(payloads)  # items may arrive in any order
        retry = False
        for rx in rxs:
            rx.begin_attempt(attempt)
            for p in payloads:
                rx.stage(p)
            try:
                rx.apply()
            except dt.errors.UnsupportedLoader:
                assert opts["fp32_norms"] and not overwrite  # XOR for a cast path
                retry = True
        if retry:
            payloads = [p for o in owners for p in o.build(attempt + 1, version,
                                                           overwrite_all=True)]
            for rx in rxs:
                rx.begin_attempt(attempt + 1)
                for p in payloads:
                    rx.stage(p)
                rx.apply()
        for ref, got in zip(make(), models):
            ref.load_weights(list(canon.items()))
            assert dt.state_bytes(ref) == dt.state_bytes(got), \
                f"seed {seed}: {kind} owners tp {owners_tp} receivers tp {rx_tp} {opts}"
        for o in owners:
            o.commit()
