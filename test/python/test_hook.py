"""The dispatch hook's contract (docs/python.md, docs/loaders.md): exact XOR,
add and overwrite application, and every loader condition enforced with a
typed error."""

import numpy as np
import pytest
import torch
from torch import nn

import dcr
import dcr.torch as dt

CANON = [("w", (4, 8), torch.bfloat16), ("b", (8,), torch.bfloat16)]


class Tiny(nn.Module):
    """`w` stored as is, `b` in FP32 (a cast); `mode` picks a broken loader."""

    def __init__(self, mode="good", b_mode="cast"):
        super().__init__()
        self.mode, self.b_mode = mode, b_mode
        self.w = nn.Parameter(torch.zeros(4, 8, dtype=torch.bfloat16), requires_grad=False)
        self.b = nn.Parameter(torch.zeros(8, dtype=torch.float32), requires_grad=False)
        self.register_buffer("buf", torch.arange(3, dtype=torch.float32))

    def load_weights(self, weights):
        loaded = set()
        for name, t in weights:
            m = self.mode
            if name == "b":
                if self.b_mode == "normalised":  # each output reads every input
                    t = t.float() / (t.float().abs().sum() + 1)
                elif self.b_mode == "nan_to_zero":  # the two fills' images coincide
                    t = torch.nan_to_num(t.float(), nan=0.0)
                self.b.data.copy_(t)
                loaded.add("b")
                continue
            if m in ("good", "no_report"):
                self.w.data.copy_(t)
            elif m == "add_":
                self.w.data.add_(t)
            elif m == "temp":
                tmp = torch.empty_like(t)
                tmp.copy_(t)
                self.w.data.copy_(tmp)
            elif m == "report_buf":
                self.w.data.copy_(t)
                loaded.add("buf")
            elif m == "transposed":  # through transposed and sliced views of both sides
                self.w.data.t()[:, :2].copy_(t.t()[:, :2])
                self.w.data.t()[:, 2:].copy_(t.t()[:, 2:])
            elif m == "broadcast":  # every row from row 0: a view the entries cannot invert
                self.w.data.copy_(t[0:1].expand(4, 8))
            elif m == "twice":
                self.w.data.copy_(t)
                self.w.data[:2].copy_(t[:2])
            elif m == "value_dependent":
                self.w.data.copy_(t.clone() if bool(t.any()) else t)
            elif m == "nonzero_only":  # on a zero scratch this looks like "not this rank's"
                if not bool(t.any()):
                    continue
                self.w.data.copy_(t)
            elif m == "writes_input":
                self.w.data.copy_(t)
                t.fill_(1)
            elif m == "raises":
                if bool(t.any()):
                    raise RuntimeError("boom")
                self.w.data.copy_(t)
            loaded.add("w")
        return None if self.mode == "no_report" else loaded


def tensors(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(s, generator=g).to(d) for n, s, d in CANON}


def item(old, new, idx, encoding):
    """Indices (uint64) and values (uint8 bytes) of an item changing `idx`."""
    o = old.view(-1).view(torch.int16)[idx]
    n = new.view(-1).view(torch.int16)[idx]
    if encoding == "xor":
        v = o ^ n
    elif encoding == "add":
        d = (n.to(torch.int64) - o.to(torch.int64)) & 0xFFFF
        d = torch.where(d >= 0x8000, d - 0x10000, d)  # signed 16-bit difference
        z = ((d << 1) ^ (d >> 63)) & 0xFFFF
        v = torch.where(z >= 0x8000, z - 0x10000, z).to(torch.int16)
    else:
        v = n
    return (np.asarray(idx, dtype=np.uint64), v.numpy().view(np.uint8).copy())


@pytest.mark.parametrize("mode", ["good", "transposed"])
@pytest.mark.parametrize("encoding", ["xor", "add", "overwrite"])
def test_exact_apply_each_encoding(encoding, mode):
    a, b = tensors(0), tensors(1)
    # NaN and infinity among the new values: bits, not floats, are compared.
    b["w"].view(-1)[3] = float("nan")
    b["w"].view(-1)[5] = float("inf")
    b["b"].view(-1)[2] = float("nan")
    m = Tiny(mode)
    rx = dt.Receiver(m, CANON)
    assert rx.xor_allowed("w") and not rx.xor_allowed("b")
    assert all(op.mapped for op in rx._plans["w"].ops)
    rx.dense_refit(a)
    idx = list(range(0, 32, 3)) + [5]
    idx = sorted(set(idx))
    rx.apply_item("w", encoding, *item(a["w"], b["w"], idx, encoding))
    rx.apply_item("b", "overwrite", *item(a["b"], b["b"], [0, 2, 7], "overwrite"))
    expect = {k: v.clone() for k, v in a.items()}
    expect["w"].view(-1).view(torch.int16)[idx] = b["w"].view(-1).view(torch.int16)[idx]
    expect["b"].view(-1).view(torch.int16)[[0, 2, 7]] = \
        b["b"].view(-1).view(torch.int16)[[0, 2, 7]]
    ref = Tiny(mode)
    ref.load_weights(expect.items())
    assert dt.state_bytes(ref) == dt.state_bytes(m)


