"""Training ranks as `torch.distributed` processes, each holding its own shards
as parameters and handing them to its owner by pointer (docs/distributed-trainers.md).

`MegatronTrainer`: one tensor-parallel rank whose `nn.Parameter`s are exactly
its shards of a `TrainerPlan` (Megatron's layout: fused QKV, merged fc1, row
and column splits, padded vocabulary), BF16 with an FP32 AdamW master.
`FSDP2Trainer`: a module sharded by `torch.distributed.fsdp.fully_shard`,
whose plan is derived from its DTensor placements (`TrainerPlan.from_fsdp`).

Both give the same rank-side surface: `plan`, `rank`, `shards` (`{shard key:
tensor}`, views of the rank's parameters, what `dcr.torch.Owner` and an
owner server read in place), `owner()` and `step(ids)`. Every method that
communicates is a collective: every rank of the group calls it, in the same
order.
"""

from __future__ import annotations

from typing import Callable, Mapping

import torch
import torch.distributed as dist
from torch import nn

from . import errors
from .torch import Owner, TrainerPlan

__all__ = ["MegatronTrainer", "FSDP2Trainer", "causal_lm_loss"]


def causal_lm_loss(model: nn.Module, ids: torch.Tensor, params=None) -> torch.Tensor:
    """Next-token cross entropy of a causal LM on `ids` ([batch, seq + 1]),
    the module run on `params` (`torch.func.functional_call`) when given."""
    args = (ids[:, :-1],)
    out = model(*args) if params is None else torch.func.functional_call(model, params, args)
    logits = out.logits if hasattr(out, "logits") else out
    return nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                       ids[:, 1:].reshape(-1))


class MegatronTrainer:
    """One tensor-parallel rank of a Megatron-style trainer over a process group.

    `plan`: the `TrainerPlan` of the layout (its world the group's size;
    only tensor parallelism: every shard is on one rank or on all of them).
    `canonical`: `{checkpoint name: tensor}` of the initial weights, the same
    on every rank (each rank projects its own shards from it and keeps
    nothing else of it). `model`: the module the forward runs on the gathered
    canonical tensors (its own parameters are not trained); `to_params` maps
    the canonical tensors to its parameter names (default: the same names).

    The forward gathers the canonical tensors from the ranks' owned shards
    with a differentiable all-gather (`torch.distributed.nn`), through the
    plan's own projection index (`TrainerPlan.source_index`), so backward
    gives each rank the gradients of its own shards. Every rank runs the same
    batch (TP ranks see the same data), and the all-gather's backward sums
    the ranks' identical gradients, so the loss is divided by the world
    size. Replicated shards (norms) are trained on every rank with their
    gradient all-reduced, as Megatron's all-reduce keeps replicas equal: the
    copies stay bitwise equal because every rank runs the same AdamW step on
    the same FP32 master and gradient."""

    def __init__(self, model: nn.Module, plan: TrainerPlan, canonical: Mapping[str, torch.Tensor],
                 *, lr: float, group=None,
                 to_params: Callable[[dict], dict] | None = None):
        self.model, self.plan, self.group = model, plan, group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        if plan.world != self.world:
            errors.raise_error(errors.InvalidArgument,
                               f"megatron trainer: a plan of {plan.world} ranks in a group of "
                               f"{self.world}")
        for s in plan.shards:
            if len(s["replicas"]) not in (1, self.world):
                errors.raise_error(errors.InvalidArgument,
                                   f"shard {s['key']}: replicated on {len(s['replicas'])} of "
                                   f"{self.world} ranks (only TP layouts: one rank or all)")
        self.to_params = to_params or (lambda c: c)
        self.shards: dict[str, nn.Parameter] = {
            k: nn.Parameter(t, requires_grad=True)
            for k, t in plan.project(self.rank, canonical).items()}
        # The gather: canonical element -> position in the ranks' owned shards
        # laid end to end, each rank's block padded to the longest (the
        # all-gather takes equal sizes). Every rank computes every rank's
        # index from the plan alone.
        self._owned = [[s["key"] for s in plan.rank_shards(r) if s["owner"] == r]
                       for r in range(self.world)]
        index = [plan.source_index(r) for r in range(self.world)]
        self._index = index[self.rank]
        sizes = [sum(index[r][k].numel() for k in self._owned[r]) for r in range(self.world)]
        self._block = max(sizes)
        total = sum(m.numel for m in plan.canonical)
        gather = torch.full((total,), -1, dtype=torch.int64)
        for r in range(self.world):
            at = r * self._block
            for k in self._owned[r]:
                idx = index[r][k]
                valid = idx > 0
                pos = idx[valid] - 1
                free = gather[pos] < 0  # the first owned shard that holds it
                gather[pos[free]] = torch.nonzero(valid).view(-1)[free] + at
                at += idx.numel()
        if bool((gather < 0).any()):
            errors.raise_error(errors.Coverage,
                               "megatron trainer: the owned shards do not cover every "
                               "canonical element")
        self._gather = gather
        self._replicated = [s["key"] for s in plan.rank_shards(self.rank)
                            if len(s["replicas"]) > 1]
        self._params = list(self.shards.values())
        self._master = [p.detach().float().clone().requires_grad_(True) for p in self._params]
        self._opt = torch.optim.AdamW(self._master, lr=lr)
        self._offsets = []
        at = 0
        for m in plan.canonical:
            self._offsets.append((m.name, at, m.numel, m.shape))
            at += m.numel

    def owner(self, **kw) -> Owner:
        """This rank's owner over its parameters (views, no copy); baseline
        = the parameters now."""
        return Owner(self.plan, self.rank, self.shards, **kw)

    def canonical(self, *, grad: bool = False) -> dict[str, torch.Tensor]:
        """The canonical tensors gathered from every rank's owned shards
        (collective; new tensors)."""
        import torch.distributed.nn.functional as dfn

        with torch.set_grad_enabled(grad):
            dtype = self._params[0].dtype if self._params else torch.bfloat16
            parts = [self.shards[k].view(-1) for k in self._owned[self.rank]]
            local = torch.cat(parts) if parts else torch.zeros(0, dtype=dtype)
            # The collective in FP32: exact for BF16 and FP16 values, and the
            # backward's sum of the ranks' gradients is then taken in FP32,
            # not rounded to the weights' dtype at every addition.
            pad = self._block - local.numel()
            local = nn.functional.pad(local.float(), (0, pad))
            if grad:
                blocks = dfn.all_gather(local, group=self.group)
            else:
                blocks = [torch.empty_like(local) for _ in range(self.world)]
                dist.all_gather(blocks, local, group=self.group)
            flat = torch.cat(list(blocks))[self._gather]
        return {n: flat[a:a + k].view(shape).to(m.dtype)
                for (n, a, k, shape), m in zip(self._offsets, self.plan.canonical)}

    def step(self, ids: torch.Tensor) -> float:
        """One AdamW step on the batch `ids` ([batch, seq + 1], the same on
        every rank); the shards change in place. Returns the loss."""
        loss = causal_lm_loss(self.model, ids, self.to_params(self.canonical(grad=True)))
        (loss / self.world).backward()
        grads = {k: (p.grad if p.grad is not None else torch.zeros_like(p))
                 for k, p in self.shards.items()}
        if self._replicated:
            # A non-owner copy has no gradient from the gather: the sum is
            # the owner's gradient, now on every replica.
            flat = torch.cat([grads[k].float().view(-1) for k in self._replicated])
            dist.all_reduce(flat, group=self.group)
            at = 0
            for k in self._replicated:
                n = grads[k].numel()
                grads[k] = flat[at:at + n].view(grads[k].shape)
                at += n
        for (k, p), m in zip(self.shards.items(), self._master):
            m.grad = grads[k].float()
            p.grad = None
        self._opt.step()
        self._opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            for p, m in zip(self._params, self._master):
                p.copy_(m)  # round to nearest BF16, in the parameter's own storage
        return float(loss.detach())


