"""Trainer ranks as torch.distributed processes (gloo, 2 ranks, spawned),
each rank's owner reading its own parameters in place and publishing its
payloads to a shared fs object store; this process fetches them, applies
them to vLLM-like TP receivers and compares every receiver byte with a dense
`load_weights` of the canonical weights gathered from the ranks of the same
step. The ranks commit only after this process reports that every receiver
holds the version.

Trainers: `dcr.trainers.MegatronTrainer` (the plan's TP shards as
parameters) and `dcr.trainers.FSDP2Trainer` (`fully_shard`, the plan derived
from the DTensor placements)."""

from __future__ import annotations

import re
import tempfile
import traceback

import numpy as np
import pytest
import torch
from torch import nn

import dcr
import dcr.torch as dt
from refit_models import (VllmLikeModel, canonical_views, hf_config, hf_model, hf_params,
                          text_tokens)

WORLD = 2
STEPS = 3
POKED_RANK = 1  # the rank whose parameter the in-place check changes
POKED_ELEMENT = 7
VOCAB_BLOCK = 64  # Megatron's make_vocab_size_divisible_by: 64 * TP rows


def _batch(tokens, gen, seq=64, batch=4):
    starts = torch.randint(0, tokens.numel() - seq - 1, (batch,), generator=gen)
    return torch.stack([tokens[s:s + seq + 1] for s in starts.tolist()])


def _poke_key(trainer, rank):
    """An owned, unreplicated attention shard of `rank` (its words reach the
    receivers only through this rank's owner)."""
    return next(s["key"] for s in trainer.plan.rank_shards(rank)
                if s["owner"] == rank and len(s["replicas"]) == 1 and
                ("linear_qkv" in s["key"] or "q_proj" in s["key"]))


def _small_norms(model):
    """Norm weights near 1e-3 (the same on every rank): their BF16 spacing
    there is below an AdamW step at lr 1e-6, so the replicated norms change
    within the run and their equality across ranks is a real check (at
    their usual 1.0 a step is far below half a BF16 spacing and they never
    change)."""
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("norm.weight"):
                p.copy_(1e-3 * (1 + 0.25 * torch.randn(p.shape, generator=gen)))


