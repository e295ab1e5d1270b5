"""The trainers' registry for CI's scripts (`rebatch_startup.trainers`): ``python -m rebatch_startup names``
(every trainer's name), ``envs`` (``NAME VENV SCRIPT`` a line), ``lanes`` (``NAME VENV`` of each trainer
CI's trainers lane runs in its own environment) or ``tests NAME`` (the test files of its lane)."""

from __future__ import annotations

import sys

from .trainers import LANE_TESTS, TRAINERS, by_name, names


def main(argv: list[str]) -> int:
    """Print what ``argv`` asks for (the module's docstring); 2 on a usage error."""
    what = argv[0] if argv else ""
    if what == "names":
        print(" ".join(names()))
    elif what == "envs":
        for t in TRAINERS:
            print(t.name, t.venv, t.env_script)
    elif what == "lanes":
        for t in TRAINERS:
            if t.lane:
                print(t.name, t.venv)
    elif what == "tests" and len(argv) == 2:
        print(" ".join((*LANE_TESTS, *by_name(argv[1]).tests)))
    else:
        sys.stderr.write("usage: python -m rebatch_startup names | envs | lanes | tests NAME\n")
        return 2
    return 0


sys.exit(main(sys.argv[1:]))
