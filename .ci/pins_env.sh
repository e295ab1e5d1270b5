#!/usr/bin/env bash
# verl's pins: a second environment with torch 2.9.1, tensordict 0.10.0 (verl 0.9.1 allows
# tensordict >=0.8,<=0.10.0, !=0.9.0) and verl 0.9.1 itself (installed --no-deps, plus only what
# verl.workers.engine.utils, verl.utils.seqlen_balancing and verl.utils.py_functional import), with
# rebatch installed in it. Usage: bash .ci/pins_env.sh VENV
#
# torch 2.9.1 comes from the registry with its CUDA libraries (about 3 GB) and runs on the CPU. A
# constraint file pins it for every later pip call, so nothing can swap it for another build.
set -euo pipefail
VENV="${1:?usage: bash .ci/pins_env.sh VENV}"
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
CONS="$(mktemp)"; trap 'rm -f "$CONS"' EXIT
echo "torch==2.9.1" > "$CONS"
PIP() { "$VENV/bin/python" -m pip -q --no-cache-dir "$@"; }

python3 -m venv "$VENV"
PIP install "torch==2.9.1"  # with its CUDA libraries: no CPU build of it on the registry
PIP install -c "$CONS" "tensordict==0.10.0"
# verl 0.9.1 without its dependencies, then the ones its engine utils, partitioner and metric helpers
# import: ray, omegaconf, transformers (verl/__init__ -> protocol, torch_functional, utils.config), and
# codetiming, peft, datasets, pillow (verl.workers.engine/__init__ imports the FSDP engine), and
# uvicorn, fastapi (verl.workers.engine_workers imports them: its TrainingWorker drives the engine lane,
# tests/test_verl_engine.py).
PIP install --no-deps "verl==0.9.1"
PIP install -c "$CONS" ray omegaconf "transformers>=5.5.3,<5.11,!=5.6.0" codetiming peft datasets pillow uvicorn fastapi
PIP install -c "$CONS" -e ".[test]"
"$VENV/bin/python" - <<'PY'
import tensordict, torch
import verl.utils.py_functional, verl.utils.seqlen_balancing, verl.workers.engine.utils  # noqa: F401
import verl.workers.engine_workers  # noqa: F401  (the engine lane's TrainingWorker)

assert torch.__version__.split("+")[0] == "2.9.1", torch.__version__
assert tensordict.__version__.startswith("0.10."), tensordict.__version__
print(f"pins: torch {torch.__version__}, tensordict {tensordict.__version__}, verl 0.9.1 importable")
PY
touch "$VENV/.rebatch-env-ok"  # built to the end (.ci/peers.sh builds an environment without it)
