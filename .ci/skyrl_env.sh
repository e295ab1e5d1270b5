#!/usr/bin/env bash
# SkyRL's pins: an environment (Python 3.12: SkyRL 0.4.0 requires >=3.12,<3.15) with torch 2.13.0 (the
# torch that skyrl 0.4.0's fsdp and megatron extras pin on Linux), tensordict 0.15.3 (the newest
# release, which requires torch >=2.11) and SkyRL 0.4.0 itself, with rebatch installed in it, so that
# tests can compare rebatch against TokenBasedBatchIterator.reorder_and_combine_batches/_items of
# skyrl.backends.skyrl_train.workers.worker_utils and the TensorBatch types of
# skyrl.backends.skyrl_train.training_batch. Usage: bash .ci/skyrl_env.sh VENV
#
# skyrl is installed --no-deps (its own requirements, peft, hf_transfer, typer..., are not imported
# there), after only what those two modules import at module level, each with its light requirements.
# torch 2.13.0 comes from the registry with its CUDA libraries (about 3 GB) and runs on the CPU: the
# torch wheel alone (--no-deps, plus its pure-Python requirements) does not import without them, since
# torch/_C links libcudnn, libcublas, libnccl, libcudart and the other CUDA libraries at load time. A
# constraint file pins it for every later pip call, so nothing can swap it for another build.
set -euo pipefail
VENV="${1:?usage: bash .ci/skyrl_env.sh VENV}"
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
CONS="$(mktemp)"; trap 'rm -f "$CONS"' EXIT
echo "torch==2.13.0" > "$CONS"
PIP() { "$VENV/bin/python" -m pip -q --no-cache-dir "$@"; }

# python3.12 on PATH (GitHub runners, actions/setup-python), else pyenv's 3.12 (where pyenv's shim
# does not serve it because 3.12 is not among the selected versions).
PY312=""
for cand in python3.12 "$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")"/versions/3.12*/bin/python3.12; do
    if "$cand" -c 'import sys; assert sys.version_info[:2] == (3, 12)' >/dev/null 2>&1; then
        PY312="$cand"; break
    fi
done
[ -n "$PY312" ] || { echo "skyrl_env.sh: no Python 3.12 found (python3.12 on PATH or pyenv's 3.12.x)" >&2; exit 1; }

"$PY312" -m venv "$VENV"
PIP install "torch==2.13.0"  # with its CUDA libraries: no CPU build of it on the registry
PIP install -c "$CONS" "tensordict==0.15.3"
# What skyrl.backends.skyrl_train.workers.worker_utils and .training_batch pull in when imported
# (SkyRL's ranges where it has them):
#   cloudpathlib, pydantic   skyrl/backends/__init__.py -> skyrl/backends/backend.py, skyrl/tinker/types.py
#   jaxtyping                skyrl/backends/skyrl_train/training_batch.py, distributed/strategy.py
#   loguru, transformers     skyrl/backends/skyrl_train/distributed/strategy.py, skyrl/utils/tok.py
#   datasets                 skyrl/train/dataset/__init__.py (PromptDataset; reached through
#                            skyrl.train.dataset.bin_packing and .replay_buffer in worker_utils)
PIP install -c "$CONS" cloudpathlib pydantic jaxtyping loguru "transformers>=5.6.1,<=5.16.1" \
    "datasets>=4.0.0"
# What skyrl.train.utils.utils (initialize_ray, prepare_runtime_environment: how the variable REBATCH
# reaches SkyRL's Ray actors, tests/test_env_activation.py) imports, at SkyRL's skyrl-train pins:
#   ray, hydra-core, omegaconf, skyrl-gym, pybase64   skyrl-train's own requirements
#   aiohttp, orjson   skyrl/backends/skyrl_train/inference_servers (imported by skyrl.train.utils.utils)
PIP install -c "$CONS" "ray==2.57.0" "hydra-core==1.3.4" omegaconf skyrl-gym aiohttp "pybase64>=1.4.2" orjson
PIP install -c "$CONS" -e ".[test]"
# Last, so that no later pip call reports SkyRL's uninstalled requirements.
PIP install --no-deps "skyrl==0.4.0"
"$VENV/bin/python" - <<'PY'
import importlib.metadata

import tensordict, torch
import skyrl.backends.skyrl_train.training_batch  # noqa: F401
import skyrl.train.utils.utils  # noqa: F401  (prepare_runtime_environment)
from skyrl.backends.skyrl_train.workers.worker_utils import TokenBasedBatchIterator

assert torch.__version__.split("+")[0] == "2.13.0", torch.__version__
assert float(torch.zeros(3).sum()) == 0.0
skyrl_version = importlib.metadata.version("skyrl")
assert skyrl_version == "0.4.0", skyrl_version
for name in ("reorder_and_combine_batches", "reorder_and_combine_items"):
    assert callable(getattr(TokenBasedBatchIterator, name)), name
print(f"skyrl: torch {torch.__version__}, tensordict {tensordict.__version__}, skyrl {skyrl_version} importable")
PY
touch "$VENV/.rebatch-env-ok"  # built to the end (.ci/peers.sh builds an environment without it)
