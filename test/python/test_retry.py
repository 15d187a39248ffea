"""Kill and retry: an attempt aborted half-applied (a receiver whose loader
fails mid-payload, and one that stopped after its first payload) is refused
for the rest of the attempt and repaired by the overwrite_all retry."""

import pytest

import dcr
from helpers import Run, vllm_receivers


def test_half_applied_attempt_is_repaired_by_overwrite_retry():
    run = Run("qwen3_moe", lr=1e-5, make_receivers=vllm_receivers(2, enable_expert_parallel=True))
    run.train()
    payloads = run.build()
    assert len(payloads) == 2

    # Receiver 0: its loader fails on the 12th call of the apply.
    rx0 = run.receivers[0]
    model0 = run.rx_models[0]
    real = model0.load_weights
    calls = {"n": 0}

    def failing(weights):
        calls["n"] += 1
        if calls["n"] == 12:
            raise OSError("receiver killed")
        return real(weights)

    rx0.load_weights = failing
    rx0.begin_attempt(run.attempt)
    for p in payloads:
        rx0.stage(p)
    with pytest.raises(dcr.LoaderCondition, match="receiver killed"):
        rx0.apply()
    rx0.load_weights = real
    with pytest.raises(dcr.Aborted):
        rx0.apply()

    # Receiver 1 applied the first payload only, then its attempt was cut.
    rx1 = run.receivers[1]
    rx1.begin_attempt(run.attempt)
    rx1.stage(payloads[0])
    rx1.apply()

    # Both are now half-applied: neither old nor new.
    bad = run.mismatches()
    assert {i for i, _ in bad} == {0, 1}

    # The retry: every record as an absolute overwrite, to every receiver.
    run.apply(run.build(overwrite_all=True))
    assert run.mismatches() == []
    run.commit()

    # The next step runs mixed again, on the repaired state.
    run.train()
    run.apply(run.build())
    assert run.mismatches() == []