@pytest.mark.parametrize("encoding", ["xor", "add", "overwrite"])
def test_views_the_entries_cannot_invert_apply_over_the_extent(encoding):
    a, b = tensors(0), tensors(1)
    m = Tiny("broadcast")
    rx = dt.Receiver(m, CANON)
    assert rx.xor_allowed("w") and not rx._plans["w"].ops[0].mapped
    rx.dense_refit(a)
    idx = [1, 6, 9]  # row 0 changes reach every row; row 1 changes none
    rx.apply_item("w", encoding, *item(a["w"], b["w"], idx, encoding))
    expect = a["w"].clone()
    expect.view(-1).view(torch.int16)[idx] = b["w"].view(-1).view(torch.int16)[idx]
    ref = Tiny("broadcast")
    ref.load_weights([("w", expect), ("b", a["b"])])
    assert dt.state_bytes(ref) == dt.state_bytes(m)


def test_relative_item_for_a_cast_path_is_refused():
    a, b = tensors(0), tensors(1)
    rx = dt.Receiver(Tiny(), CANON)
    rx.dense_refit(a)
    with pytest.raises(dcr.UnsupportedLoader, match="tensor b"):
        rx.apply_item("b", "xor", *item(a["b"], b["b"], [1], "xor"))


@pytest.mark.parametrize("mode,cls,text", [
    ("add_", dcr.LoaderCondition, "instead of copy_"),
    ("temp", dcr.LoaderCondition, "not a registered parameter"),
    ("report_buf", dcr.UnsupportedLoader, "no copy_ into it"),
    ("writes_input", dcr.UnsupportedLoader, "wrote its input"),
])
def test_prewarm_rejects(mode, cls, text):
    with pytest.raises(cls, match=text):
        dt.Receiver(Tiny(mode), CANON)


def test_overlapping_writes_disable_xor_and_fail_at_apply():
    a, b = tensors(0), tensors(1)
    m = Tiny("twice")
    rx = dt.Receiver(m, CANON)
    assert not rx.xor_allowed("w")
    rx.dense_refit(a)
    with pytest.raises(dcr.UnsupportedLoader):
        rx.apply_item("w", "xor", *item(a["w"], b["w"], [0, 9], "xor"))
    # Overwrites are exact through overlapping copies (both write the same bits).
    rx.apply_item("w", "overwrite", *item(a["w"], b["w"], [0, 9, 20], "overwrite"))
    # The run-time check stands behind prewarm's: forced on, XOR is refused.
    rx._plans["w"].xor_allowed = True
    with pytest.raises(dcr.LoaderCondition, match="overlapping xor writes"):
        rx.apply_item("w", "xor", *item(a["w"], b["w"], [0, 9], "xor"))


@pytest.mark.parametrize("mode", ["value_dependent", "nonzero_only"])
def test_prewarm_refuses_a_loader_whose_writes_depend_on_the_values(mode):
    # nonzero_only copies nothing on a zero scratch: without the second dry
    # run on non-zero words, "w" looked skipped and its items were dropped.
    with pytest.raises(dcr.UnsupportedLoader, match="depend on the values"):
        dt.Receiver(Tiny(mode), CANON)


def test_path_that_changes_after_prewarm_fails_the_attempt():
    a, b = tensors(0), tensors(1)
    m = Tiny("good")
    rx = dt.Receiver(m, CANON)
    assert rx.xor_allowed("w")
    m.mode = "value_dependent"  # the loader changed under the receiver
    with pytest.raises(dcr.LoaderCondition, match="left the path"):
        rx.apply_item("w", "xor", *item(a["w"], b["w"], [1, 2], "xor"))


def test_a_loader_that_stops_reporting_fails_the_attempt():
    # A report of None at apply would switch the report check off.
    a, b = tensors(0), tensors(1)
    m = Tiny("good")
    rx = dt.Receiver(m, CANON)
    rx.dense_refit(a)
    m.mode = "no_report"
    with pytest.raises(dcr.LoaderCondition, match="tensor w: the loader returned no report"):
        rx.apply_item("w", "overwrite", *item(a["w"], b["w"], [1, 2], "overwrite"))


def test_unsorted_or_repeated_indices_are_refused_before_any_write():
    a, b = tensors(0), tensors(1)
    m = Tiny("good")
    rx = dt.Receiver(m, CANON)
    rx.dense_refit(a)
    before = dt.state_bytes(m)
    for idx in ([5, 2], [3, 3]):
        i, v = item(a["w"], b["w"], idx, "xor")
        with pytest.raises(dcr.NotIncreasing, match="tensor w"):
            rx.apply_item("w", "xor", i, v)
    assert dt.state_bytes(m) == before


