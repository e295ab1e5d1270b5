"""``install(mode="shadow")``: verl's functions stay in charge (the trainer gets verl's results), rebatch's
checks run on every call and its own function on sampled ones, compared bit for bit; defects verl
passes silently are reported (or raised), counted by ``stats()``. Needs verl (skipped without it)."""

from __future__ import annotations

import contextlib
import copy
import importlib
import json
import logging
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from tensordict import TensorDict

import rebatch_startup
import torch_impl
from property_tests import verl_oracle as vo
from property_tests.data import jagged
from rebatch.check import _safe_load
from torch_impl.integrations import verl as integration
from torch_impl.integrations._shadow import Shadow

VERL = vo.verl_or_skip()
ENGINE = "verl.workers.engine.fsdp.transformer_impl"


def _engine():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return importlib.import_module(ENGINE)


@pytest.fixture(autouse=True)
def _restored():
    yield
    integration.uninstall()


def _duplicate_step():
    """A step whose indices repeat row 1 (and miss row 2): verl reorders it silently."""
    outs = [
        {"model_output": {"lp": jagged(torch.arange(3.0), [1, 2])}},
        {"model_output": {"lp": jagged(torch.ones(1), [1])}},
    ]
    return outs, [[0, 1], [1]], vo.make_data({})


