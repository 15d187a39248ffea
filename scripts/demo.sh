#!/usr/bin/env bash
# Sets up and builds build/, then runs the main demo on the embedded defaults
# (no servers): a synthetic model, trainer owners, vLLM-style receivers, delta
# refits over a filesystem object store with joint commits. Extra arguments go
# to the demo (e.g. --size small, --steps 5, --json).
set -euo pipefail
# Only the demo is built (a few minutes on a fresh machine); scripts/test.sh
# builds everything.
DCR_BUILD_TARGETS=examples/dcr-demo
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$DCR_ROOT"
exec build/examples/dcr-demo "$@"
