#!/usr/bin/env bash
# The trainers beside rebatch, each in an environment of its own (declared in rebatch_startup/trainers.py:
# AReaL 1.0.4 on torch 2.9.1, SkyRL 0.4.0 on Python 3.12, verl 0.9.1 in the pins environment, ...);
# .ci/run builds them beforehand (.ci/envs.sh), and a missing one is built here. In each:
# the drop-in's tests against the trainer's own function (a skip fails: REBATCH_REQUIRE_PEER), then the
# trainer's conformance report (JSON). Last, docs/peers.md's table of outcomes, and its other tables but
# for their times (rebatch.figures), are checked against the trainers' reports (regenerate it with
# `.venv/bin/python -m property_tests.conformance --report docs/peers.md .cache/peers/*.json`).
# Usage: bash .ci/peers.sh [TRAINER|verl|report ...] (default: each trainer with a lane of its own, then
# verl, then the report).
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
SECONDS=0
step() { echo "== peers [$SECONDS s] $*"; }
mkdir -p .cache/peers
# The trainers, as declared once (rebatch_startup/trainers.py): NAME VENV of each with a lane of its own
# here (verl's tests run in the pins lane, .ci/lanes.sh), and every trainer's name.
REGISTRY() { python3 -m rebatch_startup "$@"; }
declare -A LANE_VENV=()
while read -r name venv; do LANE_VENV[$name]=$venv; done < <(REGISTRY lanes)
read -r -a NAMES <<< "$(REGISTRY names)"
PARTS=("$@")
[ ${#PARTS[@]} -gt 0 ] || PARTS=($(REGISTRY lanes | cut -d' ' -f1) verl report)
REPORTS=()
for name in "${NAMES[@]}"; do REPORTS+=(".cache/peers/$name.json"); done

for part in "${PARTS[@]}"; do
  if [ -n "${LANE_VENV[$part]:-}" ]; then
    venv="${LANE_VENV[$part]}"
    if [ ! -f "$venv/.rebatch-env-ok" ]; then  # .ci/run builds it beforehand (.ci/envs.sh)
      step "$part: environment"
      bash "$(REGISTRY envs | awk -v n="$part" '$1 == n {print $3}')" "$venv"
    fi
    read -r -a TESTS <<< "$(REGISTRY tests "$part")"
    step "$part: the drop-in against the trainer's own function (a skip fails here)"
    REBATCH_REQUIRE_PEER=$part "$venv/bin/python" -m pytest -q "${TESTS[@]}"
    step "$part: conformance report"
    "$venv/bin/python" -m property_tests.conformance --candidate "$part" --json ".cache/peers/$part.json"
    continue
  fi
  case "$part" in
    verl)
      # (verl's tests/test_peers.py ran in the pins lane of .ci/lanes.sh, with every other test there)
      step "verl: conformance report (pins environment)"
      .venv-pins/bin/python -m property_tests.conformance --candidate verl --json .cache/peers/verl.json
      ;;
    report)
      step "docs/peers.md: its table of outcomes against the trainers' reports"
      .venv/bin/python -m property_tests.conformance --report docs/peers.md --check "${REPORTS[@]}"
      step "docs/peers.md's differential and speed tables (calls, differences, properties, sizes, verdicts) against them"
      .venv/bin/python -m rebatch.figures --check-peers "${REPORTS[@]}"
      ;;
    *)
      echo "unknown part: $part" >&2
      exit 2
      ;;
  esac
done
step "done"