def _activate(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    """What verl does in every process that imports it: load the plugin, which reads ``REBATCH_VERL``."""
    monkeypatch.setenv("REBATCH_VERL", value)
    rebatch_startup.activate("verl", again=True)


def test_500_engine_steps_agree_and_the_trainer_gets_verls_results(caplog, monkeypatch) -> None:
    """``REBATCH_VERL=shadow:1`` (every call compared): 500 engine-style steps, 0 differences."""
    engine = _engine()
    theirs = engine.postprocess_batch_func
    _activate(monkeypatch, "shadow:1")
    assert engine.postprocess_batch_func is not theirs
    assert engine.postprocess_batch_func.__wrapped__ is theirs

    @settings(max_examples=500, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(vo.engine_calls(metric_cls=VERL.metric.Metric))
    def step(call: vo.EngineCall) -> None:
        data = vo.make_data(call.settings)
        alone = theirs(copy.deepcopy(call.output_lst), call.indices, data)  # verl without rebatch
        got = engine.postprocess_batch_func(call.output_lst, call.indices, data)
        assert vo.same(got, alone) is None

    with caplog.at_level(logging.DEBUG, logger="rebatch"):
        step()
    assert not [r for r in caplog.records if r.name.startswith("rebatch")]  # a normal call logs nothing
    s = integration.stats()
    post = s["by_name"]["postprocess_batch_func"]
    assert post["calls"] >= 500
    assert post["sampled"] == post["calls"]
    assert (s["differences"], s["defects"], s["errors"]) == (0, 0, 0), s["messages"]
    assert s["by_name"]["append_to_dict"]["calls"] > 0  # verl's own helper, shadowed too
    assert s["verl_seconds"] > 0
    assert s["trainer_seconds"] == s["verl_seconds"]  # the trainer-neutral name
    assert s["trainer"] == "verl"
    assert s["mode"] == "shadow"
    assert s["rebatch_seconds"] > 0


def test_the_partitioners_agree_in_shadow_mode() -> None:
    """verl's split-side names through their modules, every call sampled: no difference reported."""
    integration.install(mode="shadow", sample=1.0)
    sb = VERL.seqlen_balancing

    @settings(max_examples=200, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(vo.partition_calls())
    def step(call: vo.PartitionCall) -> None:
        lengths = call.lengths
        n = len(lengths)
        batch = TensorDict(
            {"input_ids": jagged(torch.arange(sum(lengths)), lengths), "adv": torch.arange(float(n))},
            batch_size=[n],
        )
        k = min(n, call.min_num_micro_batch or 1)
        for fn in (
            lambda: sb.rearrange_micro_batches(
                batch, call.max_token_len, min_num_micro_batch=call.min_num_micro_batch
            ),
            lambda: sb.get_seqlen_balanced_partitions(lengths, k, False),
        ):
            with contextlib.suppress(Exception):  # verl refuses it: its exception is the trainer's
                fn()

    step()
    s = integration.stats()
    assert s["by_name"]["get_seqlen_balanced_partitions"]["sampled"] > 100
    assert s["by_name"]["rearrange_micro_batches"]["sampled"] > 100
    assert s["differences"] == 0, s["messages"]


def test_a_duplicate_index_is_reported_as_misaligned(caplog, tmp_path) -> None:
    engine = _engine()
    outs, indices, data = _duplicate_step()
    alone = engine.postprocess_batch_func(copy.deepcopy(outs), indices, data)  # verl alone
    dump = tmp_path / "step.pt"
    integration.install(mode="shadow", dump=str(dump))
    with caplog.at_level(logging.ERROR, logger="rebatch.shadow"):
        got = engine.postprocess_batch_func(outs, indices, data)
    assert vo.same(got, alone) is None  # verl's (misaligned) result, unchanged
    lines = {r.getMessage().split(",")[0]: r.getMessage() for r in caplog.records}
    line = lines.pop("verl postprocess_batch_func")
    assert "call 0: verl's result of this step is misaligned in keys ['lp']" in line
    assert "NotAPermutationError" in line
    assert "index 1 duplicates" in line
    assert list(lines) == ["verl restore_dynamic_batch"]  # verl's own helper, shadowed too, refused as well
    assert integration.stats()["by_name"]["postprocess_batch_func"]["defects"] == 1
    saved = _safe_load(str(dump))  # the format `rebatch check --dump` reads, loaded as it loads it
    assert (saved["trainer"], saved["function"]) == (
        "verl",
        "verl.workers.engine.utils.postprocess_batch_func",
    )
    assert saved["inputs"]["indices"] == indices


def test_rebatch_verl_shadow_reports_a_duplicate_index_step_with_its_key_and_row(caplog, monkeypatch) -> None:
    """``REBATCH_VERL=shadow`` (the default sample): the first step is always compared and checked."""
    engine = _engine()
    outs, indices, data = _duplicate_step()
    _activate(monkeypatch, "shadow")
    with caplog.at_level(logging.ERROR, logger="rebatch.shadow"):
        engine.postprocess_batch_func(outs, indices, data)
    line = next(
        r.getMessage() for r in caplog.records if r.getMessage().startswith("verl postprocess_batch_func")
    )
    assert "verl's result of this step is misaligned in keys ['lp']" in line
    assert "index 1 duplicates" in line  # the row, named with its micro-batch and position
    assert integration.stats()["defects"] >= 1


def test_on_defect_raise_stops_the_step() -> None:
    engine = _engine()
    integration.install(mode="shadow", on_defect="raise")
    with pytest.raises(torch_impl.errors.NotAPermutationError, match="index 1 duplicates"):
        engine.postprocess_batch_func(*_duplicate_step())


def test_stats_count_sampled_calls_and_write_the_report(tmp_path) -> None:
    engine = _engine()
    report = tmp_path / "shadow.json"
    integration.install(mode="shadow", sample=0.25, report=str(report))
    outs = [{"model_output": {"lp": jagged(torch.arange(3.0), [1, 2])}}]
    for _ in range(9):
        engine.postprocess_batch_func(outs, [[1, 0]], vo.make_data({}))
    s = integration.stats(json_path=str(tmp_path / "now.json"))
    post = s["by_name"]["postprocess_batch_func"]
    assert (post["calls"], post["sampled"], post["differences"], post["defects"]) == (
        9,
        3,
        0,
        0,
    )  # calls 0, 4, 8
    assert json.loads(report.read_text())["by_name"]["postprocess_batch_func"]["sampled"] == 3
    assert json.loads((tmp_path / "now.json").read_text())["calls"] == s["calls"]


def test_uninstall_restores_verls_functions() -> None:
    engine = _engine()
    theirs = engine.postprocess_batch_func, VERL.seqlen_balancing.rearrange_micro_batches
    integration.install(mode="shadow")
    integration.install()  # idempotent: the shadow stays
    assert engine.postprocess_batch_func.__wrapped__ is theirs[0]
    integration.uninstall()
    assert (engine.postprocess_batch_func, VERL.seqlen_balancing.rearrange_micro_batches) == theirs


def test_a_difference_is_logged_with_its_row_and_both_values(caplog) -> None:
    """The Shadow itself, with a candidate that differs: verl's object comes back, one ERROR line."""
    shadow = Shadow(1.0, "log", None)
    control = torch.tensor([1.0, 2.0])
    wrapped = shadow.wrap("f", lambda: control, lambda: torch.tensor([1.0, 3.0]))
    with caplog.at_level(logging.ERROR, logger="rebatch.shadow"):
        assert wrapped() is control
    (line,) = [r.getMessage() for r in caplog.records]
    assert "verl f, call 0: rebatch and verl differ" in line
    assert "values differ at row 1: 3.0 vs 2.0" in line
    assert shadow.stats()["differences"] == 1


def test_rebatchs_other_exceptions_are_recorded_not_raised(caplog) -> None:
    def broken() -> None:
        raise RuntimeError("a bug of rebatch's")

    shadow = Shadow(1.0, "log", None)
    wrapped = shadow.wrap("f", lambda: 7, broken)
    with caplog.at_level(logging.WARNING, logger="rebatch.shadow"):
        assert wrapped() == 7
    assert shadow.stats()["errors"] == 1
    assert "a bug of rebatch's" in caplog.text
    raising = Shadow(1.0, "raise", None)
    assert (
        raising.wrap("f", lambda: 7, broken)() == 7
    )  # only a defect is raised (tests/test_shadow_faults.py)
    assert raising.stats()["errors"] == 1
    with pytest.raises(torch_impl.errors.UnsupportedSettingError):
        Shadow(2.0, "log", None)


def test_a_failing_dump_or_report_never_breaks_the_run(tmp_path, caplog) -> None:
    def full_disk() -> None:
        raise OSError("no space left")

    shadow = Shadow(1.0, "log", str(tmp_path / "missing" / "report.json"))
    wrapped = shadow.wrap("f", lambda: 1, lambda: 2, on_first_difference=full_disk)
    with caplog.at_level(logging.WARNING, logger="rebatch.shadow"):
        assert wrapped() == 1
    assert shadow.stats()["differences"] == 1
    assert shadow.stats()["errors"] == 1
    assert "shadow mode failed: OSError: no space left" in caplog.text


def test_the_overhead_script_runs(capsys) -> None:
    """`python -m rebatch.bench.shadow`, tiny: one line per variant, and verl left as it was."""
    from rebatch.bench.shadow import main

    theirs = _engine().postprocess_batch_func
    assert main(["--rows", "8", "--micro-batches", "2", "--max-len", "4", "--min-time", "0"]) == 0
    out = capsys.readouterr().out
    assert "verl alone" in out
    assert "shadow, unsampled calls (checks only)" in out
    assert _engine().postprocess_batch_func is theirs
