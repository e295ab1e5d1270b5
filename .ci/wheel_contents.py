"""Fail unless the wheel holds exactly the four packages, the startup hook (the package ``rebatch_startup``
and its two files at the top of site-packages, ``rebatch.pth`` and ``rebatch.start``: the variable
``REBATCH``) and its metadata, with no test files outside the testing kit ``property_tests``, and the
hook's files as ``rebatch_startup`` holds them. Usage: ``python .ci/wheel_contents.py dist/rebatch-*.whl``."""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

ALLOWED = {
    "ref",
    "torch_impl",
    "property_tests",
    "rebatch",
    "rebatch_startup",
    "rebatch.pth",
    "rebatch.start",
}
#: the startup hook's files at the wheel's top (site-packages), copies of the package's own
HOOK = {"rebatch.pth": "rebatch_startup/rebatch.pth", "rebatch.start": "rebatch_startup/rebatch.start"}
#: the repository's root: every module of the packages' source trees must be in the wheel (an explicit
#: package list once left ``torch_impl.integrations`` out, and later ``torch_impl._alignment`` and the
#: ``torch_impl.integrations.miles`` package, which a stale build directory hid)
ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ref", "torch_impl", "property_tests", "rebatch", "rebatch_startup")
REQUIRED = {
    p.relative_to(ROOT).as_posix()
    for package in PACKAGES
    for p in (ROOT / package).rglob("*.py")
    if "__pycache__" not in p.parts
}


def main(path: str) -> int:
    wheel = zipfile.ZipFile(path)
    names = wheel.namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    tests_outside_kit = [n for n in names if "/test_" in n and not n.startswith("property_tests/")]
    print(f"{path}: top level {sorted(tops)}, {len(names)} files")
    missing = sorted(REQUIRED - set(names))
    hook = [
        top
        for top, kept in HOOK.items()
        if top in names and kept in names and wheel.read(top) != wheel.read(kept)
    ]
    if tops != ALLOWED or tests_outside_kit or missing or hook:
        print(
            f"unexpected: top level {sorted(tops - ALLOWED)}, missing {sorted(ALLOWED - tops)}, tests "
            f"{tests_outside_kit}, modules missing {missing}, hook files differing from rebatch_startup's "
            f"{hook}"
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
