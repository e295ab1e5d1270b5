"""Fuzzing: every property under the ``fuzz`` profile for a time budget.

``python -m property_tests.fuzz --minutes N`` shares the budget between the properties and runs each in
rounds of examples until its share is spent. Hypothesis's example database lives in
``.hypothesis/fuzz-db`` (``REBATCH_FUZZ_DB`` overrides), so a failure found once is replayed first
next time. On a failure it prints the shrunk example and the ``@reproduce_failure`` blob and exits 1.
The same properties run under HypoFuzz (``hypothesis fuzz property_tests/test_properties.py``).
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

from .profiles import FUZZ_DATABASE_DIR, register_profiles
from .properties import PROPERTIES

__all__ = ["main", "fuzz"]

ROUND = 25  # examples per round; rounds repeat until a property's share of the time is spent


def _counting(check: Callable[[Any], None], counter: list[int]) -> Callable[[Any], None]:
    def counted(drawn: Any) -> None:
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
        f"fuzzing {len(names)} properties for {minutes:g} min ({share:.0f} s each); database {database.path}", file=out
    )
    failed = False
    for name in names:
        prop = PROPERTIES[name]
        counter = [0]
        test = settings(fuzz_profile, max_examples=ROUND, database=database)(
            given(prop.strategy)(_counting(prop.check, counter))
        )
        start = time.perf_counter()
        rounds = 0
        while time.perf_counter() - start < share and counter[0] < fuzz_profile.max_examples:
            rounds += 1
            try:
                test()
            except Exception:
                failed = True
                print(f"FAILED {name} after {counter[0]} examples:", file=out)
                traceback.print_exc(file=out)
                print(
                    "Reproduce: the failing example is saved in the database above and replays first on the next run;"
                    " the @reproduce_failure line printed by Hypothesis above pins it in a test.",
                    file=out,
                )
                break
        elapsed = time.perf_counter() - start
        print(
            f"{'FAIL' if failed else 'ok  '} {name:<36} {counter[0]:>7} examples  {counter[0] / elapsed:8.1f} examples/s  ({elapsed:.0f} s)",
            file=out,
            flush=True,
        )
        if failed:
            return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")  # device defects need 2
    parser = argparse.ArgumentParser(
        prog="python -m property_tests.fuzz", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=10.0, help="total time budget (default 10)")
    parser.add_argument(
        "--property", action="append", choices=list(PROPERTIES), help="fuzz only this property (repeatable)"
    )
    args = parser.parse_args(argv)
    return fuzz(args.minutes, only=args.property)


if __name__ == "__main__":
    sys.exit(main())
