"""``on`` mode can be seen (issue 42, item 7): with rebatch in charge, each replaced function counts its
calls, rows, keys witnessed and errors (`torch_impl.integrations._counts.Counts`, in `Integration` for
every trainer), in ``stats()`` and in the process's report, which ``rebatch report`` reads.

On a stand-in trainer module (no trainer installed). b383f49 reported ``calls: 0`` in ``on`` mode."""

from __future__ import annotations

import json
import sys
import threading
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from tensordict import NonTensorData, TensorDict

import torch_impl
from property_tests.data import jagged
from rebatch.report import main as report_main
from ref.errors import NotAPermutationError
from torch_impl.integrations import _integration, _patch, verl
from torch_impl.integrations._counts import Counts

FAKE = "rebatch_fake_trainer"


def _step(indices: Any = ((2, 0), (1, 3))) -> tuple[list[Any], list[list[int]], TensorDict]:
    outs = [
        {"model_output": {"lp": jagged(torch.arange(5.0), [2, 3]), "v": torch.tensor([1.0, 2.0])}},
        {"model_output": {"lp": jagged(torch.arange(5.0, 9.0), [1, 3]), "v": torch.tensor([3.0, 4.0])}},
    ]
    data = TensorDict({"input_ids": jagged(torch.arange(9), [3, 1, 2, 3])}, batch_size=[4])
    data["use_dynamic_bsz"] = NonTensorData(True)
    return outs, [list(p) for p in indices], data


def _theirs(output_lst: Any, indices: Any, data: Any) -> str:
    return "theirs"


def _append(data: dict[str, list[Any]], new: dict[str, Any]) -> None:
    for k, v in new.items():
        data.setdefault(k, []).append(v)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A trainer module holding two names, and its `Integration` (the one verl, AReaL and SkyRL use)."""
    module = types.ModuleType(FAKE)
    module.postprocess_batch_func = _theirs  # type: ignore[attr-defined]
    module.append_to_dict = _append  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, FAKE, module)

    def table(row: str) -> list[_integration.Replaced]:
        post = verl.INTEGRATION.row("postprocess_batch_func")  # verl's adapters: its rows rule
        return [post._replace(module=FAKE), _integration.Replaced(FAKE, "append_to_dict", _append)]

    versions = _patch.Versions(FAKE, {"1.0": None}, fallback="1.0")
    monkeypatch.setattr(versions, "installed", lambda: "1.0")
    integration = _integration.Integration(FAKE, versions, table, label="fake")
    yield module, integration
    integration.uninstall()


def test_on_mode_counts_calls_rows_keys_witnessed_and_errors(fake: Any, tmp_path: Path) -> None:
    module, integration = fake
    report = tmp_path / "rebatch-areal-host-20260101T000000Z-0000abcd-1.json"
    integration.install(None, mode="on", lazy=False, force=False, report=str(report))
    assert module.postprocess_batch_func.__wrapped__ is torch_impl.postprocess_batch_func
    got = module.postprocess_batch_func(*_step())
    assert set(got["model_output"]) == {"lp", "v"}
    module.postprocess_batch_func(*_step())
    with pytest.raises(NotAPermutationError):  # re-raised unchanged, and counted
        module.postprocess_batch_func(*_step(((2, 0), (1, 2))))
    module.append_to_dict({}, {"a": 1})
    s = integration.stats()
    assert s["mode"] == "on"
    post = s["by_name"]["postprocess_batch_func"]
    assert (post["calls"], post["rows"], post["errors"]) == (3, 12, 1)
    assert post["keys_witnessed"] == 2  # "lp" bound to input_ids in each good call; the bad one refused first
    assert s["by_name"]["append_to_dict"] == {
        "calls": 1,
        "rows": 0,
        "keys_witnessed": 0,
        "errors": 0,
        "sampled": 0,
        "differences": 0,
        "defects": 0,
    }
    assert (s["calls"], s["errors"], s["defects"]) == (4, 1, 0)
    saved = json.loads(report.read_text())  # written at the error and at each power-of-two call
    assert saved["mode"] == "on"
    assert saved["by_name"]["postprocess_batch_func"]["errors"] == 1
    assert report_main([str(tmp_path)]) == 0  # an on process, shown by rebatch report
    integration.uninstall()
    assert module.postprocess_batch_func is _theirs
    assert integration.stats()["by_name"]["postprocess_batch_func"]["calls"] == 3  # kept for stats


def test_counting_reads_no_device_value(fake: Any) -> None:
    """Rows come from the indices' lengths, keys witnessed from the witness's own count: a step on the
    meta device (where any read of a value fails) is counted."""
    module, integration = fake
    integration.install(None, mode="on", lazy=False, force=False)
    outs, indices, data = _step()
    meta = [{"model_output": {k: v.to("meta") for k, v in o["model_output"].items()}} for o in outs]
    module.postprocess_batch_func(meta, indices, data)
    post = integration.stats()["by_name"]["postprocess_batch_func"]
    assert (post["calls"], post["rows"], post["errors"]) == (1, 4, 0)


def test_threads_count_their_own_keys(fake: Any) -> None:
    module, integration = fake
    integration.install(None, mode="on", lazy=False, force=False)

    def run() -> None:
        for _ in range(20):
            module.postprocess_batch_func(*_step())

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    post = integration.stats()["by_name"]["postprocess_batch_func"]
    assert (post["calls"], post["rows"], post["keys_witnessed"]) == (80, 320, 80)


def test_stats_of_an_on_install_says_on_and_counts() -> None:
    """`torch_impl.integrations.stats()` gives an on install's counters (b383f49: calls 0, always)."""
    from torch_impl import integrations
    from torch_impl.integrations import skyrl

    assert not skyrl.installed()
    it = types.SimpleNamespace(
        _microbatches=[[1], [0]],
        _num_padding_microbatches=0,
        _token_counts=[1, 1],
        data=types.SimpleNamespace(batch_size=2),
    )
    counts = Counts("skyrl", "0.4.0")
    counted = counts.wrap(
        "reorder_and_combine_items",
        skyrl.reorder_and_combine_items,
        skyrl.INTEGRATION.row("reorder_and_combine_items").rows,
    )
    assert counted(it, [["b"], ["a"]]) == ["a", "b"]
    state = skyrl.INTEGRATION
    before = state.kept
    state.kept = counts
    try:
        got = integrations.stats()["skyrl"]
        assert (got["mode"], got["calls"], got["rows"]) == ("on", 1, 2)
    finally:
        state.kept = before
