"""Shared scaffolding of the vLLM engine tests: a tiny Llama, its trained
versions as checkpoints, engines on the CPU, and their state and greedy
output (test/python_vllm)."""

from __future__ import annotations

import os
import sys

# Before vllm is imported: the CPU platform, a small KV cache, and the
# engine core in this process unless a test asks for its own processes.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
for p in (os.path.join(ROOT, "python"), os.path.join(ROOT, "examples", "python")):
    if p not in sys.path:
        sys.path.insert(0, p)

import torch  # noqa: E402

# The example's engine helpers: checkpoints, greedy output, worker state.
from rl_loop import engine_state, greedy, save_checkpoint, shutdown  # noqa: E402,F401


def llama_config(dtype: str):
    """A tiny Llama: head_dim 32 (the CPU attention refuses 16), untied
    embeddings (vLLM's layerwise reload processes a tied tensor once)."""
    import transformers
    return transformers.LlamaConfig(
        vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        max_position_embeddings=256, tie_word_embeddings=False, dtype=dtype,
        bos_token_id=1, eos_token_id=2)


def start_engine(path: str, dtype: str, *, tp: int = 1, extension: bool = True, **kw):
    from vllm import LLM
    if extension:
        kw["worker_extension_cls"] = "dcr.vllm.DcrWorkerExtension"
    return LLM(model=path, skip_tokenizer_init=True, dtype=dtype, max_model_len=128,
               enforce_eager=True, max_num_seqs=4, tensor_parallel_size=tp,
               distributed_executor_backend="mp" if tp > 1 else None,
               seed=0, **kw)


def versions(dtype: str, *, train_steps: int = 2, lr: float = 1e-5, seed: int = 0):
    """(config, [canonical tensors of v0, v1, ...]): v0 a random init, then
    `train_steps` AdamW steps (FP32 master) on real text from the machine,
    then one version with low mantissa bits changed in about 2 % of the
    elements of layer 0's tensors only (layer 1, the embeddings, the final
    norm and the LM head untouched)."""
    import transformers
    import dcr.torch as dt
    from refit_models import Trainer, canonical_views, text_tokens

    cfg = llama_config(dtype)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(cfg).to(getattr(torch, dtype))
    names = [m.name for m in dt.TrainerPlan(cfg, tp=2).canonical]

    def snap():
        return {n: t.detach().clone() for n, t in canonical_views(model, names).items()}

    out = [snap()]
    trainer = Trainer(model, lr, text_tokens(1 << 16), seed=seed)
    for _ in range(train_steps):
        trainer.step()
        out.append(snap())
    last = {k: t.clone() for k, t in out[-1].items()}
    g = torch.Generator().manual_seed(seed + 1)
    word = {2: torch.int16, 4: torch.int32}
    for k, t in last.items():
        if ".layers.0." not in k:
            continue
        w = t.view(-1).view(word[t.element_size()])
        idx = torch.randperm(w.numel(), generator=g)[: max(1, w.numel() // 50)]
        w[idx] ^= torch.randint(1, 8, (idx.numel(),), generator=g, dtype=w.dtype)
    out.append(last)
    return cfg, out
