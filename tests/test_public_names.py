"""Every public name a package or public module lists in ``__all__`` imports, so ``from X import *`` works
(issue 42: ``ref.MisalignmentError`` and ``ref.RankFailedError`` were listed and missing). Each package in a
fresh interpreter (no test's imports, no trainer, the startup hook's variables unset)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

PACKAGES = ["ref", "torch_impl", "torch_impl.integrations", "property_tests", "rebatch", "rebatch_startup"]

_PROBE = textwrap.dedent(
    """
    import importlib, pkgutil, sys
    pkg = importlib.import_module(sys.argv[1])
    names = [sys.argv[1]]
    if hasattr(pkg, "__path__"):
        names += [
            f"{sys.argv[1]}.{i.name}"
            for i in pkgutil.iter_modules(pkg.__path__)
            if not i.name.startswith("_")
        ]
    missing = []
    for name in names:
        if name.startswith("property_tests.test_") or name == "rebatch_startup.verl":
            continue  # pytest's modules; verl's plugin, whose import is the hook's activation
        mod = importlib.import_module(name)
        missing += [f"{name}.{n}" for n in getattr(mod, "__all__", ()) if not hasattr(mod, n)]
        exec(f"from {name} import *", {})
    print("missing:", missing)
    sys.exit(1 if missing else 0)
    """
)


@pytest.mark.parametrize("package", PACKAGES)
def test_every_name_in_all_imports(package: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REBATCH")}
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, package],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "missing: []" in done.stdout
