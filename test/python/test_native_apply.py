"""The extension's per-entry apply (`dcr._dcr.scatter_words`, `zero_words`,
`MappedCopy`) against torch index operations, its checks, and the receiver's
C++ path against its torch path on the same items (docs/python.md)."""

import numpy as np
import pytest
import torch

import dcr
import dcr.torch as dt
from dcr import _dcr

from test_hook import CANON, Tiny, item, tensors


def test_scatter_words_checks_every_index_before_writing():
    buf = torch.zeros(16, dtype=torch.int16)
    vals = np.array([1, 2, 3], dtype=np.int16).view(np.uint8)
    for bad in ([1, 5, 5], [3, 2, 7], [1, 2, 16]):
        with pytest.raises(dcr.Error):
            _dcr.scatter_words(buf.data_ptr(), 16, 2, np.array(bad, dtype=np.uint64), vals)
        assert not bool(buf.any())  # nothing written
    with pytest.raises(dcr.Error):  # value bytes for another number of entries
        _dcr.scatter_words(buf.data_ptr(), 16, 2, np.array([1, 2], dtype=np.uint64), vals)
    idx = np.array([0, 7, 15], dtype=np.uint64)
    _dcr.scatter_words(buf.data_ptr(), 16, 2, idx, vals)
    assert buf.tolist() == [1] + [0] * 6 + [2] + [0] * 7 + [3]
    _dcr.zero_words(buf.data_ptr(), 16, 2, idx)
    assert not bool(buf.any())
    # Dense entries clear their whole range.
    dense = np.arange(2, 12, dtype=np.uint64)
    _dcr.scatter_words(buf.data_ptr(), 16, 2, dense, np.ones(10, dtype=np.int16).view(np.uint8))
    _dcr.zero_words(buf.data_ptr(), 16, 2, dense)
    assert not bool(buf.any())


def _unzigzag(u: torch.Tensor) -> torch.Tensor:
    u = u.to(torch.int64) & 0xFFFF
    return (u >> 1) ^ -(u & 1)


@pytest.mark.parametrize("op", [1, 2, 3])
@pytest.mark.parametrize("view", ["block", "rows", "transposed", "columns"])
def test_mapped_copy_matches_torch_views(op, view):
    """Entries of a canonical [6, 10] tensor through a source view of the
    scratch into a destination view of a larger storage, as torch would
    copy them, for XOR (1), overwrite (2) and add (3)."""
    g = torch.Generator().manual_seed(op)
    src_base = torch.zeros(60, dtype=torch.int16)
    storage = torch.randint(-(1 << 15), 1 << 15, (200,), generator=g, dtype=torch.int16)
    canon = src_base.view(6, 10)
    if view == "block":
        s, d = canon[2:5], storage[30:60].view(3, 10)
    elif view == "rows":  # contiguous source, strided destination rows
        s, d = canon[1:4], storage.as_strided((3, 10), (20, 1), 7)
    elif view == "transposed":
        s, d = canon.t()[3:9], storage[100:136].view(6, 6)
    else:  # a column slice (a row-parallel split)
        s, d = canon[:, 4:9], storage[50:80].view(6, 5)
    idx = np.sort(np.random.default_rng(op).choice(60, 25, replace=False)).astype(np.uint64)
    words = torch.randint(-(1 << 15), 1 << 15, (25,), generator=g, dtype=torch.int16)
    # Reference: the entries in the scratch, then the masked torch copy.
    scratch = torch.zeros(60, dtype=torch.int16)
    scratch[torch.from_numpy(idx.view(np.int64))] = words
    active = torch.zeros(60, dtype=torch.bool)
    active[torch.from_numpy(idx.view(np.int64))] = True
    sv = scratch.as_strided(s.shape, s.stride(), s.storage_offset())
    av = active.as_strided(s.shape, s.stride(), s.storage_offset())
    expect = storage.clone()
    dv = expect.as_strided(d.shape, d.stride(), d.storage_offset())
    if op == 1:
        dv.bitwise_xor_(sv)
    elif op == 2:
        dv.copy_(torch.where(av, sv, dv))
    else:
        r = (dv.to(torch.int64) + _unzigzag(sv)) & 0xFFFF
        dv.copy_(torch.where(r >= 0x8000, r - 0x10000, r).to(torch.int16))
    mc = _dcr.MappedCopy(s.storage_offset(), list(s.shape), list(s.stride()),
                         d.storage_offset(), list(d.stride()))
    got = storage.clone()
    n = mc.apply(got.data_ptr(), got.numel(), 2, idx, words.numpy().view(np.uint8), op)
    assert n == int(av.sum())
    assert torch.equal(got, expect)


def test_mapped_copy_refuses_a_destination_outside_the_storage():
    storage = torch.zeros(20, dtype=torch.int16)
    mc = _dcr.MappedCopy(0, [4, 8], [8, 1], 0, [8, 1])  # 32 elements into 20
    idx = np.array([0, 31], dtype=np.uint64)
    with pytest.raises(dcr.Error):
        mc.apply(storage.data_ptr(), 20, 2, idx, np.ones(2, dtype=np.int16).view(np.uint8), 1)
    assert not bool(storage.any())


@pytest.mark.parametrize("mode", ["good", "transposed", "broadcast"])
@pytest.mark.parametrize("encoding", ["xor", "add", "overwrite"])
def test_extension_path_equals_torch_path(mode, encoding):
    """The same items through the C++ path and the torch path (the one a
    CUDA model takes) give the same bytes; the scratch is zero after each."""
    a, b = tensors(0), tensors(1)
    idx = [0, 3, 5, 9, 17, 30, 31]
    out = []
    for native in (True, False):
        m = Tiny(mode)
        rx = dt.Receiver(m, CANON)
        assert rx._native
        rx._native = native
        rx.dense_refit(a)
        rx.apply_item("w", encoding, *item(a["w"], b["w"], idx, encoding))
        rx.apply_item("b", "overwrite", *item(a["b"], b["b"], [1, 6], "overwrite"))
        assert not bool(rx._scratch.any())
        out.append(dt.state_bytes(m))
    assert out[0] == out[1]


def test_the_loader_reads_the_item_values_when_it_reads_the_scratch():
    """The scratch is filled on the loader's first read (any aten op on it
    but a view): a loader that inspects its input sees the item's values."""
    a, b = tensors(0), tensors(1)
    seen = []

    class Reader(Tiny):
        def load_weights(self, weights):
            weights = list(weights)
            for name, t in weights:
                if name == "w":
                    seen.append(t.clone())  # a read: the values are there
            return super().load_weights(weights)

    m = Reader()
    rx = dt.Receiver(m, CANON)
    rx.dense_refit(a)
    seen.clear()
    idx = [2, 11, 29]
    ind, vals = item(a["w"], b["w"], idx, "xor")
    rx.apply_item("w", "xor", ind, vals)
    expect = torch.zeros(32, dtype=torch.int16)
    expect[idx] = torch.from_numpy(vals.view(np.int16).copy())
    assert torch.equal(seen[0].view(-1).view(torch.int16), expect)
    assert not bool(rx._scratch.any())
