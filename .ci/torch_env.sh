#!/usr/bin/env bash
# The newest torch rebatch is tested on: an environment with torch 2.14.1 (beside the main environment's
# pinned 2.13.0) and rebatch installed in it with its test extras, for the torch lane of .ci/lanes.sh
# (the tests whose outcome depends on torch's release: .ci/torch_tests.txt). A constraint file pins torch
# for the later pip call, so nothing can swap it for another build. Usage: bash .ci/torch_env.sh VENV
set -euo pipefail
VENV="${1:?usage: bash .ci/torch_env.sh VENV}"
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
TORCH=2.14.1
CONS="$(mktemp)"; trap 'rm -f "$CONS"' EXIT
echo "torch==$TORCH" > "$CONS"
PIP() { "$VENV/bin/python" -m pip -q --no-cache-dir "$@"; }

python3 -m venv "$VENV"
PIP install "torch==$TORCH"
PIP install -c "$CONS" -e ".[test]"
"$VENV/bin/python" - "$TORCH" <<'PY'
import sys

import torch

assert torch.__version__.split("+")[0] == sys.argv[1], torch.__version__
print(f"torch lane: torch {torch.__version__}")
PY
touch "$VENV/.rebatch-env-ok"  # built to the end