def _rank_main(rank, init, trainer_kind, kind, vocab, lr, store_dir, incarnation, poke, inbox,
               outbox):
    """One training rank: its trainer, its owner over its own parameters, and
    per step build -> publish -> report -> (wait) -> commit."""
    import torch.distributed as dist

    from dcr.trainers import FSDP2Trainer, MegatronTrainer

    try:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=WORLD)
        cfg = hf_config(kind, vocab=vocab)
        model = hf_model(cfg, seed=0)  # the same initial weights on every rank
        _small_norms(model)
        if trainer_kind == "megatron":
            plan = dt.TrainerPlan(cfg, tp=WORLD, vocab_block=VOCAB_BLOCK)
            canon = canonical_views(model, [m.name for m in plan.canonical])
            tr = MegatronTrainer(model, plan, canon, lr=lr, to_params=hf_params)
            gen = torch.Generator().manual_seed(1)  # TP ranks see the same batch
        else:
            tr = FSDP2Trainer(model, lr=lr, wrap=list(model.model.layers))
            gen = torch.Generator().manual_seed(1 + rank)  # data parallel
        refusal = None
        if trainer_kind == "fsdp2":
            # A placement that is no dim-0 row range, on the same mesh: the
            # plan derivation refuses it, naming the tensor and the placement.
            from torch.distributed.tensor import Shard, distribute_tensor

            other = nn.Module()
            other.w = nn.Parameter(distribute_tensor(
                torch.zeros(4, 6, dtype=torch.bfloat16), next(model.parameters()).device_mesh,
                [Shard(1)]))
            try:
                dt.TrainerPlan.from_fsdp(other)
            except dcr.InvalidArgument as e:
                refusal = str(e)
        tokens = text_tokens(1 << 18)
        owner = tr.owner()
        store = dcr.ObjectStore(f"fs:{store_dir}", incarnation)

        def state():
            canon = {n: t.clone() for n, t in tr.canonical().items()}  # collective
            shards = [(s["key"], s["param"], tr.shards[s["key"]].detach().clone())
                      for s in tr.plan.rank_shards(rank)]
            return canon, shards

        outbox.put(("ready", refusal) + state())
        steps = STEPS + (1 if poke else 0)
        for step in range(1, steps + 1):
            info = {}
            if step <= STEPS:
                info["loss"] = tr.step(_batch(tokens, gen))
            else:
                # One element of this rank's parameter changes in place,
                # after the last set_candidate; nothing is copied or
                # projected for the owner.
                if rank == POKED_RANK:
                    key = _poke_key(tr, rank)
                    with torch.no_grad():
                        flat = tr.shards[key].view(-1)
                        old = flat[POKED_ELEMENT].clone()
                        flat[POKED_ELEMENT] = -old if old != 0 else 1.0
                        info.update(key=key, old=old.view(torch.int16).item(),
                                    new=flat[POKED_ELEMENT].view(torch.int16).item())
                    if trainer_kind == "megatron":
                        pos = int(tr.plan.source_index(rank)[key][POKED_ELEMENT]) - 1
                        info["canonical_position"] = pos
            owner.set_candidate(tr.shards)
            info["changed_words"] = owner.changed_words
            payloads = owner.build(step, step)  # attempt, version
            info["manifest"] = store.publish(step, rank, payloads)
            outbox.put(("published", step, info) + state())
            msg = inbox.get(timeout=300)
            if msg != ("commit", step):
                raise RuntimeError(f"rank {rank}: expected commit of {step}, got {msg}")
            owner.commit()
        outbox.put(("done",))
    except BaseException:  # reported to the test, which fails on it
        outbox.put(("error", f"rank {rank}:\n{traceback.format_exc()}"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _served_rank_main(rank, init, trainer_kind, kind, vocab, lr, work, inbox, outbox):
    """One training rank whose owner is served to a coordinator in another
    process (`dcr.OwnerServer`): the trainer's shards go to the server as
    they are, and the parameters change only after the joint commit moved
    the owner's baseline to the version it published."""
    import torch.distributed as dist

    from dcr.trainers import FSDP2Trainer, MegatronTrainer

    try:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=WORLD)
        cfg = hf_config(kind, vocab=vocab)
        model = hf_model(cfg, seed=0)
        _small_norms(model)
        if trainer_kind == "megatron":
            plan = dt.TrainerPlan(cfg, tp=WORLD, vocab_block=VOCAB_BLOCK)
            canon = canonical_views(model, [m.name for m in plan.canonical])
            tr = MegatronTrainer(model, plan, canon, lr=lr, to_params=hf_params)
            gen = torch.Generator().manual_seed(1)
        else:
            tr = FSDP2Trainer(model, lr=lr, wrap=list(model.model.layers))
            gen = torch.Generator().manual_seed(1 + rank)
        tokens = text_tokens(1 << 18)
        store = dcr.ObjectStore(f"fs:{work}/objects")
        commits = dcr.CommitStore(f"file:{work}/control")
        server = dcr.OwnerServer(tr.owner(), store, commits, lease=True)
        server.set_candidate(tr.shards)
        canon = {n: t.clone() for n, t in tr.canonical().items()}
        outbox.put(("ready", server.address, canon))
        version = 0
        while True:
            msg = inbox.get(timeout=300)
            if msg is None or msg[0] == "stop":
                break
            server.wait_committed(version, 120)
            loss = tr.step(_batch(tokens, gen))
            server.set_candidate(tr.shards)
            version += 1
            canon = {n: t.clone() for n, t in tr.canonical().items()}  # collective
            outbox.put(("trained", loss, canon))
        server.wait_committed(version, 60)
        server.close()
        outbox.put(("stopped", server.version))
    except BaseException:
        outbox.put(("error", f"rank {rank}:\n{traceback.format_exc()}"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _bytes(t):
    return t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes()


def _check_shards(trainer_kind, cfg, canon, shards_by_rank):
    """The canonical tensors the ranks gathered are what every rank holds:
    Megatron, each rank's shards (replicas included) are the plan's
    projection of them; FSDP2, each rank's local rows are its torch.chunk."""
    if trainer_kind == "megatron":
        plan = dt.TrainerPlan(cfg, tp=WORLD, vocab_block=VOCAB_BLOCK)
        for r, shards in enumerate(shards_by_rank):
            want = plan.project(r, canon)
            assert sorted(want) == sorted(k for k, _, _ in shards)
            for k, _, t in shards:
                assert _bytes(t) == _bytes(want[k]), f"rank {r} shard {k}"
    else:
        held = {}
        for r, shards in enumerate(shards_by_rank):
            for k, param, t in shards:
                chunk = torch.chunk(canon[param], WORLD)[r]
                assert _bytes(t) == _bytes(chunk), f"rank {r} shard {k}"
                held[param] = held.get(param, 0) + t.numel()
        assert held == {n: t.numel() for n, t in canon.items()}


def _flat_position(canon, name, index):
    names = list(canon)
    return sum(canon[n].numel() for n in names[:names.index(name)]) + index


def _run(trainer_kind, kind, vocab, lr, *, poke=False):
    import torch.multiprocessing as mp

    cfg = hf_config(kind, vocab=vocab)
    store_dir = tempfile.mkdtemp(prefix="dcr-dist-store-")
    store = dcr.ObjectStore(f"fs:{store_dir}")  # a new commit history
    ctx = mp.get_context("spawn")
    init = f"file://{tempfile.mkdtemp(prefix='dcr-dist-init-')}/init"
    boxes = [(ctx.Queue(), ctx.Queue()) for _ in range(WORLD)]
    procs = [ctx.Process(target=_rank_main,
                         args=(r, init, trainer_kind, kind, vocab, lr, store_dir,
                               store.incarnation,
                               poke, *boxes[r]), daemon=True)
             for r in range(WORLD)]
    for p in procs:
        p.start()

    def receive(what):
        out = []
        for _, outbox in boxes:
            got = outbox.get(timeout=300)
            if got[0] == "error":  # the others' reports too: the first failure may be theirs
                others = []
                for _, o in boxes:
                    try:
                        m = o.get(timeout=5)
                        if m[0] == "error":
                            others.append(m[1])
                    except Exception:
                        pass
                pytest.fail("\n".join([got[1]] + others))
            assert got[0] == what, got
            out.append(got)
        return out

    def gathered(msgs):
        canon = msgs[0][-2]
        for m in msgs[1:]:  # every rank gathered the same tensors
            assert canon.keys() == m[-2].keys()
            assert all(_bytes(canon[n]) == _bytes(m[-2][n]) for n in canon)
        _check_shards(trainer_kind, cfg, canon, [m[-1] for m in msgs])
        return canon

    try:
        msgs = receive("ready")
        if trainer_kind == "fsdp2":
            for m in msgs:
                assert m[1] is not None and re.search(
                    r"tensor w: placement Shard\(dim=1\) on mesh dimension 0", m[1]), m[1]
        canon = gathered(msgs)
        first = [{k: t for k, _, t in m[-1]} for m in msgs]
        rx_models = [VllmLikeModel(cfg, r, WORLD) for r in range(WORLD)]
        receivers = [dt.Receiver(m, canon) for m in rx_models]
        for rx in receivers:
            rx.dense_refit(canon)
        reader = dcr.ObjectStore(f"fs:{store_dir}", store.incarnation)
        losses = []
        for step in range(1, STEPS + (2 if poke else 1)):
            msgs = receive("published")
            assert [m[1] for m in msgs] == [step] * WORLD
            infos = [m[2] for m in msgs]
            before, canon = canon, gathered(msgs)
            last = [m[-1] for m in msgs]
            changed = [n for n in canon if _bytes(canon[n]) != _bytes(before[n])]
            payloads, owners = reader.fetch(step)
            assert sorted(owners) == list(range(WORLD))
            if step <= STEPS:
                losses.append(infos[0]["loss"])
                assert changed, f"step {step}: training changed no weight"
                assert all(i["changed_words"] > 0 for i in infos)
            else:
                # The in-place change: that word, and nothing else, is the payload.
                info = infos[POKED_RANK]
                assert [i["changed_words"] for i in infos] == \
                    [1 if r == POKED_RANK else 0 for r in range(WORLD)]
                items = [it for p in payloads for it in dcr.decode_payload(p)[1]]
                assert len(items) == 1 and len(items[0]["indices"]) == 1, items
                name = items[0]["tensor"]["name"]
                index = int(items[0]["indices"][0])
                assert changed == [name]
                if trainer_kind == "megatron":
                    assert _flat_position(canon, name, index) == info["canonical_position"]
                else:
                    # FSDP2 rank r holds rows from r * ceil(n / W) of its parameter.
                    rows = canon[name].shape[0]
                    cols = canon[name].numel() // rows
                    start = POKED_RANK * -(-rows // WORLD)
                    assert index == start * cols + POKED_ELEMENT
                word = canon[name].view(-1)[index:index + 1].view(torch.int16).item()
                assert word == info["new"] != info["old"]
                value = items[0]["values"].view(np.int16)
                if items[0]["encoding"] == "overwrite":
                    assert value.tolist() == [info["new"]]
                elif items[0]["encoding"] == "xor":
                    assert value.tolist() == [info["new"] ^ info["old"]]
            entries = 0
            for rx in receivers:
                rx.begin_attempt(step)
                for p in payloads:
                    rx.stage(p)
                entries += rx.apply()["entries"]
            assert entries > 0
            # Every receiver byte against a dense load of the same weights.
            for r, got in enumerate(rx_models):
                ref = VllmLikeModel(cfg, r, WORLD)
                ref.load_weights(list(canon.items()))
                a, b = dt.state_bytes(ref), dt.state_bytes(got)
                assert a.keys() == b.keys()
                bad = [k for k in a if a[k] != b[k]]
                assert bad == [], f"step {step}: receiver {r} differs in {bad}"
            for inbox, _ in boxes:
                inbox.put(("commit", step))
            reader.collect(step)
        receive("done")
        if trainer_kind == "megatron":
            # The replicas (norms) were trained: their equality on every
            # rank, checked each step by _check_shards, was not vacuous.
            plan = dt.TrainerPlan(cfg, tp=WORLD, vocab_block=VOCAB_BLOCK)
            replicated = {s["key"] for s in plan.shards if len(s["replicas"]) > 1}
            assert replicated
            moved = {k for k, _, t in last[0] if k in replicated and
                     _bytes(t) != _bytes(first[0][k])}
            assert moved, "no replicated shard changed"
        return losses
    finally:
        for inbox, _ in boxes:
            inbox.put(None)
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()


# An odd vocabulary: FSDP2 splits the embedding 151 / 150 rows (torch.chunk),
# Megatron pads it (and 300) to 384 rows, the padding rows in no canonical tensor.
@pytest.mark.parametrize("trainer_kind, kind, vocab, lr, in_place", [
    pytest.param("megatron", "qwen3", 300, 1e-6, True, id="megatron-qwen3-lr1e-6-in-place"),
    pytest.param("megatron", "llama", 301, 1e-5, False, id="megatron-llama-lr1e-5"),
    # Experts TP-sharded (no EP), the router replicated.
    pytest.param("megatron", "qwen3_moe", 300, 1e-6, False, id="megatron-qwen3_moe-lr1e-6"),
    pytest.param("fsdp2", "llama", 301, 1e-6, True, id="fsdp2-llama-lr1e-6-in-place"),
    pytest.param("fsdp2", "qwen3", 301, 1e-5, False, id="fsdp2-qwen3-lr1e-5"),
])
def test_distributed_trainer_refit_equals_dense(trainer_kind, kind, vocab, lr, in_place):
    """3 steps of each trainer; with `in_place`, a 4th version where one
    element of a rank's parameter changed in place (the owner reads the
    parameter itself) is exactly the payload."""
    losses = _run(trainer_kind, kind, vocab, lr, poke=in_place)
    assert len(losses) == STEPS and all(np.isfinite(losses))


def test_distributed_trainer_ranks_serve_their_owners_to_a_coordinator(tmp_path):
    """The FSDP2 ranks hand their owners (over their own local tensors) to
    `dcr.OwnerServer`s; a `dcr.ClusterCoordinator` here runs each transition
    over the control channel to a `dcr.NodeServer` of two vLLM-like TP
    receivers; after each committed version every receiver byte equals a
    dense load of the weights the ranks gathered."""
    import torch.multiprocessing as mp

    work = str(tmp_path)
    kind, vocab, lr = "llama", 301, 1e-5
    cfg = hf_config(kind, vocab=vocab)
    ctx = mp.get_context("spawn")
    init = f"file://{work}/gloo-init"
    boxes = [(ctx.Queue(), ctx.Queue()) for _ in range(WORLD)]
    procs = [ctx.Process(target=_served_rank_main,
                         args=(r, init, "fsdp2", kind, vocab, lr, work, *boxes[r]), daemon=True)
             for r in range(WORLD)]
    for p in procs:
        p.start()

    def receive(what):
        out = []
        for _, outbox in boxes:
            got = outbox.get(timeout=300)
            if got[0] == "error":
                pytest.fail(got[1])
            assert got[0] == what, got
            out.append(got)
        return out

    node = None
    try:
        ready = receive("ready")
        canon = ready[0][2]
        ids = [f"tp{r}" for r in range(WORLD)]
        models = {i: VllmLikeModel(cfg, r, WORLD) for r, i in enumerate(ids)}
        receivers = {}
        for i, m in models.items():
            receivers[i] = dt.Receiver(m, canon)
            receivers[i].dense_refit(canon)
        store = dcr.ObjectStore(f"fs:{work}/objects")
        commits = dcr.CommitStore(f"file:{work}/control")
        node = dcr.NodeServer(receivers, store)
        co = dcr.ClusterCoordinator(commits, store, [m[1] for m in ready], [node.address])
        co.take_over()
        co.bootstrap()
        for step in range(1, STEPS + 1):
            for inbox, _ in boxes:
                inbox.put(("train",))
            msgs = receive("trained")
            canon = msgs[0][2]
            for m in msgs[1:]:
                assert all(_bytes(canon[n]) == _bytes(m[2][n]) for n in canon)
            rep = co.transition()
            assert rep["committed_version"] == step
            assert rep["attempts"][0]["payloads"] > 0
            assert commits.load()["version"] == step
            for r, i in enumerate(ids):
                ref = VllmLikeModel(cfg, r, WORLD)
                ref.load_weights(list(canon.items()))
                a, b = dt.state_bytes(ref), dt.state_bytes(models[i])
                assert a.keys() == b.keys()
                bad = [k for k in a if a[k] != b[k]]
                assert bad == [], f"step {step}: receiver {i} differs in {bad}"
        for inbox, _ in boxes:
            inbox.put(("stop",))
        assert [m[1] for m in receive("stopped")] == [STEPS] * WORLD
    finally:
        for inbox, _ in boxes:
            inbox.put(None)
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
        if node is not None:
            node.close()


# -- the dim-0 row-range plan itself (no processes) ----------------------------

_METAS = [("a", [5, 3], "bfloat16"), ("b", [4], "float32"), ("c", [1, 2], "bfloat16")]


def test_dim0_plan_shards_are_the_given_rows():
    # a: FSDP2's chunks over 2 ranks (3 + 2 rows); b: HSDP-like, rows
    # [0, 2) replicated on ranks 0 and 1, [2, 4) on 2 and 3; c: one row, on
    # rank 0 only (the others hold none).
    rows = [[(0, 0, 3), (1, 3, 5), (2, 5, 5), (3, 5, 5)],
            [(0, 0, 2), (1, 0, 2), (2, 2, 4), (3, 2, 4)],
            [(0, 0, 1), (1, 1, 1), (2, 1, 1), (3, 1, 1)]]
    plan = dt.TrainerPlan._from_core(dcr.Plan.dim0_shards(_METAS, rows, 4))
    got = {s["key"]: (s["param"], tuple(s["shape"]), s["dtype"], s["replicas"])
           for s in plan.shards}
    assert got == {"a@rows0:3": ("a", (3, 3), "bfloat16", [0]),
                   "a@rows3:5": ("a", (2, 3), "bfloat16", [1]),
                   "b@rows0:2": ("b", (2,), "float32", [0, 1]),
                   "b@rows2:4": ("b", (2,), "float32", [2, 3]),
                   "c@rows0:1": ("c", (1, 2), "bfloat16", [0])}
    for s in plan.shards:
        assert s["owner"] in s["replicas"]
    gen = torch.Generator().manual_seed(0)
    canon = {n: torch.randn(shape, generator=gen).to(getattr(torch, d)) for n, shape, d in _METAS}
    for r in range(4):
        for k, t in plan.project(r, canon).items():
            name, span = k.split("@rows")
            b, e = (int(x) for x in span.split(":"))
            assert _bytes(t) == _bytes(canon[name][b:e]), (r, k)


@pytest.mark.parametrize("rows, cls, what", [
    ([[(0, 0, 3), (1, 4, 5)]], dcr.Coverage, "tensor a: rows 3..3 held by no rank"),
    ([[(0, 0, 3), (1, 2, 5)]], dcr.Coverage, "tensor a: rows 2..2 held in overlapping"),
    ([[(0, 0, 3), (1, 3, 4)]], dcr.Coverage, "tensor a: rows 4..4 held by no rank"),
    ([[(0, 0, 3), (0, 3, 5)]], dcr.InvalidArgument, "tensor a: rank 0 listed twice"),
    ([[(0, 0, 3), (2, 3, 5)]], dcr.InvalidArgument, "tensor a: rank 2 outside a world of 2"),
    ([[(0, 0, 3), (1, 3, 6)]], dcr.InvalidArgument, "tensor a: rows [3, 6) of rank 1 outside"),
    ([], dcr.InvalidArgument, "0 row lists for 1 tensors"),
])
def test_dim0_plan_refuses_rows_that_are_not_a_partition(rows, cls, what):
    with pytest.raises(cls, match=re.escape(what)):
        dcr.Plan.dim0_shards(_METAS[:1], rows, 2)


def test_dim0_plan_refuses_an_unknown_dtype():
    with pytest.raises(dcr.BadDtype, match="tensor x: dtype int8"):
        dcr.Plan.dim0_shards([("x", [2], "int8")], [[(0, 0, 2)]], 1)


def test_fsdp2_plan_refuses_a_module_that_is_not_sharded():
    with pytest.raises(dcr.InvalidArgument, match=r"tensor weight: not a DTensor"):
        dt.TrainerPlan.from_fsdp(torch.nn.Linear(2, 2))
