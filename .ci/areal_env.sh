#!/usr/bin/env bash
# AReaL's pins: an environment (Python 3.11) with torch 2.9.1 (AReaL 1.0.4 asks for torch >=2.9.1,<2.11),
# tensordict 0.10.0 and AReaL 1.0.4 itself, with rebatch installed in it, so that tests can compare
# rebatch against areal.engine.core.train_engine.reorder_and_pad_outputs and the helpers of
# areal.utils.data (MicroBatchList, reorder_list, unpack_sequence, pad_and_stack_tensors_along_first_dim).
# Usage: bash .ci/areal_env.sh VENV
#
# AReaL's own requirements (vLLM/SGLang clients, agents SDKs, wandb, swanlab, litellm, ...) are far too
# heavy, so areal is installed --no-deps, after only what those two modules import at module level:
# areal/__init__ imports areal.infra (controllers, launchers, schedulers, RPC server), which imports
# areal.api.cli_args, areal.utils.data and areal.experimental.openai; each package below is one of those
# imports (the file that needs it is named), installed with its own light requirements.
# torch 2.9.1 (with its CUDA libraries, about 6 GB installed; it runs on the CPU) is the pins environment's
# (.ci/pins_env.sh, built first if missing), hard-linked in (.ci/link_dists.py): one copy on disk for both.
# A constraint file pins it for every later pip call, so nothing can swap it for another build.
set -euo pipefail
VENV="${1:?usage: bash .ci/areal_env.sh VENV}"
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
CONS="$(mktemp)"; trap 'rm -f "$CONS"' EXIT
echo "torch==2.9.1" > "$CONS"
PIP() { "$VENV/bin/python" -m pip -q --no-cache-dir "$@"; }

PINS="${REBATCH_PINS_VENV:-.venv-pins}"
[ -f "$PINS/.rebatch-env-ok" ] || bash .ci/pins_env.sh "$PINS"
python3 -m venv "$VENV"
"$PINS/bin/python" .ci/link_dists.py torch "$VENV"
PIP install -c "$CONS" "tensordict==0.10.0"
# What areal.engine.core.train_engine and areal.utils.data pull in when imported (AReaL's pins where it
# has them: hydra-core 1.4.0.dev1, omegaconf 2.4.0.dev2, transformers <=5.3.0):
#   aiohttp, tenacity   areal/infra/workflow_context.py, areal/infra/rpc/rtensor.py, areal/infra/utils/http.py
#   httpx               areal/infra/workflow_context.py
#   colorlog            areal/utils/logging.py
#   flask               areal/infra/rpc/guard (RPC server of areal.infra.controller)
#   torchdata           areal/utils/data.py (torchdata.stateful_dataloader)
#   lark                areal/api/alloc_mode.py
#   uvloop, pyyaml, hydra-core, omegaconf   areal/api/cli_args.py
#   transformers        areal/engine/fsdp_utils (imported by areal/api/cli_args.py)
#   ray                 areal/infra/scheduler/ray.py, areal/infra/rpc/rtensor.py
#   numba               areal/utils/seqpack.py
#   pillow              areal/api/io_struct.py, areal/api/engine_api.py
#   orjson              areal/infra/rpc/guard/data_blueprint.py, areal/infra/rpc/rtensor.py
#   einops              areal/utils/data.py
#   aiofiles            areal/infra/workflow_executor.py
#   openai              areal/experimental/openai (imported by areal.infra.controller)
#   peft                areal/engine/fsdp_engine.py (AReaL's pin, <=0.18.1): the FSDP engine imports on CPU, so
#                       tests/test_trainer_activation.py sees its binding of reorder_and_pad_outputs
PIP install -c "$CONS" aiohttp httpx colorlog tenacity flask torchdata lark uvloop pyyaml \
    "hydra-core==1.4.0.dev1" "omegaconf==2.4.0.dev2" "transformers>=5.0.0,<=5.3.0" ray numba pillow \
    orjson einops aiofiles openai "peft<=0.18.1"
PIP install -c "$CONS" -e ".[test]"
# Last, so that no later pip call reports AReaL's many uninstalled requirements.
PIP install --no-deps "areal==1.0.4"
"$VENV/bin/python" - <<'PY'
import importlib.metadata

import tensordict, torch
import areal.engine.core.train_engine as train_engine
from areal.utils.data import (  # noqa: F401
    MicroBatchList,
    pad_and_stack_tensors_along_first_dim,
    reorder_list,
    unpack_sequence,
)

assert torch.__version__.split("+")[0] == "2.9.1", torch.__version__
assert tensordict.__version__.startswith("0.10."), tensordict.__version__
areal_version = importlib.metadata.version("areal")
assert areal_version == "1.0.4", areal_version
assert callable(train_engine.reorder_and_pad_outputs)
print(f"areal: torch {torch.__version__}, tensordict {tensordict.__version__}, areal {areal_version} importable")
PY
touch "$VENV/.rebatch-env-ok"  # built to the end (.ci/peers.sh builds an environment without it)
