"""`torch_impl.integrations.verl.install()`: one call turns rebatch on in verl, in the engine modules that
bound verl's functions at import (loaded before or after), idempotently, undone by ``uninstall()``, and
in Ray worker processes through Ray's setup hook. Needs verl (skipped, with the reason shown, without
it; CI runs these in its pins environment, where a skip fails)."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings

import pytest

import torch_impl
from property_tests import verl_oracle as vo
from torch_impl.integrations import verl as integration

VERL = vo.verl_or_skip()

ENGINES = ["verl.workers.engine.fsdp.transformer_impl"]


def _engine(name: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return importlib.import_module(name)


@pytest.fixture(autouse=True)
def _restored():
    yield
    integration.uninstall()


def test_install_replaces_every_binding_and_uninstall_restores_them() -> None:
    engine = _engine(ENGINES[0])  # imported before install: bound verl's functions
    theirs_post, theirs_prep = engine.postprocess_batch_func, engine.prepare_micro_batches
    assert theirs_post is not torch_impl.postprocess_batch_func
    chosen = integration.install()
    assert integration.installed()
    assert (chosen.trainer, chosen.version, chosen.row, chosen.mode) == (
        "verl",
        VERL.version,
        VERL.version,
        "on",
    )
    assert integration.plan().left == ()
    ours = integration.replacements()  # this release's (VERSIONS)
    rearrange = ours[integration.SEQLEN_BALANCING, "rearrange_micro_batches"]
    # each place holds rebatch's function, counted (on mode's counters: ``__wrapped__`` is rebatch's)
    assert engine.postprocess_batch_func.__wrapped__ is torch_impl.postprocess_batch_func
    assert engine.prepare_micro_batches.__wrapped__ is ours[integration.ENGINE_UTILS, "prepare_micro_batches"]
    assert VERL.engine_utils.postprocess_batch_func is engine.postprocess_batch_func
    assert VERL.seqlen_balancing.rearrange_micro_batches.__wrapped__ is rearrange
    assert VERL.engine_utils.rearrange_micro_batches is VERL.seqlen_balancing.rearrange_micro_batches
    assert VERL.py_functional.append_to_dict.__wrapped__ is torch_impl.append_to_dict
    assert integration.install() == chosen  # idempotent: nothing recorded twice, the same places
    integration.uninstall()
    assert not integration.installed()
    assert engine.postprocess_batch_func is theirs_post
    assert engine.prepare_micro_batches is theirs_prep
    assert VERL.engine_utils.postprocess_batch_func is theirs_post
    integration.uninstall()  # idempotent too


def test_an_engine_imported_after_install_binds_rebatch() -> None:
    """In a fresh interpreter: install() first, then the engine module is imported."""
    code = (
        "import warnings; warnings.simplefilter('ignore')\n"
        "import torch_impl\n"
        "from torch_impl.integrations import verl\n"
        "verl.install()\n"
        "import verl.workers.engine.fsdp.transformer_impl as m\n"
        "assert m.postprocess_batch_func.__wrapped__ is torch_impl.postprocess_batch_func\n"
        "prep = m.prepare_micro_batches.__wrapped__  # counted (on mode), around rebatch's\n"
        "assert prep is verl.replacements()[verl.ENGINE_UTILS, 'prepare_micro_batches']\n"
        "assert getattr(prep, '__wrapped__', prep) is torch_impl.prepare_micro_batches\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("ok"), done.stdout[-2000:]


def test_the_engine_call_reaches_rebatch_and_refuses_a_duplicate_index() -> None:
    """After install(), the engine's own name rejects what verl's would silently misalign."""
    import torch

    from property_tests.data import jagged

    engine = _engine(ENGINES[0])
    integration.install()
    outs = [
        {"model_output": {"lp": jagged(torch.arange(3.0), [1, 2])}},
        {"model_output": {"lp": jagged(torch.ones(1), [1])}},
    ]
    data = vo.make_data({})
    with pytest.raises(torch_impl.errors.NotAPermutationError, match="index 1 duplicates"):
        engine.postprocess_batch_func(outs, [[0, 1], [1]], data)


def test_ray_worker_setup_hook_installs_in_every_worker(ray_temp_dir: str) -> None:
    """Ray's ``worker_process_setup_hook`` pointing at install(): a worker process sees rebatch's
    functions in verl's engine module (run in a fresh interpreter: Ray starts its own processes)."""
    pytest.importorskip("ray", reason="ray is not installed")
    code = (
        "import ray, warnings; warnings.simplefilter('ignore')\n"
        f"ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, _temp_dir={ray_temp_dir!r},\n"
        "         runtime_env={'worker_process_setup_hook': 'torch_impl.integrations.verl.install'})\n"
        "@ray.remote\n"
        "def probe():\n"
        "    import torch_impl, verl.workers.engine.fsdp.transformer_impl as m\n"
        "    return getattr(m.postprocess_batch_func, '__wrapped__', None) "
        "is torch_impl.postprocess_batch_func\n"
        "print('worker sees rebatch:', ray.get(probe.remote()))\n"
        "ray.shutdown()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=300
    )
    assert "worker sees rebatch: True" in done.stdout, (done.stdout[-2000:], done.stderr[-3000:])


def test_install_can_dump_the_first_step_for_rebatch_check(tmp_path) -> None:
    import torch

    from property_tests.data import jagged
    from rebatch.check import run_check

    engine = _engine(ENGINES[0])
    path = tmp_path / "step.pt"
    integration.install(dump=str(path))
    outs = [
        {"model_output": {"lp": jagged(torch.arange(3.0), [1, 2])}},
        {"model_output": {"lp": jagged(torch.ones(1), [1])}},
    ]
    engine.postprocess_batch_func(outs, [[2, 0], [1]], vo.make_data({}))
    assert path.is_file()
    assert run_check(str(path), None, as_json=True) == 0


def test_on_mode_counts_the_engines_calls_in_stats_and_its_report(tmp_path) -> None:
    """b383f49: with rebatch in charge of verl (on mode), `torch_impl.integrations.stats()` said calls 0 for
    every name; now each replaced name counts calls, rows and errors, and the report says so (mode on)."""
    import json

    import torch

    from property_tests.data import jagged
    from rebatch.report import main as report_main
    from torch_impl import integrations

    engine = _engine(ENGINES[0])
    report = tmp_path / "rebatch-verl-host-20260101T000000Z-0000abcd-1.json"
    integration.install(report=str(report))
    outs = [
        {"model_output": {"lp": jagged(torch.arange(3.0), [1, 2])}},
        {"model_output": {"lp": jagged(torch.ones(1), [1])}},
    ]
    engine.postprocess_batch_func(outs, [[2, 0], [1]], vo.make_data({}))
    with pytest.raises(torch_impl.errors.NotAPermutationError):
        engine.postprocess_batch_func(outs, [[0, 1], [1]], vo.make_data({}))
    got = integrations.stats()["verl"]
    post = got["by_name"]["postprocess_batch_func"]
    assert got["mode"] == "on"
    assert (post["calls"], post["rows"], post["errors"]) == (2, 6, 1)
    saved = json.loads(report.read_text())
    assert saved["mode"] == "on"
    assert saved["by_name"]["postprocess_batch_func"]["errors"] == 1
    assert report_main([str(tmp_path)]) == 0
