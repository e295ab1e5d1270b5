#!/usr/bin/env bash
# CI's tests, in four lanes (each mostly one process on one core), so that both cores test while the
# trainers' environments still download (.ci/envs.sh, started in the background by .ci/run, writes
# .cache/envs/pins.built once verl's pins are built, .cache/envs/trainers.built once every trainer's
# environment is, .cache/envs/torch.built once the newest torch's is, and .cache/envs/status, its exit
# status, at its end):
#  main:     the command given (.ci/run gives the README's test command: torch 2.13, tensordict today's), from the start
#  trainers: each trainer declared in rebatch_startup/trainers.py with an environment of its own: the
#            drop-ins against the trainers' own functions (a skip fails), each trainer's conformance
#            report; from when the main lane has ended and every trainer's environment is built
#  pins:     the provenance state machine alone in a fresh process (a few runs: the kit's first import of
#            verl is its own), then on verl's pins (torch 2.9.1, tensordict 0.10) the tests that reach verl
#            (.ci/pins_tests.py: verl 0.9.1's own functions as oracle, a skip fails; among them the engine
#            lane, tests/test_verl_engine.py, verl's own FSDP engine over a tiny model with rebatch off, on
#            and in shadow: docs/engine.md) and the tests whose outcome depends on torch's release
#            (.ci/torch_tests.txt); then the verl tests on verl 0.8.0 and 0.9.0 too (each --no-deps beside
#            the pins' torch); then verl's own tests on verl, and with rebatch's install() applied (same
#            outcomes), and verl's conformance report (everything that needs only the pins environment);
#            from when the pins environment is built
#  torch:    the tests whose outcome depends on torch's release (.ci/torch_tests.txt: the kit's torch facts,
#            private torch, compile, fake CUDA, dtypes, devices, the property suite, ...) and `rebatch
#            check`, on the newest torch tested (torch 2.14.1, .venv-torch); from when the pins lane has
#            ended and that environment is built
# main then trainers, beside pins then torch. Every other test gives the same outcome on any torch and
# runs in the main lane only.
# Each lane's output goes to .cache/lane-NAME.log, printed when all have ended; fails if any failed (a lane
# whose environment failed to build fails with the build's log). Then docs/peers.md is checked against
# every trainer's report (.ci/peers.sh report).
# Usage: bash .ci/lanes.sh COMMAND...   (from .ci/run, after it has started .ci/envs.sh; COMMAND: the main lane's)
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: bash .ci/lanes.sh COMMAND... (the main lane's)"; exit 2; }
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
step() { echo "== lanes [$SECONDS s] $*"; }
lane() {  # lane NAME COMMAND...: its output in .cache/lane-NAME.log, its seconds in .cache/lane-NAME.seconds
  local name="$1"; shift
  local start=$SECONDS rc=0
  "$@" > ".cache/lane-$name.log" 2>&1 || rc=$?
  echo "$((SECONDS - start))" > ".cache/lane-$name.seconds"  # main's: the README's test command, timed (.ci/run checks it)
  echo "== lanes [$SECONDS s] lane $name: exit $rc after $((SECONDS - start)) s"
  return "$rc"
}
built() {  # built pins|trainers|torch|all: wait until .ci/envs.sh has built verl's pins, every trainer's
  local what="$1"  # environment, the newest torch's (or every environment); 1 if it failed first
  while :; do
    if [ "$what" != all ] && [ -e ".cache/envs/$what.built" ]; then return 0; fi
    if [ -e .cache/envs/status ]; then
      [ "$(cat .cache/envs/status)" = 0 ] && return 0
      echo "building the trainers' environments failed ($(df -h . | awk 'NR == 2 {print $4}') free on disk now):"
      grep -v "is ignored" .cache/envs.log | tail -n 60
      return 1
    fi
    sleep 2
  done
}
pins() {  # then what needs only the pins environment (verl 0.8.0, 0.9.0, verl's own tests, its report)
  local verl_tests torch_tests
  mapfile -t verl_tests < <(python3 .ci/pins_tests.py)
  mapfile -t torch_tests < <(grep -v -e '^#' -e '^$' .ci/torch_tests.txt)
  built pins && REBATCH_MACHINE_RUNS=3 .venv-pins/bin/python -m pytest property_tests/test_provenance_machine.py -q \
    && env REBATCH_REQUIRE_VERL=1 REBATCH_REQUIRE_PEER=verl REBATCH_REQUIRE_ENGINE=1 \
    .venv-pins/bin/python -m pytest -m "not main_lane_only" "${verl_tests[@]}" \
    && .venv-pins/bin/python -m pytest "${torch_tests[@]}" && bash .ci/verl_versions.sh "$PWD/.venv-pins" \
    && bash .ci/verl_upstream/run.sh "$PWD/.venv-pins" && bash .ci/peers.sh verl
}
newest() {  # the tests whose outcome depends on torch's release, on the newest torch (one argument a line)
  local tests; mapfile -t tests < <(grep -v -e '^#' -e '^$' .ci/torch_tests.txt)
  built torch && .venv-torch/bin/python -c "import torch; print('torch', torch.__version__)" \
    && .venv-torch/bin/python -m pytest "${tests[@]}"
}
trainers() {  # the trainers with a lane of their own (rebatch_startup/trainers.py), in their environments
  local names; names="$(python3 -m rebatch_startup names | tr ' ' '|')"
  built trainers && grep -E "^== envs|^(pins|$names):" .cache/envs.log \
    && bash .ci/peers.sh $(python3 -m rebatch_startup lanes | cut -d' ' -f1)
}
step "four lanes: the main tests now, then the trainers | the tests on verl's pins once built (those reaching verl, and the torch-sensitive ones), then verl 0.8.0 and 0.9.0, verl's own tests and report, then the torch-sensitive tests on the newest torch"
rc=0
(rc=0; lane pins pins || rc=1; lane torch newest || rc=1; exit "$rc") &
PINS=$!
lane main "$@" || rc=1
lane trainers trainers || rc=1
wait "$PINS" || rc=1
for name in main torch pins trainers; do
  step "lane $name: its output"
  grep -v "is ignored" ".cache/lane-$name.log" || true
done
[ "$rc" -eq 0 ] || { echo "a lane failed (its output above)"; exit 1; }
step "docs/peers.md against every trainer's report"
bash .ci/peers.sh report
