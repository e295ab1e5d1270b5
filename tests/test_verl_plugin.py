"""``REBATCH_VERL``: verl's plugin, `rebatch_startup.verl`, loaded by verl itself, mid-import, as a
``verl.plugins`` entry point (made visible through a throwaway ``*.dist-info`` on ``PYTHONPATH``:
exactly how ``importlib.metadata`` discovers entry points) or through ``VERL_USE_EXTERNAL_MODULES``,
in a fresh interpreter and in a Ray worker, on the installed verl release: 0.9.0 and 0.9.1 load the
entry point, 0.8.0 (no plugin group) only ``VERL_USE_EXTERNAL_MODULES``, so the same activations go
through that there. Needs verl (skipped without it, as test_verl_install.py)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

import rebatch_startup
from property_tests import verl_oracle as vo
from ref.errors import UnsupportedSettingError
from torch_impl.integrations import verl as integration

VERL = vo.verl_or_skip()
ROOT = str(Path(__file__).resolve().parents[1])
#: Whether each release's ``verl/__init__.py`` loads the ``verl.plugins`` entry points.
PLUGIN_GROUP = {"0.8.0": False, "0.9.0": True, "0.9.1": True}
EXTERNAL = {"VERL_USE_EXTERNAL_MODULES": "rebatch_startup.verl"}

PROBE = (
    "import warnings; warnings.simplefilter('ignore')\nimport torch_impl\nimport "
    "verl.workers.engine.fsdp.transformer_impl as m\nfrom verl.workers.engine import "
    "utils\nprint('rebatch:', getattr(m.postprocess_batch_func, '__wrapped__', None) is "
    "torch_impl.postprocess_batch_func)\nprint('verl:', m.postprocess_batch_func is "
    "utils.postprocess_batch_func)\n"
)


@pytest.fixture(scope="module")
def entry_point(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A directory holding a ``*.dist-info`` that declares the plugin (what rebatch's install declares)."""
    root = tmp_path_factory.mktemp("ep")
    info = root / "rebatch_plugin_probe-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: rebatch-plugin-probe\nVersion: 0\n")
    (info / "entry_points.txt").write_text("[verl.plugins]\nrebatch = rebatch_startup.verl:activate\n")
    return str(root)


def _run(code: str, entry_point: str | None, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {
        k: v
        for k, v in os.environ.items()
        if k not in ("REBATCH", "REBATCH_VERL", "VERL_USE_EXTERNAL_MODULES")
    }
    outer = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]  # where this verl comes from
    environ["PYTHONPATH"] = os.pathsep.join([ROOT] + ([entry_point] if entry_point else []) + outer)
    environ.update(env)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=300, env=environ
    )


