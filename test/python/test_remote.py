"""The distributed roles in separate processes: two trainer ranks of a
`torch.distributed` (gloo) trainer, each serving its owner (`OwnerServer`),
two serving processes with vLLM-like TP ranks behind `NodeServer`s, and
the coordinator (`ClusterCoordinator`) here, over an fs object store and a
file commit store with a job key. After every committed step every byte of
every receiver equals a dense `load_weights` of the trained weights, and
the commit record names the version and every receiver. Also the C++
programs against the Python roles, both ways (test_remote_interop.py)."""

from __future__ import annotations

import os
import queue
import socket

import pytest
import torch
import torch.multiprocessing as mp

import dcr
import dcr.torch as dt
import remote_roles
from refit_models import VllmLikeModel, hf_config

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _expect(out, kind: str, n: int, timeout: float = 180.0) -> dict:
    got = {}
    while len(got) < n:
        try:
            msg = out.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no '{kind}' from the processes within {timeout} s") from None
        if msg[0] == "failed":
            raise AssertionError(f"process {msg[1]} failed:\n{msg[2]}")
        assert msg[0] == kind, msg[:2]
        got[msg[1]] = msg[2:]
    return got


class Job:
    """Two trainer ranks and two serving processes (2 TP receivers each)."""

    def __init__(self, work: str, key: str | None, lr: float = 1e-5,
                 relay: list[str] | None = None):
        self.ctx = mp.get_context("spawn")
        self.work, self.key = work, key
        self.rank_cmd = [self.ctx.Queue() for _ in range(2)]
        self.node_cmd = [self.ctx.Queue() for _ in range(2)]
        self.rank_out, self.node_out = self.ctx.Queue(), self.ctx.Queue()
        init = os.path.join(work, "gloo-init")
        self.procs = [self.ctx.Process(target=remote_roles.trainer_rank,
                                       args=(r, 2, ROOT, init, work, key, lr, self.rank_cmd[r],
                                             self.rank_out, relay))
                      for r in range(2)]
        self.ids = [[f"node{n}-tp{r}" for r in range(2)] for n in range(2)]
        self.procs += [self.ctx.Process(target=remote_roles.serving_node,
                                        args=(n, self.ids[n], ROOT, work, key, self.node_cmd[n],
                                              self.node_out, relay))
                       for n in range(2)]
        for p in self.procs:
            p.start()
        self.owners = [a for _, (a,) in sorted(_expect(self.rank_out, "ready", 2).items())]
        self.nodes = [a for _, (a,) in sorted(_expect(self.node_out, "ready", 2).items())]

    def train(self):
        for q in self.rank_cmd:
            q.put(("train",))
        got = _expect(self.rank_out, "trained", 2)
        return got[0][0], got[0][1]  # loss, canonical weights (rank 0's replica)

    def states(self) -> dict:
        for q in self.node_cmd:
            q.put(("state",))
        out = {}
        for _, (s,) in _expect(self.node_out, "state", 2).items():
            out.update(s)
        return out

    def stop(self):
        for q in self.rank_cmd + self.node_cmd:
            q.put(("stop",))
        for p in self.procs:
            p.join(60)
            if p.is_alive():
                p.kill()


def _mismatches(cfg, canon, states: dict) -> list:
    bad = []
    for n in range(2):
        for r in range(2):
            ref = VllmLikeModel(cfg, r, 2)
            ref.load_weights(list(canon.items()))
            want, got = dt.state_bytes(ref), states[f"node{n}-tp{r}"]
            assert want.keys() == got.keys()
            bad += [(n, r, k) for k in want if want[k] != got[k]]
    return bad


@pytest.fixture
def key_file(tmp_path):
    p = tmp_path / "job.key"
    p.write_bytes(os.urandom(32))
    return str(p)


