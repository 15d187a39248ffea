"""The deployment choices of the C++ cluster programs, by name, from Python.

- `ObjectStore(url)`: where attempt objects go. `memory:` (this process),
  `fs:<directory>`, or `s3://HOST:PORT/BUCKET` (`s3+https://` for TLS) through
  dcr-net's S3 client; S3 keys from a credentials file (lines `access_key K`
  and `secret_key S`, as `--s3-credentials`) or `DCR_S3_ACCESS_KEY` /
  `DCR_S3_SECRET_KEY`, as the C++ programs take them.
- `CommitStore(url)`: where the commit record lives. `file:<directory>` or
  `etcd://HOST:PORT[,HOST:PORT...][/prefix]` (`etcd+https://` with a
  credentials file of `ca`, `cert`, `key` lines, as `--etcd-credentials`).
- `RelayTree(receivers_per_node=1, fanout=2, tcp=False)`: the other
  transport of the C++ programs (`--transport relay_tree`): owners stream
  payloads to a root node that forwards them through a k-ary tree of the
  receivers' nodes (in-process pipes, or loopback TCP), sized by the
  coordinator's receivers. Pass it where an object store goes.
- `RelayNodes(nodes, fanout=2)`: the relay tree across processes, for
  `OwnerServer(relay=)` and `NodeServer(relay=, relay_node=)`.
- `Coordinator(commits, store, owners, receivers)`: the library's
  coordinator (`protocol::coordinator`) driving owners of this process and
  Python receivers: `take_over()`, `bootstrap()` (commit version 0),
  `transition()` (attempts until every receiver holds the owners'
  candidate, overwrite retries included, then the compare-and-set of the
  commit record, the owners' baselines and garbage collection).

Across processes (`OwnerServer`, `NodeServer`, `ClusterCoordinator`):
each trainer rank serves its owner on the library's control channel, each
serving process serves a node of its receivers, and one coordinator
process drives them over remote links, as the C++ programs `dcr-owner`,
`dcr-rollout` and `dcr-coordinator` do (the same wire format: each Python
role works with the C++ ones). `job_key=` (a key file's path, or the
secret's bytes) authenticates every control call and seals payloads,
manifests and the commit record; give every role of a job the same one.

Failures are typed: a malformed URL or missing credentials is
`dcr.InvalidArgument`, a server that cannot be reached `dcr.Unavailable`, a
coordinator fenced by a newer one (or any lost compare-and-set) `dcr.Conflict`.
"""

from __future__ import annotations

import os

from . import _dcr, errors


