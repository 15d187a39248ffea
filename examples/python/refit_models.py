"""The pieces of the Python refit example (and of test/python): a real
`transformers` model as the trainer's model, its canonical tensors, a BF16
trainer with an FP32 AdamW master on real text, and serving models whose
`load_weights` places weights as vLLM's loaders do.

`VllmLikeModel` mirrors vLLM's parameter layout and loader functions for
Llama, Qwen3 and Qwen3-MoE (`QKVParallelLinear.weight_loader` with
`shard_id`, `MergedColumnParallelLinear`, `RowParallelLinear`,
`VocabParallelEmbedding` padded to 64 (its padding zero-filled as vLLM
does), tied embeddings, `FusedMoE.weight_loader` with expert-parallel
placement, and `stacked_params_mapping` / `make_expert_params_mapping` in
`load_weights`). It holds weights only: serving it is vLLM's business.
"""

from __future__ import annotations

import glob
import os
import re

import torch
from torch import nn

# -- the trainer's model -------------------------------------------------------


def hf_config(kind: str, *, vocab: int = 300, layers: int = 2, tied: bool | None = None):
    """A small config of a real `transformers` architecture: llama, qwen3, qwen3_moe."""
    import transformers as tf

    common = dict(vocab_size=vocab, hidden_size=64, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    if kind == "llama":
        c = tf.LlamaConfig(intermediate_size=128, tie_word_embeddings=bool(tied), **common)
    elif kind == "qwen3":
        c = tf.Qwen3Config(intermediate_size=128, head_dim=16,
                           tie_word_embeddings=True if tied is None else tied, **common)
    elif kind == "qwen3_moe":
        c = tf.Qwen3MoeConfig(intermediate_size=128, moe_intermediate_size=32, head_dim=16,
                              num_experts=4, num_experts_per_tok=2,
                              tie_word_embeddings=bool(tied), **common)
    else:
        raise ValueError(kind)
    c.dtype = torch.bfloat16
    return c


def hf_model(config, seed: int = 0) -> nn.Module:
    """The `transformers` causal LM of `config`, random weights, BF16."""
    import transformers as tf

    torch.manual_seed(seed)
    cls = {"llama": tf.LlamaForCausalLM, "qwen3": tf.Qwen3ForCausalLM,
           "qwen3_moe": tf.Qwen3MoeForCausalLM}[config.model_type]
    return cls(config).to(torch.bfloat16)


_EXPERT = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$")


def canonical_views(model: nn.Module, names) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors as views of `model`'s parameters.

    transformers 5 keeps a Qwen3-MoE layer's experts fused
    (`experts.gate_up_proj` [E, 2I, H] = [gate; up], `experts.down_proj`
    [E, H, I]); the checkpoint names each expert's projection, which is a
    contiguous slice of those."""
    params = dict(model.named_parameters(remove_duplicate=False))
    out = {}
    for n in names:
        if n in params:
            out[n] = params[n].data
            continue
        m = _EXPERT.match(n)
        if not m:
            raise KeyError(n)
        prefix, e, which = m.group(1), int(m.group(2)), m.group(3)
        if which == "down":
            out[n] = params[prefix + ".down_proj"].data[e]
        else:
            gu = params[prefix + ".gate_up_proj"].data
            half = gu.shape[1] // 2
            out[n] = gu[e, :half] if which == "gate" else gu[e, half:]
    return out


def text_tokens(limit: int = 1 << 20) -> torch.Tensor:
    """Real text found on the machine, tokenized byte-level (ids 0..255)."""
    data = bytearray()
    for pattern in ("/usr/share/common-licenses/*", "/usr/share/doc/*/copyright"):
        for path in sorted(glob.glob(pattern)):
            if os.path.isfile(path):
                with open(path, "rb") as f:
                    data += f.read()
            if len(data) >= limit:
                break
    if len(data) < 4096:
        raise RuntimeError("no text found under /usr/share/common-licenses or /usr/share/doc")
    return torch.frombuffer(bytearray(data[:limit]), dtype=torch.uint8).to(torch.long)


class Trainer:
    """BF16 weights, FP32 AdamW master state, causal LM loss on byte text."""

    def __init__(self, model: nn.Module, lr: float, tokens: torch.Tensor, *, seq: int = 64,
                 batch: int = 4, seed: int = 0):
        self.model, self.tokens, self.seq, self.batch = model, tokens, seq, batch
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.master = [p.detach().float().clone().requires_grad_(True) for p in self.params]
        self.opt = torch.optim.AdamW(self.master, lr=lr)
        self.gen = torch.Generator().manual_seed(seed)

    def step(self) -> float:
        starts = torch.randint(0, self.tokens.numel() - self.seq - 1, (self.batch,),
                               generator=self.gen)
        ids = torch.stack([self.tokens[s:s + self.seq + 1] for s in starts.tolist()])
        out = self.model(input_ids=ids[:, :-1])
        loss = nn.functional.cross_entropy(out.logits.float().reshape(-1, out.logits.shape[-1]),
                                           ids[:, 1:].reshape(-1))
        loss.backward()
        for p, m in zip(self.params, self.master):
            m.grad = None if p.grad is None else p.grad.float()
            p.grad = None
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            for p, m in zip(self.params, self.master):
                p.copy_(m)  # round to nearest BF16
        return float(loss.detach())


_EXPERTS = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$")


def hf_params(canon: dict) -> dict:
    """Canonical (checkpoint) tensors in the `transformers` model's parameter
    names: a Qwen3-MoE layer's per-expert projections stacked into its fused
    `experts.gate_up_proj` ([gate; up] per expert) and `experts.down_proj`
    (differentiable: gradients reach the tensors stacked)."""
    out, experts = {}, {}
    for n, t in canon.items():
        m = _EXPERTS.match(n)
        if m is None:
            out[n] = t
        else:
            experts.setdefault(m.group(1), {}).setdefault(int(m.group(2)), {})[m.group(3)] = t
    for prefix, by_e in experts.items():
        order = sorted(by_e)
        out[prefix + ".gate_up_proj"] = torch.stack(
            [torch.cat([by_e[e]["gate"], by_e[e]["up"]]) for e in order])
        out[prefix + ".down_proj"] = torch.stack([by_e[e]["down"] for e in order])
    return out


class ShardedTrainer:
    """A Megatron-style TP trainer whose parameters are the ranks' source
    shards themselves: `shards[rank]` is `{shard key: nn.Parameter}` in the
    plan's layout (what dcr's owners read, as views, with no projection).

    The forward pass is the `transformers` model run on canonical tensors
    gathered from the shards (a differentiable gather, so real gradients
    reach the shard parameters); BF16 parameters with an FP32 AdamW master,
    as `Trainer`. Each shard element is trained in the shard of its owner
    rank; replicated shards (norms, experts without EP) and other copies
    are set from it after every step, as Megatron's gradient all-reduce
    keeps replicas equal."""

    def __init__(self, model: nn.Module, plan, lr: float, tokens: torch.Tensor, *,
                 seq: int = 64, batch: int = 4, seed: int = 0):
        self.model, self.plan, self.tokens, self.seq, self.batch = model, plan, tokens, seq, batch
        self.names = [m.name for m in plan.canonical]
        canon = canonical_views(model, self.names)
        self.shards = []
        self.index = []
        for r in range(plan.world):
            projected = plan.project(r, canon)
            self.shards.append({k: nn.Parameter(t, requires_grad=True)
                                for k, t in projected.items()})
            self.index.append(plan.source_index(r))
        # The trained elements: each canonical element from its owner's shard.
        total = sum(m.numel for m in plan.canonical)
        self.trained: list[nn.Parameter] = []
        sources, at = [], 0
        gather = torch.full((total,), -1, dtype=torch.int64)
        for r in range(plan.world):
            for s in plan.rank_shards(r):
                if s["owner"] != r:
                    continue
                idx = self.index[r][s["key"]]
                valid = idx > 0
                pos = idx[valid] - 1
                free = gather[pos] < 0  # the first owner shard that holds it
                gather[pos[free]] = torch.nonzero(valid).view(-1)[free] + at
                self.trained.append(self.shards[r][s["key"]])
                sources.append(s["key"])
                at += idx.numel()
        if bool((gather < 0).any()):
            raise ValueError("sharded trainer: the owned shards do not cover every canonical element")
        self.gather = gather
        self.master = [p.detach().float().clone().requires_grad_(True) for p in self.trained]
        self.opt = torch.optim.AdamW(self.master, lr=lr)
        self.gen = torch.Generator().manual_seed(seed)
        self.offsets = {}
        at = 0
        for m in plan.canonical:
            self.offsets[m.name] = (at, m.numel, m.shape)
            at += m.numel

    def canonical(self, *, grad: bool = False) -> dict[str, torch.Tensor]:
        """The canonical tensors gathered from the owners' shards (new tensors)."""
        with torch.set_grad_enabled(grad):
            flat = torch.cat([p.view(-1) for p in self.trained])[self.gather]
        return {n: flat[a:a + k].view(shape) for n, (a, k, shape) in self.offsets.items()}

    def _hf_params(self, canon):
        return hf_params(canon)

    def step(self) -> float:
        starts = torch.randint(0, self.tokens.numel() - self.seq - 1, (self.batch,),
                               generator=self.gen)
        ids = torch.stack([self.tokens[s:s + self.seq + 1] for s in starts.tolist()])
        params = self._hf_params(self.canonical(grad=True))
        out = torch.func.functional_call(self.model, params, (ids[:, :-1],))
        loss = nn.functional.cross_entropy(out.logits.float().reshape(-1, out.logits.shape[-1]),
                                           ids[:, 1:].reshape(-1))
        loss.backward()
        for p, m in zip(self.trained, self.master):
            m.grad = None if p.grad is None else p.grad.float()
            p.grad = None
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            for p, m in zip(self.trained, self.master):
                p.copy_(m)  # round to nearest BF16, in the parameter's own storage
            self.sync_replicas()
        return float(loss.detach())

    @torch.no_grad()
    def sync_replicas(self) -> None:
        """Every shard element that is not the one trained set from the one
        that is, in place (the shards stay the tensors the owners hold)."""
        flat = torch.cat([p.view(-1) for p in self.trained])[self.gather]
        for r, shards in enumerate(self.shards):
            for k, p in shards.items():
                idx = self.index[r][k]
                valid = idx > 0
                p.view(-1)[valid] = flat[idx[valid] - 1]


