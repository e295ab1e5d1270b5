"""Fuzzing: every property under the ``fuzz`` profile for a time budget.

``python -m property_tests.fuzz --minutes N`` shares the budget between the properties and runs each in
rounds of examples until its share is spent; the
round under way when the share runs out ends at its next example (so the budget holds). Hypothesis's example
database lives in
``.hypothesis/fuzz-db`` (``REBATCH_FUZZ_DB`` overrides), so a failure found once is replayed first
next time. On a failure it prints the shrunk example and the ``@reproduce_failure`` blob and exits 1.
The same properties run under HypoFuzz (``hypothesis fuzz property_tests/test_properties.py``).

``python -m property_tests.fuzz --machine provenance --minutes N`` runs a state machine (`MACHINES`)
instead, in rounds of `MACHINE_ROUND` runs of `MACHINE_STEPS` steps until the budget is spent (a round
under way when it runs out is finished: a run cannot stop midway).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from hypothesis import given, settings
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.reporting import with_reporter

from .profiles import FUZZ_DATABASE_DIR, register_profiles
from .properties import PROPERTIES

__all__ = ["main", "fuzz"]

ROUND = 25  # examples per round; rounds repeat until a property's share of the time is spent
MACHINE_ROUND = 5  # runs of a state machine per round
MACHINE_STEPS = 20  # steps a run

#: The state machines, by name: their module and class.
MACHINES = {"provenance": ("property_tests.provenance_machine", "ProvenanceMachine")}


class _TimeUp(BaseException):
    """Raised inside a round when a property's share of the time is spent: not an `Exception`, so
    Hypothesis neither records nor shrinks it, and the round ends at once (rounds never overrun)."""


def _counting(
    check: Callable[[Any], None], counter: list[int], deadline: list[float]
) -> Callable[[Any], None]:
    def counted(drawn: Any) -> None:
        if time.perf_counter() >= deadline[0]:
            raise _TimeUp
        counter[0] += 1
        check(drawn)

    return counted


def fuzz(minutes: float, *, only: list[str] | None = None, out: Any = None) -> int:
    out = out or sys.stdout
    register_profiles()
    names = only or list(PROPERTIES)
    database = DirectoryBasedExampleDatabase(os.environ.get("REBATCH_FUZZ_DB", FUZZ_DATABASE_DIR))
    share = minutes * 60.0 / len(names)
    fuzz_profile = settings.get_profile("fuzz")
    print(
        f"fuzzing {len(names)} properties for {minutes:g} min ({share:.0f} s each); database {database.path}",
        file=out,
    )
    failed = False
    for name in names:
        prop = PROPERTIES[name]
        counter = [0]
        start = time.perf_counter()
        deadline = [start + share]
        test = settings(fuzz_profile, max_examples=ROUND, database=database)(
            given(prop.strategy)(_counting(prop.check, counter, deadline))
        )
        while time.perf_counter() < deadline[0] and counter[0] < fuzz_profile.max_examples:
            lines: list[object] = []
            try:
                with with_reporter(lines.append):
                    test()
            except _TimeUp:
                break  # what Hypothesis reported about the interrupted round (a seed) is no failure
            except Exception:
                failed = True
                print("\n".join(map(str, lines)), file=out)
                print(f"FAILED {name} after {counter[0]} examples:", file=out)
                traceback.print_exc(file=out)
                print(
                    "Reproduce: the failing example is saved in the database above and replays first on "
                    "the next run; the @reproduce_failure line printed by Hypothesis above pins it in a "
                    "test.",
                    file=out,
                )
                break
            if lines:
                print("\n".join(map(str, lines)), file=out)
        elapsed = time.perf_counter() - start
        print(
            f"{'FAIL' if failed else 'ok  '} {name:<36} {counter[0]:>7} examples  "
            f"{counter[0] / elapsed:8.1f} examples/s  ({elapsed:.0f} s)",
            file=out,
            flush=True,
        )
        if failed:
            return 1
    return 0


def fuzz_machine(name: str, minutes: float, *, out: Any = None) -> int:
    """The state machine ``name`` (`MACHINES`) under the ``fuzz`` profile for ``minutes``, in rounds."""
    import importlib

    from hypothesis.stateful import run_state_machine_as_test

    out = out or sys.stdout
    register_profiles()
    module, cls = MACHINES[name]
    machine = getattr(importlib.import_module(module), cls)
    database = DirectoryBasedExampleDatabase(os.environ.get("REBATCH_FUZZ_DB", FUZZ_DATABASE_DIR))
    each = settings(
        settings.get_profile("fuzz"),
        max_examples=MACHINE_ROUND,
        stateful_step_count=MACHINE_STEPS,
        database=database,
    )
    print(f"fuzzing the {name} state machine for {minutes:g} min; database {database.path}", file=out)
    start = time.perf_counter()
    runs = 0
    while time.perf_counter() < start + minutes * 60.0:
        lines: list[object] = []
        try:
            with with_reporter(lines.append):
                run_state_machine_as_test(machine, settings=each)
        except Exception:
            print("\n".join(map(str, lines)), file=out)
            print(f"FAILED the {name} state machine after {runs} runs:", file=out)
            traceback.print_exc(file=out)
            return 1
        runs += MACHINE_ROUND
    elapsed = time.perf_counter() - start
    print(
        f"ok   the {name} state machine: {runs} runs of up to {MACHINE_STEPS} steps ({elapsed:.0f} s)",
        file=out,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")  # device defects need 2
    parser = argparse.ArgumentParser(
        prog="python -m property_tests.fuzz",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--minutes", type=float, default=10.0, help="total time budget (default 10)")
    parser.add_argument(
        "--property", action="append", choices=list(PROPERTIES), help="fuzz only this property (repeatable)"
    )
    parser.add_argument("--machine", choices=list(MACHINES), help="fuzz this state machine instead")
    args = parser.parse_args(argv)
    if args.machine is not None:
        return fuzz_machine(args.machine, args.minutes)
    return fuzz(args.minutes, only=args.property)


if __name__ == "__main__":
    sys.exit(main())
