"""Typed errors at the Python/C++ boundary: tensors checked (dtype, device,
contiguity, size) naming the tensor; payloads validated byte for byte by the
C++ decoder; attempts fenced and duplicates suppressed."""

import pytest
import torch

import dcr
import dcr.torch as dt
from helpers import Run, vllm_receivers
from refit_models import canonical_views, hf_config, hf_model


@pytest.fixture(scope="module")
def llama():
    cfg = hf_config("llama")
    model = hf_model(cfg)
    plan = dt.TrainerPlan(cfg, tp=2)
    canon = canonical_views(model, [m.name for m in plan.canonical])
    return plan, canon


def test_error_classes_mirror_errc():
    assert dcr.InvalidArgument.code == 1 and dcr.DigestMismatch.code == 7
    assert dcr.LoaderCondition.code == 18 and dcr.Aborted.code == 29
    assert issubclass(dcr.ShapeMismatch, dcr.Error)


@pytest.mark.parametrize("bad,cls,text", [
    (lambda t: t.float(), dcr.BadDtype, "dtype torch.float32"),
    (lambda t: t.t(), dcr.InvalidArgument, "not contiguous"),
    (lambda t: t[:-1], dcr.ShapeMismatch, "shape"),
    (lambda t: torch.empty_like(t, device="meta"), dcr.InvalidArgument, "CPU memory"),
    (lambda t: t.numpy() if False else [1, 2], dcr.InvalidArgument, "torch.Tensor"),
])
def test_tensor_checks_name_the_tensor(llama, bad, cls, text):
    plan, canon = llama
    name = "model.layers.0.self_attn.o_proj.weight"
    given = dict(canon)
    given[name] = bad(canon[name])
    with pytest.raises(cls, match=text) as e:
        plan.project(0, given)
    assert name in str(e.value)


def test_owner_shard_checks(llama):
    plan, canon = llama
    shards = plan.project(0, canon)
    key = next(k for k in shards if "linear_qkv.weight" in k)
    bad = dict(shards)
    bad[key] = shards[key][:1].clone()
    with pytest.raises(dcr.ShapeMismatch, match=key):
        dt.Owner(plan, 0, bad)
    owned = dict(shards)
    del owned[key]
    with pytest.raises(dcr.NotFound, match="not given"):
        dt.Owner(plan, 0, owned)
    with pytest.raises(dcr.InvalidArgument, match="rank"):
        plan.rank_shards(7)


def test_config_errors():
    with pytest.raises(dcr.BadFormat):
        dt.TrainerPlan("{not json")
    with pytest.raises(dcr.InvalidArgument, match="config.json"):
        dt.TrainerPlan({"model_type": "llama"})


def test_payload_validation_and_fencing():
    run = Run("llama", lr=1e-5, make_receivers=vllm_receivers(1))
    run.train()
    payloads = [bytes(p) for p in run.build()]
    rx = run.receivers[0]
    p = bytearray(payloads[0])
    p[-5] ^= 0x01
    with pytest.raises(dcr.DigestMismatch):
        rx.stage(bytes(p))
    with pytest.raises(dcr.BadMagic):
        rx.stage(b"XXXX" + payloads[0][4:])
    with pytest.raises((dcr.Truncated, dcr.LengthOverflow)):
        rx.stage(payloads[0][:20])
    pid = rx.stage(payloads[0])
    assert pid["attempt"] == run.attempt
    with pytest.raises(dcr.Duplicate):
        rx.stage(payloads[0])
    run.attempt += 1
    rx.begin_attempt(run.attempt)
    with pytest.raises(dcr.StaleAttempt):
        rx.stage(payloads[1])
    # Nothing staged survives the newer attempt; an overwrite retry repairs.
    run.apply(run.build(overwrite_all=True))
    assert run.mismatches() == []