def _free_ports(n: int) -> list[int]:
    """Ports on 127.0.0.1 that were free a moment ago (relay addresses must
    be fixed before any process starts: every process dials them)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@pytest.mark.parametrize("transport", ["object_store", "relay_tree"])
def test_trainer_ranks_and_serving_processes(tmp_path, key_file, transport):
    work = str(tmp_path)
    relay = None
    if transport == "relay_tree":
        relay = [f"127.0.0.1:{p}" for p in _free_ports(2)]
    job = Job(work, key_file, relay=relay)
    try:
        store = dcr.ObjectStore(f"fs:{work}/objects", job_key=key_file)
        commits = dcr.CommitStore(f"file:{work}/control", job_key=key_file)
        # Without the job key the servers refuse the channel (a typed error).
        with pytest.raises(dcr.Error):
            dcr.ClusterCoordinator(dcr.CommitStore(f"file:{work}/control"),
                                   dcr.ObjectStore(f"fs:{work}/objects"), job.owners, job.nodes,
                                   connect_wait_s=2)
        # Stores opened without the role's key are refused before anything runs.
        with pytest.raises(dcr.InvalidArgument, match="commit store was opened without"):
            dcr.ClusterCoordinator(dcr.CommitStore(f"file:{work}/control"), store, job.owners,
                                   job.nodes, job_key=key_file)
        co = dcr.ClusterCoordinator(commits, store, job.owners, job.nodes, job_key=key_file)
        assert co.node_ids == job.ids
        co.take_over()
        co.bootstrap()
        assert commits.load()["version"] == 0
        cfg = hf_config("llama")
        for step in range(1, 4):
            loss, canon = job.train()
            assert loss == loss and loss > 0  # a real, finite loss
            rep = co.transition()
            assert rep["committed_version"] == step
            assert rep["attempts"][0]["payloads"] > 0
            if relay:
                # Payloads streamed through the tree, none through the store.
                assert not [d for d, _, files in os.walk(f"{work}/objects")
                            if os.sep + "payload" in d and files]
            rec = commits.load()
            assert rec["version"] == step
            assert [r for r, _ in rec["receivers"]] == [i for ids in job.ids for i in ids]
            assert _mismatches(cfg, canon, job.states()) == []
        # The commit record is keyed: a reader without the key refuses it.
        with pytest.raises(dcr.Error):
            dcr.CommitStore(f"file:{work}/control").load()
    finally:
        job.stop()


def test_second_owner_process_is_refused_by_the_lease(tmp_path):
    """An owner lease per rank: a second server for the same rank is refused."""
    cfg = hf_config("llama")
    plan = dt.TrainerPlan(cfg, tp=2)
    shards = plan.empty_shards(0)
    store = dcr.ObjectStore(f"fs:{tmp_path}/objects")
    commits = dcr.CommitStore(f"file:{tmp_path}/control")
    first = dcr.OwnerServer(dt.Owner(plan, 0, shards), store, commits, lease=True)
    try:
        with pytest.raises(dcr.Conflict):
            dcr.OwnerServer(dt.Owner(plan, 0, shards), store,
                            dcr.CommitStore(f"file:{tmp_path}/control"), lease=True,
                            lease_wait_s=0.2)
    finally:
        first.close()


def test_unkeyed_listener_off_loopback_is_refused(tmp_path):
    cfg = hf_config("llama")
    plan = dt.TrainerPlan(cfg, tp=2)
    store = dcr.ObjectStore(f"fs:{tmp_path}/objects")
    with pytest.raises(dcr.InvalidArgument, match="without a job key"):
        dcr.OwnerServer(dt.Owner(plan, 0, plan.empty_shards(0)), store, listen="0.0.0.0:0")
    with pytest.raises(dcr.InvalidArgument, match="job key"):
        dcr.job_secret(b"short")
    # Relay addresses: an unkeyed relay node off loopback is refused like a
    # control listener; fixed ports, distinct addresses, a node index in range.
    owner = dt.Owner(plan, 0, plan.empty_shards(0))
    with pytest.raises(dcr.InvalidArgument, match="relay node 10.0.0.1:9000"):
        dcr.OwnerServer(owner, store, relay=dcr.RelayNodes(["10.0.0.1:9000"]))
    with pytest.raises(dcr.InvalidArgument, match="port 0"):
        dcr.RelayNodes(["127.0.0.1:0"])
    with pytest.raises(dcr.InvalidArgument, match="repeat"):
        dcr.RelayNodes(["127.0.0.1:9000", "127.0.0.1:9000"])
    with pytest.raises(dcr.InvalidArgument, match="fanout"):
        dcr.RelayNodes(["127.0.0.1:9000"], fanout=0)
    rx = dt.Receiver(VllmLikeModel(cfg, 0, 2), plan.canonical)
    with pytest.raises(dcr.InvalidArgument, match="go together"):
        dcr.NodeServer({"r": rx}, store, relay=dcr.RelayNodes(["127.0.0.1:9000"]))
    with pytest.raises(dcr.InvalidArgument, match="relay_node 1 of 1"):
        dcr.NodeServer({"r": rx}, store, relay=dcr.RelayNodes(["127.0.0.1:9000"]), relay_node=1)
