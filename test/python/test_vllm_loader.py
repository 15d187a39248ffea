"""vLLM's own model classes as receivers: `LlamaForCausalLM`,
`Qwen3ForCausalLM` and `Qwen3MoeForCausalLM` from the pinned `vllm` package,
built on the CPU (TP 1 here, TP 2 in two spawned processes, gloo groups),
refitted through their own `load_weights` (QKVParallelLinear with
`shard_id`, MergedColumnParallelLinear, RowParallelLinear,
VocabParallelEmbedding padded to 64, FusedMoE). After every step of a real
training run every parameter and buffer byte equals a dense `load_weights`
of the trained weights (docs/python.md, "vLLM's own loaders")."""

import os
import tempfile

import pytest
import torch

import dcr
from helpers import Run

# vLLM picks its platform at import: the CPU one, whatever the machine has,
# so that no CUDA device is touched (these models only hold weights here).
os.environ["VLLM_TARGET_DEVICE"] = "cpu"
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

import vllm  # noqa: E402
import vllm.triton_utils  # noqa: E402
from vllm.config import DeviceConfig, ModelConfig, VllmConfig, set_current_vllm_config  # noqa: E402
from vllm.distributed import (init_distributed_environment,  # noqa: E402
                              initialize_model_parallel)

# The CPU platform's config check asks for a Triton with a CPU backend,
# which only serving needs (its kernels); building models and loading
# weights runs none, so the check is answered for this process.
vllm.triton_utils.HAS_TRITON = True

_CLASSES = {}
_DIR = tempfile.mkdtemp(prefix="dcr-vllm-")
_INIT = []


def _classes():
    if not _CLASSES:
        from vllm.model_executor.models.llama import LlamaForCausalLM
        from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM
        from vllm.model_executor.models.qwen3_moe import Qwen3MoeForCausalLM
        _CLASSES.update(llama=LlamaForCausalLM, qwen3=Qwen3ForCausalLM,
                        qwen3_moe=Qwen3MoeForCausalLM)
    return _CLASSES


def vllm_config(cfg) -> VllmConfig:
    path = os.path.join(_DIR, f"{cfg.model_type}-{int(bool(cfg.tie_word_embeddings))}")
    if not os.path.exists(os.path.join(path, "config.json")):
        cfg.save_pretrained(path)
    return VllmConfig(model_config=ModelConfig(model=path, skip_tokenizer_init=True,
                                               dtype=torch.bfloat16, max_model_len=256,
                                               enforce_eager=True),
                      device_config=DeviceConfig(device="cpu"))


def _init_groups(world: int = 1, rank: int = 0, init: str | None = None) -> None:
    """vLLM's process groups, once per process (gloo): under a config without
    a model, which makes vLLM create the expert-parallel group as well (it
    does for MoE models only), so that every class here finds its groups."""
    if _INIT:
        return
    with set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device="cpu"))):
        init_distributed_environment(world_size=world, rank=rank, local_rank=rank,
                                     distributed_init_method=init or f"file://{_DIR}/dist",
                                     backend="gloo")
        initialize_model_parallel(world, 1)
    _INIT.append(True)


def vllm_model(cfg) -> torch.nn.Module:
    """vLLM's own model class of `cfg`, BF16, on the CPU, at the TP size of
    this process's groups (TP 1 unless `_init_groups` said otherwise)."""
    vc = vllm_config(cfg)
    _init_groups()
    with set_current_vllm_config(vc):
        default = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16)
        try:
            model = _classes()[cfg.model_type](vllm_config=vc)
        finally:
            torch.set_default_dtype(default)
    return model


def vllm_receivers(cfg):
    return [vllm_model(cfg)]


def _encodings(payloads) -> set:
    return {it["encoding"] for p in payloads for it in dcr.decode_payload(p)[1]}


CASES = [("llama", None, 1e-6), ("qwen3", True, 1e-6), ("qwen3_moe", None, 1e-6),
         ("llama", True, 1e-5)]


@pytest.mark.parametrize("kind,tied,lr", CASES,
                         ids=[f"{k}-{'tied' if t else 'untied'}-{lr:g}" for k, t, lr in CASES])
