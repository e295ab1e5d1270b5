"""``python -m rebatch.bench.cuda_check``, the one device script, on this machine: without CUDA it says so
and exits 0; ``--dry-run`` runs every section on the CPU and writes them all to ``--out``; a section that
fails is reported while the others still run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from property_tests import sidebyside
from rebatch.bench import cuda_check

SECTIONS = {"properties", "device_calls", "launches", "timings", "machine"}


def test_without_cuda_it_says_so_and_exits_0(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cuda_check.main([]) == 0
    assert "no CUDA device here" in capsys.readouterr().out


def test_dry_run_writes_every_section(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cuda_check.json"
    assert cuda_check.main(["--dry-run", "--out", str(out)]) == 0
    results = json.loads(out.read_text())
    assert set(results) >= SECTIONS
    assert all("error" not in results[s] for s in SECTIONS)
    timed = results["timings"]["rows"]
    assert {r["trainer"] for r in timed} == set(sidebyside.TRAINERS)  # every trainer with a side-by-side call
    assert all(r["rebatch_s"] > 0 for r in timed)
    assert all(r["theirs_s"] is None or r["theirs_s"] > 0 for r in timed)
    printed = capsys.readouterr().out
    assert "trainer" in printed
    assert "kernels traced/counted" in printed


def test_a_failing_section_hides_no_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("broken on purpose")

    monkeypatch.setattr(cuda_check, "_launches", broken)
    out = tmp_path / "cuda_check.json"
    assert cuda_check.main(["--dry-run", "--out", str(out)]) == 1
    results = json.loads(out.read_text())
    assert "broken on purpose" in results["launches"]["error"]
    assert all("error" not in results[s] for s in SECTIONS - {"launches"})
    assert "FAIL section launches" in capsys.readouterr().out