def _credential_lines(path: str, allowed: set[str], flag: str) -> dict[str, str]:
    """`name value` lines (blank lines and `#` comments skipped), as the C++ programs read them."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        errors.raise_error(errors.InvalidArgument, f"{flag}: cannot read {path}: {e.strerror}")
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.replace("=", " ").split(None, 1)
        if len(parts) != 2 or parts[0] not in allowed:
            errors.raise_error(errors.InvalidArgument,
                               f"{flag} {path}: bad line '{parts[0]}' (expected one of "
                               f"{', '.join(sorted(allowed))} with a value)")
        out[parts[0]] = parts[1].strip()
    return out


def job_secret(job_key) -> bytes:
    """The secret bytes of `job_key`: None (no key), bytes (the secret
    itself) or a path of a key file (at least 16 bytes, as the C++
    programs' `--job-key`; longer than 64 it is hashed to a 64-byte key)."""
    if job_key is None:
        return b""
    if isinstance(job_key, (bytes, bytearray, memoryview)):
        secret = bytes(job_key)
    else:
        try:
            with open(os.fspath(job_key), "rb") as f:
                secret = f.read()
        except OSError as e:
            errors.raise_error(errors.InvalidArgument,
                               f"job key: cannot read {job_key}: {e.strerror}")
    if len(secret) < 16:
        errors.raise_error(errors.InvalidArgument,
                           f"job key: {len(secret)} bytes, a job key needs at least 16")
    return secret


def _host_port(address: str, what: str) -> tuple[str, int]:
    host, sep, port = str(address).rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        errors.raise_error(errors.InvalidArgument, f"{what}: '{address}' is not HOST:PORT")
    return host, int(port)


def _check_stores(secret: bytes, what: str, **stores) -> None:
    """A role's stores must be opened with the role's job key: a store
    without it would write (or require) unkeyed manifests and records while
    the channel is keyed, and its readers would fail or, worse, trust less
    than the job asked for."""
    for name, st in stores.items():
        if st is None or not hasattr(st, "_job_secret"):
            continue
        if st._job_secret != secret:
            why = ("was opened without the job key the role has" if not st._job_secret else
                   "has a job key and the role has none" if not secret else
                   "has another job key than the role")
            errors.raise_error(errors.InvalidArgument,
                               f"{what}: the {name.replace('_', ' ')} {why}; "
                               "give every store and role of a job the same job_key")


def _check_listen(host: str, secret: bytes, insecure: bool, what: str) -> None:
    """Unkeyed control channels are for loopback: anyone who can reach the
    port could otherwise publish, fence or drop receivers."""
    if secret or insecure or host.startswith("127.") or host == "localhost":
        return
    errors.raise_error(errors.InvalidArgument,
                       f"{what}: listening on {host} without a job key; give job_key= (or "
                       "insecure=True for a network you trust)")


class ObjectStore(_dcr.ObjectStore):
    """Attempt objects of one commit history in a store named by URL (see module doc).

    `incarnation`: the commit history to read and write (32 hex digits;
    empty: a new one). `credentials`: an S3 credentials file; without it the
    keys come from `DCR_S3_ACCESS_KEY` and `DCR_S3_SECRET_KEY`.
    """

    def __init__(self, url: str, incarnation: str = "", *, region: str = "us-east-1",
                 credentials: str | None = None, job_key=None):
        access = secret = ""
        if url.startswith(("s3://", "s3+https://")):
            if credentials is not None:
                c = _credential_lines(credentials, {"access_key", "secret_key"}, "credentials")
                if "access_key" not in c or "secret_key" not in c:
                    errors.raise_error(errors.InvalidArgument,
                                       f"credentials {credentials}: needs access_key and "
                                       "secret_key lines")
                access, secret = c["access_key"], c["secret_key"]
            else:
                access = os.environ.get("DCR_S3_ACCESS_KEY", "")
                secret = os.environ.get("DCR_S3_SECRET_KEY", "")
        self._job_secret = job_secret(job_key)
        super().__init__(url, incarnation, region, access, secret, self._job_secret)
        self.url = url


RelayTree = _dcr.RelayTree


class RelayNodes:
    """The relay tree across processes (the C++ programs' `--transport
    relay_tree`, `--relay-nodes`, `--relay-fanout`): `nodes` lists every
    rollout node's relay address "HOST:PORT" in node order (node 0 is the
    root the owners stream to; node i's children are the k-ary heap's), and
    `fanout` is the children per node. Give the same one to every
    `OwnerServer` (`relay=`) and `NodeServer` (`relay=`, `relay_node=i`: the
    node it hosts, listening on `nodes[i]`) of a job. Payloads then stream
    owner → root → children instead of going through the object store; dense
    exports and restores still use the store. With a job key the links are
    authenticated and every payload's and stream's digest keyed; without one
    every relay address must be on loopback (or `insecure=True` on the roles).
    """

    def __init__(self, nodes, fanout: int = 2):
        nodes = [str(a) for a in nodes]
        if not nodes:
            errors.raise_error(errors.InvalidArgument, "RelayNodes: no node addresses")
        for a in nodes:
            if _host_port(a, "RelayNodes")[1] == 0:
                errors.raise_error(errors.InvalidArgument,
                                   f"RelayNodes: '{a}' has port 0 (every process dials "
                                   "these addresses, so each must be fixed)")
        if len(set(nodes)) != len(nodes):
            errors.raise_error(errors.InvalidArgument, "RelayNodes: addresses repeat")
        if int(fanout) < 1:
            errors.raise_error(errors.InvalidArgument, f"RelayNodes: fanout {fanout} < 1")
        self.nodes, self.fanout = nodes, int(fanout)

    def _check(self, secret: bytes, insecure: bool, what: str) -> None:
        for a in self.nodes:
            _check_listen(_host_port(a, what)[0], secret, insecure, f"{what} relay node {a}")

    def __repr__(self) -> str:
        return f"RelayNodes({self.nodes!r}, fanout={self.fanout})"


class CommitStore(_dcr.CommitStore):
    """The commit record, epoch and attempt counters in a store named by URL.

    `load()` returns the stored record as a dict (`version`, `revision`,
    `epoch`, `attempt`, `incarnation`, `receivers` as (id, digest) pairs);
    `take_over()` and `prepare(epoch)` are the store's counters (a
    coordinator calls them itself). `credentials`: for `etcd+https://`, a
    file of `ca`, `cert` and `key` lines.
    """

    def __init__(self, url: str, *, credentials: str | None = None, job_key=None):
        ca = cert = key = ""
        if credentials is not None:
            c = _credential_lines(credentials, {"ca", "cert", "key"}, "credentials")
            if ("cert" in c) != ("key" in c):
                errors.raise_error(errors.InvalidArgument,
                                   f"credentials {credentials}: 'cert' and 'key' go together")
            ca, cert, key = c.get("ca", ""), c.get("cert", ""), c.get("key", "")
        self._job_secret = job_secret(job_key)
        super().__init__(url, ca, cert, key, self._job_secret)
        self.url = url


def state_parts(rx) -> list:
    """A receiver's state as (name, bytes view) pairs, for its ACK digest:
    every parameter and buffer of its model in registration order (CPU
    tensors as views; device tensors copied to the host, which also waits
    for the device)."""
    import torch

    model = rx.model
    out = []
    for n, t in list(model.named_parameters(remove_duplicate=False)) + \
            list(model.named_buffers(remove_duplicate=False)):
        t = t.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        out.append((n, t.contiguous().view(-1).view(torch.uint8).numpy()))
    return out


def _core_owner(o):
    core = getattr(o, "_core", o)
    if not isinstance(core, _dcr.Owner):
        errors.raise_error(errors.InvalidArgument,
                           f"coordinator: {type(o).__name__} is not a dcr owner")
    return core


class Coordinator:
    """The library's coordinator over `owners` (`dcr.torch.Owner`s of this
    process) and `receivers` (`{id: receiver}` or (id, receiver) pairs;
    `dcr.torch.Receiver` or anything with `begin_attempt`, `stage`, `apply`
    and a `model`), publishing through `store` (an `ObjectStore`, or a
    `RelayTree` of the receivers) and committing in `commits`.

    Every receiver must hold the committed version when it joins (a dense
    `load_weights` of it). `restore(id)`, when given, returns a new receiver
    of that id restored densely to the committed version; the coordinator
    calls it for a receiver it dropped (`kill`, or one whose staged payloads
    a failed attempt's manifests contradict). `state_parts(rx)` gives what a
    receiver's ACK digest covers (default: every parameter and buffer).
    """

    def __init__(self, commits: CommitStore, store, owners, receivers, *,
                 restore=None, state_parts=state_parts, max_attempts: int = 4,
                 deadline_s: float = 120.0, collect_garbage: bool = True,
                 fetch_all: bool = True):
        if isinstance(receivers, dict):
            receivers = list(receivers.items())
        self.owners = list(owners)
        self.receivers = dict(receivers)
        if len(self.receivers) != len(receivers):
            errors.raise_error(errors.InvalidArgument, "coordinator: receiver ids repeat")
        self.commits, self.store = commits, store
        self._cores = [_core_owner(o) for o in self.owners]
        self._core = _dcr.Coordinator(commits, store, self._cores,
                                      [(str(i), r) for i, r in receivers], state_parts,
                                      restore, max_attempts, deadline_s, collect_garbage,
                                      fetch_all)
        self.last_report: dict | None = None

    @property
    def epoch(self) -> int:
        return self._core.epoch

    def take_over(self) -> int:
        """Become the active coordinator (fences every older one); returns the epoch."""
        return self._core.take_over()

    def bootstrap(self) -> None:
        """Commit version 0 (the owners' baselines, every receiver's ACK) if
        the store holds no record yet; a store with one is left as it is."""
        self._core.bootstrap()

    def transition(self) -> dict:
        """Run the transition to the owners' candidates and commit it; returns the
        report (`committed_version`, per-attempt `attempts`, timings). Raises the
        typed error of a failed transition (the report is in `last_report`)."""
        for k, c in enumerate(self._cores):
            if not c.has_candidate:
                errors.raise_error(errors.InvalidArgument,
                                   f"coordinator: owner {k} has no candidate (set_candidate first)")
        rep = self._core.transition()
        self.last_report = rep
        return _raise_report(rep)

    def kill(self, receiver_id: str) -> None:
        """Drop a receiver's storage (as a crash would): it rejoins restored
        (`restore`) at the next transition's membership step."""
        self._core.kill(str(receiver_id))

    def counters(self, receiver_id: str) -> dict:
        """The endpoint's counts: staged, applied calls, duplicates, stale, restores."""
        return self._core.counters(str(receiver_id))


def _raise_report(rep: dict) -> dict:
    if rep["error"] is not None:
        code, message = rep["error"]
        cls = errors.BY_CODE.get(code, errors.Error)
        raise cls(f"{cls.name}: {message}", code)
    return rep


class OwnerServer:
    """The owner of one trainer rank (`dcr.torch.Owner`), served to a
    coordinator in another process on the control channel.

    The owner publishes its payloads to `store` (this process's connection
    to the job's object store) when the coordinator asks, and moves its
    baseline only after it has read in `commits` that the record names the
    attempt it published. `version`: the committed version the owner's
    baseline holds (0 for a new job). `lease=True` claims the rank's owner
    lease in `commits` for the server's life (a second process serving the
    same rank is refused with `dcr.Conflict`) and checks it around every
    write. `listen`: "HOST:PORT" (port 0: any free port; `address` tells).

    The trainer replaces the candidate with `set_candidate(shards)` (never
    while a call reads it) and waits for the joint commit with
    `wait_committed(version)` before it changes the parameters again. Or,
    for a trainer that steps on its own (the C++ coordinator runs one
    transition after the other), `next_candidate(v)` returns the shards of
    version v + 1 (or None) and is called on the server's thread right after
    the baseline moved to v, before the coordinator's next call.

    `relay` (a `RelayNodes`): payloads stream to the job's relay tree
    instead of `store` (dense exports still go to `store`).
    """

    def __init__(self, owner, store: ObjectStore, commits: CommitStore | None = None, *,
                 version: int = 0, listen: str = "127.0.0.1:0", job_key=None,
                 insecure: bool = False, lease: bool = False, lease_ttl_s: float = 10.0,
                 lease_wait_s: float = -1.0, next_candidate=None,
                 relay: RelayNodes | None = None):
        host, port = _host_port(listen, "OwnerServer listen")
        secret = job_secret(job_key)
        _check_listen(host, secret, insecure, "OwnerServer")
        if relay is not None:
            relay._check(secret, insecure, "OwnerServer")
        _check_stores(secret, "OwnerServer", object_store=store, commit_store=commits)
        self.owner = owner
        hook = None
        if next_candidate is not None:
            def hook(v):
                shards = next_candidate(v)
                return None if shards is None else (owner._spans(shards), dict(shards))
        self._core = _dcr.OwnerServer(_core_owner(owner), store, commits, version, host, port,
                                      secret, lease, lease_ttl_s, lease_wait_s, hook,
                                      relay.nodes if relay else [], relay.fanout if relay else 2)
        self.address = f"{host}:{self._core.port}"

    @property
    def version(self) -> int:
        """The committed version the baseline holds."""
        return self._core.version

    @property
    def lease_token(self) -> str:
        return self._core.lease_token

    def set_candidate(self, shards) -> None:
        """The next candidate (the rank's shards after a training step); waits
        for a running call to end. Call it before the coordinator's
        transition starts, and leave the tensors alone until `wait_committed`."""
        o = self.owner
        self._core.set_candidate(o._core, o._spans(shards), dict(shards))

    def wait_committed(self, version: int, timeout_s: float = 300.0) -> None:
        """Wait until the baseline holds `version` (the coordinator committed
        it and moved this owner); `dcr.Unavailable` after `timeout_s`."""
        if not self._core.wait_committed(version, timeout_s):
            errors.raise_error(errors.Unavailable,
                               f"owner {self.owner.rank}: version {version} not committed "
                               f"within {timeout_s} s (baseline at {self.version})")

    def close(self) -> None:
        self._core.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class NodeServer:
    """A rollout node of Python receivers (`{id: receiver}`, each at the
    committed version), served to a coordinator in another process.

    Payloads come from `store` (the node fetches each once for all its
    receivers; `fetch_all=False`: only those whose manifest index names a
    tensor a receiver needs). `restore(id)` returns a new receiver of that id
    restored densely to the committed version (for one the coordinator
    dropped); `verify(version, incarnation)` returns, per receiver in order,
    whether it equals a dense load of that version (the coordinator's
    `verify`). `gate=True`: requests admitted through `admit()` (a context
    manager) are waited for before an apply, and new ones wait while it runs.
    `relay` (a `RelayNodes`) with `relay_node=i`: this server hosts node i
    of the job's relay tree (listening on `relay.nodes[i]`, forwarding to its
    children) and its receivers take their payloads from it, not `store`.
    """

    def __init__(self, receivers, store: ObjectStore, *, listen: str = "127.0.0.1:0",
                 job_key=None, insecure: bool = False, restore=None, verify=None,
                 state_parts=None, fetch_all: bool = True, gate: bool = False,
                 relay: RelayNodes | None = None, relay_node: int | None = None):
        if isinstance(receivers, dict):
            receivers = list(receivers.items())
        receivers = [(str(i), r) for i, r in receivers]
        if len({i for i, _ in receivers}) != len(receivers):
            errors.raise_error(errors.InvalidArgument, "node server: receiver ids repeat")
        host, port = _host_port(listen, "NodeServer listen")
        secret = job_secret(job_key)
        _check_listen(host, secret, insecure, "NodeServer")
        _check_stores(secret, "NodeServer", object_store=store)
        if (relay is None) != (relay_node is None):
            errors.raise_error(errors.InvalidArgument,
                               "NodeServer: relay= and relay_node= go together")
        if relay is not None:
            relay._check(secret, insecure, "NodeServer")
            if not 0 <= int(relay_node) < len(relay.nodes):
                errors.raise_error(errors.InvalidArgument,
                                   f"NodeServer: relay_node {relay_node} of "
                                   f"{len(relay.nodes)} nodes")
        self.receivers = dict(receivers)
        self._core = _dcr.NodeServer(receivers, state_parts or globals()["state_parts"], restore,
                                     verify, store, fetch_all, gate, host, port, secret,
                                     relay.nodes if relay else [],
                                     relay.fanout if relay else 2,
                                     int(relay_node) if relay else 0)
        self.address = f"{host}:{self._core.port}"

    @property
    def ids(self) -> list[str]:
        return list(self._core.ids)

    def admit(self):
        """Admit one request (blocks while a transition applies); use as
        `with node.admit(): ...`."""
        return self._core.admit()

    def try_admit(self):
        """A ticket, or a false one when the gate is closed."""
        return self._core.try_admit()

    def counters(self, receiver_id: str) -> dict:
        return self._core.counters(str(receiver_id))

    def close(self) -> None:
        self._core.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class ClusterCoordinator:
    """The library's coordinator over owner and node processes: `owners[k]`
    is the address of rank k's `OwnerServer` (or `dcr-owner --rank k`),
    `nodes` the addresses of the `NodeServer`s (or `dcr-rollout`s). The
    same transitions as `Coordinator` (attempts, overwrite retries, the
    manifest binding, the compare-and-set of the commit record, the owners'
    baseline updates, garbage collection), with the payload bytes going from
    the owner processes to `store` and from there to the nodes.
    `asynchronous=True`: receivers stage while their gate is open and apply
    after it closed (asynchronous RL). Peers not listening yet are waited
    for up to `connect_wait_s`.
    """

    def __init__(self, commits: CommitStore, store: ObjectStore, owners, nodes, *,
                 job_key=None, max_attempts: int = 4, deadline_s: float = 120.0,
                 collect_garbage: bool = True, asynchronous: bool = False,
                 connect_wait_s: float = 60.0):
        owners, nodes = [str(a) for a in owners], [str(a) for a in nodes]
        for a in owners + nodes:
            _host_port(a, "ClusterCoordinator")
        self.commits, self.store = commits, store
        secret = job_secret(job_key)
        _check_stores(secret, "ClusterCoordinator", object_store=store, commit_store=commits)
        self._core = _dcr.ClusterCoordinator(commits, store, owners, nodes, max_attempts,
                                             deadline_s, collect_garbage, asynchronous,
                                             secret, connect_wait_s)
        self.last_report: dict | None = None

    @property
    def epoch(self) -> int:
        return self._core.epoch

    @property
    def node_ids(self) -> list[list[str]]:
        """Each node's receiver ids, in node order."""
        return [list(n) for n in self._core.node_ids]

    def take_over(self) -> int:
        """Become the active coordinator (fences every older one); returns the epoch."""
        return self._core.take_over()

    def bootstrap(self) -> None:
        """Commit version 0 if the store holds no record yet."""
        self._core.bootstrap()

    def transition(self) -> dict:
        """Run the transition to the owners' candidates and commit it; returns
        the report. Raises the typed error of a failed transition (the report
        is in `last_report`)."""
        rep = self._core.transition()
        self.last_report = rep
        return _raise_report(rep)

    def verify(self) -> list[tuple[str, bool, str]]:
        """Every receiver against a dense load of the committed version from
        the owners' dense export, at its node: (id, equal, state digest)."""
        return [tuple(x) for x in self._core.verify()]

    def kill(self, receiver_id: str) -> None:
        """Drop a receiver's storage at its node (it rejoins restored)."""
        self._core.kill(str(receiver_id))


__all__ = ["ObjectStore", "CommitStore", "RelayTree", "RelayNodes", "Coordinator", "state_parts",
           "OwnerServer", "NodeServer", "ClusterCoordinator", "job_secret"]