class FSDP2Trainer:
    """One rank of a module sharded by FSDP2 (`fully_shard` over a 1-D mesh of
    the default group, parameters DTensors placed `Shard(0)`), BF16 with an
    FP32 AdamW master of the rank's local rows.

    `wrap`: submodules to `fully_shard` first (each its own all-gather
    unit; a `transformers` model's decoder layers), the module itself last.
    The plan comes from the DTensor placements (`TrainerPlan.from_fsdp`);
    `shards` are the parameters' local tensors (`to_local()`, views of
    FSDP2's sharded storage), which the optimizer step writes in place.
    FSDP2 is data parallel: each rank trains on its own batch and the
    gradients are reduce-scattered as their mean."""

    def __init__(self, model: nn.Module, *, lr: float, wrap=(), mesh=None):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        if mesh is None:
            dev = next(model.parameters()).device.type
            mesh = init_device_mesh(dev, (self.world,))
        for m in wrap:
            fully_shard(m, mesh=mesh)
        fully_shard(model, mesh=mesh)
        self.model = model
        self.plan = TrainerPlan.from_fsdp(model)
        self._named = list(model.named_parameters())
        self._master = [p.to_local().detach().float().clone().requires_grad_(True)
                        for _, p in self._named]
        self._opt = torch.optim.AdamW(self._master, lr=lr)

    @property
    def shards(self) -> dict[str, torch.Tensor]:
        """`{shard key: local tensor}` of this rank (views, no copy; taken
        without autograd, so the owner holds no graph)."""
        with torch.no_grad():
            local = {n: p.to_local() for n, p in self._named}
        return {s["key"]: local[s["param"]] for s in self.plan.rank_shards(self.rank)}

    def owner(self, **kw) -> Owner:
        return Owner(self.plan, self.rank, self.shards, **kw)

    def canonical(self) -> dict[str, torch.Tensor]:
        """The full parameters (collective: DTensor's all-gather; new tensors)."""
        with torch.no_grad():
            return {n: p.full_tensor() for n, p in self._named}

    def step(self, ids: torch.Tensor) -> float:
        """One AdamW step on this rank's batch `ids` ([batch, seq + 1])."""
        loss = causal_lm_loss(self.model, ids)
        loss.backward()
        for (n, p), m in zip(self._named, self._master):
            m.grad = None if p.grad is None else p.grad.to_local().float()
            p.grad = None
        self._opt.step()
        self._opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            for (_, p), m in zip(self._named, self._master):
                p.to_local().copy_(m)  # in FSDP2's sharded storage
        return float(loss.detach())
