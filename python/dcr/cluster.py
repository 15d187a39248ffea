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
- `Coordinator(commits, store, owners, receivers)`: the library's
  coordinator (`protocol::coordinator`) driving owners of this process and
  Python receivers: `take_over()`, `bootstrap()` (commit version 0),
  `transition()` (attempts until every receiver holds the owners'
  candidate, overwrite retries included, then the compare-and-set of the
  commit record, the owners' baselines and garbage collection).

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


class ObjectStore(_dcr.ObjectStore):
    """Attempt objects of one commit history in a store named by URL (see module doc).

    `incarnation`: the commit history to read and write (32 hex digits;
    empty: a new one). `credentials`: an S3 credentials file; without it the
    keys come from `DCR_S3_ACCESS_KEY` and `DCR_S3_SECRET_KEY`.
    """

    def __init__(self, url: str, incarnation: str = "", *, region: str = "us-east-1",
                 credentials: str | None = None):
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
        super().__init__(url, incarnation, region, access, secret)
        self.url = url


RelayTree = _dcr.RelayTree


class CommitStore(_dcr.CommitStore):
    """The commit record, epoch and attempt counters in a store named by URL.

    `load()` returns the stored record as a dict (`version`, `revision`,
    `epoch`, `attempt`, `incarnation`, `receivers` as (id, digest) pairs);
    `take_over()` and `prepare(epoch)` are the store's counters (a
    coordinator calls them itself). `credentials`: for `etcd+https://`, a
    file of `ca`, `cert` and `key` lines.
    """

    def __init__(self, url: str, *, credentials: str | None = None):
        ca = cert = key = ""
        if credentials is not None:
            c = _credential_lines(credentials, {"ca", "cert", "key"}, "credentials")
            if ("cert" in c) != ("key" in c):
                errors.raise_error(errors.InvalidArgument,
                                   f"credentials {credentials}: 'cert' and 'key' go together")
            ca, cert, key = c.get("ca", ""), c.get("cert", ""), c.get("key", "")
        super().__init__(url, ca, cert, key)
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
        if rep["error"] is not None:
            code, message = rep["error"]
            cls = errors.BY_CODE.get(code, errors.Error)
            raise cls(f"{cls.name}: {message}", code)
        return rep

    def kill(self, receiver_id: str) -> None:
        """Drop a receiver's storage (as a crash would): it rejoins restored
        (`restore`) at the next transition's membership step."""
        self._core.kill(str(receiver_id))

    def counters(self, receiver_id: str) -> dict:
        """The endpoint's counts: staged, applied calls, duplicates, stale, restores."""
        return self._core.counters(str(receiver_id))


__all__ = ["ObjectStore", "CommitStore", "RelayTree", "Coordinator", "state_parts"]