@pytest.mark.parametrize(
    ("value", "ours"), [("on", True), (None, False), ("off", False), ("shadow", False), ("shadow:0.5", False)]
)
def test_the_entry_point_activates_as_the_variable_says(
    entry_point: str, value: str | None, ours: bool
) -> None:
    """on: the engine binds rebatch's function; unset, off: verl's; shadow: verl's own wrapped (verl
    0.8.0: through ``VERL_USE_EXTERNAL_MODULES``, its only way)."""
    env = {} if value is None else {"REBATCH_VERL": value}
    if not PLUGIN_GROUP[VERL.version]:
        env.update(EXTERNAL)
    code = PROBE
    if value and value.startswith("shadow"):
        code += "print('shadowed:', m.postprocess_batch_func.__wrapped__.__module__)\n"
    done = _run(code, entry_point, **env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"rebatch: {ours}" in done.stdout, (done.stdout, done.stderr[-3000:])
    if value and value.startswith("shadow"):
        assert "verl: True" in done.stdout  # the engine and verl's module hold the same wrapper
        assert "shadowed: verl.workers.engine.utils" in done.stdout  # a wrapper of verl's own function
    elif not ours:
        assert "verl: True" in done.stdout  # verl untouched


def test_the_installed_entry_point_imports_no_torch_impl_with_the_variables_unset() -> None:
    """rebatch's own ``verl.plugins`` entry point is the torch-free `rebatch_startup.verl`: a verl process
    with ``REBATCH`` and ``REBATCH_VERL`` unset loads it (0.9.x) and imports nothing of torch_impl."""
    import importlib.metadata

    values = [
        ep.value for ep in importlib.metadata.entry_points(group="verl.plugins") if ep.name == "rebatch"
    ]
    assert "rebatch_startup.verl:activate" in values, values
    code = (
        "import sys, verl; "
        "print('loaded:', 'torch_impl' in sys.modules, 'rebatch_startup.verl' in sys.modules)"
    )
    done = _run(code, None)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"loaded: False {PLUGIN_GROUP[VERL.version]}" in done.stdout, done.stdout


@pytest.mark.parametrize(
    ("env", "ours"),
    [
        ({"REBATCH": "on"}, True),  # every trainer's variable (0.8.0 too: rebatch's startup hook)
        ({"REBATCH": "on", "REBATCH_VERL": "off"}, False),  # verl's own, when set, wins for verl
        ({"REBATCH": "off", "REBATCH_VERL": "on"}, True),
    ],
)
def test_rebatch_reaches_verl_and_rebatch_verl_wins_when_set(env: dict[str, str], ours: bool) -> None:
    if env.get("REBATCH") != "on" and not PLUGIN_GROUP[VERL.version]:
        env = {**env, "VERL_USE_EXTERNAL_MODULES": "rebatch_startup.verl"}
    done = _run(PROBE, None, **env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"rebatch: {ours}" in done.stdout, (done.stdout, done.stderr[-3000:])


def test_verl_use_external_modules_activates_the_same_way() -> None:
    done = _run(PROBE, None, REBATCH_VERL="on", **EXTERNAL)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rebatch: True" in done.stdout, (done.stdout, done.stderr[-3000:])


def test_the_entry_point_alone_activates_where_verl_has_the_plugin_group(entry_point: str) -> None:
    """0.9.0 and 0.9.1 load it; 0.8.0 has no plugin group, so it stays untouched (hence EXTERNAL there)."""
    done = _run(PROBE + "import verl; print('version:', verl.__version__)\n", entry_point, REBATCH_VERL="on")
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"version: {VERL.version}" in done.stdout, done.stdout  # the subprocess imports the same verl
    assert f"rebatch: {PLUGIN_GROUP[VERL.version]}" in done.stdout, (done.stdout, done.stderr[-3000:])


def test_on_fails_loudly_on_a_release_rebatch_does_not_support() -> None:
    """The version read from verl's metadata (faked: 0.7.0) refused under on: the ERROR line names it,
    and the exception stops verl's import (``VERL_USE_EXTERNAL_MODULES`` lets it through)."""
    fake = (
        "import importlib.metadata as md\n"
        "real = md.version\n"
        "md.version = lambda name: '0.7.0' if name == 'verl' else real(name)\n"
    )
    done = _run(fake + PROBE, None, REBATCH_VERL="on", **EXTERNAL)
    assert done.returncode != 0, done.stdout
    assert (
        "could not install rebatch in verl: UnsupportedSettingError: verl 0.7.0 is not supported"
        in done.stderr
    )
    assert "supported: 0.8.0, 0.9.0, 0.9.1" in done.stderr


def test_activation_logs_one_info_line_naming_what_it_replaced(entry_point: str) -> None:
    code = "import logging, sys; logging.basicConfig(level=logging.INFO, stream=sys.stdout)\n" + PROBE
    code += (
        "import rebatch_startup; rebatch_startup.activate('verl', again=True)\n"  # idempotent: no 2nd line
    )
    done = _run(code, entry_point, REBATCH_VERL="on", **({} if PLUGIN_GROUP[VERL.version] else EXTERNAL))
    lines = [line for line in done.stdout.splitlines() if line.startswith("INFO:rebatch:")]
    assert len(lines) == 1, done.stdout
    assert (
        f"rebatch: verl {VERL.version}: rebatch replaces verl's "
        "verl.workers.engine.utils.postprocess_batch_func" in lines[0]
    )
    assert lines[0].endswith("left as verl's: none"), lines[0]


def test_a_ray_worker_sees_rebatch_through_the_runtime_env(entry_point: str, ray_temp_dir: str) -> None:
    """``runtime_env.env_vars`` carries the variable to the workers (verl's
    ``+ray_kwargs.ray_init.runtime_env.env_vars.REBATCH_VERL=on``); verl loads the plugin there."""
    pytest.importorskip("ray", reason="ray is not installed")
    outer = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    path = os.pathsep.join([ROOT, entry_point, *outer])
    env_vars = {"REBATCH_VERL": "on", "PYTHONPATH": path, **({} if PLUGIN_GROUP[VERL.version] else EXTERNAL)}
    code = (
        "import ray, warnings; warnings.simplefilter('ignore')\nray.init(num_cpus=1, "
        f"include_dashboard=False, log_to_driver=False, _temp_dir={ray_temp_dir!r},\n         "
        f"runtime_env={{'env_vars': {env_vars!r}}})\n@ray.remote\ndef probe():\n    import torch_impl, "
        "verl.workers.engine.fsdp.transformer_impl as m\n    return getattr(m.postprocess_batch_func, "
        "'__wrapped__', None) is torch_impl.postprocess_batch_func\nprint('worker sees rebatch:', "
        "ray.get(probe.remote(), timeout=240))\nray.shutdown()\n"
    )
    done = _run(code, None)  # the driver itself has no entry point and no REBATCH_VERL
    assert "worker sees rebatch: True" in done.stdout, (done.stdout[-2000:], done.stderr[-3000:])


@pytest.mark.parametrize(("value", "ours"), [("on", True), (None, False)])
def test_a_ray_worker_of_plain_ray_init_sees_what_the_driver_variable_says(
    entry_point: str, value: str | None, ours: bool, ray_temp_dir: str
) -> None:
    """``REBATCH_VERL=on`` in the driver's environment and nothing else (no runtime_env, no setup hook):
    the workers of the local cluster that ``ray.init()`` starts inherit it, and verl loads the plugin
    in each; unset, a worker sees verl's own function."""
    pytest.importorskip("ray", reason="ray is not installed")
    code = (
        "import ray, warnings; warnings.simplefilter('ignore')\nray.init(num_cpus=1, "
        f"include_dashboard=False, log_to_driver=False, _temp_dir={ray_temp_dir!r})\n@ray.remote\ndef "
        "probe():\n    import torch_impl, verl.workers.engine.fsdp.transformer_impl as m\n    from "
        "verl.workers.engine import utils\n    ours = getattr(m.postprocess_batch_func, '__wrapped__', "
        "None) is torch_impl.postprocess_batch_func\n    theirs = m.postprocess_batch_func is "
        "utils.postprocess_batch_func and not ours\n    return ours, theirs\nprint('worker sees (rebatch, "
        "verl):', ray.get(probe.remote(), timeout=240))\nray.shutdown()\n"
    )
    env = {} if value is None else {"REBATCH_VERL": value}
    if not PLUGIN_GROUP[VERL.version]:
        env.update(EXTERNAL)  # verl 0.8.0's only way to load a plugin
    done = _run(code, entry_point, **env)
    expected = f"worker sees (rebatch, verl): ({ours}, {not ours})"
    assert expected in done.stdout, (done.stdout[-2000:], done.stderr[-3000:])


@pytest.fixture
def _fresh():
    yield
    integration.uninstall()


@pytest.mark.usefixtures("_fresh")
def test_a_broken_activation_under_on_is_logged_and_raised(monkeypatch, caplog) -> None:
    def broken(**kwargs: object) -> None:
        raise RuntimeError("no verl here")

    monkeypatch.setattr(integration, "install", broken)
    monkeypatch.setenv("REBATCH_VERL", "on")
    with (
        caplog.at_level(logging.ERROR, logger="rebatch"),
        pytest.raises(
            UnsupportedSettingError,
            match=r"REBATCH_VERL=.on.: could not install rebatch in verl.*no verl here",
        ),
    ):
        rebatch_startup.activate("verl", again=True)
    assert any("could not install rebatch in verl" in r.getMessage() for r in caplog.records)
    caplog.clear()
    monkeypatch.setenv("REBATCH_VERL", "shadow")  # shadow never stops the run: logged only
    with caplog.at_level(logging.ERROR, logger="rebatch"):
        rebatch_startup.activate("verl", again=True)
    assert any("RuntimeError: no verl here" in r.getMessage() for r in caplog.records)


@pytest.mark.usefixtures("_fresh")
def test_a_bad_value_is_refused(monkeypatch, caplog) -> None:
    monkeypatch.setenv("REBATCH_VERL", "yes please")
    with caplog.at_level(logging.ERROR, logger="rebatch"), pytest.raises(UnsupportedSettingError):
        rebatch_startup.activate("verl", again=True)
    assert not integration.installed()
    assert rebatch_startup.parse("shadow:0.05", rebatch_startup.VERL_ENV).sample == 0.05
    assert rebatch_startup.parse(" OFF ", rebatch_startup.VERL_ENV) is None
