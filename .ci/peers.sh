#!/usr/bin/env bash
# The trainers beside rebatch, each in an environment of its own: AReaL 1.0.4 (torch 2.9.1, Python 3.11),
# SkyRL 0.4.0 (Python 3.12) and verl 0.9.1 (the pins environment); .ci/run builds all three beforehand
# (.ci/envs.sh), and a missing one is built here. In each:
# the drop-in's tests against the trainer's own function (a skip fails: REBATCH_REQUIRE_PEER), then the
# trainer's conformance report (JSON). Last, docs/peers.md's table of outcomes, and its other tables but
# for their times (rebatch.figures), are checked against the three reports (regenerate it with
# `.venv/bin/python -m property_tests.conformance --report docs/peers.md .cache/peers/*.json`).
# Usage: bash .ci/peers.sh [areal|skyrl|verl|report ...] (default: all four).
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
SECONDS=0
step() { echo "== peers [$SECONDS s] $*"; }
mkdir -p .cache/peers
PARTS=("$@")
[ ${#PARTS[@]} -gt 0 ] || PARTS=(areal skyrl verl report)
TESTS=(tests/test_peers.py tests/test_integrations.py tests/test_trainer_activation.py tests/test_skyrl_items.py
  tests/test_trainer_steps.py)

for part in "${PARTS[@]}"; do
  case "$part" in
    areal | skyrl)
      venv=".venv-$part"
      if [ ! -f "$venv/.rebatch-env-ok" ]; then  # .ci/run builds it beforehand (.ci/envs.sh)
        step "$part: environment"
        bash ".ci/${part}_env.sh" "$venv"
      fi
      step "$part: the drop-in against the trainer's own function (a skip fails here)"
      REBATCH_REQUIRE_PEER=$part "$venv/bin/python" -m pytest -q "${TESTS[@]}"
      step "$part: conformance report"
      "$venv/bin/python" -m property_tests.conformance --candidate "$part" --json ".cache/peers/$part.json"
      ;;
    verl)
      # (verl's tests/test_peers.py ran in the pins lane of .ci/lanes.sh, with every other test there)
      step "verl: conformance report (pins environment)"
      .venv-pins/bin/python -m property_tests.conformance --candidate verl --json .cache/peers/verl.json
      ;;
    report)
      step "docs/peers.md: its table of outcomes against the three reports"
      .venv/bin/python -m property_tests.conformance --report docs/peers.md --check \
        .cache/peers/verl.json .cache/peers/areal.json .cache/peers/skyrl.json
      step "docs/peers.md's differential and speed tables (calls, differences, properties, sizes, verdicts) against them"
      .venv/bin/python -m rebatch.figures \
        --check-peers .cache/peers/verl.json .cache/peers/areal.json .cache/peers/skyrl.json
      ;;
    *)
      echo "unknown part: $part" >&2
      exit 2
      ;;
  esac
done
step "done"
