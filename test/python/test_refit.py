"""A real torch training loop refitting vLLM-like receivers through their own
load_weights: after every step every parameter and buffer byte of every
receiver equals a dense load_weights of the trained weights."""

import pytest

from helpers import Run, vllm_receivers

CASES = [
    # (model, receiver options, lr)
    ("llama", dict(), 1e-6),
    ("qwen3", dict(), 1e-6),  # tied embeddings
    ("qwen3_moe", dict(enable_expert_parallel=True), 1e-6),
    ("qwen3_moe", dict(fp32_norms=True), 1e-6),  # experts TP-sharded; norms through a cast
    ("llama", dict(fp32_norms=True), 1e-5),
]


@pytest.mark.parametrize("kind,opts,lr", CASES,
                         ids=[f"{k}-{'-'.join(o) or 'tp'}-{lr:g}" for k, o, lr in CASES])
def test_training_refit_equals_dense(kind, opts, lr):
    run = Run(kind, lr=lr, make_receivers=vllm_receivers(2, **opts))
    assert run.mismatches() == []
    changed = []
    for step in range(3):
        run.train()
        attempts, entries = run.refit()
        assert run.mismatches() == [], f"step {step + 1}"
        changed.append(entries)
        run.commit()
    # Real gradients move real weights: every step changed something, and at
    # lr 1e-6 on BF16 only a small part of the model.
    assert all(c > 0 for c in changed)
    total = sum(m.numel for m in run.plan.canonical)
    assert max(changed) < (0.2 if lr <= 1e-6 else 0.9) * total * 2


def test_xor_and_add_and_overwrite_paths_are_all_used():
    run = Run("qwen3_moe", lr=1e-5, make_receivers=vllm_receivers(2, fp32_norms=True))
    run.train()
    import dcr
    encodings = set()
    for p in run.build():
        _, items = dcr.decode_payload(p)
        encodings |= {it["encoding"] for it in items}
    assert {"xor", "add"} & encodings
    run.attempt -= 1  # rebuild the same attempt after the look
    run.apply(run.build())
    assert run.mismatches() == []
    # The receivers marked the FP32 norms overwrite-only and the rest XOR-allowed.
    rx = run.receivers[0]
    assert not rx.xor_allowed("model.norm.weight")
    assert rx.xor_allowed("model.layers.0.self_attn.q_proj.weight")
    # An overwrite_all attempt of the same version changes nothing.
    run.apply(run.build(overwrite_all=True))
    assert run.mismatches() == []


def test_four_phase_engine():
    """init / start_update / update / finish, the weight-transfer-engine shape."""
    import dcr.torch as dt

    run = Run("qwen3_moe", lr=1e-5, make_receivers=vllm_receivers(2, enable_expert_parallel=True))
    engines = []
    for m in run.rx_models:
        e = dt.RefitEngine(m, m.load_weights)
        with pytest.raises(dt.errors.InvalidArgument):
            e.finish()
        e.init(run.plan.canonical)
        engines.append(e)
    # EP: each rank holds half the experts and says so.
    expert = "model.layers.0.mlp.experts.3.up_proj.weight"
    assert [e.receiver.needs(expert) for e in engines] == [False, True]
    for _ in range(2):
        run.train()
        payloads = run.build()
        for e in engines:
            e.start_update(run.attempt)
            assert e.update(payloads + payloads[:1]) == len(payloads)  # the repeat suppressed
            assert e.finish()["payloads"] == len(payloads)
        run.rx_models = [e.model for e in engines]
        assert run.mismatches() == []
        run.commit()


def test_cast_paths_take_the_overwrite_retry():
    """At a learning rate that moves the norms, the receivers' FP32 norms (a
    cast: overwrite-only) refuse the mixed attempt's relative items; the
    overwrite_all retry applies them by the two-fill rule, bit-exactly."""
    run = Run("llama", lr=1e-2, make_receivers=vllm_receivers(2, fp32_norms=True))
    for step in range(2):
        run.train()
        attempts, _ = run.refit()
        assert attempts == 2
        assert run.mismatches() == [], f"step {step + 1}"
        run.commit()
