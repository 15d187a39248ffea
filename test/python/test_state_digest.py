"""The vLLM worker's state digest (`dcr.vllm._parts_digest`): hashed in
pieces on a thread pool, it must still be a function of the parts alone."""

import numpy as np
import pytest

from dcr import vllm as dv


def parts(seed: int, sizes=(0, 5, (64 << 20) + 3, 1 << 20)):
    rng = np.random.default_rng(seed)
    return [(f"p{i}", rng.integers(0, 256, size=n, dtype=np.uint8)) for i, n in enumerate(sizes)]


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_equal_parts_equal_digest_any_thread_count(threads):
    assert dv._parts_digest(parts(1), threads) == dv._parts_digest(parts(1), 1)


def test_every_change_changes_it():
    base = dv._parts_digest(parts(1), 2)
    flipped = parts(1)
    flipped[2][1][(64 << 20) + 1] ^= 1  # a byte in the second piece of a part
    assert dv._parts_digest(flipped, 2) != base
    renamed = parts(1)
    renamed[1] = ("q1", renamed[1][1])
    assert dv._parts_digest(renamed, 2) != base
    # the same bytes split differently between two parts
    moved = parts(1)
    moved[0] = (moved[0][0], moved[1][1][:1])
    moved[1] = (moved[1][0], moved[1][1][1:])
    assert dv._parts_digest(moved, 2) != base
    assert dv._parts_digest(parts(2), 2) != base
