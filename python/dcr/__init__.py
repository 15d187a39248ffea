"""dcr: bit-exact delta-compressed refit of policy weights, from PyTorch.

`dcr.Plan` and `dcr.decode_payload` come from the C++ core (`dcr._dcr`);
`dcr.torch` holds the PyTorch receiver and the torch-facing owner;
`dcr.ObjectStore`, `dcr.CommitStore` and `dcr.Coordinator` (`dcr/cluster.py`)
are the object store, commit store and coordinator of the C++ cluster
programs, chosen by URL (docs/python.md).
"""

from __future__ import annotations

import os as _os

# In a source checkout the extension is built into <build>/python
# (DCR_BUILD_DIR, default build/); installed, it sits next to this file.
_build = _os.environ.get("DCR_BUILD_DIR")
if _build is None:
    _build = _os.path.join(_os.path.dirname(__file__), "..", "..", "build")
_ext_dir = _os.path.abspath(_os.path.join(_build, "python"))
if _os.path.isdir(_ext_dir) and _ext_dir not in __path__:
    __path__.append(_ext_dir)

from . import errors  # noqa: E402
from .errors import *  # noqa: E402,F401,F403

try:
    from . import _dcr  # noqa: E402
except ImportError as _e:  # pragma: no cover - message for a missing build
    raise ImportError(
        "dcr: the extension dcr._dcr is not built; run scripts/setup-python.sh "
        f"(looked in {_ext_dir} and next to {__file__}): {_e}"
    ) from _e

_dcr._register_errors(dict(errors.BY_CODE))

Plan = _dcr.Plan
from .cluster import (ClusterCoordinator, CommitStore, Coordinator, NodeServer,  # noqa: E402
                      ObjectStore, OwnerServer, RelayNodes, RelayTree, job_secret)
read_payload_id = _dcr.read_payload_id
decode_payload = _dcr.decode_payload

__all__ = ["Plan", "ObjectStore", "CommitStore", "Coordinator", "RelayTree", "RelayNodes",
           "OwnerServer",
           "NodeServer", "ClusterCoordinator", "job_secret", "read_payload_id", "decode_payload",
           "errors", "Error"] + errors.__all__
