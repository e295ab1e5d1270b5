"""The test files CI's pins lane runs on verl's pins (torch 2.9.1, tensordict 0.10, verl 0.9.1), one a line.

Those that reach verl (its functions as oracle, its engine, its plugin, its peer adapter), by one rule:
`reaches_verl`. The tests whose outcome depends on torch's release run there too, from their own list
(`.ci/torch_tests.txt`, read by `.ci/lanes.sh`); everything else runs in the main lane only (torch 2.13),
as it would give the same outcome on any torch. `tests/test_ci_lanes.py` checks every test module that
imports verl, in any of the ways the kit allows, is listed.

Usage: python3 .ci/pins_tests.py   (from the repository's root; prints paths relative to it)
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: What a test module that reaches verl holds: the kit's verl oracle or its skip, a requirement CI sets in
#: the pins lane (a skip fails there), verl imported directly or through the kit's one trainer import.
REACHES_VERL = re.compile(
    r"verl_or_skip|verl_oracle|REBATCH_REQUIRE_(?:VERL|ENGINE|PEER)|^\s*(?:import|from) verl\b"
    r"|(?:import_trainer_module|trainer_module_or_none)\(\s*[\"']verl",
    re.MULTILINE,
)


def reaches_verl(path: Path) -> bool:
    """Whether the test module at ``path`` reaches verl (its name says so, or its source does)."""
    return path.name.startswith("test_verl") or REACHES_VERL.search(path.read_text()) is not None


def pins_tests(root: Path = ROOT) -> list[str]:
    """The test files of the pins lane, relative to ``root``."""
    return [str(p.relative_to(root)) for p in sorted((root / "tests").glob("test_*.py")) if reaches_verl(p)]


if __name__ == "__main__":
    print("\n".join(pins_tests()))
    sys.exit(0)
