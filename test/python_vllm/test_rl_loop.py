"""examples/python/rl_loop.py as a user runs it: trainer ranks as
torch.distributed processes, a vLLM engine refitted through the coordinator
in its own process, checked after every step against vLLM's dense reload and
at the end against a fresh engine per version, with a trainer rank or a
serving worker SIGKILLed mid-refit. The program's own checks decide; the
test reads its exit status, its messages and its table."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PROGRAM = os.path.join(ROOT, "examples", "python", "rl_loop.py")


def _run(tmp_path, *args: str, timeout: float = 420.0) -> str:
    env = dict(os.environ)
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the program chooses per --tp
    env["PYTHONPATH"] = os.path.join(ROOT, "python")
    p = subprocess.run([sys.executable, PROGRAM, "--workdir", str(tmp_path / "work"), *args],
                       capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-6000:]
    return p.stdout


def _rows(out: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines() if re.match(r"^\s+\d+\s+\d", line)]


@pytest.mark.parametrize("trainer,lr,extra", [
    ("megatron", "1e-6", ["--kill", "rank:2"]),
    ("fsdp2", "1e-5", ["--tp", "2", "--job-key", "KEY", "--transport", "relay_tree",
                       "--kill", "worker:2"]),
], ids=["megatron-tp1-rank-killed", "fsdp2-tp2-keyed-relay-worker-killed"])
def test_rl_loop(tmp_path, trainer, lr, extra):
    """Step 1 refits as usual; in step 2 a trainer rank (or a serving
    worker) is SIGKILLed mid-refit and the job recovers: the transition
    fails with nothing committed (or, for a rank that died after its
    owner's publish, commits), and the restarted side is refit bit-exact.
    The second case streams the payloads through the relay tree (the
    engine's node restarted at the same relay address)."""
    if "KEY" in extra:
        key = tmp_path / "job.key"
        key.write_bytes(os.urandom(32))
        extra = [str(key) if a == "KEY" else a for a in extra]
    out = _run(tmp_path, "--trainer", trainer, "--lr", lr, "--steps", "2", *extra)
    assert out.strip().splitlines()[-1] == "rl_loop: 2 steps, bit-exact, generation equal", out
    assert "every version equals a fresh engine from its checkpoint: yes" in out, out
    what = extra[extra.index("--kill") + 1].split(":")[0]
    killed = re.search(rf"rl_loop: step 2: {what} SIGKILLed mid-refit; the transition failed "
                       r"\(.*\); committed version (\d)", out)
    assert killed, out
    if what == "worker":
        assert killed.group(1) == "1", out  # the engine died before its ACK
    elif killed.group(1) == "1":
        # The restarted trainer's candidate differs from the lost one: the
        # coordinator itself has the engine restored before its retry.
        assert "the coordinator restored the engine densely to version 1" in out, out
    rows = _rows(out)
    assert [r[0] for r in rows] == ["1", "2"], out
    for r in rows:
        loss, change, payload = float(r[1]), float(r[2]), float(r[3])
        assert 0 < loss < 20 and 0 < change < 100, r
        # A version committed before the rank died was refit by the failed
        # transition itself (no report of it: no payload figure).
        assert payload > 0 or (r[0] == "2" and killed.group(1) == "2"), r
        assert r[-2:] == ["yes", "yes"], r  # generation equal, bit-exact
