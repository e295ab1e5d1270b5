"""``REBATCH`` in the trainers' own environments (.ci/peers.sh: ``.venv-areal``, ``.venv-skyrl``): a fresh
interpreter with only the variable set sees rebatch's functions, the processes each trainer starts get
it (an AReaL RPC worker started by AReaL's own local scheduler; a SkyRL Ray actor on a cluster started
without it, reached by the variable that ``prepare_runtime_environment`` carries), and shadow mode on
each trainer's silent cases and on 300 random valid calls, with per-process reports read by
``rebatch report``. Skipped without the trainer; CI sets ``REBATCH_REQUIRE_PEER``, where a skip fails.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import rebatch_startup
from property_tests.peer_report import drawn
from property_tests.peers import PEERS, differential, outcome
from property_tests.strategies import microbatch_outputs
from rebatch_startup.trainers import TRAINERS, by_name

ROOT = Path(__file__).resolve().parents[1]
#: The trainers tested in their own environments (CI's trainers lane), with a kit module.
OWN_LANES = [t.name for t in TRAINERS if t.lane and t.kit]
REQUIRE_ENV = "REBATCH_REQUIRE_PEER"


def _need(name: str) -> None:
    try:
        PEERS[name].theirs()
    except ImportError as err:
        why = (
            f"{PEERS[name].label} is not installed here ({err}); CI runs these in its environment "
            "(.ci/peers.sh)"
        )
        if name in os.environ.get(REQUIRE_ENV, "").split(","):
            pytest.fail(why)
        pytest.skip(why)


def _python(code: str, timeout: float = 240, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k not in rebatch_startup.CARRIED}
    environ.update(env)
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
        env=environ,
    )


def _probed(done: subprocess.CompletedProcess[str]) -> list[str]:
    """The probe's own lines (the trainers log to stdout too)."""
    return [line.removeprefix("PROBE ") for line in done.stdout.splitlines() if line.startswith("PROBE ")]


@contextlib.contextmanager
def _shadow_lines(level: int) -> Iterator[list[logging.LogRecord]]:
    """The records of shadow mode's logger (a handler on it: AReaL replaces logging's root and manager
    at each of its getLogger calls, which pytest's caplog, on the root, does not survive)."""
    from torch_impl.integrations import _shadow

    records: list[logging.LogRecord] = []
    handler = logging.Handler(level)
    handler.emit = records.append  # type: ignore[method-assign]
    before = _shadow.log.level
    _shadow.log.addHandler(handler)
    _shadow.log.setLevel(level)
    try:
        yield records
    finally:
        _shadow.log.removeHandler(handler)
        _shadow.log.setLevel(before)


# -- a fresh interpreter, the variable alone ---------------------------------------------------------

AREAL_PROBE = """
import importlib, sys, warnings
warnings.simplefilter("ignore")
te = importlib.import_module("areal.engine.core.train_engine")
places = {
    "areal.engine.core.train_engine": te,
    "areal.engine.core": importlib.import_module("areal.engine.core"),
}
for name in (
    "areal.experimental.engine.archon_engine",
    "areal.engine.fsdp_engine",
    "areal.engine.megatron_engine",
):
    try:
        places[name] = importlib.import_module(name)
    except ImportError as err:  # not importable on this CPU environment: said, not hidden
        print("not importable:", name, type(err).__name__, err)
ours = getattr(sys.modules.get("torch_impl.integrations.areal"), "reorder_and_pad_outputs", None)
for name, module in places.items():
    fn = module.reorder_and_pad_outputs
    mine = ours is not None and getattr(fn, "__wrapped__", None) is ours  # counted (on mode) around ours
    kind = "rebatch" if mine else "shadow" if hasattr(fn, "__wrapped__") else "areal"
    print("PROBE", name, kind, fn.__module__)
print("LOADED torch_impl:", "torch_impl" in sys.modules)
"""


