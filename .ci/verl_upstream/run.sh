#!/usr/bin/env bash
# verl's own tests of what rebatch replaces or touches, taken at CI time from verl's source distribution
# (nothing of verl's is kept in this repository), run twice in the pins environment: on verl as it is,
# then with rebatch's install() applied in every process (site/sitecustomize.py). Fails unless every test
# has the same outcome both times, and unless the plain run's outcomes are the ones recorded in
# expected.txt (so a test file that stops importing, or runs nothing, cannot pass as "the same twice").
#
# The files (FILES below) and why: the metric helpers whose values rebatch's metric fold must keep
# (verl.utils.metric, verl.trainer.ppo.metric_utils), append_to_dict itself (the value-loss test folds
# metrics with it), the DataProto/TensorDict helpers a restored batch goes through (verl.protocol,
# verl.utils.tensordict_utils), and verl.workers.engine_workers, one of the modules install() rebinds.
# They run on the CPU as shipped: no edit, no deselection. What verl's repository tests of the
# partitioner (force groups, the synchronised constraint errors, the partition over a gloo group) is not
# in the source distribution; rebatch's own tests cover it against verl's installed functions
# (docs/trainers/verl.md, "verl's own tests").
#
# Usage: bash .ci/verl_upstream/run.sh VENV   (VENV: verl 0.9.1 installed, rebatch importable)
set -uo pipefail
VENV="${1:?usage: run.sh VENV}"
HERE="$(cd "$(dirname "$0")" && pwd)"
VERSION=0.9.1
SHA256=3e03d8816b2546b2c5580705671b8d0bb3f79b8364e7b5c56dbfc1245536ba22  # verl-0.9.1.tar.gz on PyPI
FILES=(tests/trainer/ppo/test_metric_utils_on_cpu.py tests/trainer/ppo/test_rollout_moe_lb_metrics_on_cpu.py
       tests/trainer/ppo/test_value_loss_normalization_on_cpu.py tests/test_protocol_on_cpu.py
       tests/test_protocol_v2_on_cpu.py tests/checkpoint_engine/test_global_steps_on_cpu.py)
WORK="$(mktemp -d)"; trap 'rm -rf "$WORK"' EXIT
PY="$VENV/bin/python"

installed="$("$PY" -c 'import importlib.metadata as m; print(m.version("verl"))')" || exit 1
[ "$installed" = "$VERSION" ] || { echo "verl $installed installed in $VENV, expected $VERSION"; exit 1; }

echo "== verl $VERSION's source distribution (its tests/)"
"$PY" -m pip download -q --no-deps --no-binary :all: "verl==$VERSION" -d "$WORK/dist" || exit 1
SDIST="$WORK/dist/verl-$VERSION.tar.gz"
echo "$SHA256  $SDIST" | sha256sum -c --quiet - || { echo "$SDIST: not the recorded sha256"; exit 1; }
# only tests/, into a folder without verl's sources (the tests must import the installed verl), through
# tarfile's "data" filter (no links out, no absolute paths, no special files)
"$PY" - "$SDIST" "$WORK/src" <<'PY' || exit 1
import sys, tarfile
sdist, dest = sys.argv[1:]
with tarfile.open(sdist) as tar:
    top = tar.getmembers()[0].name.split("/")[0]
    members = [m for m in tar.getmembers() if m.name.startswith(f"{top}/tests/") and (m.isfile() or m.isdir())]
    for m in members:
        m.name = m.name[len(top) + 1 :]
    tar.extractall(dest, members=members, filter="data")
print(f"  {sum(m.isfile() for m in members)} files of {top}/tests/")
PY

outcomes() {  # outcomes FILE: "nodeid outcome" lines from a junit report
  "$PY" - "$1" <<'PY'
import sys, xml.etree.ElementTree as ET
for case in ET.parse(sys.argv[1]).iter("testcase"):
    kind = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed")
    print(f"{case.get('classname')}::{case.get('name')} {kind}")
PY
}
counts() {  # counts OUTCOMES: "module outcome=count ..." a test module a line, sorted
  awk '{split($1, p, "::"); n = split(p[1], c, "."); m = ""
        for (i = 1; i <= n; i++) { m = m (i > 1 ? "." : "") c[i]; if (c[i] ~ /^test_/) break }
        k[m " " $2]++} END {for (x in k) {split(x, y, " "); print y[1], y[2] "=" k[x]}}' "$1" | sort
}
run() {  # run LABEL [env...]: the tests once; pytest's own summary goes to a log (the comparison is the verdict)
  local label="$1"; shift
  (cd "$WORK/src" && env "$@" "$PY" -m pytest -c "$HERE/pytest.ini" --rootdir "$WORK/src" -q -W ignore \
    --junitxml="$WORK/$label.xml" "${FILES[@]}") > "$WORK/$label.log" 2>&1
  if [ ! -s "$WORK/$label.xml" ]; then cat "$WORK/$label.log"; echo "no report from the $label run"; exit 1; fi
  outcomes "$WORK/$label.xml" | sort > "$WORK/$label.txt"
}
echo "== verl's own tests, verl unpatched"
run verl
echo "== the same tests with rebatch's install() applied"
SITE="$HERE/site${PYTHONPATH:+:$PYTHONPATH}"
PYTHONPATH="$SITE" "$PY" -W ignore - <<'PY' 2>&1 | grep -v "accelerator\|Platform" || exit 1
import inspect, torch_impl, verl.utils.seqlen_balancing as sb, verl.utils.py_functional as pf
from torch_impl.integrations import verl as integration
assert integration.installed(), "install() not applied"
assert inspect.unwrap(sb.rearrange_micro_batches) is torch_impl.rearrange_micro_batches, "not rebatch's"
assert inspect.unwrap(pf.append_to_dict) is torch_impl.append_to_dict, "not rebatch's"
print("  install() applied at start-up: verl.utils.py_functional.append_to_dict is rebatch's")
PY
run rebatch PYTHONPATH="$SITE"
echo "== outcomes, verl unpatched and with rebatch:"
for label in verl rebatch; do
  echo "  $label: $(awk '{print $2}' "$WORK/$label.txt" | sort | uniq -c | awk '{printf "%s=%s ", $2, $1}')"
done
rc=0
if diff "$WORK/verl.txt" "$WORK/rebatch.txt"; then
  echo "identical outcomes for all $(wc -l < "$WORK/verl.txt") tests"
else
  echo "outcomes differ (above)"; rc=1
fi
counts "$WORK/verl.txt" > "$WORK/counts.txt"
if grep -v "^#" "$HERE/expected.txt" | diff - "$WORK/counts.txt"; then
  echo "the outcomes recorded in .ci/verl_upstream/expected.txt, module by module"
else
  echo "verl's own outcomes differ from .ci/verl_upstream/expected.txt (above: < recorded, > now; the log follows)"
  tail -n 40 "$WORK/verl.log"; rc=1
fi
exit "$rc"
