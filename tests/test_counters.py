"""rebatch's counters tell the truth: zeroed in a forked child (every counter, one fork mechanism), one
report writer per path and process (a reinstall replaces it), the witness switch restored whatever the
order of uninstalls, every skipped check counted by reason, and a forced kernel that cannot run raises."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import types
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch

import torch_impl
from property_tests.data import jagged
from ref import errors
from torch_impl.integrations import areal, skyrl, verl

ROOT = Path(__file__).resolve().parents[1]
#: Every reason a check is skipped (`torch_impl._tally.SKIPS`).
REASONS = ("calls_without_witness", "skipped_unreadable_witness", "skipped_device_offsets")


def _python(code: str, tmp_path: Path) -> str:
    """``code`` in a fresh interpreter (a fork here would make JAX warn), its stdout."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_forked_child_starts_every_counter_at_zero(tmp_path: Path) -> None:
    """The witness's counters, the skips' and an install's (its ``caught`` too), after calls in the parent:
    all zero in a forked child, whose report counts its own calls only."""
    out = _python(
        """
        import json, os
        import numpy as np
        import torch_impl
        from torch_impl._alignment import Witness, read_witness
        from torch_impl.integrations._counts import Counts

        Witness(np.array([1, 2]), 2, None, [2], ()).verdict()  # a witnessed call
        read_witness({"input_ids": None})  # no lengths
        read_witness(object())  # unreadable
        counts = Counts("verl", None)
        counts.wrap("f", lambda x: x, rows=lambda x: 1 // 0)(1)  # a call whose rows cannot be counted
        parent = torch_impl.witness_stats()
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                stats = counts.stats()
                os.write(
                    w, json.dumps([torch_impl.witness_stats(), stats["calls"], stats.get("caught")]).encode()
                )
            finally:
                os._exit(0)
        os.close(w)
        os.waitpid(pid, 0)
        print(json.dumps([parent, json.loads(os.read(r, 1 << 16))]))
        """,
        tmp_path,
    )
    parent, (child, calls, caught) = json.loads(out)
    assert parent["calls"] == 1
    assert child == dict.fromkeys(parent, 0)
    assert (calls, caught) == (0, {})
    assert (parent["calls_without_witness"], parent["skipped_unreadable_witness"]) == (1, 1)


def test_a_reinstall_replaces_the_report_writer_of_its_path(tmp_path: Path) -> None:
    """Two installs writing one report in turn: at exit the report is the second's counters (before: the
    first's writer, registered at exit and never removed, overwrote it)."""
    _python(
        """
        from torch_impl.integrations._counts import Counts

        first = Counts("verl", None, report="r.json")
        f = first.wrap("f", lambda: None)
        for _ in range(5):
            f()
        second = Counts("verl", None, report="r.json")
        second.wrap("f", lambda: None)()
        """,
        tmp_path,
    )
    assert json.loads((tmp_path / "r.json").read_text())["calls"] == 1


def test_uninstalls_in_any_order_put_the_witness_switch_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """verl sets the switch off and unbinds ``a``, AReaL unbinds ``b``; verl uninstalled first leaves AReaL's
    setting in force, and the last uninstall puts the switch as it was before both."""
    for integration, release in ((verl, "0.9.1"), (areal, "1.0.4")):
        monkeypatch.setattr(integration.INTEGRATION.versions, "installed", lambda release=release: release)
    before = torch_impl.witness_config()
    try:
        verl.install(lazy=True, witness=False, unbound=["a"])
        areal.install(lazy=True, unbound=["b"])
        assert torch_impl.witness_config() == (False, frozenset({"b"}))
        verl.uninstall()
        assert torch_impl.witness_config() == (before[0], frozenset({"b"}))
        areal.uninstall()
        assert torch_impl.witness_config() == before
    finally:
        verl.uninstall()
        areal.uninstall()
        torch_impl.set_witness(before[0], unbound=before[1])