@pytest.mark.parametrize(("value", "kind"), [("on", "rebatch"), (None, "areal"), ("off", "areal")])
def test_areal_a_new_process_with_only_the_variable(value: str | None, kind: str) -> None:
    _need("areal")
    done = _python(AREAL_PROBE, **({} if value is None else {"REBATCH": value}))
    assert done.returncode == 0, done.stderr[-3000:]
    bound = [line.split() for line in _probed(done)]
    names = [b[0] for b in bound]
    # every engine that imports on CPU (.ci/areal_env.sh): megatron's needs mbridge (megatron-core), not
    # installed
    assert names == [
        "areal.engine.core.train_engine",
        "areal.engine.core",
        "areal.experimental.engine.archon_engine",
        "areal.engine.fsdp_engine",
    ], done.stdout[-2000:]
    assert (
        "not importable: areal.engine.megatron_engine ModuleNotFoundError No module named 'mbridge'"
        in done.stdout
    )
    want = "torch_impl.integrations.areal" if kind == "rebatch" else "areal.engine.core.train_engine"
    assert all(b[1] == kind and b[2] == want for b in bound), done.stdout
    assert (
        f"LOADED torch_impl: {value == 'on'}" in done.stdout
    )  # unset or off: rebatch's modules never imported


def test_areal_a_bad_value_names_the_variable() -> None:
    _need("areal")
    done = _python("import areal.engine.core.train_engine", REBATCH="onn")
    assert done.returncode == 1
    assert (
        "UnsupportedSettingError: REBATCH='onn': expected off, on, shadow or shadow:FRACTION" in done.stderr
    )


