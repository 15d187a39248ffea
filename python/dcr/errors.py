"""Typed errors: one `dcr.Error` subclass per C++ `dcr::errc` code.

The C++ core raises these through the extension (the message is the C++
`what()`, "<code>: <message>", naming the tensor, item or byte offset); the
Python layer raises the same classes for what it checks itself (a tensor of
the wrong dtype, device, layout or size, a loader that leaves its planned
path).
"""

from __future__ import annotations


class Error(Exception):
    """Base class of every dcr error. `code` is the stable numeric `errc`."""

    code = 0
    name = "error"

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        if code is not None and code != type(self).code:
            self.code = code


# errc values of include/dcr/core/error.hpp (stable: tools print them).
_CODES = {
    1: ("invalid_argument", "InvalidArgument"),
    2: ("bad_magic", "BadMagic"),
    3: ("unsupported_version", "UnsupportedVersion"),
    4: ("truncated", "Truncated"),
    5: ("trailing_bytes", "TrailingBytes"),
    6: ("length_overflow", "LengthOverflow"),
    7: ("digest_mismatch", "DigestMismatch"),
    8: ("compression", "Compression"),
    9: ("bad_dtype", "BadDtype"),
    10: ("bad_encoding", "BadEncoding"),
    11: ("bad_location", "BadLocation"),
    12: ("index_out_of_range", "IndexOutOfRange"),
    13: ("not_increasing", "NotIncreasing"),
    14: ("offset_out_of_range", "OffsetOutOfRange"),
    15: ("shape_mismatch", "ShapeMismatch"),
    16: ("duplicate", "Duplicate"),
    17: ("stale_attempt", "StaleAttempt"),
    18: ("loader_condition", "LoaderCondition"),
    19: ("unsupported_loader", "UnsupportedLoader"),
    20: ("conflict", "Conflict"),
    21: ("io", "IOFailure"),
    22: ("not_found", "NotFound"),
    23: ("nan_value", "NanValue"),
    24: ("parts_disagree", "PartsDisagree"),
    25: ("coverage", "Coverage"),
    26: ("bad_format", "BadFormat"),
    27: ("device", "DeviceError"),
    28: ("verification", "Verification"),
    29: ("aborted", "Aborted"),
    30: ("unavailable", "Unavailable"),
    31: ("foreign_incarnation", "ForeignIncarnation"),
}

BY_CODE: dict[int, type[Error]] = {}
for _code, (_name, _cls) in _CODES.items():
    _t = type(_cls, (Error,), {"code": _code, "name": _name, "__module__": __name__})
    globals()[_cls] = _t
    BY_CODE[_code] = _t


def raise_error(cls: type[Error], message: str) -> None:
    """Raise `cls` with the message formatted as the C++ side formats it."""
    raise cls(f"{cls.name}: {message}")


__all__ = ["Error", "BY_CODE", "raise_error"] + [c for _, c in _CODES.values()]
