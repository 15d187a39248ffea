"""Real servers for the Python interop tests, started as the C++ suites start them:
etcd (/usr/bin/etcd of Debian etcd-server, free loopback ports, a temporary
data directory; test/etcd/etcd_server.hpp) and OpenStack Swift with s3api
(test/s3/start-swift.sh, which prints `READY <port> <access> <secret>
<region>` and stops its servers when its stdin closes; test/s3/swift_cluster.hpp).

A server whose binaries are missing skips its tests with the reason, except
under CI (`CI` set to a true value), where it fails them: the setup script
installs both, so a missing one there is a broken setup, not a machine
without the feature. A server that is installed but does not start always
fails its tests.
"""

from __future__ import annotations

import ctypes
import os
import selectors
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ETCD = "/usr/bin/etcd"
SWIFT_BINARIES = ["/usr/bin/swift-proxy-server", "/usr/bin/swift-object-server",
                  "/usr/bin/swift-container-server", "/usr/bin/swift-account-server",
                  "/usr/bin/swift-ring-builder"]
START_SWIFT = os.path.join(ROOT, "test", "s3", "start-swift.sh")


def under_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def unavailable(reason: str):
    """Skip, or fail under CI (see module doc)."""
    if under_ci():
        pytest.fail(f"{reason} (CI is set: the setup installs it)")
    pytest.skip(reason)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent():
    # PR_SET_PDEATHSIG (1) = SIGKILL: the server dies with the test process.
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)


class EtcdServer:
    def __init__(self):
        if not os.access(ETCD, os.X_OK):
            unavailable(f"{ETCD} not found (install the Debian package etcd-server)")
        self.dir = tempfile.mkdtemp(prefix="dcr-etcd-")
        self.client_port, peer_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{peer_port}"
        self.log = open(os.path.join(self.dir, "etcd.log"), "wb")
        self.proc = subprocess.Popen(
            [ETCD, "--name", "dcr-test", "--data-dir", os.path.join(self.dir, "data"),
             "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"dcr-test={peer}", "--initial-cluster-state", "new"],
            stdout=self.log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.stop()
                pytest.fail(f"etcd exited during start-up:\n{self._tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if b'"true"' in r.read():
                        return
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        pytest.fail(f"etcd not healthy within 30 s:\n{self._tail()}")

    def _tail(self) -> str:
        with open(os.path.join(self.dir, "etcd.log"), "rb") as f:
            return f.read()[-2000:].decode(errors="replace")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class SwiftServer:
    """start-swift.sh as a child whose stdin is our pipe."""

    def __init__(self):
        for b in SWIFT_BINARIES:
            if not os.access(b, os.X_OK):
                unavailable(f"{b} not found (install the Debian packages swift swift-proxy "
                            "swift-account swift-container swift-object)")
        self.proc = subprocess.Popen(["bash", START_SWIFT], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, preexec_fn=_die_with_parent)
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        line = b""
        deadline = time.monotonic() + 120
        while b"\n" not in line:
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                self.stop()
                pytest.fail("start-swift.sh: no READY line within 120 s")
            chunk = os.read(self.proc.stdout.fileno(), 256)
            if not chunk:
                rc = self.proc.wait()
                if rc == 77:
                    unavailable("start-swift.sh found no swift installation")
                pytest.fail(f"start-swift.sh exited with {rc} (its messages are above)")
            line += chunk
        parts = line.split(b"\n")[0].decode().split()
        if len(parts) != 5 or parts[0] != "READY":
            self.stop()
            pytest.fail(f"start-swift.sh said {line!r}")
        self.port = int(parts[1])
        self.access_key, self.secret_key, self.region = parts[2], parts[3], parts[4]

    def url(self, bucket: str) -> str:
        return f"s3://127.0.0.1:{self.port}/{bucket}"

    def credentials_file(self, directory) -> str:
        path = os.path.join(str(directory), "s3-credentials")
        with open(path, "w") as f:
            f.write(f"# Swift tempauth user\naccess_key {self.access_key}\n"
                    f"secret_key {self.secret_key}\n")
        return path

    def stop(self):
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()  # end of file: the script stops its servers
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
