#!/usr/bin/env bash
# The end of CI, once the trainers' environments are built (.ci/envs.sh), in two lanes at once (each is
# mostly one process on one core, so on 2 cores the two take about as long as the longer one):
#  pins:     the tests on verl's pins, verl 0.9.1's own functions as oracle (a skip fails here)
#  trainers: the verl tests on verl 0.8.0 and 0.9.0 too (each --no-deps beside the pins' torch); verl's own
#            tests on verl, then with rebatch's install() applied (same outcomes); AReaL 1.0.4 and SkyRL
#            0.4.0 in environments of their own (and verl in the pins one): the drop-ins against the
#            trainers' own functions (a skip fails), each trainer's conformance report, docs/peers.md checked
# Each lane's output goes to .cache/lane-NAME.log, printed when both have ended; fails if either failed.
# Usage: bash .ci/lanes.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
step() { echo "== lanes [$SECONDS s] $*"; }
step "two lanes: the tests on verl's pins | verl 0.8.0 and 0.9.0, verl's own tests, the trainers (.ci/peers.sh)"
lane() {  # lane NAME COMMAND...: its output in .cache/lane-NAME.log, its time and verdict as it ends
  local name="$1"; shift
  local start=$SECONDS rc=0
  "$@" > ".cache/lane-$name.log" 2>&1 || rc=$?
  echo "== lanes [$SECONDS s] lane $name: exit $rc after $((SECONDS - start)) s"
  return "$rc"
}
trainers() {
  bash .ci/verl_versions.sh "$PWD/.venv-pins" && bash .ci/verl_upstream/run.sh "$PWD/.venv-pins" && bash .ci/peers.sh
}
lane pins env REBATCH_REQUIRE_VERL=1 REBATCH_REQUIRE_PEER=verl .venv-pins/bin/python -m pytest tests &
PINS=$!
lane trainers trainers &
TRAINERS=$!
rc=0
wait "$PINS" || rc=1
wait "$TRAINERS" || rc=1
for name in pins trainers; do
  step "lane $name: its output"
  grep -v "is ignored" ".cache/lane-$name.log" || true
done
[ "$rc" -eq 0 ] || { echo "a lane failed (its output above)"; exit 1; }
