"""The Python roles and the C++ cluster programs in one job, both ways, over
the same control channel, fs object store and file commit store, with a job
key:

- Python owners (`OwnerServer` over `TrainerPlan.row_split_checkpoint`,
  stepping through `next_candidate`) against C++ `dcr-rollout` nodes and the
  C++ `dcr-coordinator --verify` (every receiver against a dense load of the
  committed version from the Python owners' dense export, and the commit
  record's digest of each);
- C++ `dcr-owner` ranks against Python `NodeServer`s of Python receivers and
  the Python `ClusterCoordinator`: after every step every byte of every
  receiver equals a dense `load_weights` of that version's checkpoint.

Both replay the same checkpoints: a small Llama trained two AdamW steps on
text from the machine (the C++ programs' `--checkpoints`)."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
import torch

import dcr
import dcr.torch as dt
from refit_models import Trainer, VllmLikeModel, canonical_views, hf_config, hf_model, text_tokens
from servers import free_port

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
EXAMPLES = os.environ.get("DCR_EXAMPLES_DIR") or os.path.join(
    os.environ.get("DCR_BUILD_DIR", os.path.join(ROOT, "build")), "examples")
NODES, PER_NODE, TP = 2, 2, 2


def _program(name: str) -> str:
    path = os.path.join(EXAMPLES, name)
    if not os.access(path, os.X_OK):
        pytest.fail(f"{path} is not built (meson's examples option; DCR_EXAMPLES_DIR)")
    return path


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """(config, [safetensors path of v0, v1, v2], [canonical tensors of each])."""
    from safetensors.torch import save_file
    d = tmp_path_factory.mktemp("ckpt")
    cfg = hf_config("llama")
    model = hf_model(cfg, 0)
    names = [m.name for m in dt.TrainerPlan(cfg, tp=TP).canonical]
    trainer = Trainer(model, 1e-5, text_tokens(1 << 16), seed=0)
    paths, canons = [], []
    for v in range(3):
        if v:
            trainer.step()
        canon = {k: t.detach().clone().contiguous()
                 for k, t in canonical_views(model, names).items()}
        p = str(d / f"v{v}.safetensors")
        save_file(canon, p)
        paths.append(p)
        canons.append(canon)
    # Real steps: every version differs from the one before.
    for a, b in zip(canons, canons[1:]):
        assert any(not torch.equal(a[k], b[k]) for k in a)
    return cfg, paths, canons


@pytest.fixture
def key_file(tmp_path):
    p = tmp_path / "job.key"
    p.write_bytes(os.urandom(32))
    return str(p)


def _job_flags(work: str, paths: list[str], key: str) -> list[str]:
    return ["--workdir", work, "--tp", str(TP), "--dp", "1", "--nodes", str(NODES),
            "--receivers-per-node", str(PER_NODE), "--job-key", key, "--checkpoints", *paths]


class Programs:
    """C++ processes of the job, stopped (SIGTERM, then SIGKILL) at the end;
    their output is kept for the failure message."""

    def __init__(self, work: str):
        self.work, self.procs = work, []

    def start(self, name: str, *args: str) -> str:
        log = os.path.join(self.work, f"{name}-{len(self.procs)}.log")
        f = open(log, "w")
        self.procs.append((subprocess.Popen([_program(name), *args], stdout=f,
                                            stderr=subprocess.STDOUT), f, log))
        return log

    def logs(self) -> str:
        out = []
        for p, f, log in self.procs:
            f.flush()
            with open(log) as g:
                out.append(f"--- {os.path.basename(log)} (rc {p.poll()})\n{g.read()[-3000:]}")
        return "\n".join(out)

    def alive(self) -> None:
        for p, _, log in self.procs:
            if p.poll() is not None:
                raise AssertionError(f"{os.path.basename(log)} exited {p.returncode}:\n"
                                     + self.logs())

    def stop(self) -> None:
        for p, _, _ in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p, f, _ in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            f.close()


def test_python_owners_with_cpp_rollouts_and_coordinator(tmp_path, checkpoints, key_file):
    cfg, paths, canons = checkpoints
    work = str(tmp_path)
    plan = dt.TrainerPlan.row_split_checkpoint(paths[0], tp=TP, dp=1)
    servers = []
    progs = Programs(work)
    try:
        for r in range(TP):
            shards = plan.project(r, canons[0])
            owner = dt.Owner(plan, r, shards, job_key=key_file)

            def next_candidate(v, r=r):
                # The version after v, as the C++ owner replays it (the last
                # checkpoint stays the candidate once the steps are done).
                return plan.project(r, canons[min(v + 1, len(canons) - 1)])

            s = dcr.OwnerServer(owner, dcr.ObjectStore(f"fs:{work}/objects", job_key=key_file),
                                dcr.CommitStore(f"file:{work}/control", job_key=key_file),
                                job_key=key_file, lease=True, next_candidate=next_candidate)
            s.set_candidate(shards)
            servers.append(s)
        flags = _job_flags(work, paths, key_file)
        nodes = [f"127.0.0.1:{free_port()}" for _ in range(NODES)]
        for n, a in enumerate(nodes):
            progs.start("dcr-rollout", "--node", str(n), "--listen", a, *flags)
        peers = [a for s in servers for a in ("--owner", s.address)]
        peers += [a for n in nodes for a in ("--node", n)]
        co = subprocess.run([_program("dcr-coordinator"), *flags, *peers,
                             "--steps", "2", "--verify", "--wait", "60"],
                            capture_output=True, text=True, timeout=300)
        out = co.stdout + co.stderr
        assert co.returncode == 0, out + "\n" + progs.logs()
        assert (f"verification: {NODES * PER_NODE} of {NODES * PER_NODE} receivers equal a dense "
                f"load of version 2 byte for byte: PASS") in out, out
        progs.alive()
        rec = dcr.CommitStore(f"file:{work}/control", job_key=key_file).load()
        assert rec["version"] == 2
        assert len(rec["receivers"]) == NODES * PER_NODE
        assert [s.version for s in servers] == [2, 2]
    finally:
        progs.stop()
        for s in servers:
            s.close()


def _dense(cfg, canon, rank: int) -> dict:
    ref = VllmLikeModel(cfg, rank, PER_NODE)
    ref.load_weights(list(canon.items()))
    return dt.state_bytes(ref)


def test_cpp_owners_with_python_nodes_and_coordinator(tmp_path, checkpoints, key_file):
    cfg, paths, canons = checkpoints
    work = str(tmp_path)
    plan = dt.TrainerPlan.row_split_checkpoint(paths[0], tp=TP, dp=1)
    progs = Programs(work)
    node_servers = []
    try:
        flags = _job_flags(work, paths, key_file)
        owners = [f"127.0.0.1:{free_port()}" for _ in range(TP)]
        for r, a in enumerate(owners):
            progs.start("dcr-owner", "--rank", str(r), "--listen", a, *flags)
        store = dcr.ObjectStore(f"fs:{work}/objects", job_key=key_file)
        commits = dcr.CommitStore(f"file:{work}/control", job_key=key_file)
        models = {}
        for n in range(NODES):
            receivers = {}
            for r in range(PER_NODE):
                rid = f"node{n}-tp{r}"
                models[rid] = VllmLikeModel(cfg, r, PER_NODE)
                rx = dt.Receiver(models[rid], plan.canonical, job_key=key_file)
                rx.dense_refit(canons[0])
                receivers[rid] = rx
            node_servers.append(dcr.NodeServer(receivers, store, job_key=key_file))
        co = dcr.ClusterCoordinator(commits, store, owners, [s.address for s in node_servers],
                                    job_key=key_file, connect_wait_s=60)
        co.take_over()
        co.bootstrap()
        assert commits.load()["version"] == 0
        for step in (1, 2):
            deadline = time.monotonic() + 60
            while True:
                progs.alive()
                try:
                    rep = co.transition()
                    break
                except dcr.Unavailable:
                    # The C++ owner trains its next candidate on its own
                    # thread after the commit; the coordinator waits for it.
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            assert rep["committed_version"] == step, rep
            assert rep["attempts"][-1]["payloads"] > 0
            rec = commits.load()
            assert rec["version"] == step
            assert [r for r, _ in rec["receivers"]] == sorted(models)
            for rid, m in models.items():
                want = _dense(cfg, canons[step], int(rid[-1]))
                got = dt.state_bytes(m)
                assert want.keys() == got.keys()
                assert [k for k in want if want[k] != got[k]] == [], (step, rid)
        progs.alive()
    finally:
        for s in node_servers:
            s.close()
        progs.stop()
