#!/usr/bin/env bash
# miles' pins: an environment (Python 3.11: miles-rl 0.0.2 requires >=3.10) with torch 2.9.1 and miles-rl
# 0.0.2 itself (the slime family's trainer, top package ``miles``), with rebatch installed in it, so that
# tests can compare rebatch against miles.backends.training_utils.log_utils.aggregate_forward_results fed
# by miles' own DataIterator and get_data_iterator (miles.backends.training_utils.data).
# Usage: bash .ci/miles_env.sh VENV
#
# miles' own requirements (sglang-router, torchft-nightly, ring_flash_attn, mcp, memray, wandb,
# tensorboard, ...) are far too heavy and GPU-bound, so miles-rl is installed --no-deps, after only what
# those modules import at module level (the wheel also carries its own megatron and sglang trees: nothing
# of them is imported there). torch 2.9.1 (with its CUDA libraries, about 6 GB installed; it runs on the
# CPU) is the pins environment's (.ci/pins_env.sh, built first if missing), hard-linked in
# (.ci/link_dists.py) with ray, psutil and httpx: one copy on disk for both, nothing downloaded for them.
# A constraint file pins torch for every later pip call, so nothing can swap it for another build.
set -euo pipefail
VENV="${1:?usage: bash .ci/miles_env.sh VENV}"
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
CONS="$(mktemp)"; trap 'rm -f "$CONS"' EXIT
echo "torch==2.9.1" > "$CONS"
PIP() { "$VENV/bin/python" -m pip -q --no-cache-dir "$@"; }

PINS="${REBATCH_PINS_VENV:-.venv-pins}"
[ -f "$PINS/.rebatch-env-ok" ] || bash .ci/pins_env.sh "$PINS"
python3 -m venv "$VENV"
# What miles.backends.training_utils.log_utils and .data, and miles.ray.actor_group (the Ray actors'
# environment: RayTrainGroup._allocate_gpus_for_actor, tests/test_miles.py) import at module level:
#   torch (and NumPy)   miles/utils/types.py, miles/backends/training_utils/*.py
#   psutil              miles/backends/training_utils/log_utils.py
#   ray                 miles/utils/data.py, miles/utils/ray_utils.py, miles/ray/actor_group.py, ray_actor.py
#   httpx               miles/utils/misc.py (reached through miles/utils/data.py and miles/ray/ray_actor.py)
for dist in torch psutil ray httpx; do
    "$PINS/bin/python" .ci/link_dists.py "$dist" "$VENV"
done
PIP install -c "$CONS" "tensordict==0.10.0"
PIP install -c "$CONS" -e ".[test]"
# Last, so that no later pip call reports miles' many uninstalled requirements.
PIP install --no-deps "miles-rl==0.0.2"
"$VENV/bin/python" - <<'PY'
import importlib.metadata

import torch
import miles.backends.training_utils.log_utils as log_utils
import miles.ray.actor_group as actor_group
from miles.backends.training_utils.data import DataIterator, get_data_iterator  # noqa: F401

assert torch.__version__.split("+")[0] == "2.9.1", torch.__version__
assert float(torch.zeros(3).sum()) == 0.0
miles_version = importlib.metadata.version("miles-rl")
assert miles_version == "0.0.2", miles_version
assert callable(log_utils.aggregate_forward_results)
assert callable(actor_group.RayTrainGroup._allocate_gpus_for_actor)
print(f"miles: torch {torch.__version__}, miles-rl {miles_version} importable")
PY
touch "$VENV/.rebatch-env-ok"  # built to the end (.ci/peers.sh builds an environment without it)
