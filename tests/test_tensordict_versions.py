"""torch_impl with the tensordict verl pins (0.10) and the installed latest release, each in its own process.

tensordict 0.10.0 is installed on first use into ``.cache/tensordict-0.10.0`` (pip, no dependencies:
torch and the rest come from the environment) and put first on ``PYTHONPATH``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PINNED = "0.10.0"


def _pinned_dir() -> Path:
    target = ROOT / ".cache" / f"tensordict-{PINNED}"
    if not (target / "tensordict").is_dir():
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-deps",
                "--target",
                str(target),
                f"tensordict=={PINNED}",
                "pyvers>=0.1,<0.2",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr
    return target


@pytest.mark.parametrize("version", ["installed", PINNED])
def test_torch_impl_with_tensordict(version: str) -> None:
    env = dict(os.environ)
    paths = [str(ROOT)]
    if version != "installed":
        paths.insert(0, str(_pinned_dir()))
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "tensordict_check.py")],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    if version != "installed":
        assert f"tensordict {version} ok" in done.stdout, done.stdout
    else:
        assert "ok" in done.stdout
