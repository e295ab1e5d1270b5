"""The engine lane: verl 0.9.1's own ``FSDPEngineWithLMHead``, driven by verl's ``TrainingWorker`` over a
tiny random Qwen2 on this CPU (`tests/engine/verl_engine.py`, the driver), with rebatch off, ``REBATCH=on``,
``REBATCH_VERL=on``, ``install()`` and ``REBATCH=shadow:1``, each in fresh processes (world size 1, and 2
through torchrun), compared bit for bit against verl's own run; well-formed misalignments injected inside
the engine loop (world size 1); ``rebatch check --dump`` and ``rebatch report`` on what the engine left;
and the negative control (rebatch's binding left out of the engine module: the misalignment check fails).

Needs verl 0.9.1 with its engine's imports (the pins environment, ``.ci/pins_env.sh``): skipped without
them, failed instead under ``REBATCH_REQUIRE_ENGINE=1`` (CI's pins lane).
``REBATCH_ENGINE_NEGATIVE_CONTROL=1``
runs the ``install`` mode with ``--unbind``: the lane must then fail (docs/engine.md shows it failing).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

import pytest

import rebatch_startup
from property_tests.compare import first_difference

ROOT = Path(__file__).resolve().parents[1]
DRIVER = ROOT / "tests" / "engine" / "verl_engine.py"
REQUIRE_ENV = "REBATCH_REQUIRE_ENGINE"
NEGATIVE_ENV = "REBATCH_ENGINE_NEGATIVE_CONTROL"
MODES = ("off", "on", "verl", "install", "shadow")
REBATCH_MODES = ("on", "verl", "install", "shadow")
# : The configurations, the fixed-length batch's last (every row one length: only provenance sees a swap
# there).
CONFIGS = [f"{d}-rmpad{r}-dyn{b}" for d in ("bf16", "fp32") for r in (1, 0) for b in (1, 0)] + [
    "fp32-rmpad1-dyn1-fixedlen"
]
INJECTIONS = ("swap_micro_batches", "swap_rows", "swap_fixed", "swap_equal")
#: verl's own run with each misalignment injected: the rows restored with another row's length (measured:
#: verl raises nothing, and its no_padding_2_padding goes on, as it checks only the total length).
VERL_WRONG_ROWS = {"swap_micro_batches": 6, "swap_rows": 2, "swap_fixed": 8, "swap_equal": 0}
#: What catches each injection in rebatch's modes: the split's provenance (an output in another micro-batch's
#: slot, whatever the lengths) or the alignment witness (rows rebuilt on fresh offsets carry no provenance).
CAUGHT_BY = {
    "swap_micro_batches": "by the split's provenance",
    "swap_rows": "alignment witness",
    "swap_fixed": "by the split's provenance",
    "swap_equal": "by the split's provenance",
}
#: Shadow mode's defects a step with each injection counts: verl's own postprocess_batch_func (in charge)
#: one, and, with dynamic batch size, each key it restores through restore_dynamic_batch (rebatch's, which
#: checks the restored rows' lengths against the split's: log_probs and entropy) where the lengths tell.
SHADOW_DEFECTS = {"swap_micro_batches": 3, "swap_rows": 3, "swap_fixed": 1, "swap_equal": 1}
TIMEOUT = 600


def _need_engine() -> None:
    missing = [
        m for m in ("verl", "uvicorn", "fastapi", "transformers") if importlib.util.find_spec(m) is None
    ]
    version = importlib.metadata.version("verl") if "verl" not in missing else None
    if not missing and version == "0.9.1":
        return
    why = (
        f"verl 0.9.1's engine cannot run here (missing {missing}, verl {version}); CI runs the engine lane "
        "in its pins environment (.ci/pins_env.sh)"
    )
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(why)
    pytest.skip(why, allow_module_level=True)


_need_engine()


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Run(NamedTuple):
    """One driver process (or torchrun's two): its exit status, output, and per rank what it wrote."""

    rc: int
    output: str
    results: list[dict[str, Any]]
    records: list[dict[str, Any]]
    dump_dir: Path
    report_dir: Path


def drive(out: Path, mode: str, world: int, *extra: str) -> Run:
    """Run the driver in fresh processes with ``mode``'s environment (the variables rebatch reads, and
    nothing else of the caller's rebatch settings)."""
    import torch

    env = {
        k: v
        for k, v in os.environ.items()
        if k not in rebatch_startup.CARRIED and not k.startswith("REBATCH_")
    }
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    env["OMP_NUM_THREADS"] = "1"
    dump_dir, report_dir = out / "dump", out / "report"
    if mode in ("on", "shadow"):
        env["REBATCH"] = "on" if mode == "on" else "shadow:1"
    if mode == "verl":
        env["REBATCH_VERL"] = "on"
    if mode == "shadow":
        env["REBATCH_DUMP_DIR"], env["REBATCH_REPORT_DIR"] = str(dump_dir), str(report_dir)
    args = [str(DRIVER), "--out", str(out), "--mode", mode, *extra]
    if mode == "install" and os.environ.get(NEGATIVE_ENV) == "1":
        args.append("--unbind")
    if world == 1:
        command = [sys.executable, *args, "--port", str(_port())]
    else:
        torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
        assert torchrun, "torchrun is not installed next to this interpreter"
        command = [torchrun, f"--nproc-per-node={world}", f"--master-port={_port()}", *args]
    done = subprocess.run(
        command, capture_output=True, text=True, check=False, timeout=TIMEOUT, env=env, cwd=ROOT
    )
    output = done.stdout + done.stderr
    results, records = [], []
    for rank in range(world):
        if (out / f"rank-{rank}.json").exists():
            records.append(json.loads((out / f"rank-{rank}.json").read_text()))
            results.append(torch.load(out / f"rank-{rank}.pt", weights_only=True))
    assert len(records) == world or done.returncode, output[-3000:]
    return Run(done.returncode, output, results, records, dump_dir, report_dir)


class Runs:
    """The driver's launches, each run once, when a test first asks for it: every mode at world size 1
    (the configurations and the injected misalignments) and 2 (the configurations): ten launches, the
    lane's cost."""

    def __init__(self, factory: pytest.TempPathFactory) -> None:
        self.factory = factory
        self.done: dict[tuple[str, int], Run] = {}

    def __getitem__(self, key: tuple[str, int]) -> Run:
        if key not in self.done:
            mode, world = key
            expect = ["--expect", "caught"] if world == 1 and mode in ("on", "verl", "install") else []
            self.done[key] = drive(self.factory.mktemp(f"{mode}-w{world}"), mode, world, *expect)
        return self.done[key]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return Runs(tmp_path_factory)


def _clean(run: Run) -> Run:
    assert len(run.records) == len(run.results) > 0, run.output[-3000:]
    for record in run.records:
        for name, what in record["runs"].items():
            if not name.startswith("inject-"):
                assert "raised" not in what, f"{name}: {what.get('traceback')}"
    return run


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("mode", REBATCH_MODES)
def test_every_configuration_is_bit_identical_to_verls_own(runs: Runs, mode: str, world: int) -> None:
    """Log-probs and entropy (values, offsets, dtypes, padded), the micro-batches' rows in the order the
    engine ran them, the gradients before each of the two optimizer steps, the parameters after, the
    metrics but the wall-clock ones: every configuration, every rank."""
    ours, theirs = _clean(runs[mode, world]), _clean(runs["off", world])
    for rank in range(world):
        for config in CONFIGS:
            got, want = ours.results[rank][config], theirs.results[rank][config]
            assert set(got) == {
                "log_prob_1",
                "update_metrics",
                "log_prob_2",
                "micro_batches",
                "grads",
                "params",
            }
            assert len(got["grads"]) == 2
            assert len(got["grads"][0]) == len(got["params"]) > 0
            why = first_difference(got, want)
            assert why is None, f"{mode}, world size {world}, rank {rank}, {config}: {why}"
            shadow = ours.records[rank]["runs"][config].get("shadow")
            if mode == "shadow":  # shadow:1 compares every call of every replaced name: none differed
                assert shadow["sampled"] == shadow["calls"] > 0, shadow
                assert shadow["differences"] == shadow["defects"] == shadow["errors"] == 0, shadow
            else:
                assert shadow is None, shadow


@pytest.mark.parametrize("mode", MODES)
def test_the_engine_module_binds_what_the_mode_says(runs: Runs, mode: str) -> None:
    for world in (1, 2):
        for record in _clean(runs[mode, world]).records:
            bound = record["bindings"]["postprocess_batch_func"]
            if mode == "off":
                assert bound.startswith(
                    "verl.workers.engine.utils.postprocess_batch_func (engine/utils.py)"
                ), bound
            elif mode == "shadow":  # verl's function in charge, inside the shadow's wrapper
                assert bound.startswith("verl.workers.engine.utils.postprocess_batch_func (integrations/"), (
                    bound
                )
            else:
                assert bound.startswith("torch_impl."), bound


def test_world_size_2_agrees_the_micro_batch_count(runs: Runs) -> None:
    """Rank 1's rows are longer: alone, rank 0 would run fewer micro-batches; verl (and rebatch's
    prepare_micro_batches) agree the count, so both ranks run the same number."""
    alone, two = runs["off", 1].results[0], runs["off", 2].results
    for mode in MODES:
        for config in CONFIGS:
            counts = [
                {p: len(m) for p, m in r[config]["micro_batches"].items()} for r in runs[mode, 2].results
            ]
            assert counts[0] == counts[1], (mode, config, counts)
    raised = [
        c
        for c in CONFIGS
        if "dyn1" in c
        and len(two[0][c]["micro_batches"]["log_prob_1"]) > len(alone[c]["micro_batches"]["log_prob_1"])
    ]
    assert raised == [c for c in CONFIGS if "dyn1" in c and "fixedlen" not in c], (
        raised
    )  # fixed length: ranks alike


@pytest.mark.parametrize("kind", INJECTIONS)
@pytest.mark.parametrize("mode", MODES)
def test_a_misalignment_inside_the_engine_loop(runs: Runs, mode: str, kind: str) -> None:
    """verl's own: silent, rows of the wrong length go on; on, REBATCH_VERL, install(): MisalignmentError
    naming the key; shadow: verl's result returned, its defects counted (`SHADOW_DEFECTS`)."""
    run = runs[mode, 1]
    record, result = run.records[0]["runs"][f"inject-{kind}"], run.results[0][f"inject-{kind}"]
    assert record["injected"], record
    if mode in ("on", "verl", "install"):
        assert record.get("raised") == "MisalignmentError", f"{mode}, {kind}: not caught: {record}"
        assert "key 'log_probs'" in record["message"], record
        assert CAUGHT_BY[kind] in record["message"], record
        assert run.rc == 0, run.output[-3000:]
        return
    assert "raised" not in record, record
    assert record["rows_of_wrong_length"] == VERL_WRONG_ROWS[kind], record
    config = record["config"]
    clean = runs["off", 1].results[0][config]["log_prob_1"]
    assert first_difference(result["log_prob_1"], clean) is not None
    if mode == "shadow":
        assert record["shadow"]["defects"] == SHADOW_DEFECTS[kind], record
        assert record["shadow"]["differences"] == 0, record
        assert first_difference(result, runs["off", 1].results[0][f"inject-{kind}"]) is None
    else:
        assert "shadow" not in record


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in rebatch_startup.CARRIED}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    return subprocess.run(
        [sys.executable, "-m", "rebatch", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        env=env,
    )


def test_rebatch_check_and_report_read_what_the_engine_left(runs: Runs) -> None:
    """Shadow at world size 1 met one misalignment per injection: one dump (the first), which ``rebatch
    check --dump`` rejects naming the misalignment (exit 1), and a report that ``rebatch report`` finds
    not clean (exit 1, the defects of every injection). At world size 2 (no misalignment): no dump, two clean
    reports (exit 0)."""
    one, two = runs["shadow", 1], runs["shadow", 2]
    dumps = sorted(p for p in one.dump_dir.iterdir() if p.is_file())
    assert len(dumps) == 1, dumps
    check = _cli("check", "--dump", str(dumps[0]))
    assert check.returncode == 1, check.stdout + check.stderr
    assert "MisalignmentError" in check.stdout, check.stdout
    assert "MISMATCH" in check.stdout, check.stdout
    report = _cli("report", str(one.report_dir))
    assert report.returncode == 1, report.stdout + report.stderr
    assert f"{sum(SHADOW_DEFECTS.values())} defect(s)" in report.stdout, report.stdout
    assert not two.dump_dir.exists() or not any(two.dump_dir.iterdir())
    assert len([p for p in two.report_dir.iterdir() if p.is_file()]) == 2
    report = _cli("report", str(two.report_dir))
    assert report.returncode == 0, report.stdout + report.stderr


def test_negative_control_without_rebatchs_binding_in_the_engine_the_lane_fails(tmp_path: Path) -> None:
    """install(), then verl's own postprocess_batch_func put back in the FSDP engine module, and verl's own
    restore_dynamic_batch in verl's utils module (which verl's function calls): the same injected
    misalignments pass silently and the driver's check fails (exit 1)."""
    run = drive(tmp_path, "install", 1, "--only-inject", "--unbind", "--expect", "caught")
    assert run.rc == 1, run.output[-3000:]
    assert "NOT caught" in run.output, run.output[-3000:]
    record = run.records[0]
    assert record["bindings"]["postprocess_batch_func"].startswith("verl.workers.engine.utils"), record[
        "bindings"
    ]
    assert record["bindings"]["prepare_micro_batches"].startswith("torch_impl."), record["bindings"]
    for kind in INJECTIONS:
        assert "raised" not in record["runs"][f"inject-{kind}"], record["runs"][f"inject-{kind}"]
        assert record["runs"][f"inject-{kind}"]["rows_of_wrong_length"] == VERL_WRONG_ROWS[kind]