def test_vllm_refit_equals_dense(kind, tied, lr):
    run = Run(kind, lr=lr, tied=tied, make_receivers=vllm_receivers)
    model, rx = run.rx_models[0], run.receivers[0]
    assert type(model).__module__.startswith("vllm.model_executor.models.")
    # The fused and padded layouts are vLLM's own, not the checkpoint's.
    params = dict(model.named_parameters())
    assert "model.layers.0.self_attn.qkv_proj.weight" in params
    assert params["model.embed_tokens.weight"].shape[0] % 64 == 0
    assert params["model.embed_tokens.weight"].shape[0] > run.cfg.vocab_size
    if kind == "qwen3_moe":
        assert any(".experts." in n and n.endswith("w13_weight") for n in params)
    # Every BF16 path of vLLM's loaders is a plain copy of a view of the
    # input: XOR-allowed throughout, nothing skipped at TP 1.
    assert all(rx.xor_allowed(n) for n in run.names)
    assert run.mismatches() == []
    total = sum(m.numel for m in run.plan.canonical)
    for step in range(3):
        run.train()
        payloads = run.build()
        assert {"xor", "add"} & _encodings(payloads)  # relative encodings, no overwrite
        stats = run.apply(payloads)[0]
        assert run.mismatches() == [], f"step {step + 1}"
        assert 0 < stats["entries"] < (0.1 if lr <= 1e-6 else 0.9) * total * 2
        run.commit()
    # The overwrite path: a retry of the next version sent as overwrites only.
    run.train()
    payloads = run.build(overwrite_all=True)
    assert _encodings(payloads) == {"overwrite"}
    run.apply(payloads)
    assert run.mismatches() == []
    run.commit()


def test_vllm_kill_and_overwrite_retry():
    """An attempt aborted half-applied leaves vLLM's parameters off the dense
    result; the overwrite retry of the same version repairs every byte."""
    run = Run("qwen3_moe", lr=1e-5, make_receivers=vllm_receivers)
    rx = run.receivers[0]
    run.train()
    payloads = run.build()
    rx.begin_attempt(run.attempt)
    for p in payloads[: max(1, len(payloads) // 2)]:
        rx.stage(p)
    rx.apply()
    assert run.mismatches() != []  # half applied: not yet the trained weights
    run.apply(run.build(overwrite_all=True))
    assert run.mismatches() == []


def _tp_rank(rank: int, world: int, init: str, inbox, outbox) -> None:
    """One vLLM TP rank in its own process: a model per ("model", kind, ...)
    message refitted by dcr per ("apply", ...) and, after every version,
    compared byte for byte with a fresh model's dense load."""
    import dcr.torch as dt
    from refit_models import hf_config

    try:
        _init_groups(world, rank, init)
        while True:
            msg = inbox.get()
            if msg is None:
                break
            if msg[0] == "model":
                _, kind, metas, canon = msg
                cfg = hf_config(kind)
                model = vllm_model(cfg)
                rx = dt.Receiver(model, metas)
                rx.dense_refit(canon)
                outbox.put(("ready", sorted(m[0] for m in metas if rx.needs(m[0]))))
                continue
            _, attempt, payloads, canon = msg
            rx.begin_attempt(attempt)
            for p in payloads:
                rx.stage(p)
            stats = rx.apply()
            ref = vllm_model(cfg)
            ref.load_weights(list(canon.items()))
            a, b = dt.state_bytes(ref), dt.state_bytes(model)
            outbox.put(("applied", stats["entries"], sorted(k for k in a if a[k] != b.get(k))))
    except BaseException as e:  # reported to the test, which fails on it
        outbox.put(("error", f"rank {rank}: {type(e).__name__}: {e}"))


def test_vllm_tp2_refit_equals_dense():
    """vLLM's classes at TP 2: two processes over a gloo group, each rank's
    loaders taking its split of every tensor (Llama; Qwen3-MoE with its
    FusedMoE experts TP-sharded), 3 training steps each."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    init = f"file://{tempfile.mkdtemp(prefix='dcr-vllm-tp-')}/dist"
    boxes = [(ctx.Queue(), ctx.Queue()) for _ in range(2)]
    procs = [ctx.Process(target=_tp_rank, args=(r, 2, init, *boxes[r]), daemon=True)
             for r in range(2)]
    for p in procs:
        p.start()

    def send(msg):
        for inbox, _ in boxes:
            inbox.put(msg)
        out = []
        for _, outbox in boxes:
            got = outbox.get(timeout=300)
            assert got[0] != "error", got[1]
            out.append(got)
        return out

    def canon(run):
        return {n: t.clone() for n, t in run.canonical().items()}

    try:
        for kind in ("llama", "qwen3_moe"):
            run = Run(kind, lr=1e-6, make_receivers=lambda cfg: [])
            metas = [(m.name, tuple(m.shape), str(m.dtype).replace("torch.", ""))
                     for m in run.plan.canonical]
            needs = [set(m[1]) for m in send(("model", kind, metas, canon(run)))]
            assert needs[0] == needs[1] == set(run.names)  # TP: every rank a split of each
            for step in range(3):
                run.train()
                payloads = [bytes(p) for p in run.build()]
                for r, (_, entries, bad) in enumerate(send(("apply", run.attempt, payloads,
                                                            canon(run)))):
                    assert bad == [], f"{kind} rank {r} step {step + 1}"
                    assert entries > 0
                run.commit()
    finally:
        for inbox, _ in boxes:
            inbox.put(None)
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
