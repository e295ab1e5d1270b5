"""Fail unless the wheel holds exactly the four packages (and its metadata), with no test files outside
the testing kit ``property_tests``. Usage: ``python .ci/wheel_contents.py dist/rebatch-*.whl``."""

from __future__ import annotations

import sys
import zipfile

ALLOWED = {"ref", "torch_impl", "property_tests", "rebatch"}
#: modules of subpackages a wheel must hold (an explicit package list once left ``torch_impl.integrations`` out)
REQUIRED = {
    "torch_impl/integrations/_patch.py",
    "torch_impl/integrations/verl.py",
    "torch_impl/integrations/areal.py",
    "torch_impl/integrations/skyrl.py",
    "torch_impl/integrations/verl_plugin.py",
    "rebatch/bench/run.py",
    "property_tests/defects/__init__.py",
}


def main(path: str) -> int:
    names = zipfile.ZipFile(path).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    tests_outside_kit = [n for n in names if "/test_" in n and not n.startswith("property_tests/")]
    print(f"{path}: top level {sorted(tops)}, {len(names)} files")
    missing = sorted(REQUIRED - set(names))
    if tops != ALLOWED or tests_outside_kit or missing:
        print(
            f"unexpected: top level {sorted(tops - ALLOWED)}, missing {sorted(ALLOWED - tops)}, tests "
            f"{tests_outside_kit}, modules missing {missing}"
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