def test_areal_shadow_wraps_areals_own_function_and_carries_the_variable(tmp_path: Path) -> None:
    _need("areal")
    code = (
        "import areal.engine.core.train_engine as te\nfrom areal.infra.scheduler import local, ray\nfrom "
        "areal.infra.utils import launcher\nfn = te.reorder_and_pad_outputs\nprint('PROBE', "
        "fn.__wrapped__.__module__, fn.__wrapped__.__name__)\nprint('PROBE', "
        "launcher.get_env_vars('A=1').get('REBATCH'), local.get_env_vars is launcher.get_env_vars, "
        "ray.get_env_vars is launcher.get_env_vars)\nfrom areal.api.cli_args import "
        "SchedulingSpec\nscheduler = object.__new__(ray.RayScheduler); scheduler.enable_tms_offload = "
        "False\nenv = scheduler._build_env_vars(SchedulingSpec(cpu=1, env_vars={'X': '1'}))  # "
        "RuntimeEnv(env_vars=env)\nprint('PROBE', env.get('REBATCH'), env.get('REBATCH_REPORT_DIR'), "
        "env.get('X'))\n"
    )
    done = _python(code, REBATCH="shadow:0.5", REBATCH_REPORT_DIR=str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    assert _probed(done) == [
        "areal.engine.core.train_engine reorder_and_pad_outputs",
        "shadow:0.5 True True",
        f"shadow:0.5 {tmp_path} 1",  # what AReaL's Ray scheduler gives each worker's runtime environment
    ]


def test_areal_probed_with_find_spec_before_its_import_is_activated() -> None:
    """Issue 42's reproduction: ``importlib.util.find_spec("areal")`` first (an optional dependency probed)
    used to take AReaL off the hook's list, and the import then ran AReaL's own function."""
    _need("areal")
    code = (
        "import importlib.util, warnings\n"
        "warnings.simplefilter('ignore')\n"
        "assert importlib.util.find_spec('areal') is not None\n"
        "import areal.engine.core.train_engine as t\n"
        "print('PROBE', t.reorder_and_pad_outputs.__module__)\n"
    )
    done = _python(code, REBATCH="on")
    assert done.returncode == 0, done.stderr[-3000:]
    assert _probed(done) == ["torch_impl.integrations.areal"], done.stdout[-2000:]


#: Every ``REBATCH*`` setting, as the trainer's launcher process has it (the witness's two included).
SETTINGS = {
    "REBATCH": "on",
    "REBATCH_ON_DEFECT": "raise",
    "REBATCH_WITNESS": "off",
    "REBATCH_WITNESS_UNBOUND": "kl",
}


def test_areal_get_env_vars_carries_every_setting() -> None:
    """AReaL's own ``get_env_vars`` (what its local and Ray schedulers give each RPC worker) carries the
    witness's variables too: a worker raises or stays silent as the launcher was told to."""
    _need("areal")
    code = (
        "import json, warnings\n"
        "warnings.simplefilter('ignore')\n"
        "from areal.infra.utils import launcher\n"
        "env = launcher.get_env_vars('A=1')\n"
        f"print('PROBE', json.dumps({{k: env.get(k) for k in {sorted(SETTINGS)!r}}}))\n"
    )
    done = _python(code, **SETTINGS)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [json.loads(line) for line in _probed(done)] == [SETTINGS], done.stdout[-2000:]


PROBE_ENGINE = '''
import json, sys
from areal.api.engine_api import TrainEngine


class Probe(TrainEngine):
    """An engine the RPC worker creates: it says which reorder_and_pad_outputs the worker's AReaL holds."""

    def __init__(self, out: str = "") -> None:
        import areal.engine.core as core
        import areal.engine.core.train_engine as te

        ours = getattr(sys.modules.get("torch_impl.integrations.areal"), "reorder_and_pad_outputs", None)
        with open(out, "w") as f:
            mine = ours is not None and (
                getattr(te.reorder_and_pad_outputs, "__wrapped__", None) is ours  # counted
            )
            json.dump({"rebatch": mine and core.reorder_and_pad_outputs is te.reorder_and_pad_outputs}, f)


Probe.__abstractmethods__ = frozenset()
'''

AREAL_SCHEDULER = """
import asyncio, json, os, sys
from areal.api.cli_args import SchedulingSpec
from areal.api.scheduler_api import Job
from areal.infra.scheduler.local import LocalScheduler

root = sys.argv[1]
os.makedirs(os.path.join(root, "nr"), exist_ok=True)
scheduler = LocalScheduler(gpu_devices=[0], log_dir=os.path.join(root, "logs"), startup_timeout=120.0,
    experiment_name="rebatch", trial_name="probe", fileroot=root, nfs_record_root=os.path.join(root, "nr"))
try:
    spec = SchedulingSpec(cpu=1, gpu=0, mem=1, cmd="python -m areal.infra.rpc.rpc_server")
    ids = scheduler.create_workers(Job(role="probe", replicas=1, tasks=[spec]))
    scheduler.get_workers("probe", timeout=120)
    out = os.path.join(root, "out.json")
    asyncio.run(scheduler.create_engine(ids[0], "rebatch_probe_engine.Probe", out=out))
    print("worker:", open(out).read())
finally:
    scheduler.delete_workers()
"""


def test_areal_an_rpc_worker_of_the_local_scheduler_runs_rebatch(tmp_path: Path) -> None:
    """AReaL's own LocalScheduler starts ``areal.infra.rpc.rpc_server`` (CPU, gpu=0) from a controller
    with ``REBATCH=on``; an engine created in that worker sees rebatch's function."""
    _need("areal")
    (tmp_path / "rebatch_probe_engine.py").write_text(PROBE_ENGINE)
    (tmp_path / "root").mkdir()
    code = f"import sys; sys.argv = ['x', {str(tmp_path / 'root')!r}]\n" + AREAL_SCHEDULER
    path = os.pathsep.join(
        [str(tmp_path), *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
    )
    done = _python(code, timeout=300, REBATCH="on", PYTHONPATH=path, AREAL_LOG_LEVEL="WARNING")
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    assert 'worker: {"rebatch": true}' in done.stdout, done.stdout[-2000:]


SKYRL_PROBE = """
import sys, warnings
warnings.simplefilter("ignore")
from skyrl.backends.skyrl_train.workers.worker_utils import TokenBasedBatchIterator as T
mod = sys.modules.get("torch_impl.integrations.skyrl")
for name in ("reorder_and_combine_batches", "reorder_and_combine_items"):
    fn = vars(T)[name]
    ours = mod is not None and getattr(fn, "__wrapped__", None) is getattr(mod, name)  # counted (on mode)
    kind = "rebatch" if ours else "shadow" if hasattr(fn, "__wrapped__") else "skyrl"
    print("PROBE", name, kind)
from skyrl.train.config import SkyRLTrainConfig
from skyrl.train.utils.utils import prepare_runtime_environment
print("PROBE carried:", prepare_runtime_environment(SkyRLTrainConfig()).get("REBATCH"))
"""


@pytest.mark.parametrize(
    ("value", "kind"), [("on", "rebatch"), (None, "skyrl"), ("off", "skyrl"), ("shadow", "shadow")]
)
def test_skyrl_a_new_process_with_only_the_variable(value: str | None, kind: str) -> None:
    _need("skyrl")
    done = _python(SKYRL_PROBE, **({} if value is None else {"REBATCH": value}))
    assert done.returncode == 0, done.stderr[-3000:]
    carried = value if value not in (None, "off") else None
    assert _probed(done) == [
        f"reorder_and_combine_batches {kind}",
        f"reorder_and_combine_items {kind}",
        f"carried: {carried}",
    ]


def test_skyrl_a_bad_value_names_the_variable() -> None:
    _need("skyrl")
    done = _python("import skyrl.backends.skyrl_train.workers.worker_utils", REBATCH="shadow:lots")
    assert done.returncode == 0  # shadow never stops the run: an ERROR line, SkyRL's own methods
    assert "REBATCH='shadow:lots': expected off, on, shadow or shadow:FRACTION" in done.stderr
    done = _python("import skyrl.backends.skyrl_train.workers.worker_utils", REBATCH="yes")
    assert done.returncode == 1
    assert "UnsupportedSettingError: REBATCH='yes'" in done.stderr


def test_skyrl_prepare_runtime_environment_carries_every_setting() -> None:
    """SkyRL's own ``prepare_runtime_environment`` (the Ray actors' environment) carries the witness's
    variables too."""
    _need("skyrl")
    code = (
        "import json, warnings\n"
        "warnings.simplefilter('ignore')\n"
        "from skyrl.train.config import SkyRLTrainConfig\n"
        "from skyrl.train.utils.utils import prepare_runtime_environment\n"
        "env = prepare_runtime_environment(SkyRLTrainConfig())\n"
        f"print('PROBE', json.dumps({{k: env.get(k) for k in {sorted(SETTINGS)!r}}}))\n"
    )
    done = _python(code, **SETTINGS)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [json.loads(line) for line in _probed(done)] == [SETTINGS], done.stdout[-2000:]


SKYRL_DRIVER = """
import sys, ray
from skyrl.train.config import SkyRLTrainConfig
from skyrl.train.utils.utils import prepare_runtime_environment

env_vars = prepare_runtime_environment(SkyRLTrainConfig())  # what SkyRL's initialize_ray passes
print("carried:", env_vars.get("REBATCH"))
ray.init(address=sys.argv[1], runtime_env={"env_vars": env_vars}, log_to_driver=False)


@ray.remote(num_cpus=0)
class Probe:
    def where(self):
        import os, sys
        from skyrl.backends.skyrl_train.workers.worker_utils import TokenBasedBatchIterator as T

        mod = sys.modules.get("torch_impl.integrations.skyrl")
        names = ("reorder_and_combine_batches", "reorder_and_combine_items")
        ours = [
            mod is not None and getattr(vars(T)[n], "__wrapped__", None) is getattr(mod, n) for n in names
        ]
        return os.environ.get("REBATCH"), all(ours)


print("actor:", ray.get(Probe.remote().where.remote(), timeout=120))
"""


@pytest.fixture
def skyrl_installed() -> None:
    """SkyRL's test needs SkyRL (skipped or failed here, before a Ray cluster is started)."""
    _need("skyrl")


def test_skyrl_a_ray_actor_on_a_cluster_started_without_the_variable_binds_rebatch(
    skyrl_installed: None, ray_head: str
) -> None:
    """A head node started without ``REBATCH`` (its own temp dir, stopped by its own process:
    ``tests/conftest.py``); a driver with ``REBATCH=on`` attaches, passing what
    ``prepare_runtime_environment`` returns (as SkyRL's ``initialize_ray``): only that reaches the actor."""
    code = f"import sys; sys.argv = ['x', {ray_head!r}]\n" + SKYRL_DRIVER
    done = _python(code, timeout=240, REBATCH="on")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "carried: on" in done.stdout
    assert "actor: ('on', True)" in done.stdout, done.stdout


# -- shadow mode, in this process ---------------------------------------------------------------------

#: What each trainer's own function is silent on among its native defects (from its kit module's ``OUTCOMES``;
#: tests/test_peers.py: TRAINER_OUTCOMES).
SILENT = {
    name: tuple(
        defect
        for defect, what in importlib.import_module(f"property_tests.trainers.{name}").OUTCOMES.items()
        if what == "silent"
    )
    for name in OWN_LANES
}


@pytest.fixture
def shadowed(request: pytest.FixtureRequest):
    """``(integration, the trainer's own functions)`` with ``install(mode="shadow", sample=1.0)`` in force
    (``"NAME:0"``: ``sample=0.0``, only each name's first call compared, the others checked only)."""
    import importlib

    name, _, sample = str(request.param).partition(":")
    _need(name)
    integration = importlib.import_module(f"torch_impl.integrations.{name}")
    own = PEERS[name].theirs()
    integration.install(mode="shadow", sample=float(sample or 1.0))
    try:
        yield integration, own
    finally:
        integration.uninstall()
        integration.INTEGRATION.kept = None


def _same(a: Any, b: Any) -> bool:
    from property_tests.compare import first_difference

    return first_difference(a, b) is None


@pytest.mark.parametrize("shadowed", OWN_LANES, indirect=True)
def test_shadow_reports_every_native_defect_and_returns_the_trainers_result(shadowed) -> None:
    integration, own = shadowed
    name = integration.__name__.rsplit(".", 1)[1]
    peer = PEERS[name]
    now = peer.theirs()  # the module's functions now: the shadow wrappers
    assert all(now[f] is not own[f] and now[f].__wrapped__ is own[f] for f in own)
    defects = peer.native_defects()
    for n, defect in enumerate(defects, 1):
        with _shadow_lines(logging.ERROR) as records:
            alone = outcome(lambda d=defect: d.attempt(own))
            if alone == "silent":
                assert _same(defect.attempt(now), defect.attempt(own)), (
                    defect.name
                )  # the trainer's result, unchanged
            else:  # the trainer's own function raises (AReaL: AssertionError on a plain duplicate)
                assert outcome(lambda d=defect: d.attempt(now)) == alone, defect.name
        assert integration.stats()["defects"] == n, (defect.name, integration.stats()["messages"])
        (line,) = [r.getMessage() for r in records]
        assert line.startswith(f"{name} "), line
        assert f"{name}'s result of this step is misaligned in keys" in line, line
        assert defect.error.__name__ in line, line
    assert {d.name for d in defects if outcome(lambda d=d: d.attempt(own)) == "silent"} == set(SILENT[name])
    s = integration.stats()
    assert (s["differences"], s["errors"], s["trainer"], s["mode"]) == (0, 0, name, "shadow")
    from torch_impl import integrations

    assert integrations.stats()[name]["defects"] == len(defects)  # every active integration's counters
    integration.uninstall()
    integration.install(mode="shadow", sample=0.0)  # each name's first call compared, the others checked only
    for defect in defects:
        outcome(lambda d=defect: d.attempt(peer.theirs()))
    s = integration.stats()
    assert s["defects"] == len(defects), s["messages"]  # rebatch's check-only functions find them too
    assert s["sampled"] == len(s["by_name"]) < s["calls"]


@pytest.mark.parametrize("shadowed", OWN_LANES, indirect=True)
def test_shadow_dumps_the_first_misaligned_step(shadowed, tmp_path: Path) -> None:
    import torch

    integration, _own = shadowed
    name = integration.__name__.rsplit(".", 1)[1]
    integration.uninstall()
    dump = tmp_path / "step.pt"
    integration.install(mode="shadow", dump=str(dump))
    defect = next(d for d in PEERS[name].native_defects() if d.name == SILENT[name][0])
    with _shadow_lines(logging.ERROR) as records:
        defect.attempt(PEERS[name].theirs())
    assert len(records) == 1
    saved = torch.load(dump, weights_only=False)
    assert saved["function"].startswith(f"{name}.")


@pytest.mark.parametrize("shadowed", [*OWN_LANES, *(f"{name}:0" for name in OWN_LANES)], indirect=True)
def test_shadow_on_300_random_valid_calls_finds_nothing_and_logs_nothing(shadowed) -> None:
    """Compared every call, and (``:0``) checked only after each name's first: rebatch's check-only
    functions (`check_reorder_and_pad_outputs`, `check_reorder_and_combine_batches`) refuse no valid call."""
    integration, own = shadowed
    name = integration.__name__.rsplit(".", 1)[1]
    peer = PEERS[name]
    calls = drawn(microbatch_outputs(**peer.bounds, use_dynamic_bsz=None), 300)
    with _shadow_lines(logging.WARNING) as records:
        found = differential(
            peer._replace(ours=lambda: own), calls
        )  # the shadowed trainer vs its own function
    assert found == []
    s = integration.stats()
    assert (s["differences"], s["defects"], s["errors"]) == (0, 0, 0), s["messages"]
    assert s["calls"] >= 300
    assert s["sampled"] == (s["calls"] if integration.INTEGRATION.kept.every else len(s["by_name"]))
    assert [r.getMessage() for r in records] == []


@pytest.mark.parametrize("shadowed", OWN_LANES, indirect=True)
def test_on_defect_raise_stops_the_step_with_rebatchs_error(shadowed) -> None:
    integration, _own = shadowed
    name = integration.__name__.rsplit(".", 1)[1]
    integration.uninstall()
    integration.install(mode="shadow", on_defect="raise")
    defect = next(d for d in PEERS[name].native_defects() if d.name == SILENT[name][0])
    assert outcome(lambda: defect.attempt(PEERS[name].theirs())) == f"raises {defect.error.__name__}"


REPORTING = """
import warnings
warnings.simplefilter("ignore")
from property_tests.peers import PEERS
peer = PEERS[{name!r}]
defect = next(d for d in peer.native_defects() if d.name == {case!r})
{call}
"""


@pytest.mark.parametrize("name", OWN_LANES)
def test_reports_of_a_shadow_process_and_rebatch_report(name: str, tmp_path: Path) -> None:
    """``REBATCH=shadow REBATCH_REPORT_DIR=DIR``: one report a process (host and pid in its name), with the
    trainer, its release, the mode and the process; ``rebatch report`` exits 1 on it, 0 on a clean one."""
    _need(name)
    dirty, clean = tmp_path / "dirty", tmp_path / "clean"
    bad = REPORTING.format(name=name, case=SILENT[name][0], call="defect.attempt(peer.theirs())")
    good = textwrap.dedent(
        """
        from property_tests.peer_report import drawn
        from property_tests.strategies import microbatch_outputs
        for case in drawn(microbatch_outputs(**peer.bounds, use_dynamic_bsz=None), 5):
            peer.run(peer.theirs(), case.output_lst, case.indices, case.use_dynamic_bsz, case.pad_mode)
        """
    )
    for code, where in (
        (bad, dirty),
        (REPORTING.format(name=name, case=SILENT[name][0], call="") + good, clean),
    ):
        done = _python(code, REBATCH="shadow", REBATCH_REPORT_DIR=str(where))
        assert done.returncode == 0, done.stderr[-3000:]
    (report,) = dirty.glob("*.json")
    assert report.name.startswith(f"rebatch-{name}-")
    assert report.name.endswith(".json")
    saved = json.loads(report.read_text())
    assert (saved["trainer"], saved["version"], saved["mode"], saved["defects"]) == (
        name,
        PEERS_VERSION[name],
        "shadow",
        1,
    )
    assert str(saved["process"]["pid"]) in report.name
    cli = [sys.executable, "-m", "rebatch", "report"]
    dirty_run = subprocess.run([*cli, str(dirty)], capture_output=True, text=True, check=False, timeout=120)
    assert dirty_run.returncode == 1, dirty_run.stdout + dirty_run.stderr
    assert "1 defect(s)" in dirty_run.stdout
    clean_run = subprocess.run([*cli, str(clean)], capture_output=True, text=True, check=False, timeout=120)
    assert clean_run.returncode == 0, clean_run.stdout + clean_run.stderr


#: Each trainer's release under test (its declaration's, ``"AReaL 1.0.4"``).
PEERS_VERSION = {name: by_name(name).release.rsplit(" ", 1)[-1] for name in OWN_LANES}
