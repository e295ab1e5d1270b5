#!/usr/bin/env bash
# The verl differential, forced-group, install, plugin, binding-site, shadow and version tests on verl 0.8.0
# and 0.9.0 (0.9.1 is the pins environment's own, tested by .ci/run's pins step). verl is pure Python: each release
# installs --no-deps into .cache/verl/VERSION, put on PYTHONPATH before the pins environment's verl 0.9.1
# (torch 2.9.1, tensordict 0.10.0 and verl's other dependencies are the pins environment's: these tests
# need nothing more). A skip fails (REBATCH_REQUIRE_VERL=1); the release actually imported is printed and
# checked. The releases' test runs go in parallel (each about 3 minutes on 2 busy cores, most of it
# subprocesses importing verl); the two Ray worker tests, which exercise Ray's runtime environment rather
# than verl, run in the pins step only.
# Usage: bash .ci/verl_versions.sh VENV [VERSION ...] (default: 0.8.0 0.9.0).
set -euo pipefail
VENV="$(cd "${1:?usage: verl_versions.sh VENV [VERSION ...]}" && pwd)"
shift
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
VERSIONS=("$@")
[ ${#VERSIONS[@]} -gt 0 ] || VERSIONS=(0.8.0 0.9.0)
TESTS=(tests/test_verl_differential.py tests/test_verl_forced_groups.py tests/test_verl_install.py tests/test_verl_plugin.py
       tests/test_verl_binding_sites.py tests/test_verl_shadow.py tests/test_verl_versions.py
       --deselect tests/test_verl_install.py::test_ray_worker_setup_hook_installs_in_every_worker
       --deselect tests/test_verl_plugin.py::test_a_ray_worker_sees_rebatch_through_the_runtime_env
       --deselect tests/test_verl_plugin.py::test_a_ray_worker_of_plain_ray_init_sees_what_the_driver_variable_says)
SECONDS=0
for version in "${VERSIONS[@]}"; do
  target="$PWD/.cache/verl/$version"
  echo "== verl $version [$SECONDS s]: pip install --no-deps --target $target"
  rm -rf "$target"
  "$VENV/bin/python" -m pip install -q --no-deps --no-cache-dir --target "$target" "verl==$version"
  # the wheel also ships verl's own tests/ and scripts/ as top-level packages: not verl, and a tests/ on
  # PYTHONPATH would shadow this repository's
  rm -rf "$target/tests" "$target/scripts"
  PYTHONPATH="$target:$PWD" "$VENV/bin/python" -W ignore -c "
import importlib.metadata, verl
got, where = importlib.metadata.version('verl'), verl.__file__
print(f'  imported verl {got} (verl.__version__ {verl.__version__}) from {where}')
assert got == verl.__version__ == '$version' and where.startswith('$target'), (got, verl.__version__, where)"
done
pids=()
for version in "${VERSIONS[@]}"; do
  echo "== verl $version [$SECONDS s]: tests started (a skip fails here; log .cache/verl/$version.log)"
  REBATCH_REQUIRE_VERL=1 PYTHONPATH="$PWD/.cache/verl/$version:$PWD" \
    "$VENV/bin/python" -m pytest -q "${TESTS[@]}" > ".cache/verl/$version.log" 2>&1 &
  pids+=($!)
done
failed=()
for i in "${!VERSIONS[@]}"; do
  version="${VERSIONS[$i]}"
  if wait "${pids[$i]}"; then status=passed; else status=FAILED; failed+=("$version"); fi
  echo "== verl $version [$SECONDS s]: tests $status"
  if [ "$status" = passed ]; then tail -n 1 ".cache/verl/$version.log"; else tail -n 80 ".cache/verl/$version.log"; fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "verl ${failed[*]}: tests failed"
  exit 1
fi
echo "== verl ${VERSIONS[*]}: done [$SECONDS s]"
