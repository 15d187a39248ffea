#!/usr/bin/env python3
"""An RL weight-sync loop with dcr: trainer ranks as torch.distributed
processes, a real vLLM engine as the receiver, one coordinator in a process
of its own.

    .venv-vllm/bin/python3 examples/python/rl_loop.py [--steps 3] [--trainer megatron|fsdp2]
        [--tp 1|2] [--store URL] [--commits URL] [--transport object_store|relay_tree]
        [--job-key FILE] [--lr 1e-6] [--workdir DIR] [--kill worker:STEP|rank:STEP]

Processes:
- 2 trainer ranks (`torch.multiprocessing`, gloo): `dcr.trainers.MegatronTrainer`
  (tensor-parallel shards as parameters) or `dcr.trainers.FSDP2Trainer`
  (`fully_shard`, the plan from the DTensor placements), BF16 weights, FP32
  AdamW, next-token loss on text found on the machine. Each serves its
  owner (`dcr.OwnerServer`, reading its shards in place, holding the rank's
  owner lease) and steps only after the joint commit moved its baseline.
- the coordinator (`dcr.ClusterCoordinator`) in its own process: attempts,
  the compare-and-set of the commit record, the owners' baseline moves.
- this process: the vLLM engine (`vllm.LLM` with `dcr.vllm.DcrWorkerExtension`;
  `--tp 2`: two worker processes) served as one receiver by a
  `dcr.NodeServer`.

After every step the engine's state (every parameter, buffer and kernel
tensor of every worker) and its greedy output of fixed prompts are taken,
then the same version is loaded densely through vLLM's own
`reload_weights` from a checkpoint and compared: bit-exact and generation
equal, or the program exits non-zero. At the end a fresh engine is started
from each version's checkpoint and compared with what the refit produced.
Ends with `rl_loop: N steps, bit-exact, generation equal`.

`--kill worker:K` SIGKILLs a serving worker (TP 2) just before the engine
applies step K's attempt: the transition fails with nothing committed, the
engine is started again from the committed version's checkpoint at the same
node address, and the coordinator's next transition refits it. `--kill
rank:K` SIGKILLs trainer rank 1 while its owner publishes step K: the
trainer restarts from the committed version's weights (a new process group,
its ranks serving their owners at the same addresses) and trains step K
again, or goes on if the version committed before the rank died. Either way
the checks above decide.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import traceback

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
for p in (os.path.join(ROOT, "python"), HERE):
    if p not in sys.path:
        sys.path.insert(0, p)

import torch  # noqa: E402

WORLD = 2
PROMPTS = ["The licence grants", "Permission is hereby", "THE SOFTWARE IS", "copyright 2026"]
MAX_TOKENS = 12


def model_config(hidden: int, layers: int):
    """A small Llama (BF16, untied embeddings: vLLM's layerwise reload
    processes a tied tensor once), byte-level vocabulary padded to 512,
    head_dim 32 (vLLM's CPU attention refuses 16)."""
    import transformers
    return transformers.LlamaConfig(
        vocab_size=512, hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=hidden // 32, num_key_value_heads=2,
        head_dim=32, max_position_embeddings=256, tie_word_embeddings=False,
        dtype="bfloat16", bos_token_id=1, eos_token_id=2)


def _batch(tokens, gen, seq=64, batch=4):
    starts = torch.randint(0, tokens.numel() - seq - 1, (batch,), generator=gen)
    return torch.stack([tokens[s:s + seq + 1] for s in starts.tolist()])


# ---------------------------------------------------------------------------
# Trainer rank


def rank_main(rank, args, init, inbox, outbox, resume=None, listen="127.0.0.1:0"):
    """One trainer rank. `resume`: (version, checkpoint) of a restarted job:
    the weights of the committed version's checkpoint (the optimizer state
    starts anew, as a job restarted from weights alone does)."""
    import torch.distributed as dist
    import transformers

    import dcr
    import dcr.torch as dt
    from dcr.trainers import FSDP2Trainer, MegatronTrainer
    from refit_models import canonical_views, hf_params, text_tokens

    try:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=WORLD)
        cfg = model_config(args.hidden, args.layers)
        torch.manual_seed(args.seed)
        model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
        version = 0
        if resume is not None:
            from safetensors.torch import load_file
            version, ckpt = resume
            weights = hf_params(load_file(os.path.join(ckpt, "model.safetensors")))
            with torch.no_grad():
                for n, p in model.named_parameters():
                    p.copy_(weights[n])
        if args.trainer == "megatron":
            plan = dt.TrainerPlan(cfg, tp=WORLD)
            canon = canonical_views(model, [m.name for m in plan.canonical])
            tr = MegatronTrainer(model, plan, canon, lr=args.lr, to_params=hf_params)
            gen = torch.Generator().manual_seed(args.seed + 1)  # TP ranks: one batch
        else:
            tr = FSDP2Trainer(model, lr=args.lr, wrap=list(model.model.layers))
            gen = torch.Generator().manual_seed(args.seed + 1 + rank)  # DP: their own
        tokens = text_tokens(1 << 20)
        server = dcr.OwnerServer(tr.owner(job_key=args.job_key), dcr.ObjectStore(args.store, job_key=args.job_key),
                                 dcr.CommitStore(args.commits, job_key=args.job_key),
                                 job_key=args.job_key,
                                 lease=True, version=version, listen=listen,
                                 relay=relay_nodes(args))
        server.set_candidate(tr.shards)
        full = tr.canonical()  # collective
        outbox.put(("ready", server.address,
                    {n: t.clone() for n, t in full.items()} if rank == 0 else None))
        while True:
            msg = inbox.get(timeout=600)
            if msg == "stop":
                break
            server.wait_committed(version, 300)
            loss = tr.step(_batch(tokens, gen))
            server.set_candidate(tr.shards)
            version += 1
            full = tr.canonical()  # collective
            outbox.put(("trained", loss,
                        {n: t.clone() for n, t in full.items()} if rank == 0 else None))
        server.wait_committed(version, 300)
        server.close()
        outbox.put(("stopped", version))
    except BaseException:
        outbox.put(("error", f"rank {rank}:\n{traceback.format_exc()}"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


# ---------------------------------------------------------------------------
# Coordinator


def coordinator_main(args, owners, nodes, inbox, outbox):
    import dcr
    try:
        co = dcr.ClusterCoordinator(dcr.CommitStore(args.commits, job_key=args.job_key),
                                    dcr.ObjectStore(args.store, job_key=args.job_key),
                                    owners, nodes, job_key=args.job_key)
        co.take_over()
        co.bootstrap()
        outbox.put(("ready", co.epoch))
        while True:
            msg = inbox.get(timeout=600)
            if msg == "stop":
                break
            t0 = time.perf_counter()
            try:
                rep = co.transition()
            except dcr.Error as e:
                # A peer died mid-refit: nothing committed; the driver
                # restarts it and asks again.
                outbox.put(("failed", f"{type(e).__name__}: {e}", co.commits.load()))
                continue
            outbox.put(("committed", time.perf_counter() - t0, rep))
    except BaseException:
        outbox.put(("error", f"coordinator:\n{traceback.format_exc()}"))


# ---------------------------------------------------------------------------
# Engine side (this process)


def save_checkpoint(path: str, cfg, tensors: dict) -> str:
    from safetensors.torch import save_file
    os.makedirs(path, exist_ok=True)
    cfg.save_pretrained(path)
    save_file({k: v.contiguous() for k, v in tensors.items()},
              os.path.join(path, "model.safetensors"))
    return path


def relay_nodes(args):
    """The job's relay tree (`--transport relay_tree`): one node, the
    engine's, at `--relay-listen`; None with the object store."""
    import dcr
    return dcr.RelayNodes([args.relay_listen]) if args.transport == "relay_tree" else None


def serve_engine(args, rx, committed_checkpoint, listen: str = "127.0.0.1:0"):
    """The engine as the node `engine` of the job, on the job's store and key.
    When the coordinator drops the engine's receiver (it no longer trusts
    what the engine holds, e.g. part of a lost attempt of another
    candidate), the node restores it densely from `committed_checkpoint()`
    through the engine's own reload."""
    import dcr
    import dcr.vllm as dv

    def restore(receiver_id):
        rx.dense_restore(committed_checkpoint())
        return rx

    relay = relay_nodes(args)
    return dcr.NodeServer({"engine": rx}, dcr.ObjectStore(args.store, job_key=args.job_key),
                          listen=listen, job_key=args.job_key, state_parts=dv.state_parts,
                          restore=restore, relay=relay, relay_node=0 if relay else None)


def start_engine(path: str, tp: int):
    from vllm import LLM
    return LLM(model=path, skip_tokenizer_init=True, dtype="bfloat16", max_model_len=128,
               enforce_eager=True, max_num_seqs=4, tensor_parallel_size=tp,
               distributed_executor_backend="mp" if tp > 1 else None, seed=0,
               worker_extension_cls="dcr.vllm.DcrWorkerExtension")


def greedy(llm) -> list:
    """Token ids and each chosen token's logprob (the logprobs move with any
    weight change, where a tiny model's argmax often does not)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    outs = llm.generate([TokensPrompt(prompt_token_ids=list(p.encode())) for p in PROMPTS],
                        SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True,
                                       logprobs=0), use_tqdm=False)
    return [(list(o.outputs[0].token_ids),
             [lp[t].logprob for t, lp in zip(o.outputs[0].token_ids, o.outputs[0].logprobs)])
            for o in outs]


def engine_state(llm) -> list[dict]:
    from dcr.vllm import _unwrap
    return _unwrap(llm.collective_rpc("dcr_state", args=(False,)), "dcr_state")


def state_diff(a: list[dict], b: list[dict]) -> list[str]:
    if len(a) != len(b):
        return [f"{len(a)} workers against {len(b)}"]
    out = []
    for w, (x, y) in enumerate(zip(a, b)):
        if x.keys() != y.keys():
            out.append(f"worker {w}: other tensors")
        out += [f"worker {w}: {n}" for n in x if n in y and x[n] != y[n]]
    return out


def shutdown(llm, dead: bool = False) -> None:
    """Stop an engine; `dead`: one whose processes died (what is left of
    it is stopped, errors of the dead parts ignored)."""
    import gc
    from vllm.distributed import cleanup_dist_env_and_memory
    if hasattr(llm.llm_engine, "engine_core"):
        try:
            llm.llm_engine.engine_core.shutdown()
        except Exception:
            if not dead:
                raise
    del llm
    gc.collect()
    cleanup_dist_env_and_memory()


def changed_fraction(a: dict, b: dict) -> float:
    from dcr.torch import word_view
    n = d = 0
    for k, t in a.items():
        x = word_view(t.contiguous().view(-1))
        y = word_view(b[k].contiguous().view(-1))
        n += x.numel()
        d += int((x != y).sum())
    return d / max(n, 1)


def _wait_gone(pid: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(") ")[-1].startswith("Z"):
                    return  # a zombie: dead, not yet reaped by its parent
        except OSError:
            return
        time.sleep(0.02)


def arm_fault(what: str, rx, roles) -> None:
    """--kill: SIGKILL the last serving worker just before the engine
    applies the staged attempt (its other worker may apply, or not, before
    the engine notices), or trainer rank 1 when the engine stages the
    attempt's first payload (its owner is publishing, or has published)."""
    import signal
    if what == "worker":
        victim = rx.worker_pids()[-1]
        real = rx.apply

        def apply():
            os.kill(victim, signal.SIGKILL)
            _wait_gone(victim)
            return real()
        rx.apply = apply
    else:
        real = rx.stage

        def stage(payload):
            p = roles.ranks[-1]
            if p.is_alive():
                p.kill()
                p.join(10)
            return real(payload)
        rx.stage = stage


def disarm_fault(rx) -> None:
    rx.__dict__.pop("apply", None)
    rx.__dict__.pop("stage", None)


class Roles:
    """The trainer and coordinator processes, their queues, and their errors
    (the first report of any process ends the run)."""

    def __init__(self, args):
        import torch.multiprocessing as mp
        self.ctx = mp.get_context("spawn")
        self.args = args
        self.generation = 0
        self.ranks = []
        self.start_ranks()
        self.co = None

    def start_ranks(self, resume=None, listen=None):
        """The trainer's processes (again, with `resume`, after one died: a
        new process group, as a restarted job makes)."""
        self.generation += 1
        init = f"file://{os.path.join(self.args.workdir, f'gloo-init-{self.generation}')}"
        self.rank_boxes = [(self.ctx.Queue(), self.ctx.Queue()) for _ in range(WORLD)]
        self.ranks = [self.ctx.Process(target=rank_main,
                                       args=(r, self.args, init, *self.rank_boxes[r], resume,
                                             listen[r] if listen else "127.0.0.1:0"),
                                       daemon=True) for r in range(WORLD)]
        for p in self.ranks:
            p.start()

    def kill_ranks(self):
        """SIGKILL whatever is left of the trainer (a rank lost mid-step
        takes its process group down)."""
        for p in self.ranks:
            if p.is_alive():
                p.kill()
            p.join(timeout=30)

    def _get(self, box, proc, what, timeout=600.0):
        deadline = time.monotonic() + timeout
        while True:
            try:
                msg = box.get(timeout=1.0)
            except Exception:
                if not proc.is_alive():
                    raise SystemExit(f"rl_loop: the {what} process exited "
                                     f"({proc.exitcode}) without a report")
                if time.monotonic() > deadline:
                    raise SystemExit(f"rl_loop: no report from the {what} within {timeout} s")
                continue
            if msg[0] == "error":
                raise SystemExit(f"rl_loop: {msg[1]}")
            return msg

    def ranks_say(self, what):
        return [self._get(o, p, f"rank {r}") for r, ((_, o), p)
                in enumerate(zip(self.rank_boxes, self.ranks))]

    def tell_ranks(self, msg):
        for i, _ in self.rank_boxes:
            i.put(msg)

    def start_coordinator(self, owners, nodes):
        self.co_box = (self.ctx.Queue(), self.ctx.Queue())
        self.co = self.ctx.Process(target=coordinator_main,
                                   args=(self.args, owners, nodes, *self.co_box), daemon=True)
        self.co.start()

    def transition(self):
        """("committed", seconds, report) or ("failed", why, commit record)."""
        self.co_box[0].put("transition")
        return self._get(self.co_box[1], self.co, "coordinator")

    def transition_when_back(self, what: str, wait_s: float = 60.0):
        """A transition after a peer restarted: the coordinator's link to the
        old process fails once (`Unavailable`) and reconnects on the next
        call; retried while the peer is unavailable, up to `wait_s`."""
        deadline = time.monotonic() + wait_s
        while True:
            msg = self.transition()
            if msg[0] != "failed":
                return msg
            if not msg[1].startswith("Unavailable") or time.monotonic() > deadline:
                raise SystemExit(f"rl_loop: {what}: {msg[1]}")
            time.sleep(0.5)

    def close(self):
        if self.co is not None and self.co.is_alive():
            self.co_box[0].put("stop")
        for p in self.ranks + ([self.co] if self.co else []):
            p.join(timeout=30)
            if p.is_alive():
                p.kill()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--trainer", choices=["megatron", "fsdp2"], default="megatron")
    ap.add_argument("--tp", type=int, choices=[1, 2], default=1,
                    help="vLLM tensor parallelism (2: two worker processes)")
    ap.add_argument("--store", help="object store URL (default fs:WORKDIR/objects; s3://...)")
    ap.add_argument("--commits", help="commit store URL (default file:WORKDIR/control; etcd://...)")
    ap.add_argument("--transport", choices=["object_store", "relay_tree"],
                    default="object_store",
                    help="payload transport from the trainer ranks to the engine: the object "
                         "store, or the relay tree (the owners stream to the engine's relay "
                         "node; dense restores still use the store)")
    ap.add_argument("--relay-listen", metavar="HOST:PORT",
                    help="the engine's relay node address (default: a free loopback port)")
    ap.add_argument("--job-key", help="file of the job's shared secret (>= 16 bytes)")
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", help="default: a new temporary directory, removed at the end")
    ap.add_argument("--kill", metavar="worker:STEP|rank:STEP",
                    help="SIGKILL a serving worker (needs --tp 2) or trainer rank 1 in the "
                         "middle of step STEP's refit, then recover: the engine restarted from "
                         "the committed version, or the trainer from its weights")
    args = ap.parse_args(argv)
    if args.kill:
        what, _, step = args.kill.partition(":")
        if what not in ("worker", "rank") or not step.isdigit() or not 1 <= int(step) <= args.steps:
            ap.error(f"--kill {args.kill}: expected worker:STEP or rank:STEP, 1 <= STEP <= --steps")
        if what == "worker" and args.tp < 2:
            ap.error("--kill worker needs --tp 2 (the workers of a --tp 1 engine run in this "
                     "process)")
        args.kill = (what, int(step))

    if args.relay_listen and args.transport != "relay_tree":
        ap.error("--relay-listen goes with --transport relay_tree")
    own_dir = args.workdir is None
    args.workdir = os.path.abspath(args.workdir or tempfile.mkdtemp(prefix="dcr-rl-loop-"))
    os.makedirs(args.workdir, exist_ok=True)
    args.store = args.store or f"fs:{args.workdir}/objects"
    args.commits = args.commits or f"file:{args.workdir}/control"
    if args.transport == "relay_tree" and not args.relay_listen:
        # Every rank dials this address, so it is fixed before they start.
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            args.relay_listen = f"127.0.0.1:{s.getsockname()[1]}"
    if args.tp > 1:
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(map(str, range(args.tp))))
    else:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if args.job_key:
        args.job_key = os.path.abspath(args.job_key)

    import dcr.vllm as dv

    cfg = model_config(args.hidden, args.layers)
    print(f"rl_loop: {args.trainer} trainer, {WORLD} ranks (gloo); vLLM {args.tp} worker(s); "
          f"lr {args.lr}; store {args.store}; commits {args.commits}; transport "
          f"{args.transport}{' at ' + args.relay_listen if args.relay_listen else ''}",
          flush=True)
    roles = Roles(args)
    llm = node = None
    ok = True
    try:
        ready = roles.ranks_say("ready")
        owners = [m[1] for m in ready]
        canon = ready[0][2]
        ckpts = [save_checkpoint(os.path.join(args.workdir, "ckpt", "v0"), cfg, canon)]
        t0 = time.perf_counter()
        llm = start_engine(ckpts[0], args.tp)
        rx = dv.EngineReceiver(llm, canon, job_key=args.job_key)
        print(f"rl_loop: engine started in {time.perf_counter() - t0:.1f} s; "
              f"{len(rx.info)} worker(s) prewarmed", flush=True)
        at = [0]  # the committed version (its checkpoint restores the engine)
        node = serve_engine(args, rx, lambda: ckpts[at[0]])
        roles.start_coordinator(owners, [node.address])
        roles._get(roles.co_box[1], roles.co, "coordinator")  # ready: version 0 committed
        total = sum(t.numel() * t.element_size() for t in canon.values())
        print(f"rl_loop: {len(canon)} tensors, {total / 1e6:.2f} MB; version 0 committed",
              flush=True)
        head = (f"{'step':>4}  {'loss':>7}  {'change %':>8}  {'payload MB':>10}  "
                f"{'refit s':>7}  {'dense s':>7}  {'speedup':>7}  {'gen equal':>9}  bit-exact")
        print(head)
        print("-" * len(head), flush=True)
        refit_states, refit_tokens = [], []
        fault = args.kill  # (what, step) or None: fires once
        k = 1
        retrain = False
        while k <= args.steps:
            roles.tell_ranks("step")
            trained = roles.ranks_say("trained")
            loss = sum(m[1] for m in trained) / WORLD
            new = trained[0][2]
            change = changed_fraction(new, canon)
            del ckpts[k:]  # a step trained again after a lost rank replaces its checkpoint
            ckpts.append(save_checkpoint(os.path.join(args.workdir, "ckpt", f"v{k}"), cfg, new))
            armed = fault if fault and fault[1] == k else None
            if armed:
                arm_fault(armed[0], rx, roles)
                fault = None
            msg = roles.transition() if armed else roles.transition_when_back(f"step {k}")
            if armed:
                disarm_fault(rx)
            if msg[0] == "failed":
                if not armed:
                    raise SystemExit(f"rl_loop: step {k}: {msg[1]}")
                committed = at[0] = msg[2]["version"]
                print(f"rl_loop: step {k}: {armed[0]} SIGKILLed mid-refit; the transition "
                      f"failed ({msg[1][:160]}); committed version {committed}", flush=True)
                if committed not in (k - 1, k):
                    raise SystemExit(f"rl_loop: committed version {committed} after a failed "
                                     f"transition to {k}")
                if armed[0] == "worker":
                    # The engine died with its worker: a new one from the
                    # committed version's checkpoint, served at the same
                    # address; the coordinator's retry refits it.
                    if committed != k - 1:
                        raise SystemExit(f"rl_loop: version {k} committed without the "
                                         "engine's apply")
                    node.close()
                    shutdown(llm, dead=True)
                    llm = start_engine(ckpts[committed], args.tp)
                    rx = dv.EngineReceiver(llm, canon, job_key=args.job_key)
                    node = serve_engine(args, rx, lambda: ckpts[at[0]], listen=node.address)
                    msg = roles.transition_when_back(f"step {k} after the engine's restart")
                else:
                    # A lost rank takes the trainer down: the job restarts
                    # from the committed version's weights, its ranks serving
                    # their owners at the same addresses.
                    roles.kill_ranks()
                    roles.start_ranks(resume=(committed, ckpts[committed]), listen=owners)
                    roles.ranks_say("ready")
                    if committed == k - 1:
                        # The restarted trainer trains another candidate of
                        # version k than the lost one. The overwrite retry
                        # rewrites one candidate's changed set only: the
                        # coordinator sees the candidate changed and has the
                        # engine restored densely before the retry.
                        touched = bool(refit_states) and bool(
                            state_diff(refit_states[-1], engine_state(llm)))
                        print(f"rl_loop: step {k}: the engine "
                              f"{'holds part of the lost attempt' if touched else 'is untouched'}",
                              flush=True)
                        retrain = True
                        continue  # train step k again
                    msg = ("committed", float("nan"),
                           {"committed_version": k, "attempts": [{"payload_bytes": 0}]})
            _, refit_s, rep = msg
            if retrain:
                if rep["restore_seconds"] > 0:
                    print(f"rl_loop: step {k}: the coordinator restored the engine densely to "
                          f"version {k - 1} ({rep['restore_seconds']:.2f} s) before the retry",
                          flush=True)
                else:
                    print(f"rl_loop: step {k}: the coordinator retried without a restore",
                          flush=True)
                retrain = False
            if rep["committed_version"] != k:
                raise SystemExit(f"rl_loop: step {k} committed version {rep['committed_version']}")
            at[0] = k
            canon = new
            payload = rep["attempts"][-1]["payload_bytes"]
            state, tokens = engine_state(llm), greedy(llm)
            refit_states.append(state)
            refit_tokens.append(tokens)
            # The same version densely through vLLM's own path, on the same engine.
            t0 = time.perf_counter()
            llm.collective_rpc("reload_weights", kwargs={"weights_path": ckpts[-1]})
            llm.reset_prefix_cache()
            dense_s = time.perf_counter() - t0
            diff = state_diff(state, engine_state(llm))
            gen_eq = greedy(llm) == tokens
            ok = ok and not diff and gen_eq
            print(f"{k:>4}  {loss:>7.4f}  {100 * change:>8.3f}  {payload / 1e6:>10.3f}  "
                  f"{refit_s:>7.3f}  {dense_s:>7.3f}  {dense_s / refit_s:>6.2f}x  "
                  f"{'yes' if gen_eq else 'NO':>9}  {'yes' if not diff else 'NO'}", flush=True)
            if diff:
                print(f"rl_loop: step {k}: differs from vLLM's dense reload in {diff[:5]}")
                break
            k += 1
        roles.tell_ranks("stop")
        roles.ranks_say("stopped")
        node.close()
        node = None
        shutdown(llm)
        llm = None
        if ok:
            # A fresh engine per version against what the refit produced.
            for k, (st, tok) in enumerate(zip(refit_states, refit_tokens), start=1):
                fresh = start_engine(ckpts[k], args.tp)
                diff = state_diff(st, engine_state(fresh))
                gen_eq = greedy(fresh) == tok
                shutdown(fresh)
                if diff or not gen_eq:
                    ok = False
                    print(f"rl_loop: version {k} differs from a fresh engine: "
                          f"{diff[:5]}{'' if gen_eq else ' (greedy output too)'}")
            print(f"rl_loop: every version equals a fresh engine from its checkpoint: "
                  f"{'yes' if ok else 'NO'}", flush=True)
    finally:
        if node is not None:
            node.close()
        if llm is not None:
            shutdown(llm)
        roles.close()
        if own_dir and ok:
            shutil.rmtree(args.workdir, ignore_errors=True)
    if not ok:
        print(f"rl_loop: FAILED (work directory {args.workdir})")
        return 1
    print(f"rl_loop: {args.steps} steps, bit-exact, generation equal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
