"""pytest setup: the dcr package from python/ (extension from DCR_BUILD_DIR,
default build/) and the example's models from examples/python."""

import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
for p in (os.path.join(ROOT, "python"), os.path.join(ROOT, "examples", "python")):
    if p not in sys.path:
        sys.path.insert(0, p)

import torch  # noqa: E402

torch.set_num_threads(min(2, torch.get_num_threads()))
