"""``REBATCH``: the startup hook (`rebatch_startup`, ``rebatch.pth``/``rebatch.start``) without a trainer.

Fast tests in the main environment: the values and options parsed, the hook installed in this
interpreter's site-packages and torch-free at start, a stand-in trainer package (``areal`` of a
throwaway directory with its own ``*.dist-info``) activated in a fresh interpreter by the variable alone,
the trainer-neutral `Shadow` (a defect recorded before the trainer's function runs), ``stats()`` of every
integration and ``rebatch report``'s exit codes. The real trainers: ``tests/test_trainer_activation.py``
(their CI environments).
"""

from __future__ import annotations

import json
import logging
import os
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import rebatch_startup
from rebatch.report import main as report_main
from ref.errors import NotAPermutationError, UnsupportedSettingError
from torch_impl.integrations._shadow import Shadow

ROOT = Path(__file__).resolve().parents[1]
VARIABLES = rebatch_startup.CARRIED


def _environ(**env: str) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if k not in VARIABLES}
    environ.update(env)
    return environ


def _python(code: str, *flags: str, path: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    environ = _environ(**env)
    if path is not None:
        environ["PYTHONPATH"] = os.pathsep.join(
            [path, *[p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
        )
    return subprocess.run(
        [sys.executable, *flags, "-c", code],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env=environ,
    )


# -- values ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "mode", "sample"),
    [("on", "on", None), (" ON ", "on", None), ("shadow", "shadow", None), ("shadow:0.05", "shadow", 0.05)],
)
def test_values_parse(value: str, mode: str, sample: float | None) -> None:
    setting = rebatch_startup.parse(value)
    assert setting is not None
    assert (setting.mode, setting.sample, setting.variable) == (mode, sample, "REBATCH")


@pytest.mark.parametrize("value", [None, "", "off", " Off "])
def test_unset_and_off_are_nothing(value: str | None) -> None:
    assert rebatch_startup.parse(value) is None


@pytest.mark.parametrize("value", ["yes", "shadow:", "shadow:x", "shadow:2", "shadow:-0.1", "on:1"])
def test_a_bad_value_names_the_variable(value: str) -> None:
    with pytest.raises(UnsupportedSettingError, match=rf"REBATCH={value!r}: expected off, on, shadow"):
        rebatch_startup.parse(value)


def test_rebatch_verl_wins_for_verl_when_set() -> None:
    both = {"REBATCH": "on", "REBATCH_VERL": "off"}
    assert rebatch_startup.setting_for("verl", both) is None  # verl's own variable decides for verl
    setting = rebatch_startup.setting_for("areal", both)
    assert setting is not None
    assert setting.mode == "on"
    verl = rebatch_startup.setting_for("verl", {"REBATCH": "off", "REBATCH_VERL": "shadow"})
    assert verl is not None
    assert (verl.variable, verl.mode) == ("REBATCH_VERL", "shadow")
    only = rebatch_startup.setting_for("verl", {"REBATCH": "on"})
    assert only is not None
    assert only.variable == "REBATCH"


def test_shadow_options_from_the_environment(tmp_path: Path) -> None:
    setting = rebatch_startup.parse("shadow:0.5")
    assert setting is not None
    env = {
        "REBATCH_ON_DEFECT": "raise",
        "REBATCH_REPORT_DIR": str(tmp_path / "r"),
        "REBATCH_DUMP_DIR": str(tmp_path),
    }
    kwargs = rebatch_startup.install_kwargs("skyrl", setting, env)
    report, dump = str(kwargs.pop("report")), str(kwargs.pop("dump"))
    assert kwargs == {"mode": "shadow", "lazy": True, "sample": 0.5, "on_defect": "raise"}
    assert Path(report).parent == tmp_path / "r"
    assert (tmp_path / "r").is_dir()
    name = Path(report).name
    assert name.startswith("rebatch-skyrl-")
    assert name.endswith(f"-{os.getpid()}.json")
    assert Path(dump).name.startswith("rebatch-dump-skyrl-")
    with pytest.raises(UnsupportedSettingError, match="REBATCH_ON_DEFECT='stop'"):
        rebatch_startup.install_kwargs("skyrl", setting, {"REBATCH_ON_DEFECT": "stop"})
    on = rebatch_startup.parse("on")
    assert on is not None
    got = rebatch_startup.install_kwargs("areal", on, env)  # on mode: its counters' report, no shadow options
    assert Path(str(got.pop("report"))).name.startswith("rebatch-areal-")
    assert got == {"mode": "on", "lazy": True}
    assert rebatch_startup.install_kwargs("areal", on, {}) == {"mode": "on", "lazy": True}


def test_carried_holds_the_variables_set() -> None:
    assert rebatch_startup.carried({"REBATCH": "on", "PATH": "/bin", "REBATCH_DUMP_DIR": " "}) == {
        "REBATCH": "on"
    }


# -- the hook in this interpreter ------------------------------------------------------------------


def test_the_hook_files_are_installed_at_the_top_of_site_packages() -> None:
    """The wheel and the editable install (setup.py's build hooks) put both files in site-packages."""
    dirs = {sysconfig.get_paths()["purelib"], *site.getsitepackages()}
    found = [Path(d) for d in dirs if (Path(d) / "rebatch.pth").is_file()]
    assert found, f"rebatch.pth in none of {sorted(dirs)}"
    for name in ("rebatch.pth", "rebatch.start"):
        assert (found[0] / name).read_text() == (ROOT / "rebatch_startup" / name).read_text(), name
    assert (ROOT / "rebatch_startup" / "rebatch.start").read_text().split() == ["rebatch_startup:startup"]
    (line,) = (ROOT / "rebatch_startup" / "rebatch.pth").read_text().splitlines()
    assert line.startswith("import os;")  # site runs a .pth line only when it starts with "import"


@pytest.mark.parametrize("value", [None, "off"])
def test_unset_or_off_the_interpreter_start_imports_nothing_of_rebatch(value: str | None) -> None:
    env = {} if value is None else {"REBATCH": value}
    done = _python("pass", "-X", "importtime", **env)
    assert done.returncode == 0, done.stderr
    imported = {
        line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")
    }
    assert "site" in imported  # the table is the real one
    loaded = sorted(
        m for m in imported if m.split(".")[0] in ("torch", "torch_impl", "rebatch_startup", "ref")
    )
    assert not loaded, loaded


def test_on_the_start_imports_the_hook_alone_and_no_torch() -> None:
    code = (
        "import sys; mods = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'torch_impl', "
        "'ref', 'rebatch_startup')); print(mods); print(type(sys.meta_path[0]).__name__)"
    )
    done = _python(code, REBATCH="on")
    assert done.returncode == 0, done.stderr
    # the hook, its fork safety and the trainers' registry: three small torch-free modules
    hook = ["rebatch_startup", "rebatch_startup.forksafe", "rebatch_startup.trainers"]
    assert done.stdout.split("\n")[:2] == [str(hook), "_Finder"], done.stdout


def test_verls_plugin_module_imports_no_torch_with_the_variables_unset() -> None:
    code = (
        "import sys, rebatch_startup.verl as v; assert not v.activate(); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'torch_impl', 'ref')))"
    )
    done = _python(code)
    assert (done.returncode, done.stdout.strip()) == (0, "[]"), done.stderr


def test_a_bad_value_at_start_never_breaks_an_interpreter_that_imports_no_trainer() -> None:
    done = _python("print('fine')", REBATCH="bogus")
    assert (done.returncode, done.stdout.strip(), done.stderr) == (0, "fine", "")


# -- a stand-in trainer, activated by the variable alone -------------------------------------------

PROBE = (
    "import areal.engine.core as core, areal.engine.core.train_engine as te\nfrom torch_impl.integrations "
    "import areal as ia\nprint('ours:', getattr(core.reorder_and_pad_outputs, '__wrapped__', None) is "
    "ia.reorder_and_pad_outputs)\nprint('wrapped:', getattr(core.reorder_and_pad_outputs, '__wrapped__', "
    "print).__module__ == te.__name__)\nprint('bound:', core.reorder_and_pad_outputs is "
    "te.reorder_and_pad_outputs)\nfrom areal.infra.utils import launcher\nprint('carried:', "
    "launcher.get_env_vars().get('REBATCH'))\n"
)


@pytest.fixture(scope="module")
def fake_areal(tmp_path_factory: pytest.TempPathFactory) -> str:
    """``areal`` 1.0.4 as far as rebatch sees it: its metadata, the function and a module binding it."""
    root = tmp_path_factory.mktemp("fake_areal")
    files = {
        "areal/__init__.py": "",
        "areal/engine/__init__.py": "",
        "areal/engine/core/__init__.py": "from .train_engine import reorder_and_pad_outputs\n",
        "areal/engine/core/train_engine.py": (
            "def reorder_and_pad_outputs(outputs, output_seqlens, mb_list):\n    return 'theirs'\n"
        ),
        "areal/infra/__init__.py": "",
        "areal/infra/utils/__init__.py": "",
        "areal/infra/utils/launcher.py": "def get_env_vars(extra=None):\n    return {'PYTHONPATH': 'x'}\n",
        "areal-1.0.4.dist-info/METADATA": "Metadata-Version: 2.1\nName: areal\nVersion: 1.0.4\n",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return str(root)


@pytest.mark.parametrize(
    ("env", "ours", "wrapped", "carried"),
    [
        ({"REBATCH": "on"}, True, False, "on"),
        ({}, False, False, None),
        ({"REBATCH": "off"}, False, False, None),
        ({"REBATCH": "shadow:0.5"}, False, True, "shadow:0.5"),
    ],
)
def test_the_variable_alone_activates_a_trainer_in_a_new_process(
    fake_areal: str, env: dict[str, str], ours: bool, wrapped: bool, carried: str | None
) -> None:
    done = _python(PROBE, path=fake_areal, **env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == [
        f"ours: {ours}",
        f"wrapped: {wrapped}",
        "bound: True",
        f"carried: {carried}",
    ]


def test_under_on_a_bad_value_raises_from_the_trainers_import_naming_the_variable(fake_areal: str) -> None:
    done = _python("import areal", path=fake_areal, REBATCH="onn")
    assert done.returncode == 1
    assert "UnsupportedSettingError: REBATCH='onn': expected off, on, shadow" in done.stderr
    logged = _python("import areal", path=fake_areal, REBATCH="shadow", REBATCH_ON_DEFECT="stop")
    assert logged.returncode == 0  # shadow never stops the run: an ERROR line (logging's last resort)
    assert (
        "could not install rebatch in areal: UnsupportedSettingError: REBATCH_ON_DEFECT='stop'"
        in logged.stderr
    )


def test_under_on_a_failed_activation_raises_naming_the_variable(fake_areal: str, tmp_path: Path) -> None:
    (tmp_path / "areal-1.0.4.dist-info").mkdir()  # another release, found first
    (tmp_path / "areal-1.0.4.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: areal\nVersion: 9.9\n"
    )
    path = os.pathsep.join([str(tmp_path), fake_areal])
    done = _python("import areal", path=path, REBATCH="on")
    assert done.returncode == 1
    assert (
        "REBATCH='on': could not install rebatch in areal: UnsupportedSettingError: areal 9.9 is not"
        in done.stderr
    )
    shadow = _python(PROBE, path=path, REBATCH="shadow")
    assert shadow.returncode == 0, shadow.stderr
    assert "ours: False" in shadow.stdout
    assert "wrapped: False" in shadow.stdout
    assert "ERROR" not in shadow.stdout
    assert "could not install rebatch in areal" in shadow.stderr  # the ERROR line (logging's last resort)


#: Ways a program looks for a trainer before importing it (an optional dependency probed): none may make
#: the hook forget the trainer; it activates when the trainer's code runs.
PROBES = {
    "importlib.util.find_spec": (
        "import importlib.util\nassert importlib.util.find_spec('areal') is not None\n"
    ),
    "find_spec twice, its loader asked": (
        "import importlib.util\n"
        "spec = importlib.util.find_spec('areal')\n"
        "assert spec.loader.is_package('areal') and spec.loader.get_filename('areal') == spec.origin\n"
        "assert importlib.util.find_spec('areal').origin == spec.origin\n"
    ),
    "pkgutil.get_loader": (
        "import importlib.util, pkgutil, warnings\n"
        "with warnings.catch_warnings():\n"
        "    warnings.simplefilter('ignore', DeprecationWarning)  # deprecated in Python 3.12, gone in 3.14\n"
        "    assert getattr(pkgutil, 'get_loader', importlib.util.find_spec)('areal') is not None\n"
    ),
    "a probe's spec executed": (
        "import importlib.util, sys\n"
        "importlib.util.find_spec('areal')\n"
        "spec = importlib.util.find_spec('areal')\n"
        "module = sys.modules['areal'] = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
    ),
    "a submodule's find_spec": (
        "import importlib.util\nassert importlib.util.find_spec('areal.engine.core.train_engine')\n"
    ),
}


@pytest.mark.parametrize("probe", PROBES.values(), ids=PROBES.keys())
def test_a_probe_before_the_import_still_activates_the_trainer(fake_areal: str, probe: str) -> None:
    """``importlib.util.find_spec("areal")`` and the like only look: the trainer stays waiting until its code
    runs (before: the first find_spec took it off the finder's list, and the import then ran the trainer's
    own function, silently)."""
    done = _python(probe + PROBE, path=fake_areal, REBATCH="on")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["ours: True", "wrapped: False", "bound: True", "carried: on"]


def test_a_probe_alone_imports_nothing_of_rebatch(fake_areal: str) -> None:
    code = (
        "import importlib.util, sys\nimportlib.util.find_spec('areal')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('areal', 'torch', 'torch_impl')))\n"
    )
    done = _python(code, path=fake_areal, REBATCH="on")
    assert (done.returncode, done.stdout.strip()) == (0, "[]"), done.stderr[-3000:]


def test_under_on_a_failed_activation_raises_again_when_the_import_is_tried_again(
    fake_areal: str, tmp_path: Path
) -> None:
    """The trainer leaves the finder's list only once its activation went through: a second ``import areal``
    raises again, never runs AReaL's own function silently."""
    (tmp_path / "areal-1.0.4.dist-info").mkdir()  # another release, found first
    (tmp_path / "areal-1.0.4.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: areal\nVersion: 9.9\n"
    )
    code = (
        "for attempt in ('first', 'second'):\n"
        "    try:\n"
        "        import areal.engine.core\n"
        "        print(attempt, 'imported')\n"
        "    except Exception as err:\n"
        "        print(attempt, type(err).__name__)\n"
    )
    done = _python(code, path=os.pathsep.join([str(tmp_path), fake_areal]), REBATCH="on")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["first UnsupportedSettingError", "second UnsupportedSettingError"]


FORK = """
import contextlib, os, signal, sys, threading
import rebatch_startup
held, go = threading.Event(), threading.Event()
{hold}
thread = threading.Thread(target=hold, daemon=True)
thread.start()
assert held.wait(120)
sys.stdout.flush()
pid = os.fork()
if pid == 0:  # the child: the thread holding the lock does not exist here
    signal.alarm(60)  # a child stuck at the lock is killed: a failure, not a hang
    import areal.engine.core as core
    from torch_impl.integrations import areal as ia
    print(
        "child:",
        core.reorder_and_pad_outputs.__wrapped__ is ia.reorder_and_pad_outputs,  # counted
        flush=True,
    )
    os._exit(0)
_, status = os.waitpid(pid, 0)
go.set()
thread.join(120)
print("exit:", os.waitstatus_to_exitcode(status))
"""

#: What the other thread is doing at the fork: inside `activate` (another trainer's activation, stopped
#: while it holds the hook's lock), or holding an integration's install lock or its patcher's lock.
HOLDS = {
    "activation": (
        "real = rebatch_startup.install_kwargs\ndef stalled(trainer, setting, environ=None):\n    if "
        "trainer == 'skyrl':\n        held.set()\n        go.wait()\n    return real(trainer, setting, "
        "environ)\nrebatch_startup.install_kwargs = stalled\ndef hold():\n    with "
        "contextlib.suppress(Exception):  # skyrl is not installed here: its activation fails, later\n      "
        "  rebatch_startup.activate('skyrl')\n"
    ),
    "install state": (
        "from torch_impl.integrations import areal as ia\n"
        "def hold():\n"
        "    with ia.INTEGRATION.lock:\n"
        "        held.set()\n"
        "        go.wait()\n"
    ),
    "patcher": (
        "from torch_impl.integrations import areal as ia\n"
        "def hold():\n"
        "    with ia.INTEGRATION.patcher.lock:\n"
        "        held.set()\n"
        "        go.wait()\n"
    ),
}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork: POSIX only")
@pytest.mark.parametrize("hold", HOLDS.values(), ids=HOLDS.keys())
def test_a_fork_while_another_thread_holds_a_lock_leaves_the_child_free_to_activate(
    fake_areal: str, hold: str
) -> None:
    """In a fresh interpreter (a fork here would make JAX warn): a thread holds one of rebatch's locks, the
    main thread forks, the child imports the trainer and is activated (before: it waited at the lock for
    ever; now each lock is a `rebatch_startup.ForkSafeLock`, renewed in the child)."""
    done = _python(FORK.format(hold=hold), path=fake_areal, REBATCH="on")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["child: True", "exit: 0"], done.stderr[-3000:]


def test_a_fork_safe_lock_held_by_the_forking_thread_stays_its_own_in_the_child() -> None:
    """The thread that forks goes on in the child: a lock it holds stays held by it there (renewing it
    would make its release fail), and is free once released."""
    code = (
        "import os, threading\n"
        "from rebatch_startup import ForkSafeLock\n"
        "lock = ForkSafeLock()\n"
        "with lock:\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        with lock:\n"
        "            pass\n"
        "if pid == 0:\n"
        "    t = threading.Thread(target=lambda: lock.__enter__() or lock.__exit__())\n"
        "    t.start(); t.join(60)\n"
        "    os._exit(0 if not t.is_alive() else 3)\n"
        "print('exit:', os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))\n"
    )
    done = _python(code)
    assert (done.returncode, done.stdout.strip()) == (0, "exit: 0"), done.stderr[-3000:]


# -- every setting carried ---------------------------------------------------------------------------


def test_every_rebatch_variable_rebatch_reads_is_carried() -> None:
    """Each ``REBATCH*`` name in the code a trainer's worker runs (`rebatch_startup`, `torch_impl`, `ref`) is
    one of `rebatch_startup.CARRIED`, the witness's two among them (a MisalignmentError names them)."""
    import re

    from torch_impl._alignment import _switch

    found: set[str] = set()
    for package in ("rebatch_startup", "torch_impl", "ref"):
        for path in (ROOT / package).rglob("*.py"):
            found |= set(re.findall(r"[\"'](REBATCH(?:_[A-Z]+)*)[\"']", path.read_text()))
    assert {"REBATCH", "REBATCH_WITNESS", "REBATCH_WITNESS_UNBOUND"} <= found
    assert found <= set(VARIABLES), found - set(VARIABLES)
    assert (
        {_switch.ENV, _switch.ENV_UNBOUND} == {"REBATCH_WITNESS", "REBATCH_WITNESS_UNBOUND"} <= set(VARIABLES)
    )


def test_areals_and_skyrls_wrappers_carry_every_setting(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The wrapper of AReaL's ``get_env_vars`` and SkyRL's ``prepare_runtime_environment`` (around stand-ins
    for the trainers' functions) adds every variable of `CARRIED` set here, the witness's included."""
    from torch_impl.integrations import areal, skyrl
    from torch_impl.integrations._integration import carrying

    assert areal.INTEGRATION.carry == (areal.LAUNCHER, "get_env_vars")
    assert skyrl.INTEGRATION.carry == (skyrl.TRAIN_UTILS, "prepare_runtime_environment")

    values = {
        "REBATCH": "shadow:0.5",
        "REBATCH_VERL": "on",
        "REBATCH_ON_DEFECT": "raise",
        "REBATCH_REPORT_DIR": str(tmp_path / "reports"),
        "REBATCH_DUMP_DIR": str(tmp_path / "dumps"),
        "REBATCH_WITNESS": "off",
        "REBATCH_WITNESS_UNBOUND": "kl,entropy",
    }
    assert set(values) == set(VARIABLES)
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    get_env_vars = carrying(lambda *args, **kwargs: {"PYTHONPATH": "x", "REBATCH_ON_DEFECT": "log"})
    assert get_env_vars("A=1") == {
        **values,
        "PYTHONPATH": "x",
        "REBATCH_ON_DEFECT": "log",
    }  # AReaL's own wins
    prepare = carrying(lambda cfg: {"NCCL_DEBUG": "WARN", "REBATCH_WITNESS": "on"})
    assert prepare(object()) == {**values, "NCCL_DEBUG": "WARN", "REBATCH_WITNESS": "on"}  # SkyRL's own wins


# -- the shadow, trainer-neutral -------------------------------------------------------------------


def _refuses(*args: object) -> None:
    raise NotAPermutationError("micro-batch 1, position 0: index 1 duplicates micro-batch 0, position 1")


def test_a_defect_is_recorded_before_the_trainers_function_runs_even_when_it_raises(caplog, tmp_path) -> None:
    report = tmp_path / "r.json"
    shadow = Shadow(1.0, "log", str(report), trainer="areal", version="1.0.4")

    def theirs(*args: object) -> None:
        assert report.is_file()  # already written: the defect is in the report before AReaL's function runs
        raise AssertionError("AReaL's own reorder_list")

    wrapped = shadow.wrap(
        "reorder_and_pad_outputs", theirs, _refuses, check=_refuses, keys_of=lambda *a: ["lp"]
    )
    with (
        caplog.at_level(logging.ERROR, logger="rebatch.shadow"),
        pytest.raises(AssertionError, match="reorder_list"),
    ):
        wrapped([1])
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("areal reorder_and_pad_outputs, call 0: areal's result of this step is misaligned")
    assert "in keys ['lp']" in line
    assert "micro-batch 1, position 0: index 1 duplicates" in line
    saved = json.loads(report.read_text())
    assert (saved["defects"], saved["calls"], saved["trainer"], saved["version"]) == (1, 1, "areal", "1.0.4")
    assert saved["process"]["pid"] == os.getpid()
    assert saved["mode"] == "shadow"
    assert saved["areal_seconds"] == saved["trainer_seconds"]
    with pytest.raises(NotAPermutationError):
        Shadow(1.0, "raise", None, trainer="skyrl").wrap("f", theirs, _refuses)()


def test_stats_of_every_integration_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch_impl import integrations
    from torch_impl.integrations import areal

    assert not areal.installed()
    monkeypatch.setattr(areal.INTEGRATION, "kept", None)  # an earlier install's counters (kept for stats)
    before = integrations.stats()
    assert "areal" not in before
    areal.INTEGRATION.kept = Shadow(1.0, "log", None, trainer="areal")
    try:
        got = integrations.stats()["areal"]
        assert (got["mode"], got["trainer"], got["calls"]) == ("shadow", "areal", 0)
    finally:
        areal.INTEGRATION.kept = None


# -- rebatch report ----------------------------------------------------------------------------------


def _named(trainer: str, pid: int) -> str:
    """A report's file name, as rebatch names them (`rebatch_startup._names.REPORT_NAME`)."""
    return f"rebatch-{trainer}-host-20260101T000000Z-0000abcd-{pid}.json"


def _report(path: Path, trainer: str, bad: bool, pid: int) -> None:
    shadow = Shadow(1.0, "log", None, trainer=trainer, version="1.0")
    shadow.wrap("f", lambda: 1, _refuses if bad else (lambda: 1))()
    saved = shadow.stats()
    saved["process"]["pid"] = pid
    path.write_text(json.dumps(saved))


def test_rebatch_report_exits_1_on_a_defect_and_0_clean(tmp_path: Path, capsys, caplog) -> None:
    clean, dirty = tmp_path / "clean", tmp_path / "dirty"
    clean.mkdir()
    dirty.mkdir()
    with caplog.at_level(logging.CRITICAL, logger="rebatch.shadow"):
        _report(clean / _named("areal", 1), "areal", False, 1)
        _report(clean / _named("areal", 2), "areal", False, 2)
        _report(dirty / _named("skyrl", 3), "skyrl", True, 3)
    assert report_main([str(clean)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1].split()[:5] == ["areal", "1.0", "f", "2", "2"]  # 2 processes, 2 calls
    assert "2 report(s); clean" in out
    assert report_main([str(clean), str(dirty / _named("skyrl", 3))]) == 1
    out = capsys.readouterr().out
    assert "NOT CLEAN: 0 difference(s), 1 defect(s)" in out
    head = out.splitlines()[0].split()
    assert head[:8] == [
        "trainer",
        "function",
        "processes",
        "calls",
        "sampled",
        "differences",
        "defects",
        "errors",
    ]
    assert report_main([str(tmp_path / "missing")]) == 2
    (tmp_path / "bad.json").write_text("[1]")
    assert report_main([str(tmp_path / "bad.json")]) == 2
    done = subprocess.run(
        [sys.executable, "-m", "rebatch", "report", str(dirty)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 1, done.stderr