class _Batch(dict[str, Any]):
    batch_size = 2


def _skyrl_iterator(data: Any) -> Any:
    return types.SimpleNamespace(
        _microbatches=[[1], [0]], _num_padding_microbatches=0, _token_counts=[1, 1], data=data
    )


@pytest.mark.parametrize(
    ("reason", "call"),
    [
        ("calls_without_witness", lambda: torch_impl.read_witness({"input_ids": torch.zeros(2, 3)})),
        ("skipped_unreadable_witness", lambda: torch_impl.read_witness(object())),
        (
            "calls_without_witness",  # AReaL: no micro-batches' cu_seqlens
            lambda: areal.reorder_and_pad_outputs(
                [torch.arange(3.0)],
                [1, 2],
                types.SimpleNamespace(forward_indices=[1, 0], backward_indices=[1, 0]),
            ),
        ),
        (
            "calls_without_witness",  # SkyRL: no response_mask
            lambda: skyrl.reorder_and_combine_items(
                _skyrl_iterator(_Batch()), [[{"lp": [1.0]}], [{"lp": [2.0]}]]
            ),
        ),
        (
            "skipped_unreadable_witness",  # SkyRL: a batch without ``get``
            lambda: skyrl.reorder_and_combine_items(
                _skyrl_iterator(types.SimpleNamespace(batch_size=2)), [[{"lp": [1.0]}], [{"lp": [2.0]}]]
            ),
        ),
        (
            "skipped_device_offsets",  # jagged offsets off the CPU: trusted, counted
            lambda: torch_impl.concat([jagged(torch.zeros(3), [1, 2]).to("meta")] * 2),
        ),
    ],
    ids=[
        "verl-no-lengths",
        "verl-unreadable",
        "areal-no-lengths",
        "skyrl-no-lengths",
        "skyrl-unreadable",
        "device",
    ],
)
def test_every_skipped_check_is_counted_by_reason(reason: str, call: Any) -> None:
    before = torch_impl.witness_stats()
    call()
    after = torch_impl.witness_stats()
    assert {k: after.get(k, 0) - before.get(k, 0) for k in REASONS} == {k: int(k == reason) for k in REASONS}
    assert verl.stats()["witness"][reason] == after[reason]  # in every report
    from torch_impl._tally import SKIPS

    assert tuple(SKIPS) == REASONS


def _recording(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    ran: list[str] = []
    for name, kernel in torch_impl.KERNELS.items():
        run = mock.Mock(side_effect=lambda plan, name=name, run=kernel.run: ran.append(name) or run(plan))
        monkeypatch.setitem(torch_impl.KERNELS, name, kernel._replace(run=run))
    return ran


@pytest.mark.parametrize(
    "name", [k for k, v in torch_impl.KERNELS.items() if v.permutes and "jagged" in v.layouts]
)
def test_a_forced_kernel_runs_where_it_fits_and_raises_where_it_does_not(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    ran = _recording(monkeypatch)
    parts = [jagged(torch.arange(3.0), [1, 2]), jagged(torch.arange(2.0), [2])]
    with torch_impl.use_settings(kernel=name):
        got = torch_impl.restore(torch_impl.concat(parts), [[2, 0], [1]])
        assert ran == ["concat", name]  # concat's key is in order: not the forced kernel's to move
        assert [r.tolist() for r in got.unbind()] == [[1.0, 2.0], [0.0, 1.0], [0.0]]
        on_meta = [p.to("meta") for p in parts]
        grad = [p.detach().requires_grad_() for p in parts]
        for where in (on_meta, grad):
            if torch_impl.KERNELS[name].applies is torch_impl.KERNELS["element_indices"].applies:
                continue  # applies everywhere
            del ran[:]
            with pytest.raises(errors.UnsupportedSettingError, match=f"Settings.kernel '{name}' cannot move"):
                torch_impl.restore(torch_impl.concat(where), [[2, 0], [1]])
            assert ran == ["concat"]  # nothing else ran in its place
