"""PyTorch side of dcr: a receiver that applies payloads through a model's own
`load_weights`, and an owner fed from torch tensors (docs/python.md).

Receiver: the model's loader is run once per item on a scratch tensor of the
canonical shape, under a `TorchDispatchMode` that intercepts its final
`aten.copy_` into parameter or buffer storage and writes only the active
positions of the item (XOR masks and add differences with a zero
placeholder, overwrites with an active mask or, through a transform, by the
two-fill rule). The loader conditions of docs/loaders.md are checked at
prewarm and at every apply; a violation raises a typed `dcr.Error` and fails
the attempt, which the overwrite retry (or a dense refit) repairs.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from . import _dcr, errors
from ._tensors import DTYPES, PLACEHOLDER, WORD, dtype_of, span_of, word_view

aten = torch.ops.aten

__all__ = ["Receiver", "RefitEngine", "Owner", "TrainerPlan", "CanonicalMeta",
           "canonical_metas", "state_bytes", "fsdp2_plan"]


@dataclass(frozen=True)
class CanonicalMeta:
    name: str
    shape: tuple
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= int(s)
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


def canonical_metas(tensors) -> list[CanonicalMeta]:
    """Metas from a `{name: tensor}` mapping, `(name, shape, dtype)` tuples or plan dicts."""
    out = []
    items = tensors.items() if isinstance(tensors, Mapping) else tensors
    for x in items:
        if isinstance(x, CanonicalMeta):
            out.append(x)
        elif isinstance(x, dict):
            out.append(CanonicalMeta(x["name"], tuple(x["shape"]), dtype_of(x["dtype"])))
        elif isinstance(x[1], torch.Tensor):
            out.append(CanonicalMeta(x[0], tuple(x[1].shape), x[1].dtype))
        else:
            dt = x[2] if isinstance(x[2], torch.dtype) else dtype_of(x[2])
            out.append(CanonicalMeta(x[0], tuple(x[1]), dt))
    return out


def _geom(t: torch.Tensor) -> tuple:
    return (t.storage_offset(), tuple(t.shape), tuple(t.stride()))


def _invertible(geom: tuple) -> bool:
    """Whether a view's element offsets decompose uniquely and greedily by
    decreasing stride (a slice, transpose or permutation of a contiguous
    tensor): then an element offset maps back to its position in the view
    with one division per dimension (`_map_entries`)."""
    _, shape, stride = geom
    dims = sorted(((st, sh) for sh, st in zip(shape, stride) if sh > 1), reverse=True)
    reach = 0
    for st, sh in reversed(dims):
        if st <= reach:
            return False
        reach += (sh - 1) * st
    return True


def _contiguous(shape, stride) -> bool:
    expect = 1
    for sh, st in zip(reversed(shape), reversed(stride)):
        if sh > 1 and st != expect:
            return False
        expect *= sh
    return True


def _map_entries(idx: torch.Tensor, src: tuple, dst: tuple):
    """(positions in `idx`, destination element offsets) of the sorted canonical
    indices `idx` that the source view `src` covers, through to the view `dst`
    of the same shape. O(entries in the view's range)."""
    off, shape, stride = src
    reach = sum((sh - 1) * st for sh, st in zip(shape, stride) if sh > 1)
    lo = int(torch.searchsorted(idx, off))
    hi = int(torch.searchsorted(idx, off + reach, right=True))
    if _contiguous(shape, stride) and _contiguous(shape, dst[2]):
        return slice(lo, hi), idx[lo:hi] + (dst[0] - off)  # a block: a shift
    pos = torch.arange(lo, hi, device=idx.device)
    rem = idx[lo:hi] - off
    out = torch.full_like(rem, dst[0])
    valid = torch.ones_like(rem, dtype=torch.bool)
    for j in sorted(range(len(shape)), key=lambda j: -stride[j]):
        if shape[j] == 1:
            continue
        k = torch.div(rem, stride[j], rounding_mode="floor")
        valid &= k < shape[j]
        rem = rem - k * stride[j]
        out += k * dst[2][j]
    valid &= rem == 0
    return pos[valid], out[valid]


@dataclass
class _Op:
    """One planned storage write of a loader call."""
    kind: str               # "copy" or "fill"
    key: int                # registered storage (data_ptr of its untyped storage)
    dst: tuple              # (offset, shape, stride) in the storage's elements
    direct: bool = False    # source is a same-dtype view of the scratch
    mapped: bool = False    # direct, and its source view inverts (`_invertible`)
    src: tuple | None = None  # its (offset, shape, stride) in the scratch's elements
    native: object = None   # mapped: its `_dcr.MappedCopy` (made at prewarm)

    def same_path(self, other: "_Op") -> bool:
        return (self.kind, self.key, self.dst, self.direct, self.src) == \
            (other.kind, other.key, other.dst, other.direct, other.src)


@dataclass
class _TensorPlan:
    meta: CanonicalMeta
    ops: list = field(default_factory=list)
    reported: frozenset | None = None
    direct: bool = True        # every copy a same-dtype view of the scratch
    xor_allowed: bool = False  # direct and no destination element written twice
    disjoint: bool = False     # no destination element written twice (over all tensors)
    width: int = 0             # bytes of a stored word
    words: object = None       # the scratch's first `numel` words, flat (made at prewarm)
    all_mapped: bool = False   # every copy mapped (no mask of the indices needed)
    two_fill_error: str = ""   # why overwrites cannot take the two-fill rule ("" if they can)

    @property
    def skipped(self) -> bool:
        return not any(o.kind == "copy" for o in self.ops)


@dataclass
class _Storage:
    names: list
    flat: torch.Tensor   # the whole storage as a flat tensor of its dtype
    ptr: int


# twin::scatter_op codes of `_dcr.MappedCopy.apply`.
_XOR, _OVERWRITE, _ADD = 1, 2, 3


class _Entries:
    """An item's entries: the decoder's arrays (what the C++ paths read) and,
    made on first use, torch tensors of them on the receiver's device (what
    the torch paths read)."""

    __slots__ = ("np_idx", "np_vals", "width", "device", "scattered", "_idx", "_words")

    def __init__(self, idx: np.ndarray, vals: np.ndarray, width: int, device):
        self.np_idx, self.np_vals, self.width, self.device = idx, vals, width, device
        self._idx = self._words = None
        self.scattered = False

    @property
    def idx(self) -> torch.Tensor:
        if self._idx is None:
            self._idx = torch.from_numpy(self.np_idx.view(np.int64)).to(self.device)
        return self._idx

    @property
    def words(self) -> torch.Tensor:
        if self._words is None:
            self._words = torch.from_numpy(self.np_vals).view(WORD[self.width]).to(self.device)
        return self._words


# Arguments each aten overload writes ((position, name) pairs), by overload.
_WRITES: dict = {}


def _writes_of(func) -> tuple:
    w = _WRITES.get(func)
    if w is None:
        w = tuple((i, a.name) for i, a in enumerate(func._schema.arguments)
                  if a.alias_info is not None and a.alias_info.is_write) \
            if func._schema.is_mutable else ()
        _WRITES[func] = w
    return w


# Whether an aten overload is a view (every result aliases an input, nothing
# written): it reads no element, so it does not need the item's values.
_VIEWS: dict = {}


def _is_view(func) -> bool:
    v = _VIEWS.get(func)
    if v is None:
        rs = func._schema.returns
        v = not func._schema.is_mutable and len(rs) > 0 and all(
            r.alias_info is not None and not r.alias_info.is_write for r in rs)
        _VIEWS[func] = v
    return v


class _Hook(TorchDispatchMode):
    """Routes the loader's writes into registered storage to the receiver."""

    def __init__(self, rx: "Receiver", on_copy: Callable, on_fill: Callable):
        super().__init__()
        self.rx, self.on_copy, self.on_fill = rx, on_copy, on_fill

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is aten.copy_.default:
            return self.on_copy(args[0], args[1])
        writes = _writes_of(func)
        if writes:
            for i, name in writes:
                v = args[i] if i < len(args) else kwargs.get(name)
                if isinstance(v, torch.Tensor) and self.rx._key_of(v) is not None:
                    if func is aten.fill_.Scalar and args[1] == 0:
                        return self.on_fill(v)
                    errors.raise_error(
                        errors.LoaderCondition,
                        f"tensor {self.rx._current}: the loader writes "
                        f"{self.rx._name_of(v)} with {func} instead of copy_")
        if self.rx._pending is not None and not _is_view(func) and \
                self.rx._reads_scratch((args, kwargs)):
            self.rx._pending()  # the loader reads the scratch: the item's values first
        return func(*args, **kwargs)


class Receiver:
    """One serving rank: `model`'s parameters and buffers updated through `load_weights`.

    `load_weights(weights)` takes an iterable of `(canonical name, tensor)`
    and returns the names of the parameters it loaded (vLLM's contract; None
    turns off the report check). `canonical`: the checkpoint's tensors as
    `{name: tensor}`, `(name, shape, dtype)` tuples or `Plan.canonical()`.
    """

    def __init__(self, model: torch.nn.Module, canonical,
                 load_weights: Callable | None = None, *, device=None, job_key=None):
        from .cluster import job_secret
        self.model = model
        # Payload digests must be sealed with the job key (when there is one).
        self._job_key = job_secret(job_key)
        self.load_weights = load_weights if load_weights is not None else model.load_weights
        self.metas = {m.name: m for m in canonical_metas(canonical)}
        self._storages: dict[int, _Storage] = {}
        self._name_key: dict[str, int] = {}
        for name, t in list(model.named_parameters(remove_duplicate=False)) + \
                list(model.named_buffers(remove_duplicate=False)):
            key = t.untyped_storage().data_ptr()
            if key not in self._storages:
                n = t.untyped_storage().nbytes() // t.element_size()
                flat = torch.empty(0, dtype=t.dtype, device=t.device).set_(
                    t.untyped_storage(), 0, (n,), (1,))
                self._storages[key] = _Storage([], flat, key)
            self._storages[key].names.append(name)
            self._name_key[name] = key
        if device is None:
            first = next(iter(self._storages.values()), None)
            device = first.flat.device if first is not None else torch.device("cpu")
        self.device = torch.device(device)
        biggest = max((m.nbytes for m in self.metas.values()), default=0)
        self._scratch = torch.zeros(max(biggest, 8), dtype=torch.uint8, device=self.device)
        # Entries move in the C++ extension when the scratch and every
        # registered storage are host memory; otherwise through torch ops.
        self._native = self.device.type == "cpu" and \
            all(s.flat.device.type == "cpu" for s in self._storages.values())
        self._current = ""
        self._pending = None  # scatters the current item into the scratch, once
        self._plans: dict[str, _TensorPlan] = {}
        self._attempt = 0
        self._staged: list = []
        self._seen: set = set()
        self._failed = False
        self.applied_payloads = 0
        self._prewarm()

    # -- storage bookkeeping -------------------------------------------------
    def _key_of(self, t: torch.Tensor):
        key = t.untyped_storage().data_ptr()
        return key if key in self._storages else None

    def _name_of(self, t: torch.Tensor) -> str:
        key = self._key_of(t)
        return self._storages[key].names[0] if key is not None else "<unregistered>"

    def _check_storages(self, where: str) -> None:
        for name, t in list(self.model.named_parameters(remove_duplicate=False)) + \
                list(self.model.named_buffers(remove_duplicate=False)):
            if self._name_key.get(name) != t.untyped_storage().data_ptr():
                errors.raise_error(errors.LoaderCondition,
                                   f"{where}: the storage of {name} was replaced "
                                   "(a loader must copy_ into it, not rebind it)")

    def _scratch_for(self, meta: CanonicalMeta) -> torch.Tensor:
        return self._scratch[:meta.nbytes].view(meta.dtype).view(meta.shape)

    def _aliases_scratch(self, t: torch.Tensor) -> bool:
        return t.untyped_storage().data_ptr() == self._scratch.untyped_storage().data_ptr()

    def _reads_scratch(self, tree) -> bool:
        return any(isinstance(t, torch.Tensor) and self._aliases_scratch(t)
                   for t in tree_leaves(tree))

    def _op_of(self, kind: str, dst: torch.Tensor, src: torch.Tensor | None,
               meta: CanonicalMeta) -> _Op:
        key = self._key_of(dst)
        if key is None:
            errors.raise_error(errors.LoaderCondition,
                               f"tensor {meta.name}: copy_ into a tensor that is not a "
                               "registered parameter or buffer")
        if dst.dtype != self._storages[key].flat.dtype:
            errors.raise_error(errors.LoaderCondition,
                               f"tensor {meta.name}: copy_ into {self._storages[key].names[0]} "
                               f"reinterpreted as {dst.dtype}")
        if kind == "fill":
            return _Op("fill", key, _geom(dst))
        if self._key_of(src) is not None:
            errors.raise_error(errors.LoaderCondition,
                               f"tensor {meta.name}: copy_ source reads rank storage "
                               f"({self._name_of(src)})")
        direct = self._aliases_scratch(src) and src.dtype == meta.dtype and \
            dst.dtype == meta.dtype and tuple(src.shape) == tuple(dst.shape)
        sg = _geom(src) if direct else None
        return _Op("copy", key, _geom(dst), direct=direct, src=sg,
                   mapped=direct and _invertible(sg))

    def _dst_view(self, op: _Op, base: torch.Tensor | None = None) -> torch.Tensor:
        flat = self._storages[op.key].flat if base is None else base
        off, shape, stride = op.dst
        return flat.as_strided(shape, stride, off)

    # -- prewarm -------------------------------------------------------------
    def _prewarm(self) -> None:
        """Dry-run the loader over every canonical tensor on a zero scratch."""
        before = {k: s.flat.clone() for k, s in self._storages.items()}
        counts = {k: torch.zeros(s.flat.numel(), dtype=torch.int32, device=self.device)
                  for k, s in self._storages.items()}
        for meta in self.metas.values():
            plan = _TensorPlan(meta)
            plan.ops, reported = self._dry_run(meta)
            if bool(self._scratch[:meta.nbytes].any()):
                errors.raise_error(errors.UnsupportedLoader,
                                   f"tensor {meta.name}: the loader wrote its input")
            plan.reported = None if reported is None else frozenset(reported)
            self._check_report(plan, plan.reported, {o.key for o in plan.ops if o.kind == "copy"},
                               errors.UnsupportedLoader)
            self._probe_nonzero(plan)
            plan.direct = all(o.direct for o in plan.ops if o.kind == "copy")
            if not plan.direct and not plan.skipped:
                plan.two_fill_error = self._check_two_fill(plan)
            for o in plan.ops:
                self._dst_view(o, counts[o.key]).add_(1)
            self._plans[meta.name] = plan
        self._current = ""
        self._check_storages("prewarm")
        for k, s in self._storages.items():
            if not torch.equal(word_view(s.flat), word_view(before[k])):
                errors.raise_error(errors.UnsupportedLoader,
                                   f"prewarm: {s.names[0]} changed during the dry run (a write "
                                   "that is not an intercepted copy_)")
        # XOR (and add) need destinations written exactly once over all tensors.
        for plan in self._plans.values():
            plan.disjoint = all(bool((self._dst_view(o, counts[o.key]) == 1).all())
                                for o in plan.ops)
            plan.xor_allowed = plan.direct and not plan.skipped and plan.disjoint
            self._finish_plan(plan)

    def _dry_run(self, meta: CanonicalMeta):
        """The loader over the scratch as it is, every write intercepted and
        recorded, none made: (the writes in order, the loader's report)."""
        ops: list = []

        def on_copy(dst, src):
            ops.append(self._op_of("copy", dst, src, meta))
            return dst

        def on_fill(dst):
            ops.append(self._op_of("fill", dst, None, meta))
            return dst

        self._current = meta.name
        with torch.no_grad(), _Hook(self, on_copy, on_fill):
            reported = self.load_weights([(meta.name, self._scratch_for(meta))])
        return ops, reported

    def _probe_nonzero(self, plan: _TensorPlan) -> None:
        """The dry run again on a scratch of non-zero words (every byte 1: a
        tiny positive finite value in every float format): it must make the
        same writes and the same report. A loader whose writes depend on the
        values (one that skips zero inputs looks "skipped" on the zero
        scratch, so its items would be dropped without a word) is refused
        here instead of leaving bytes unwritten at apply."""
        meta = plan.meta
        raw = self._scratch[:meta.nbytes]
        raw.fill_(1)
        try:
            try:
                ops, reported = self._dry_run(meta)
            except errors.Error:
                raise
            except Exception as e:
                errors.raise_error(errors.UnsupportedLoader,
                                   f"tensor {meta.name}: the loader raised {type(e).__name__} "
                                   f"on non-zero words: {e}")
            if not bool((raw == 1).all()):
                errors.raise_error(errors.UnsupportedLoader,
                                   f"tensor {meta.name}: the loader wrote its input")
        finally:
            raw.zero_()
        reported = None if reported is None else frozenset(reported)
        if len(ops) != len(plan.ops) or reported != plan.reported or \
                not all(a.same_path(b) for a, b in zip(plan.ops, ops)):
            errors.raise_error(errors.UnsupportedLoader,
                               f"tensor {meta.name}: the loader's writes depend on the values "
                               f"it loads ({len(plan.ops)} writes of zeros, {len(ops)} of "
                               "non-zero words, or other destinations or reports): a delta "
                               "cannot be placed through it")

    def _captures(self, plan: _TensorPlan, words: torch.Tensor) -> list:
        """The loader's copies over a scratch holding `words` (the tensor's
        flat stored words), as the destinations' words, none written."""
        out: list = []

        def on_copy(dst, src, op):
            out.append(word_view(src.to(dst.dtype) if src.dtype != dst.dtype else src.clone()))
            return dst

        plan.words.copy_(words)
        try:
            self._run(plan, on_copy, lambda d: d)
        finally:
            plan.words.zero_()
        return out

    def _check_two_fill(self, plan: _TensorPlan) -> str:
        """The two-fill rule tried on one random overwrite of this tensor
        (random old values, a random quarter of them overwritten), every copy
        captured, nothing written: what it would leave must equal the
        loader's output for the new tensor. A transform that is not
        elementwise (a normalisation, a reduction) or maps the two fills to
        the same bits would write wrong bytes without an error; such a
        tensor's overwrites are refused at apply instead (its dense loads
        are unaffected). The empty string where the rule held."""
        meta = plan.meta
        plan.words = word_view(self._scratch_for(meta)).view(-1)
        g = torch.Generator().manual_seed(0x2F11 + meta.numel)
        if meta.dtype.is_floating_point:
            old = (torch.randn(meta.numel, generator=g) * 0.05).to(meta.dtype)
            new = (torch.randn(meta.numel, generator=g) * 0.05).to(meta.dtype)
        else:
            info = torch.iinfo(meta.dtype)
            lo, hi = max(info.min, -1000), min(info.max, 1000)
            old = torch.randint(lo, hi, (meta.numel,), generator=g).to(meta.dtype)
            new = torch.randint(lo, hi, (meta.numel,), generator=g).to(meta.dtype)
        old, new = word_view(old).to(self.device), word_view(new).to(self.device)
        active = (torch.rand(meta.numel, generator=g) < 0.25).to(self.device)
        after = torch.where(active, new, old)
        idx = active.nonzero().view(-1)
        sw = plan.words
        fills = []
        for fill in _two_fills(sw, meta):
            w = torch.full_like(sw, fill)
            w[idx] = new[idx]
            fills.append(self._captures(plan, w))
        before, expect = self._captures(plan, old), self._captures(plan, after)
        for k, (a, b, o, e) in enumerate(zip(fills[0], fills[1], before, expect)):
            if not torch.equal(torch.where(a == b, a, o), e):
                return (f"tensor {meta.name}: the loader's transform of it is not elementwise "
                        f"with distinct images of the two fills (copy {k} of "
                        f"{len(expect)} would be left wrong by the two-fill rule): its "
                        "overwrites cannot be placed through the loader; refit it densely")
        return ""

    def _finish_plan(self, plan: _TensorPlan) -> None:
        """What every apply of the tensor reuses: its word width, a flat word
        view of the scratch and, for each mapped copy, the C++ mapping."""
        meta = plan.meta
        plan.width = meta.dtype.itemsize
        plan.words = word_view(self._scratch_for(meta)).view(-1)
        copies = [o for o in plan.ops if o.kind == "copy"]
        plan.all_mapped = all(o.mapped for o in copies)
        for o in copies:
            if o.mapped and self._native:
                (so, shape, sst), (do, _, dst) = o.src, o.dst
                o.native = _dcr.MappedCopy(so, list(shape), list(sst), do, list(dst))

    def _check_report(self, plan: _TensorPlan, reported, written: set, cls) -> None:
        if reported is None:
            return
        keys = set()
        for n in reported:
            if n not in self._name_key:
                errors.raise_error(cls, f"tensor {plan.meta.name}: the loader reports {n} "
                                        "loaded, which is no parameter or buffer of the model")
            keys.add(self._name_key[n])
        for k in keys - written:
            errors.raise_error(cls, f"tensor {plan.meta.name}: the loader reports "
                                    f"{self._storages[k].names[0]} loaded but no copy_ into it "
                                    "was intercepted")
        for k in written - keys:
            errors.raise_error(cls, f"tensor {plan.meta.name}: the loader wrote "
                                    f"{self._storages[k].names[0]} without reporting it")

    # -- what prewarm found ----------------------------------------------------
    def xor_allowed(self, name: str) -> bool:
        return self._plan(name).xor_allowed

    def skipped(self, name: str) -> bool:
        return self._plan(name).skipped

    def needs(self, name: str) -> bool:
        return not self._plan(name).skipped

    def _plan(self, name: str) -> _TensorPlan:
        try:
            return self._plans[name]
        except KeyError:
            errors.raise_error(errors.NotFound, f"tensor {name}: not a canonical tensor")

    # -- staging ---------------------------------------------------------------
    def begin_attempt(self, attempt: int) -> None:
        """Start attempt `attempt`: drop what older attempts staged."""
        if attempt < self._attempt:
            errors.raise_error(errors.StaleAttempt,
                               f"attempt {attempt} is older than attempt {self._attempt}")
        if attempt != self._attempt:
            self._attempt = attempt
            self._staged = []
            self._failed = False
            # Older attempts' payloads are refused as stale from now on.
            self._seen = {k for k in self._seen if k[0] >= attempt}

    def stage(self, payload) -> dict:
        """Validate (every byte, by the C++ decoder) and keep a payload; returns its id.

        Raises `dcr.StaleAttempt` for an older attempt and `dcr.Duplicate`
        for an (attempt, owner, sequence) seen before; a newer attempt
        starts that attempt.
        """
        pid = _dcr.read_payload_id(payload, job_key=self._job_key)
        if pid["attempt"] < self._attempt:
            errors.raise_error(errors.StaleAttempt,
                               f"payload of attempt {pid['attempt']} after attempt {self._attempt}")
        key = (pid["attempt"], pid["owner"], pid["sequence"])
        if key in self._seen:
            errors.raise_error(errors.Duplicate,
                               f"payload attempt {key[0]} owner {key[1]} sequence {key[2]}")
        _, items = _dcr.decode_payload(payload, job_key=self._job_key)
        for it in items:
            t = it["tensor"]
            meta = self._plan(t["name"]).meta
            if tuple(t["shape"]) != tuple(meta.shape) or dtype_of(t["dtype"]) != meta.dtype:
                errors.raise_error(errors.ShapeMismatch,
                                   f"tensor {t['name']}: payload says {t['dtype']} "
                                   f"{tuple(t['shape'])}, canonical {meta.dtype} {meta.shape}")
        self.begin_attempt(pid["attempt"])
        self._seen.add(key)
        self._staged.append((pid, items))
        return pid

    def apply(self) -> dict:
        """Apply every staged payload, items in staging order; returns counts and time.

        A failure raises and fails the attempt: later `apply` calls of the
        same attempt raise `dcr.Aborted` until a newer attempt begins.
        """
        if self._failed:
            errors.raise_error(errors.Aborted, f"attempt {self._attempt} failed before")
        t0 = time.perf_counter()
        stats = {"payloads": 0, "items": 0, "entries": 0}
        staged, self._staged = self._staged, []
        try:
            for _, items in staged:
                for it in items:
                    self.apply_item(it["tensor"]["name"], it["encoding"], it["indices"],
                                    it["values"])
                    stats["items"] += 1
                    stats["entries"] += len(it["indices"])
                stats["payloads"] += 1
                self.applied_payloads += 1
            self._check_storages("apply")
        except BaseException:
            self._failed = True
            raise
        stats["seconds"] = time.perf_counter() - t0
        return stats

    # -- apply ---------------------------------------------------------------
    def apply_item(self, name: str, encoding: str, indices, values) -> None:
        """Apply one item: `indices` (uint64 flat canonical indices, strictly
        increasing), `values` (little-endian stored words as uint8)."""
        plan = self._plan(name)
        meta = plan.meta
        width = plan.width
        idx = np.ascontiguousarray(np.asarray(indices)).view(np.uint64)
        vals = np.ascontiguousarray(np.asarray(values)).view(np.uint8)
        if vals.size != idx.size * width:
            errors.raise_error(errors.ShapeMismatch,
                               f"tensor {name}: {vals.size} value bytes for {idx.size} "
                               f"entries of width {width}")
        if idx.size > 1 and not bool((idx[1:] > idx[:-1]).all()):
            # Repeated indices would XOR (or add) twice; the mask paths
            # assume one entry per element.
            errors.raise_error(errors.NotIncreasing,
                               f"tensor {name}: item indices are not strictly increasing")
        if idx.size and int(idx[-1]) >= meta.numel:
            errors.raise_error(errors.IndexOutOfRange, f"tensor {name}: index out of range")
        if encoding not in ("xor", "add", "overwrite"):
            errors.raise_error(errors.BadEncoding, f"tensor {name}: encoding {encoding!r}")
        if plan.skipped:
            return  # this rank holds none of it (the loader skipped it at prewarm)
        try:
            e = _Entries(idx, vals, width, self.device)
            if encoding in ("xor", "add"):
                if not plan.xor_allowed:
                    errors.raise_error(errors.UnsupportedLoader,
                                       f"tensor {name}: {encoding} item for a tensor whose "
                                       "loader path is not XOR-allowed (send overwrites)")
                self._apply_relative(plan, encoding, e)
            elif plan.direct:
                self._apply_overwrite_direct(plan, e)
            else:
                if plan.two_fill_error:
                    errors.raise_error(errors.UnsupportedLoader, plan.two_fill_error)
                self._apply_overwrite_two_fill(plan, e.idx, e.words)
        except errors.Error:
            raise
        except Exception as ex:  # torch's own errors (device, dtype, memory) typed too
            errors.raise_error(errors.LoaderCondition,
                               f"tensor {name}: apply failed: {type(ex).__name__}: {ex}")

    def _run(self, plan: _TensorPlan, on_copy, on_fill=None):
        """Run the loader over the scratch; check the path and the report."""
        meta = plan.meta
        self._current = meta.name
        seen: list = []
        written: set = set()

        def copy_hook(dst, src):
            op = self._op_of("copy", dst, src, meta)
            k = len(seen)
            if k >= len(plan.ops) or not plan.ops[k].same_path(op):
                errors.raise_error(errors.LoaderCondition,
                                   f"tensor {meta.name}: write {k} of the loader left the path "
                                   f"planned at prewarm (into {self._name_of(dst)})")
            seen.append(op)
            written.add(op.key)
            return on_copy(dst, src, plan.ops[k])

        def fill_hook(dst):
            op = self._op_of("fill", dst, None, meta)
            k = len(seen)
            if k >= len(plan.ops) or not plan.ops[k].same_path(op):
                errors.raise_error(errors.LoaderCondition,
                                   f"tensor {meta.name}: write {k} of the loader left the path "
                                   f"planned at prewarm (a fill of {self._name_of(dst)})")
            seen.append(op)
            return dst.fill_(0) if on_fill is None else on_fill(dst)

        scratch = self._scratch_for(meta)  # made outside the hook: its views are ours
        try:
            with torch.no_grad(), _Hook(self, copy_hook, fill_hook):
                reported = self.load_weights([(meta.name, scratch)])
        except errors.Error:
            raise
        except Exception as e:  # a loader that throws fails the apply
            errors.raise_error(errors.LoaderCondition,
                               f"tensor {meta.name}: the loader raised {type(e).__name__}: {e}")
        if len(seen) != len(plan.ops):
            errors.raise_error(errors.LoaderCondition,
                               f"tensor {meta.name}: the loader made {len(seen)} writes, "
                               f"{len(plan.ops)} planned")
        if reported is None and plan.reported is not None:
            # Taken as "no report" this would turn the check below off.
            errors.raise_error(errors.LoaderCondition,
                               f"tensor {meta.name}: the loader returned no report of what it "
                               "loaded (it reported at prewarm)")
        self._check_report(plan, None if reported is None else frozenset(reported), written,
                           errors.LoaderCondition)
        self._current = ""

    def _apply_relative(self, plan: _TensorPlan, encoding: str, e: "_Entries") -> None:
        """XOR masks / add differences: scattered on a zero scratch, so every
        inactive position carries the identity (0)."""
        # Destinations proven disjoint at prewarm need no marks: the entries
        # move in C++ (scatter into the scratch, mapped XOR/add into storage).
        native = self._native and plan.disjoint
        ensure = self._stage_scratch(plan, e, native)
        marks: list = []
        op_code = _XOR if encoding == "xor" else _ADD

        def on_copy(dst, src, op):
            if not op.direct or not self._aliases_scratch(src):
                errors.raise_error(errors.LoaderCondition,
                                   f"tensor {plan.meta.name}: on the {encoding} path the copy_ "
                                   "source must be a view of the scratch")
            if torch._debug_has_internal_overlap(dst) == 1:
                errors.raise_error(errors.LoaderCondition,
                                   f"tensor {plan.meta.name}: overlapping {encoding} writes "
                                   f"within one copy_ into {self._name_of(dst)}")
            if native and self._apply_mapped_native(plan, op, e, op_code):
                return dst
            ensure()
            if op.mapped:
                pos, at = _map_entries(e.idx, op.src, op.dst)
                if not plan.disjoint:
                    # Prewarm proved the planned writes disjoint, and every
                    # write is checked to be the planned one; otherwise mark.
                    mark = self._marks_of(op.key)
                    if bool(mark.index_select(0, at).any()):
                        errors.raise_error(errors.LoaderCondition,
                                           f"tensor {plan.meta.name}: overlapping {encoding} "
                                           f"writes into {self._name_of(dst)}")
                    mark.index_fill_(0, at, 1)
                    marks.append((mark, at))
                flat = word_view(self._storages[op.key].flat)
                w, old = e.words[pos], flat.index_select(0, at)
                flat.index_copy_(0, at, old ^ w if encoding == "xor" else _add_unzigzag(old, w))
                return dst
            mark = self._mark_view(op)
            if bool(mark.any()):
                errors.raise_error(errors.LoaderCondition,
                                   f"tensor {plan.meta.name}: overlapping {encoding} writes "
                                   f"into {self._name_of(dst)}")
            mark.fill_(1)
            marks.append((mark, None))
            d, s = word_view(dst), word_view(src)
            if encoding == "xor":
                d.bitwise_xor_(s)
            else:
                d.copy_(_add_unzigzag(d, s))
            return dst

        try:
            self._run(plan, on_copy)
        finally:
            for m, at in marks:
                if at is None:
                    m.zero_()
                else:
                    m.index_fill_(0, at, 0)
            self._unstage_scratch(plan, e, native)

    def _apply_mapped_native(self, plan: _TensorPlan, op: _Op, e: "_Entries",
                             op_code: int) -> bool:
        """A mapped copy on the C++ path: the item's indices through the
        source view to destination offsets, O(entries), the scratch read for
        nothing. False where the copy is not mapped (the caller lands it)."""
        if not op.mapped or op.native is None:
            return False
        flat = self._storages[op.key].flat
        op.native.apply(flat.data_ptr(), flat.numel(), plan.width, e.np_idx, e.np_vals,
                        op_code)
        return True

    def _stage_scratch(self, plan: _TensorPlan, e: "_Entries", native: bool) -> Callable:
        """The item's words into the (zero) scratch at its indices, on the C++
        path when the loader first reads the scratch: a loader that only takes
        views of it and copies them (mapped copies land from the entries)
        never needs them, and any other aten op on it, or a copy the torch
        path lands, scatters them first (returns that `ensure`)."""
        e.scattered = False

        def ensure():
            if e.scattered:
                return
            if native:
                _dcr.scatter_words(plan.words.data_ptr(), plan.meta.numel, plan.width,
                                   e.np_idx, e.np_vals)
            else:
                plan.words.index_copy_(0, e.idx, e.words)
            e.scattered = True
            self._pending = None

        if native:
            self._pending = ensure
        else:
            ensure()
        return ensure

    def _unstage_scratch(self, plan: _TensorPlan, e: "_Entries", native: bool) -> None:
        """The scratch back to zero after an item."""
        self._pending = None
        if not e.scattered:
            return
        if native:
            _dcr.zero_words(plan.words.data_ptr(), plan.meta.numel, plan.width, e.np_idx)
        else:
            plan.words.index_fill_(0, e.idx, 0)
        e.scattered = False

    def _marks_of(self, key: int) -> torch.Tensor:
        """Per-storage marks of the elements the current item's XOR/add copies wrote."""
        if not hasattr(self, "_marks"):
            self._marks = {}
        m = self._marks.get(key)
        if m is None:
            m = torch.zeros(self._storages[key].flat.numel(), dtype=torch.uint8,
                            device=self.device)
            self._marks[key] = m
        return m

    def _mark_view(self, op: _Op) -> torch.Tensor:
        return self._dst_view(op, self._marks_of(op.key))

    def _apply_overwrite_direct(self, plan: _TensorPlan, e: "_Entries") -> None:
        """Overwrites where every copy is a view of the scratch: the active
        positions are the same view of a mask of the item's indices."""
        meta = plan.meta
        native = self._native
        ensure = self._stage_scratch(plan, e, native)
        active = None
        if not plan.all_mapped:
            active = torch.zeros(meta.numel, dtype=torch.bool, device=self.device)
            active.index_fill_(0, e.idx, True)

        def on_copy(dst, src, op):
            if native and self._apply_mapped_native(plan, op, e, _OVERWRITE):
                return dst
            ensure()
            if op.mapped:
                pos, at = _map_entries(e.idx, op.src, op.dst)
                word_view(self._storages[op.key].flat).index_copy_(0, at, e.words[pos])
                return dst
            off, shape, stride = op.src
            m = active.as_strided(shape, stride, off)
            d = word_view(dst)
            d.copy_(torch.where(m, word_view(src), d))
            return dst

        try:
            self._run(plan, on_copy)
        finally:
            self._unstage_scratch(plan, e, native)

    def _apply_overwrite_two_fill(self, plan: _TensorPlan, idx, words) -> None:
        """Overwrites through a transform (a cast, a scale): the loader runs on a
        zero fill and on a NaN-placeholder fill; a position is active where its
        transformed bits do not depend on the fill (exact for elementwise
        deterministic transforms mapping 0 and NaN to different bits)."""
        meta = plan.meta
        scratch = self._scratch_for(meta)
        sw = word_view(scratch).view(-1)
        captured: list = [[], []]
        dsts: list = []
        try:
            for k, fill in enumerate(_two_fills(sw, meta)):
                sw.fill_(fill)
                sw[idx] = words

                def on_copy(dst, src, op, k=k):
                    v = src.to(dst.dtype) if src.dtype != dst.dtype else src.clone()
                    captured[k].append(word_view(v))
                    if k == 1:
                        dsts.append(dst)
                    return dst

                # Fills of padding run on the second pass only.
                self._run(plan, on_copy, (lambda d: d) if k == 0 else None)
            for a, b, dst in zip(captured[0], captured[1], dsts):
                d = word_view(dst)
                d.copy_(torch.where(a == b, a, d))
        finally:
            sw.zero_()

    # -- dense ---------------------------------------------------------------
    def dense_refit(self, tensors) -> object:
        """The same `load_weights` over full canonical tensors, without the hook."""
        items = tensors.items() if isinstance(tensors, Mapping) else tensors
        with torch.no_grad():
            return self.load_weights(list(items))


def _two_fills(sw: torch.Tensor, meta: CanonicalMeta) -> tuple:
    """The two-fill rule's fills of a scratch's words: zero and the
    placeholder. 1-byte codes: 0x00 and 0x7F, as the C++ receiver (whether a
    code "is NaN" depends on the format a transform writes; the rule never
    asks)."""
    second = 0x7F if sw.element_size() == 1 else PLACEHOLDER[meta.dtype]
    return 0, _signed(second, sw.element_size())


def _signed(word: int, width: int) -> int:
    bits = 8 * width
    return word - (1 << bits) if width > 1 and word >= 1 << (bits - 1) else word


def _add_unzigzag(d: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """`d + unzigzag(s)` modulo 2^w on stored words (codec::add_delta)."""
    w = d.element_size()
    if w == 8:
        u = s
        mag = torch.bitwise_right_shift(u, 1) & 0x7FFFFFFFFFFFFFFF
        delta = mag ^ (-(u & 1))
        return d + delta  # int64 wraps
    wide = torch.int64 if w == 4 else torch.int32
    bits = 8 * w
    mask = (1 << bits) - 1
    u = s.to(wide) & mask
    delta = (u >> 1) ^ (-(u & 1))
    r = (d.to(wide) + delta) & mask
    if w > 1:  # back to the signed word: subtract 2^w where the top bit is set
        r = r - ((r >> (bits - 1)) << bits)
    return r.to(d.dtype)


class RefitEngine:
    """vLLM's weight-transfer engine shape over a `Receiver`:
    `init` (prewarm), `start_update` (an attempt), `update` (stage payloads),
    `finish` (apply; returns counts and time)."""

    def __init__(self, model: torch.nn.Module, load_weights: Callable | None = None):
        self.model, self._load = model, load_weights
        self.receiver: Receiver | None = None

    def init(self, canonical) -> None:
        self.receiver = Receiver(self.model, canonical, self._load)

    def start_update(self, attempt: int) -> None:
        self._need().begin_attempt(attempt)

    def update(self, payloads: Iterable) -> int:
        rx = self._need()
        n = 0
        for p in payloads:
            try:
                rx.stage(p)
                n += 1
            except errors.Duplicate:
                pass  # suppressed: applying it twice would undo or double it
        return n

    def finish(self) -> dict:
        return self._need().apply()

    def _need(self) -> Receiver:
        if self.receiver is None:
            errors.raise_error(errors.InvalidArgument, "RefitEngine: init first")
        return self.receiver


def state_bytes(model: torch.nn.Module) -> dict[str, bytes]:
    """Every parameter and buffer of `model` as raw bytes (for byte comparisons)."""
    out = {}
    for n, t in list(model.named_parameters(remove_duplicate=False)) + \
            list(model.named_buffers(remove_duplicate=False)):
        out[n] = t.detach().contiguous().view(-1).view(torch.uint8).cpu().numpy().tobytes()
    return out


# ---------------------------------------------------------------------------
# Training side


def _config_text(config) -> str:
    if isinstance(config, str) and config.lstrip().startswith("{"):
        return config
    if isinstance(config, Mapping):
        return json.dumps(dict(config))
    if hasattr(config, "to_dict"):
        d = config.to_dict()
        # transformers 5 writes Qwen3-MoE's expert count as num_local_experts;
        # published checkpoints (and dcr-plan) spell it num_experts.
        if d.get("model_type") == "qwen3_moe" and "num_experts" not in d \
                and "num_local_experts" in d:
            d["num_experts"] = d["num_local_experts"]
        for k in ("dtype", "torch_dtype"):
            if not isinstance(d.get(k), (str, type(None))):
                d[k] = str(d[k]).replace("torch.", "")
        return json.dumps(d, default=str)
    with open(config) as f:
        return f.read()


class TrainerPlan:
    """The source plan of a Megatron-style trainer: an HF `config.json` (a
    path, its text, a dict or a transformers config) and the trainer layout."""

    def __init__(self, config, *, tp=1, pp=1, ep=1, etp=1, dp=1, vocab_block=0):
        self._init(_dcr.Plan(_config_text(config), tp, pp, ep, etp, dp, vocab_block))

    @classmethod
    def row_split_checkpoint(cls, path: str, *, tp: int = 2, dp: int = 1) -> "TrainerPlan":
        """The plan the C++ cluster programs use for `--checkpoints PATH ...`:
        the safetensors file's tensors in its order, each whose first
        dimension divides by `tp` split by rows over the TP ranks, the rest
        replicated; `tp * dp` ranks (rank = dp_index * tp + tp_index)."""
        p = cls.__new__(cls)
        p._init(_dcr.Plan.row_split_checkpoint(str(path), tp, dp))
        return p

    def _init(self, core) -> None:
        self.plan = core
        self.canonical = canonical_metas(self.plan.canonical())
        self._tensor_id = {m.name: i for i, m in enumerate(self.canonical)}
        self.shards = self.plan.shards()
        self.world = self.plan.world

    def rank_shards(self, rank: int) -> list[dict]:
        """The shards rank `rank` holds (key, param, shape, dtype, owner, ...)."""
        return [self.shards[s] for s in self.plan.rank_shards(rank)]

    def empty_shards(self, rank: int) -> dict[str, torch.Tensor]:
        return {s["key"]: torch.zeros(s["shape"], dtype=dtype_of(s["dtype"]))
                for s in self.rank_shards(rank)}

    def project(self, rank: int, canonical: Mapping[str, torch.Tensor],
                out: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """Rank `rank`'s shards from canonical tensors (the inverse of the
        plan's maps), written into `out` (allocated when None)."""
        if out is None:
            out = self.empty_shards(rank)
        spans = {}
        for m in self.canonical:
            if m.name not in canonical:
                errors.raise_error(errors.NotFound, f"tensor {m.name}: not given")
            spans[self._tensor_id[m.name]] = span_of(canonical[m.name], m.name, dtype=m.dtype,
                                                     shape=m.shape)
        for s in self.rank_shards(rank):
            t = out[s["key"]]
            self.plan.project(s["id"], spans, span_of(t, s["key"], dtype=dtype_of(s["dtype"]),
                                                      nbytes=s["nbytes"]))
        return out

    def source_index(self, rank: int) -> dict[str, torch.Tensor]:
        """For every shard rank `rank` holds: the flat position + 1 of each of
        its elements in the canonical tensors laid end to end (int64; 0: an
        element no canonical element feeds, e.g. vocabulary padding).

        Found with the plan's own projection (the inverse of its maps, a byte
        gather), run on canonical tensors whose stored words are their element
        positions, 16 bits (or the word width) at a time: whatever layout the
        plan has (fused QKV groups, merged fc1, row and column splits, padded
        vocabulary, experts, dim-0 row ranges), this is where each element
        comes from. A trainer gathers its canonical tensors through it."""
        widths = {m.dtype.itemsize for m in self.canonical}
        if len(widths) != 1 or next(iter(widths)) not in (2, 4):
            errors.raise_error(errors.BadDtype,
                               "source index: canonical tensors of one 2- or 4-byte dtype only")
        width = next(iter(widths))
        bits = 8 * width
        word = {2: torch.int16, 4: torch.int32}[width]
        total = sum(m.numel for m in self.canonical)
        if total + 1 >= 1 << 40:
            errors.raise_error(errors.InvalidArgument, "source index: model too large")
        positions = torch.arange(1, total + 1, dtype=torch.int64)
        out: dict[str, torch.Tensor] = {}
        for shift in range(0, 40, bits):
            part = (positions >> shift) & ((1 << bits) - 1)
            part = (part - ((part >> (bits - 1)) << bits)).to(word)  # as signed words
            canon, at = {}, 0
            for m in self.canonical:
                canon[m.name] = part[at:at + m.numel].view(m.dtype).view(m.shape)
                at += m.numel
            for k, t in self.project(rank, canon).items():
                w = t.view(word).to(torch.int64).view(-1) & ((1 << bits) - 1)
                out[k] = out.get(k, torch.zeros_like(w)) | (w << shift)
        return out

    @classmethod
    def from_fsdp(cls, module: torch.nn.Module) -> "TrainerPlan":
        """The plan of an FSDP2 module (`fully_shard`), derived from its
        DTensor parameters (`fsdp2_plan`)."""
        return fsdp2_plan(module)

    @classmethod
    def _from_core(cls, core) -> "TrainerPlan":
        p = cls.__new__(cls)
        p._init(core)
        return p


def _dim0_ranges(name: str, p) -> list[tuple[int, int, int]]:
    """(global rank, begin, end) of every rank of a DTensor's mesh: the dim-0
    rows it holds. Each mesh dimension's placement, in mesh order, is
    `Replicate` (the range stays) or `Shard(0)` (the range is chunked as
    `torch.chunk` does, which is how DTensor and FSDP2 split: ceil(n/k) rows
    per chunk, the last chunks shorter or empty)."""
    from torch.distributed.tensor import Replicate, Shard

    mesh = p.device_mesh
    ranks = mesh.mesh
    for d, pl in enumerate(p.placements):
        # type() is: _StridedShard (FSDP2 over TP) is a Shard whose rows interleave.
        if not (type(pl) is Replicate or (type(pl) is Shard and pl.dim == 0)):
            errors.raise_error(errors.InvalidArgument,
                               f"tensor {name}: placement {pl!r} on mesh dimension {d} "
                               "(only Shard(0) and Replicate are dim-0 row ranges)")
    rows = int(p.shape[0]) if p.dim() > 0 else 1
    out = []
    for coord in torch.cartesian_prod(*[torch.arange(k) for k in ranks.shape]).view(
            -1, ranks.dim()).tolist():
        b, e = 0, rows
        for d, pl in enumerate(p.placements):
            if type(pl) is Shard:
                k = ranks.shape[d]
                chunk = -(-(e - b) // k)
                i = coord[d]
                b, e = min(b + i * chunk, e), min(b + (i + 1) * chunk, e)
        out.append((int(ranks[tuple(coord)]), b, e))
    return out


def fsdp2_plan(module: torch.nn.Module) -> TrainerPlan:
    """The source plan of a module whose parameters are DTensors placed
    `Shard(0)` (and `Replicate`, HSDP) by FSDP2's `fully_shard`: one shard per
    distinct dim-0 row range of each parameter, held by the ranks whose local
    tensor it is (`dcr::dim0_shard_plan`). Canonical tensors are the module's
    parameters, named as `named_parameters()` names them (a tied parameter
    once, under its first name): for a `transformers` model, its checkpoint
    names. Every rank derives the same plan from the global metadata alone
    (shapes, dtypes, meshes, placements); each rank's own range is checked
    against its `to_local()` shape and DTensor's own offset computation.

    Raises `dcr.InvalidArgument` naming the parameter for one that is not a
    DTensor, a placement other than `Shard(0)` or `Replicate`, a mesh whose
    ranks are not the default group's, or a local tensor that disagrees."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    named = list(module.named_parameters())
    for name, p in named:
        if not isinstance(p, DTensor):
            errors.raise_error(errors.InvalidArgument,
                               f"tensor {name}: not a DTensor (is the module fully_shard-ed?)")
    world = dist.get_world_size()
    me = dist.get_rank()
    tensors, rows = [], []
    for name, p in named:
        ranks = sorted(int(r) for r in p.device_mesh.mesh.view(-1).tolist())
        if ranks != list(range(world)):
            errors.raise_error(errors.InvalidArgument,
                               f"tensor {name}: mesh ranks {ranks} are not the {world} ranks "
                               "of the default group")
        ranges = _dim0_ranges(name, p)
        local = p.to_local()
        b, e = next((b, e) for r, b, e in ranges if r == me)
        want = (e - b,) + tuple(p.shape[1:]) if p.dim() > 0 else ()
        shape, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh,
                                                              p.placements)
        if tuple(local.shape) != want or tuple(shape) != want or \
                (p.dim() > 0 and e > b and int(offset[0]) != b):
            errors.raise_error(errors.InvalidArgument,
                               f"tensor {name}: rank {me} holds {tuple(local.shape)} at offset "
                               f"{tuple(offset)}, the chunking gives rows [{b}, {e})")
        dt = str(p.dtype).replace("torch.", "")
        tensors.append((name, [int(x) for x in p.shape], dt))
        rows.append(ranges)
    return TrainerPlan._from_core(_dcr.Plan.dim0_shards(tensors, rows, world))


class Owner:
    """One training rank's owner: its baseline (the committed version of the
    shards it owns), the candidate, the payload build and the commit.

    `shards`: `{shard key: tensor}` of what this rank holds (views of its
    parameters); the owned ones are read. The baseline copies them; a
    candidate's tensors are held (and must not change) until `commit` or the
    next `set_candidate`.
    """

    def __init__(self, plan: TrainerPlan, rank: int, committed: Mapping[str, torch.Tensor], *,
                 job_key=None):
        from .cluster import job_secret
        self.plan, self.rank = plan, rank
        self._core = _dcr.Owner(plan.plan, rank, self._spans(committed), committed,
                                job_key=job_secret(job_key))

    def _spans(self, shards: Mapping[str, torch.Tensor]) -> dict:
        spans = {}
        for s in self.plan.rank_shards(self.rank):
            if s["key"] not in shards:
                continue
            spans[s["id"]] = span_of(shards[s["key"]], s["key"], dtype=dtype_of(s["dtype"]),
                                     shape=s["shape"], nbytes=s["nbytes"])
        return spans

    def set_candidate(self, shards: Mapping[str, torch.Tensor]) -> None:
        self._core.set_candidate(self._spans(shards), dict(shards))

    def build(self, attempt: int, version: int, *, overwrite_all: bool = False) -> list:
        """Payloads of attempt `attempt` (bytes-like NumPy uint8 arrays, owned by Python)."""
        return list(self._core.build(attempt, version, overwrite_all))

    @property
    def changed_words(self) -> int:
        return self._core.changed_words

    def commit(self) -> None:
        self._core.commit()

    @property
    def baseline_digest(self) -> str:
        return self._core.baseline_digest

    @property
    def candidate_digest(self) -> str:
        return self._core.candidate_digest
