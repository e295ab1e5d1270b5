#!/usr/bin/env bash
# The trainers' environments, one after another (.ci/run starts this in the background at its beginning,
# so that their downloads overlap the main test suite): verl's pins (torch 2.9.1) first, then each other
# trainer's as rebatch_startup/trainers.py declares it: AReaL 1.0.4 (the same torch as the pins, the pins
# environment's files hard-linked), SkyRL 0.4.0 (Python 3.12, torch 2.13.0), ..., then the newest torch's
# (.venv-torch: torch 2.14.1, .ci/torch_env.sh, for the torch lane, which runs last, after the pins lane) About 22 GB on disk in all (pins 8, torch 6, AReaL 1.5, SkyRL 6), plus pip's
# temporary copy of the largest download; pip's cache is off (PIP_NO_CACHE_DIR), so no second copy of
# the wheels stays behind.
# Progress for .ci/lanes.sh: .cache/envs/pins.built once the pins environment is built, .cache/envs/
# trainers.built once every trainer's is, .cache/envs/torch.built once the newest torch's is (.ci/run
# also writes .cache/envs/status, this script's exit status, when it ends).
# Usage: bash .ci/envs.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_NO_CACHE_DIR=1
SECONDS=0
free() { df -h . | awk 'NR == 2 {print $4 " free on disk"}'; }
bash .ci/pins_env.sh .venv-pins
echo "== envs [$SECONDS s] verl's pins environment built ($(free))"
mkdir -p .cache/envs && touch .cache/envs/pins.built  # .ci/lanes.sh starts the tests on verl's pins
# every other trainer's environment, as declared once (rebatch_startup/trainers.py)
python3 -m rebatch_startup envs | while read -r name venv script; do
  [ "$venv" = .venv-pins ] && continue
  bash "$script" "$venv" < /dev/null  # (not the list this loop reads)
  echo "== envs [$SECONDS s] $name's environment built ($(free))"
done
touch .cache/envs/trainers.built  # .ci/lanes.sh's trainers lane may start
bash .ci/torch_env.sh .venv-torch
echo "== envs [$SECONDS s] the newest torch's environment built ($(free))"
touch .cache/envs/torch.built  # .ci/lanes.sh's torch lane may start (it runs last, after the pins lane)
