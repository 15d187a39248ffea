"""Processes of the cross-process tests (test_remote.py): trainer ranks of a
`torch.distributed` (gloo) data-parallel trainer, each serving the owner of
its tensor-parallel shards, and serving processes holding vLLM-like
receivers behind a node server. Spawned by torch.multiprocessing, driven
through queues by the test, which runs the coordinator."""

from __future__ import annotations

import os
import sys
import traceback

import torch


def _paths(root: str) -> None:
    for p in (os.path.join(root, "python"), os.path.join(root, "examples", "python"),
              os.path.join(root, "test", "python")):
        if p not in sys.path:
            sys.path.insert(0, p)
    torch.set_num_threads(1)


class DataParallelTrainer:
    """BF16 weights with an FP32 AdamW master; each rank its own batches of
    real text; gradients averaged over the gloo group, so every rank holds
    the same weights after each step (as a DP replica)."""

    def __init__(self, model, lr: float, tokens, rank: int, *, seq: int = 64, batch: int = 2):
        import torch.distributed as dist
        self.dist = dist
        self.model, self.tokens, self.seq, self.batch = model, tokens, seq, batch
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.master = [p.detach().float().clone().requires_grad_(True) for p in self.params]
        self.opt = torch.optim.AdamW(self.master, lr=lr)
        self.gen = torch.Generator().manual_seed(1000 + rank)

    def step(self) -> float:
        starts = torch.randint(0, self.tokens.numel() - self.seq - 1, (self.batch,),
                               generator=self.gen)
        ids = torch.stack([self.tokens[s:s + self.seq + 1] for s in starts.tolist()])
        out = self.model(input_ids=ids[:, :-1])
        loss = torch.nn.functional.cross_entropy(
            out.logits.float().reshape(-1, out.logits.shape[-1]), ids[:, 1:].reshape(-1))
        loss.backward()
        world = self.dist.get_world_size()
        for p, m in zip(self.params, self.master):
            g = p.grad.float() if p.grad is not None else torch.zeros_like(m)
            self.dist.all_reduce(g)
            m.grad = g / world
            p.grad = None
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            for p, m in zip(self.params, self.master):
                p.copy_(m)  # round to nearest BF16
        return float(loss.detach())


def trainer_rank(rank: int, world: int, root: str, init: str, work: str, key: str | None,
                 lr: float, cmd, out, relay: list[str] | None = None) -> None:
    """One trainer rank: trains on command, its owner served to the coordinator."""
    try:
        _paths(root)
        import torch.distributed as dist

        import dcr
        import dcr.torch as dt
        from refit_models import canonical_views, hf_config, hf_model, text_tokens

        dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank,
                                world_size=world)
        cfg = hf_config("llama")
        model = hf_model(cfg, 0)
        plan = dt.TrainerPlan(cfg, tp=world)
        names = [m.name for m in plan.canonical]
        shards = plan.project(rank, canonical_views(model, names))
        owner = dt.Owner(plan, rank, shards, job_key=key)
        store = dcr.ObjectStore(f"fs:{work}/objects", job_key=key)
        commits = dcr.CommitStore(f"file:{work}/control", job_key=key)
        server = dcr.OwnerServer(owner, store, commits, job_key=key, lease=True,
                                 relay=dcr.RelayNodes(relay) if relay else None)
        server.set_candidate(shards)
        trainer = DataParallelTrainer(model, lr, text_tokens(1 << 16), rank)
        out.put(("ready", rank, server.address))
        version = 0
        while True:
            msg = cmd.get()
            if msg[0] == "stop":
                break
            if msg[0] == "train":
                # The parameters change only after the joint commit moved
                # this owner's baseline to the version it published.
                server.wait_committed(version, 120)
                loss = trainer.step()
                plan.project(rank, canonical_views(model, names), shards)
                server.set_candidate(shards)
                version += 1
                canon = None
                if rank == 0:
                    canon = {k: v.detach().clone() for k, v in
                             canonical_views(model, names).items()}
                out.put(("trained", rank, loss, canon))
        server.wait_committed(version, 60)
        server.close()
        dist.destroy_process_group()
        out.put(("stopped", rank, server.version))
    except BaseException:
        out.put(("failed", rank, traceback.format_exc()))


def serving_node(index: int, ids: list[str], root: str, work: str, key: str | None, cmd,
                 out, relay: list[str] | None = None) -> None:
    """A serving process: vLLM-like TP ranks at version 0 behind a node server
    (hosting node `index` of the relay tree at `relay`, if given)."""
    try:
        _paths(root)
        import dcr
        import dcr.torch as dt
        from refit_models import VllmLikeModel, canonical_views, hf_config, hf_model

        cfg = hf_config("llama")
        plan = dt.TrainerPlan(cfg, tp=2)
        names = [m.name for m in plan.canonical]
        canon = canonical_views(hf_model(cfg, 0), names)
        tp = len(ids)
        models = {i: VllmLikeModel(cfg, r, tp) for r, i in enumerate(ids)}
        receivers = {}
        for i, m in models.items():
            rx = dt.Receiver(m, plan.canonical, job_key=key)
            rx.dense_refit(canon)
            receivers[i] = rx
        store = dcr.ObjectStore(f"fs:{work}/objects", job_key=key)
        node = dcr.NodeServer(receivers, store, job_key=key, gate=True,
                              relay=dcr.RelayNodes(relay) if relay else None,
                              relay_node=index if relay else None)
        out.put(("ready", index, node.address))
        while True:
            msg = cmd.get()
            if msg[0] == "stop":
                break
            if msg[0] == "state":
                out.put(("state", index, {i: dt.state_bytes(m) for i, m in models.items()}))
            if msg[0] == "counters":
                out.put(("counters", index, {i: node.counters(i) for i in ids}))
        node.close()
        out.put(("stopped", index, None))
    except BaseException:
        out.put(("failed", index, traceback.format_exc()))
