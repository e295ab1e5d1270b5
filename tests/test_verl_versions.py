"""Which verl releases `torch_impl.integrations.verl.install` supports and what it does on each: the one
table (`VERSIONS`), the gate (another release refused, naming it and the supported ones, unless
``force=True``), the plan it logs, what it returns (`Installed`), and the plugin's path through the same gate.
The installed
version is monkeypatched, so these run without verl (``lazy=True`` installs import nothing of it); what
each row does against verl itself is the differential's (tests/test_verl_differential.py), on every
release CI installs."""

from __future__ import annotations

import functools
import logging

import pytest

import rebatch_startup
import torch_impl
from ref.errors import RebatchError, UnsupportedSettingError
from torch_impl.integrations import verl as integration
from torch_impl.integrations._patch import Versions

SUPPORTED = ["0.8.0", "0.9.0", "0.9.1"]
ONE_PASS = {"prepare_micro_batches", "rearrange_micro_batches"}


@pytest.fixture(autouse=True)
def _restored(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(rebatch_startup.VERL_ENV, raising=False)
    yield
    integration.uninstall()


def _release(monkeypatch: pytest.MonkeyPatch, version: str | None) -> None:
    """Make `install` read ``version`` as verl's installed version (None: no metadata)."""
    monkeypatch.setattr(integration.INTEGRATION.versions, "installed", lambda: version)


def test_the_table_names_every_supported_release_and_what_it_replaces() -> None:
    assert list(integration.VERSIONS) == SUPPORTED
    for version in SUPPORTED:
        chosen = integration.plan(version)
        assert (chosen.verl, chosen.row) == (version, version)
        assert chosen.replaced == tuple(f"{module}.{name}" for name, module in integration.NAMES.items())
        assert chosen.left == ()
    assert integration.plan("0.9.1").bound == {}
    for version in ("0.8.0", "0.9.0"):  # verl's one-pass count rule, before verl PR #7553
        assert integration.plan(version).bound == {name: {"one_pass": True} for name in sorted(ONE_PASS)}


@pytest.mark.parametrize("version", SUPPORTED)
def test_each_release_gets_its_functions_the_same_objects_every_call(version: str) -> None:
    table = integration.replacements(version=version)
    assert table == integration.replacements(version=version)  # identity: install's swap and undo rely on it
    for (module, name), ours in table.items():
        assert integration.NAMES[name] == module
        plain = getattr(torch_impl, name)
        if version != "0.9.1" and name in ONE_PASS:
            assert isinstance(ours, functools.partial)
            assert (ours.func, ours.keywords, ours.__wrapped__) == (plain, {"one_pass": True}, plain)
        else:
            assert ours is plain


def test_the_one_pass_rule_may_exceed_the_budget_and_0_9_1s_does_not() -> None:
    import torch
    from tensordict import TensorDict

    from property_tests.data import jagged

    lengths = [7, 7, 7, 1, 1, 1]
    batch = TensorDict({"input_ids": jagged(torch.arange(24), lengths)}, batch_size=[6])
    for version, count, most in (("0.8.0", 2, 14), ("0.9.0", 2, 14), ("0.9.1", 3, 8)):
        fn = integration.replacements(version=version)[
            integration.SEQLEN_BALANCING, "rearrange_micro_batches"
        ]
        parts = fn(batch, 12)[1]
        assert (len(parts), max(sum(lengths[i] for i in p) for p in parts)) == (count, most), version
    grouped = integration.replacements(version="0.8.0")[
        integration.SEQLEN_BALANCING, "rearrange_micro_batches"
    ]
    parts = grouped(batch, 12, force_group_size=2)[1]  # rows 0 and 1 a group of 14 tokens: not refused
    assert len(parts) == 2
    assert [0, 1] in [p[:2] for p in parts]
    with pytest.raises(torch_impl.errors.TokenBudgetError, match="A forced group exceeds max_token_len"):
        torch_impl.rearrange_micro_batches(batch, 12, force_group_size=2)


@pytest.mark.parametrize("version", ["0.7.0", "0.9.2", "1.0.0.dev0", None])
def test_another_release_is_refused_naming_it_and_the_supported_ones(
    monkeypatch, version: str | None
) -> None:
    _release(monkeypatch, version)
    with pytest.raises(UnsupportedSettingError) as caught:
        integration.install(lazy=True)
    message = str(caught.value)
    assert (f"verl {version} " if version else "version unknown") in message
    assert "supported: 0.8.0, 0.9.0, 0.9.1" in message
    assert "force=True" in message
    assert isinstance(caught.value, RebatchError)
    assert not integration.installed()
    with pytest.raises(UnsupportedSettingError):
        integration.plan(version) if version else integration.plan()


def test_force_installs_0_9_1s_replacements_with_a_warning(monkeypatch, caplog) -> None:
    _release(monkeypatch, "0.9.2")
    with caplog.at_level(logging.INFO, logger="rebatch"):
        chosen = integration.install(lazy=True, force=True)
    assert integration.installed()
    assert (chosen.trainer, chosen.version, chosen.row, chosen.mode) == ("verl", "0.9.2", "0.9.1", "on")
    warnings = [
        r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name == "rebatch"
    ]
    assert len(warnings) == 1
    assert "verl 0.9.2 is not supported" in warnings[0]
    assert "0.9.1" in warnings[0]
    assert integration.plan("0.9.2", force=True) == integration.plan("0.9.1")._replace(verl="0.9.2")


@pytest.mark.parametrize("mode", ["on", "shadow"])
def test_install_logs_one_info_line_saying_what_it_replaces_and_leaves(
    monkeypatch, caplog, mode: str
) -> None:
    _release(monkeypatch, "0.8.0")
    with caplog.at_level(logging.INFO, logger="rebatch"):
        chosen = integration.install(lazy=True, mode=mode)
        assert (
            integration.install(lazy=True, mode="on") == chosen
        )  # idempotent: the same install, no second line
    assert (chosen.version, chosen.row, chosen.mode) == ("0.8.0", "0.8.0", mode)
    assert integration.mode() == mode
    lines = [r.getMessage() for r in caplog.records if r.name == "rebatch" and r.levelno == logging.INFO]
    assert lines == [integration.plan().describe("shadows" if mode == "shadow" else "replaces")]
    how = "shadows" if mode == "shadow" else "replaces"
    assert lines[0].startswith(
        f"rebatch: verl 0.8.0: rebatch {how} verl's verl.workers.engine.utils.postprocess_batch_func"
    )
    assert "rearrange_micro_batches with one_pass=True" in lines[0]
    assert lines[0].endswith("left as verl's: none")
    integration.uninstall()
    _release(monkeypatch, "0.9.1")
    assert integration.install(lazy=True).row == "0.9.1"  # after uninstall, read again


def test_the_plugin_refuses_another_release_loudly_under_on_and_logs_it_under_shadow(
    monkeypatch, caplog
) -> None:
    _release(monkeypatch, "0.7.0")
    monkeypatch.setenv(rebatch_startup.VERL_ENV, "on")
    with (
        caplog.at_level(logging.ERROR, logger="rebatch"),
        pytest.raises(UnsupportedSettingError, match=r"0\.7\.0"),
    ):
        rebatch_startup.activate("verl", again=True)
    assert any(
        "could not install rebatch in verl" in r.getMessage() and "0.7.0" in r.getMessage()
        for r in caplog.records
    )
    assert not integration.installed()
    caplog.clear()
    monkeypatch.setenv(rebatch_startup.VERL_ENV, "shadow")  # shadow never stops the run: logged only
    with caplog.at_level(logging.ERROR, logger="rebatch"):
        rebatch_startup.activate("verl", again=True)
    assert any("UnsupportedSettingError" in r.getMessage() for r in caplog.records)
    assert not integration.installed()
    _release(monkeypatch, "0.9.0")
    monkeypatch.setenv(rebatch_startup.VERL_ENV, "on")
    rebatch_startup.activate("verl", again=True)  # a supported release: installed lazily, with 0.9.0's row
    assert integration.installed()
    assert integration.install().row == "0.9.0"


def test_versions_reads_metadata_and_checks_its_fallback() -> None:
    assert Versions("rebatch-no-such-distribution", {"1": 1}, fallback="1").installed() is None
    assert Versions("pytest", {"1": 1}, fallback="1").installed() == pytest.__version__
    with pytest.raises(ValueError, match="fallback"):
        Versions("verl", {"1": 1}, fallback="2")
    assert Versions("verl", {"1": "a", "2": "b"}, fallback="2").pick("3", force=True) == ("2", "b")
