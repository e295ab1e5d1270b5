#!/usr/bin/env bash
# verl 0.9.1's own CPU tests of its partitioner (seqlen_balancing), engine micro-batches and metric
# utilities, run twice in the pins environment: on verl as it is, then with rebatch's install()
# applied in every process (site/sitecustomize.py). Fails unless every test has the same outcome both
# times. Usage: bash .ci/verl_upstream/run.sh VENV
set -uo pipefail
VENV="${1:?usage: run.sh VENV}"
HERE="$(cd "$(dirname "$0")" && pwd)"
cd "$HERE"
FILES=(tests/utils/test_seqlen_balancing.py tests/utils/test_prepare_micro_batches_with_group_size.py
       tests/trainer/ppo/test_metric_utils_on_cpu.py cpu_edits/)
# upstream's distributed test needs CUDA and NCCL; cpu_edits/ holds its gloo copy
DESELECT=(--deselect tests/utils/test_seqlen_balancing.py::test_seqlen_balancing_distributed_params)
outcomes() {  # outcomes FILE: "nodeid outcome" lines from a junit report
  "$VENV/bin/python" - "$1" <<'PY'
import sys, xml.etree.ElementTree as ET
for case in ET.parse(sys.argv[1]).iter("testcase"):
    kind = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed")
    print(f"{case.get('classname')}::{case.get('name')} {kind}")
PY
}
run() {  # run LABEL [env...]
  local label="$1"; shift
  env "$@" "$VENV/bin/python" -m pytest -p no:cacheprovider -q -W ignore -o addopts="" \
    --junitxml="/tmp/verl_upstream_$label.xml" "${FILES[@]}" "${DESELECT[@]}" | tail -3
  outcomes "/tmp/verl_upstream_$label.xml" | sort > "/tmp/verl_upstream_$label.txt"
}
echo "== verl's own tests, verl unpatched"
run verl
echo "== the same tests with rebatch's install() applied"
run rebatch PYTHONPATH="$HERE/site"
echo "== outcomes (verl unpatched | with rebatch):"
paste -d' ' <(awk '{print $2}' /tmp/verl_upstream_verl.txt | sort | uniq -c | xargs) \
            <(echo "|") <(awk '{print $2}' /tmp/verl_upstream_rebatch.txt | sort | uniq -c | xargs)
if diff /tmp/verl_upstream_verl.txt /tmp/verl_upstream_rebatch.txt; then
  echo "identical outcomes for all $(wc -l < /tmp/verl_upstream_verl.txt) tests"
else
  echo "outcomes differ (above)"; exit 1
fi
