"""``docs/gpu.md`` is the model's rendering of the traces that made it (``docs/gpu_traces.json``), with
every trainer traced; rebatch's side of the traces is what this checkout does today."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from property_tests import sidebyside
from property_tests.fakecuda import FakeCuda, fake_like
from rebatch.bench import gpu_model

DOCS = Path(__file__).resolve().parents[1] / "docs"


def traces() -> dict[str, Any]:
    return json.loads((DOCS / "gpu_traces.json").read_text())


def test_the_page_is_the_model_of_the_traces() -> None:
    measured = json.loads((DOCS / "gpu_h200.json").read_text())
    assert (DOCS / "gpu.md").read_text() == gpu_model.render(traces(), measured=measured)


def test_every_trainer_and_case_is_traced() -> None:
    stored = traces()
    assert set(stored) == set(sidebyside.TRAINERS)
    for t in stored.values():
        cases = {(c["b"], c["keys"]) for c in t["cases"]}
        assert cases == {(b, k) for b in sidebyside.SIZES for k in sidebyside.KEYS}
        assert all(c[side]["mixed"] == 0 for c in t["cases"] for side in ("rebatch", "theirs"))


def test_a_missing_trainer_is_refused(tmp_path: Path) -> None:
    partial = {k: v for k, v in traces().items() if k != "areal"}
    with pytest.raises(ValueError, match="no traces of areal"):
        gpu_model.render(partial)
    path = tmp_path / "traces.json"
    path.write_text(json.dumps(partial))
    assert gpu_model.main(["--write", str(tmp_path / "gpu.md"), "--traces", str(path)]) == 2
    assert not (tmp_path / "gpu.md").exists()


def test_the_model_adds_launches_bytes_and_reads() -> None:
    model = gpu_model.Model(bandwidth_bytes_s=1e9, per_launch_s=1e-6, sync_s=1e-5)
    assert gpu_model.predict({"launches": 3, "bytes": 2e9, "syncs": 1}, model) == pytest.approx(2.000013)


@pytest.mark.parametrize("trainer", sidebyside.TRAINERS)
def test_rebatchs_side_is_todays(trainer: str) -> None:
    """B = 8, one key, traced again here: the stored counts, where torch's version (major.minor) is the
    one the traces were made with (the trainers' environments pin their own)."""
    stored = traces()[trainer]
    if stored["torch"].split(".")[:2] != torch.__version__.split(".")[:2]:
        pytest.skip(f"traced with torch {stored['torch']}, this is {torch.__version__}")
    fc = FakeCuda()
    pair = sidebyside.pair(trainer, 8, 1, functools.partial(fake_like, fc=fc))
    with fc:
        pair.ours()
    now = fc.trace()
    (case,) = [c for c in stored["cases"] if (c["b"], c["keys"]) == (8, 1)]
    assert (len(now.launches), now.bytes, now.syncs) == tuple(
        case["rebatch"][k] for k in ("launches", "bytes", "syncs")
    )
