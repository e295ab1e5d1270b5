#!/usr/bin/env bash
# The trainers' environments, one after another (.ci/run starts this in the background at its beginning,
# so that their downloads overlap the main test suite): verl's pins (torch 2.9.1), AReaL 1.0.4 (the same
# torch, its wheels shared through .cache/wheels) and SkyRL 0.4.0 (Python 3.12, torch 2.13.0).
# Usage: bash .ci/envs.sh
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS=0
bash .ci/pins_env.sh .venv-pins
echo "== envs [$SECONDS s] verl's pins environment built"
bash .ci/areal_env.sh .venv-areal
echo "== envs [$SECONDS s] AReaL's environment built"
bash .ci/skyrl_env.sh .venv-skyrl
echo "== envs [$SECONDS s] SkyRL's environment built"
