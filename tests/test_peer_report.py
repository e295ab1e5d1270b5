"""The trainers' adapters and the report's machinery, run here with rebatch's drop-in on both sides (the
trainers themselves are in their own environments: ``tests/test_peers.py``)."""

from __future__ import annotations

import json

import pytest

from property_tests import conformance
from property_tests.peer_report import (
    LIMIT,
    OUTCOMES_BEGIN,
    OUTCOMES_END,
    _defects,
    drawn,
    outcomes_section,
    render,
)
from property_tests.peers import PEERS, NotExpressible, differential, outcome
from property_tests.strategies import microbatch_outputs

#: Independent of torch's release and of the trainers: run once, in CI's main lane (the pins lane deselects
#: it, .ci/lanes.sh)
pytestmark = pytest.mark.main_lane_only


def _self_peer(name: str):
    peer = PEERS[name]
    return peer._replace(theirs=peer.ours)


def test_the_areal_adapter_round_trips_drawn_calls() -> None:
    peer = _self_peer("areal")
    calls = drawn(microbatch_outputs(**peer.bounds, use_dynamic_bsz=None), 60)
    assert len(calls) == 60
    assert differential(peer, calls) == []


def test_a_wrong_result_is_a_difference() -> None:
    import torch

    peer = _self_peer("areal")
    ours = peer.ours()

    def off_by_one(outputs, seqlens, mb_list, aggregate_fn=torch.cat):
        out = ours["reorder_and_pad_outputs"](outputs, seqlens, mb_list)
        return out.roll(1, 0) if out.shape[0] > 1 else out

    broken = peer._replace(theirs=lambda: {"reorder_and_pad_outputs": off_by_one})
    calls = drawn(microbatch_outputs(**{**peer.bounds, "min_rows": 3, "max_keys": 1}), 20)
    assert len(differential(broken, calls)) >= len(calls) // 2  # rows that happen to be equal roll unseen


def test_outcomes_name_what_happened() -> None:
    from ref import errors

    def raise_(err: Exception):
        def f():
            raise err

        return f

    assert outcome(lambda: 1) == "silent"
    assert outcome(raise_(errors.NotAPermutationError("x"))) == "raises NotAPermutationError"
    assert outcome(raise_(IndexError("x"))) == "crashes: IndexError"
    assert outcome(raise_(NotExpressible("x"))) == "n/a"


def test_the_report_renders_and_checks_its_table(tmp_path, capsys) -> None:
    peer = _self_peer("areal")
    report = {
        "name": "areal",
        "label": peer.label,
        "torch": "x",
        "python": "3.11",
        "differential": {"cases": 1, "differences": []},
        "properties": {"postprocess_agrees": None},
        "defects": _defects(peer, peer.ours(), peer.ours()),
        "speed": [
            {"B": 1, "mean_length": 1, "M": 1, "theirs_ms": 1.0, "ours_ms": 0.5, "speedup": 2.0, "same": None}
        ],
    }
    assert all(
        d["ours"] in ("n/a", f"raises {d['expected']}") or (d["limit"] and d["ours"] == "silent")
        for d in report["defects"]
    )
    source = tmp_path / "areal.json"
    source.write_text(json.dumps(report))
    page = tmp_path / "peers.md"
    assert conformance.main(["--report", str(page), str(source)]) == 0
    text = page.read_text()
    assert text == render([report])
    assert "\n".join(outcomes_section([report])) in text
    assert conformance.main(["--report", str(page), "--check", str(source)]) == 0
    page.write_text(text.replace("raises NotAPermutationError", "silent", 1))
    assert conformance.main(["--report", str(page), "--check", str(source)]) == 1
    assert OUTCOMES_BEGIN in text
    assert OUTCOMES_END in text
    capsys.readouterr()


def test_a_trainer_that_is_not_installed_is_said_so(capsys) -> None:
    pytest.importorskip("torch")
    try:
        PEERS["skyrl"].theirs()
    except ImportError:
        assert conformance.main(["--candidate", "skyrl", "--cases", "1"]) == 2
        assert "not installed" in capsys.readouterr().out
    else:
        pytest.skip("SkyRL is installed here")


def _fixed_length_rows(name: str) -> list[dict]:
    peer = _self_peer(name)
    return [d for d in _defects(peer, peer.ours(), peer.ours()) if d["name"].startswith("fixed_length_")]


def test_fixed_length_misalignments_raise_where_the_split_is_carried() -> None:
    """verl's call carries the split's provenance (``data``, the batch rebatch's split recorded): its
    drop-in raises on each of the table's fixed-length misalignments, no known limit claimed."""
    rows = _fixed_length_rows("verl")
    assert len(rows) == 6
    assert all(d["ours"] == "raises MisalignmentError" and d["limit"] is None for d in rows), rows


def test_where_provenance_cannot_reach_the_report_measures_silent_and_says_so() -> None:
    """AReaL's call cannot carry the split's provenance: rebatch's drop-in is measured silent there, and the
    table of outcomes says so (a known limit), never a pass."""
    rows = _fixed_length_rows("areal")
    assert len(rows) == 6
    assert all(d["ours"] == "silent" and d["limit"] == LIMIT for d in rows), rows
    report = {"label": "AReaL", "defects": rows}
    table = "\n".join(outcomes_section([report]))
    assert table.count(f"| silent | silent (known limit: {LIMIT}) |") == 6