# -- the serving model ---------------------------------------------------------


def _pad64(v: int) -> int:
    return (v + 63) // 64 * 64


def num_experts(cfg) -> int:
    """Routed experts of a config (transformers 5 names them num_local_experts)."""
    return int(getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts", 0) or 0)


def default_weight_loader(param: nn.Parameter, w: torch.Tensor) -> None:
    param.data.copy_(w)


class VllmLikeModel(nn.Module):
    """One TP rank of a vLLM-served Llama / Qwen3 / Qwen3-MoE: its parameters
    in vLLM's layout and names, and vLLM's `load_weights`.

    `enable_expert_parallel`: whole experts over the TP ranks (linear
    placement), else experts TP-sharded. `fp32_norms`: RMSNorm weights kept
    in FP32 (a cast in the loader: overwrite-only), which vLLM does not do
    but runtimes that upcast norms do."""

    def __init__(self, cfg, tp_rank: int = 0, tp_size: int = 1, *,
                 enable_expert_parallel: bool = False, fp32_norms: bool = False,
                 dtype: torch.dtype = torch.bfloat16, device=None):
        super().__init__()
        self.cfg, self.r, self.t = cfg, tp_rank, tp_size
        H, nh, nkv = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads
        d = getattr(cfg, "head_dim", None) or H // nh
        self.d, self.nh, self.nkv = d, nh, nkv
        self.nq_l = nh // tp_size
        self.nkv_l = 1 if tp_size >= nkv else nkv // tp_size
        self.vocab, self.vp = cfg.vocab_size, _pad64(cfg.vocab_size)
        self.tied = bool(cfg.tie_word_embeddings)
        self.qk_norm = cfg.model_type in ("qwen3", "qwen3_moe")
        self.moe = cfg.model_type == "qwen3_moe"
        ndt = torch.float32 if fp32_norms else dtype
        kw = dict(device=device)

        def P(shape, dt=dtype, loader=None):
            p = nn.Parameter(torch.zeros(shape, dtype=dt, **kw), requires_grad=False)
            p.weight_loader = loader or default_weight_loader
            return p

        self.model = nn.Module()
        self.model.embed_tokens = nn.Module()
        self.model.embed_tokens.weight = P((self.vp // tp_size, H), loader=self._vocab_loader)
        self.model.layers = nn.ModuleList()
        E = num_experts(cfg)
        if self.moe:
            if enable_expert_parallel and tp_size > 1:
                per, extra = divmod(E, tp_size)
                first = tp_rank * per + min(tp_rank, extra)
                n_local = per + (1 if tp_rank < extra else 0)
                self.expert_map = {first + i: i for i in range(n_local)}
                self.moe_tp_rank, self.moe_tp = 0, 1
            else:
                self.expert_map = {e: e for e in range(E)}
                self.moe_tp_rank, self.moe_tp = tp_rank, tp_size
            self.im = cfg.moe_intermediate_size // self.moe_tp
        for _ in range(cfg.num_hidden_layers):
            L = nn.Module()
            L.input_layernorm = nn.Module()
            L.input_layernorm.weight = P((H,), ndt)
            L.post_attention_layernorm = nn.Module()
            L.post_attention_layernorm.weight = P((H,), ndt)
            A = L.self_attn = nn.Module()
            A.qkv_proj = nn.Module()
            A.qkv_proj.weight = P(((self.nq_l + 2 * self.nkv_l) * d, H), loader=self._qkv_loader)
            A.o_proj = nn.Module()
            A.o_proj.weight = P((H, self.nq_l * d), loader=self._row_loader)
            if self.qk_norm:
                A.q_norm = nn.Module()
                A.q_norm.weight = P((d,), ndt)
                A.k_norm = nn.Module()
                A.k_norm.weight = P((d,), ndt)
            M = L.mlp = nn.Module()
            if self.moe:
                M.gate = nn.Module()
                M.gate.weight = P((E, H))
                M.experts = nn.Module()
                n_local = len(self.expert_map)
                M.experts.w13_weight = P((n_local, 2 * self.im, H), loader=self._moe_loader)
                M.experts.w2_weight = P((n_local, H, self.im), loader=self._moe_loader)
            else:
                I_l = cfg.intermediate_size // tp_size
                self.i_l = I_l
                M.gate_up_proj = nn.Module()
                M.gate_up_proj.weight = P((2 * I_l, H), loader=self._merged_loader)
                M.down_proj = nn.Module()
                M.down_proj.weight = P((H, I_l), loader=self._row_loader)
            self.model.layers.append(L)
        self.model.norm = nn.Module()
        self.model.norm.weight = P((H,), ndt)
        self.lm_head = nn.Module()
        if self.tied:
            self.lm_head.weight = self.model.embed_tokens.weight
        else:
            self.lm_head.weight = P((self.vp // tp_size, H), loader=self._vocab_loader)
        # A buffer no checkpoint tensor writes (vLLM's rotary cos/sin cache).
        inv = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        f = torch.outer(torch.arange(cfg.max_position_embeddings, dtype=torch.float32), inv)
        self.model.register_buffer("cos_sin_cache", torch.cat([f.cos(), f.sin()], -1).to(
            device=device))

    # vLLM's weight loaders -------------------------------------------------------
    def _qkv_loader(self, param, w, shard_id):
        d, r, t = self.d, self.r, self.t
        if shard_id == "q":
            off, size, start = 0, self.nq_l * d, r * self.nq_l * d
        else:
            size = self.nkv_l * d
            off = self.nq_l * d + (0 if shard_id == "k" else size)
            head_rank = r // (t // self.nkv) if t >= self.nkv else r
            start = head_rank * size
        param.data.narrow(0, off, size).copy_(w.narrow(0, start, size))

    def _merged_loader(self, param, w, shard_id):
        n = self.i_l
        param.data.narrow(0, shard_id * n, n).copy_(w.narrow(0, self.r * n, n))

    def _row_loader(self, param, w):
        k = param.shape[1]
        param.data.copy_(w.narrow(1, self.r * k, k))

    def _vocab_loader(self, param, w):
        per = self.vp // self.t
        start = self.r * per
        n = max(0, min(start + per, self.vocab) - start)
        param.data[:n].copy_(w.narrow(0, start, n))
        param.data[n:].fill_(0)  # vLLM zeroes the padding rows

    def _moe_loader(self, param, w, name, shard_id, expert_id):
        if expert_id not in self.expert_map:
            return False
        e, im, mr = self.expert_map[expert_id], self.im, self.moe_tp_rank
        if shard_id == "w2":
            param.data[e].copy_(w.narrow(1, mr * im, im))
        else:
            off = 0 if shard_id == "w1" else im
            param.data[e].narrow(0, off, im).copy_(w.narrow(0, mr * im, im))
        return True

    def expert_params_mapping(self):
        out = []
        for e in range(num_experts(self.cfg)):
            for sid, wn in (("w1", "gate_proj"), ("w3", "up_proj"), ("w2", "down_proj")):
                pn = "experts.w2_" if sid == "w2" else "experts.w13_"
                out.append((pn, f"experts.{e}.{wn}.", e, sid))
        return out

    def load_weights(self, weights) -> set[str]:
        stacked = [("qkv_proj", "q_proj", "q"), ("qkv_proj", "k_proj", "k"),
                   ("qkv_proj", "v_proj", "v"), ("gate_up_proj", "gate_proj", 0),
                   ("gate_up_proj", "up_proj", 1)]
        params = dict(self.named_parameters(remove_duplicate=False))
        loaded: set[str] = set()
        for name, w in weights:
            if self.tied and name.startswith("lm_head."):
                continue
            for pn, wn, sid in stacked:
                if wn not in name or "mlp.experts" in name:
                    continue
                name = name.replace(wn, pn)
                param = params[name]
                param.weight_loader(param, w, sid)
                break
            else:
                if "mlp.experts" in name:
                    for pn, wn, eid, sid in self.expert_params_mapping():
                        if wn not in name:
                            continue
                        mapped = name.replace(wn, pn)
                        param = params[mapped]
                        if param.weight_loader(param, w, mapped, shard_id=sid, expert_id=eid):
                            name = mapped
                            break
                    else:
                        continue  # an expert homed on another EP rank
                else:
                    param = params[name]
                    param.weight_loader(param, w)
            loaded.add(name)
        return loaded