def test_torch_errors_inside_an_apply_are_typed(monkeypatch):
    a, b = tensors(0), tensors(1)
    rx = dt.Receiver(Tiny("good"), CANON)
    rx.dense_refit(a)

    def broken(*args):
        raise RuntimeError("Expected all tensors to be on the same device")

    monkeypatch.setattr(rx, "_apply_overwrite_direct", broken)
    with pytest.raises(dcr.LoaderCondition, match="tensor w: apply failed: RuntimeError"):
        rx.apply_item("w", "overwrite", *item(a["w"], b["w"], [1], "overwrite"))


def test_loader_that_raises_fails_the_apply_with_a_typed_error():
    a, b = tensors(0), tensors(1)
    # Raising on non-zero values already at prewarm's second dry run:
    with pytest.raises(dcr.UnsupportedLoader, match="tensor w: the loader raised RuntimeError"):
        dt.Receiver(Tiny("raises"), CANON)
    m = Tiny("good")
    rx = dt.Receiver(m, CANON)
    m.mode = "raises"  # ... and only from now on
    with pytest.raises(dcr.LoaderCondition, match="RuntimeError: boom"):
        rx.apply_item("w", "overwrite", *item(a["w"], b["w"], [1], "overwrite"))


def test_rebinding_a_parameter_is_detected():
    class Rebind(Tiny):
        def load_weights(self, weights):
            for name, t in weights:
                if name == "w":
                    self.w.data = t.clone()
                else:
                    self.b.data.copy_(t)
            return None

    with pytest.raises(dcr.Error, match="storage of w was replaced|changed during"):
        dt.Receiver(Rebind(), CANON)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the hook on CUDA "
                    "tensors is tested where one is present")
def test_cuda_receiver():
    a, b = tensors(0), tensors(1)
    m = Tiny().cuda()
    rx = dt.Receiver(m, CANON)
    rx.dense_refit({k: v.cuda() for k, v in a.items()})
    rx.apply_item("w", "xor", *item(a["w"], b["w"], [0, 4, 31], "xor"))
    expect = a["w"].clone()
    expect.view(-1)[[0, 4, 31]] = b["w"].view(-1)[[0, 4, 31]]
    assert torch.equal(m.w.cpu().view(torch.int16), expect.view(torch.int16))


def test_loader_copying_into_parameters_that_require_grad():
    """A plain nn.Module (parameters requiring grad) whose loader copies into
    the parameter itself, not `.data`: the hook applies under no_grad."""

    class Plain(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.zeros(4, 8, dtype=torch.bfloat16))
            self.b = nn.Parameter(torch.zeros(8, dtype=torch.bfloat16))

        def load_weights(self, weights):
            for name, t in weights:
                getattr(self, name).copy_(t)
            return {name for name, _ in weights}

    a, b = tensors(0), tensors(1)
    m = Plain()
    rx = dt.Receiver(m, CANON)
    rx.dense_refit(a)
    for name, n in (("w", 32), ("b", 8)):
        idx = list(range(0, n, 2))
        rx.apply_item(name, "xor", *item(a[name], b[name], idx, "xor"))
        a[name].view(-1).view(torch.int16)[idx] = b[name].view(-1).view(torch.int16)[idx]
    ref = Plain()
    with torch.no_grad():
        ref.load_weights(a.items())
    assert dt.state_bytes(ref) == dt.state_bytes(m)


@pytest.mark.parametrize("b_mode", ["normalised", "nan_to_zero"])
def test_two_fill_refuses_transforms_it_cannot_place(b_mode):
    """A cast path whose transform is not elementwise, or maps both fills to
    the same bits, would be left wrong by the two-fill rule without an
    error: prewarm finds it, its overwrites fail naming the tensor with
    nothing written, and its dense load still works."""
    a, b = tensors(0), tensors(1)
    m = Tiny(b_mode=b_mode)
    rx = dt.Receiver(m, CANON)
    rx.dense_refit(a)
    before = dt.state_bytes(m)
    with pytest.raises(dcr.UnsupportedLoader, match="tensor b: .*not elementwise"):
        rx.apply_item("b", "overwrite", *item(a["b"], b["b"], [0, 2, 7], "overwrite"))
    assert dt.state_bytes(m) == before
    rx.apply_item("w", "overwrite", *item(a["w"], b["w"], [1, 4], "overwrite"))  # direct: fine
    rx.dense_refit(b)
    ref = Tiny(b_mode=b_mode)
    ref.load_weights(b.items())
    assert dt.state_bytes(ref) == dt.state_bytes(m)


def test_two_fill_keeps_elementwise_casts():
    rx = dt.Receiver(Tiny(), CANON)
    assert rx._plans["b"].two_fill_error == ""
