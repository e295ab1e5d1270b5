#!/usr/bin/env bash
# Install torch==VERSION (with its CUDA libraries, about 3 GB) into VENV from a local folder of wheels,
# downloading them once per Python version: the pins and AReaL environments share torch 2.9.1, so the
# second one installs it from .cache/wheels without the network (pip's own cache is not written on every
# machine). Usage: bash .ci/torch_wheels.sh VENV VERSION
set -euo pipefail
VENV="${1:?usage: bash .ci/torch_wheels.sh VENV VERSION}"
VERSION="${2:?usage: bash .ci/torch_wheels.sh VENV VERSION}"
cd "$(dirname "$0")/.."
PY="$("$VENV/bin/python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
DIR=".cache/wheels/torch-$VERSION-$PY"
mkdir -p "$DIR"
"$VENV/bin/python" -m pip -q download --dest "$DIR" "torch==$VERSION"   # skips files already there
"$VENV/bin/python" -m pip -q install --no-index --find-links "$DIR" "torch==$VERSION"
