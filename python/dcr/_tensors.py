"""Checks at the Python/C++ boundary and the dtype vocabulary.

Every tensor that crosses into the C++ core goes through `span_of`: a CPU,
contiguous tensor of the expected dtype and size, passed as (address,
nbytes). The caller keeps the tensor alive for as long as the core reads it
(the `Owner` holds its candidate's tensors until the next candidate).
"""

from __future__ import annotations

import torch

from . import errors

DTYPES = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
}

# Signed integer dtype of each stored-word width: bit operations run on these
# views (torch's unsigned 16/32-bit types lack most kernels).
WORD = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

# Canonical quiet NaN of each dtype as its stored word (include/dcr/core/dtype.hpp):
# the overwrite placeholder of the two-fill path.
PLACEHOLDER = {
    torch.bfloat16: 0x7FC0,
    torch.float16: 0x7E00,
    torch.float32: 0x7FC00000,
    torch.float8_e4m3fn: 0x7F,
    torch.float8_e5m2: 0x7E,
}


def dtype_of(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        errors.raise_error(errors.BadDtype, f"unknown dtype {name!r}")


def word_view(t: torch.Tensor) -> torch.Tensor:
    """`t` reinterpreted as integer stored words of the same width (any strides)."""
    return t.view(WORD[t.element_size()])


def span_of(t, name: str, *, dtype: torch.dtype | None = None, shape=None,
            nbytes: int | None = None) -> tuple[int, int]:
    """(address, nbytes) of a checked CPU tensor; raises a typed `dcr.Error` naming `name`."""
    if not isinstance(t, torch.Tensor):
        errors.raise_error(errors.InvalidArgument,
                           f"tensor {name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        errors.raise_error(errors.InvalidArgument,
                           f"tensor {name}: on {t.device}, the C++ core reads CPU memory")
    if dtype is not None and t.dtype != dtype:
        errors.raise_error(errors.BadDtype, f"tensor {name}: dtype {t.dtype}, expected {dtype}")
    if not t.is_contiguous():
        errors.raise_error(errors.InvalidArgument,
                           f"tensor {name}: not contiguous (strides {tuple(t.stride())})")
    if shape is not None and tuple(t.shape) != tuple(shape):
        errors.raise_error(errors.ShapeMismatch,
                           f"tensor {name}: shape {tuple(t.shape)}, expected {tuple(shape)}")
    n = t.numel() * t.element_size()
    if nbytes is not None and n != nbytes:
        errors.raise_error(errors.ShapeMismatch, f"tensor {name}: {n} bytes, expected {nbytes}")
    return (t.data_ptr(), n)
