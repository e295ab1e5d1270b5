"""The provenance state machine (`property_tests.provenance_machine`) under the profile in force (``ci``:
a fixed seed, at most `CI_RUNS` runs; ``fuzz``: the profile's, long)."""

from __future__ import annotations

import os

from hypothesis import seed, settings

from property_tests.provenance_machine import ProvenanceMachine

#: Steps a run.
STEPS = 10
#: Runs outside the ``fuzz`` profile (each restore also runs ``ref``, in JAX: about 0.2 s); fewer where
#: ``REBATCH_MACHINE_RUNS`` says (CI's pins lane runs a few in a fresh process beside verl, where the first
#: import of the trainer is the machine's own).
CI_RUNS = int(os.environ.get("REBATCH_MACHINE_RUNS", "40"))

_current = settings()
_runs = _current.max_examples if settings._current_profile == "fuzz" else min(_current.max_examples, CI_RUNS)
ProvenanceMachine.TestCase.settings = settings(
    _current, max_examples=_runs, stateful_step_count=STEPS, derandomize=False
)
# Deterministic outside ``fuzz`` by a fixed seed: derandomized state machines mostly stop after a step or
# two here (about 1 run in 40 reached a restore), where seeded runs are as varied as random ones.
TestProvenanceMachine = ProvenanceMachine.TestCase
if settings._current_profile != "fuzz":
    TestProvenanceMachine = seed(57)(TestProvenanceMachine)
