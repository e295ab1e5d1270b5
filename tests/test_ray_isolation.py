"""The Ray clusters of the test suite stay in their own temporary directories (``tests/conftest.py``): a head
node started by `ray_head` writes its current-cluster file there (not in Ray's default directory), runs
processes that name it, and is stopped by its own process; `ray_temp_dir`'s teardown fails if one of them is
left. Runs where the ``ray`` command is installed (verl's and SkyRL's environments)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.fixture
def ray_installed() -> None:
    pytest.importorskip("ray", reason="ray is not installed")


def test_a_head_node_of_a_test_lives_in_its_own_temp_dir(
    ray_installed: None, ray_head: str, ray_temp_dir: str, ray_traces: tuple[Path, Any]
) -> None:
    address_file, processes_naming = ray_traces
    before = address_file.stat().st_mtime if address_file.exists() else None
    assert Path(ray_temp_dir, "ray_current_cluster").read_text().strip().endswith(ray_head.split(":")[1])
    assert processes_naming(ray_temp_dir)  # its processes, stopped by the fixture (checked at teardown)
    assert (address_file.stat().st_mtime if address_file.exists() else None) == before


def test_no_test_starts_or_stops_ray_outside_its_own_temp_dir() -> None:
    """In the suite's code: every ``ray.init(`` names its ``_temp_dir``, every ``ray start`` its
    ``--temp-dir``, and nothing runs ``ray stop`` (which stops every Ray cluster of the machine)."""
    import re

    bad = []
    for path in sorted(Path(__file__).parent.rglob("*.py")):
        text = path.read_text()
        if path.name == Path(__file__).name:
            continue
        for m in re.finditer(r"ray\.init\(([^)]+)\)", text):  # a driver attaching (address=) uses the head's
            if "_temp_dir" not in m.group(1) and "address=" not in m.group(1):
                bad.append(f"{path.name}: ray.init without _temp_dir")
        if re.search(
            r"""["']stop["'],\s*["']--force["']|\bray stop --force""", text.replace("``ray stop``", "")
        ):
            bad.append(f"{path.name}: ray stop --force")
        if re.search(r"""["']start["'],\s*["']--head["']""", text) and "--temp-dir=" not in text:
            bad.append(f"{path.name}: ray start without --temp-dir")
    assert not bad
