"""Owners read the trainer's own parameters: a TP trainer whose parameters
are the Megatron shards (`ShardedTrainer`) hands them to `dcr.torch.Owner`
as they are, by pointer and length, with no projected copy in between."""

import re

import numpy as np
import pytest
import torch

import dcr
from helpers import Run, vllm_receivers


def test_sharded_trainer_refit_equals_dense():
    run = Run("qwen3", lr=1e-5, sharded=True, make_receivers=vllm_receivers(2))
    # The owners' inputs are the trainer's parameters themselves.
    assert all(isinstance(t, torch.nn.Parameter) for s in run.shards for t in s.values())
    for step in range(3):
        run.train()
        attempts, entries = run.refit()
        assert attempts == 1 and entries > 0
        assert run.mismatches() == [], f"step {step + 1}"
        run.commit()


def test_a_change_to_a_parameter_is_what_the_next_build_sees():
    run = Run("llama", lr=1e-5, sharded=True, make_receivers=vllm_receivers(2))
    run.train()
    run.apply(run.build())
    run.commit()
    # One element of a rank-1 parameter changes in place, after the last
    # set_candidate: no projection, no copy refreshed by the test.
    rank = 1
    key = next(s["key"] for s in run.plan.rank_shards(rank)
               if s["owner"] == rank and "linear_qkv.weight" in s["key"])
    param = run.shards[rank][key]
    with torch.no_grad():
        flat = param.view(-1)
        flat[7] = -flat[7] if flat[7] != 0 else 1.0
    for r, o in enumerate(run.owners):
        o.set_candidate(run.shards[r])
    assert [o.changed_words for o in run.owners] == [0, 1]
    run.version += 1
    payloads = run.build()
    items = [it for p in payloads for it in dcr.decode_payload(p)[1]]
    assert len(items) == 1 and len(items[0]["indices"]) == 1
    # The element the payload names is where the trainer's element comes from.
    pos = int(run.trainer.index[rank][key][7]) - 1
    name = items[0]["tensor"]["name"]
    first = sum(m.numel for m in run.plan.canonical[:run.names.index(name)])
    assert int(items[0]["indices"][0]) == pos - first
    word = param.detach().view(-1)[7:8].view(torch.uint8).numpy()
    if items[0]["encoding"] == "overwrite":
        assert np.array_equal(items[0]["values"], word)
    run.apply(payloads)
    assert run.mismatches() == []


@pytest.mark.parametrize("bad, cls, what", [
    (lambda t: t.float(), dcr.BadDtype, "dtype torch.float32"),
    (lambda t: t.detach().t().contiguous().t(), dcr.InvalidArgument, "not contiguous"),
    (lambda t: torch.empty_like(t, device="meta"), dcr.InvalidArgument, "on meta"),
    (lambda t: t.detach().view(-1)[:-1], dcr.ShapeMismatch, "shape"),
    (lambda t: [0.0] * t.numel(), dcr.InvalidArgument, "expected a torch.Tensor"),
])
def test_shard_checks_name_the_tensor(bad, cls, what):
    run = Run("llama", lr=1e-5, sharded=True, make_receivers=vllm_receivers(1))
    rank = 0
    key = next(s["key"] for s in run.plan.rank_shards(rank)
               if s["owner"] == rank and "linear_fc1.weight" in s["key"])
    shards = dict(run.shards[rank])
    shards[key] = bad(shards[key])
    with pytest.raises(cls, match=re.escape(key) + ".*" + re.escape(what)):
        run.owners[rank].set_candidate(shards)
    # The refused candidate left the owner as it was: the trainer's own shards still go.
    run.owners[rank].set_candidate(run.shards[rank])
