"""rebatch beside each trainer's own function on a GPU, as a model: traced, not timed.

Two steps. ``trace`` runs in a trainer's environment (where its own function can be imported): each case
of `property_tests.sidebyside` (B = 8, 1,024, 16,384; 1 and 5 keys) on fake CUDA tensors
(`property_tests.fakecuda`), rebatch's drop-in and the trainer's function, and stores what each did on
the device (kernel launches, bytes read and written, host-device synchronisations) in a JSON file. A
trainer that is not installed is refused (exit 2): no numbers are made up for it. ``--write`` turns the
JSON into ``docs/gpu.md`` with the cost model `Model`; it refuses (exit 2) while a trainer's traces are
missing. ``tests/test_gpu_model.py`` checks the page against the JSON.

    .venv-pins/bin/python  -m rebatch.bench.gpu_model trace --trainer verl  --out docs/gpu_traces.json
    .venv-areal/bin/python -m rebatch.bench.gpu_model trace --trainer areal --out docs/gpu_traces.json
    .venv-skyrl/bin/python -m rebatch.bench.gpu_model trace --trainer skyrl --out docs/gpu_traces.json
    .venv-pins/bin/python  -m rebatch.bench.gpu_model calibrate   # the code of 7f5c5c9, as verl's traces
    python -m rebatch.bench.devicepath --out docs/devicepath.json
    python -m rebatch.bench.gpu_model --write docs/gpu.md

``calibrate`` fits `Model`'s host scale, launch and read costs to the rows an H200 measured
(``docs/gpu_h200.json``), from the host seconds, launches and reads of the code that ran there, measured
here in the environment it runs in (verl's pins, as verl's and AReaL's traces): ``docs/gpu_calibration.json``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from rebatch_startup.trainers import names as trainer_names

__all__ = [
    "Model",
    "calibrate",
    "calibrated",
    "host_of",
    "host_seconds",
    "main",
    "predict",
    "probe",
    "render",
    "trace_trainer",
]


class Model(NamedTuple):
    """Time of a call on one GPU = ``host_scale`` x host seconds measured here + launches x
    ``per_launch_s`` + bytes / ``bandwidth_bytes_s`` + syncs x ``sync_s`` (additive: no overlap of host and
    device assumed). The host seconds of a call are its Python, NumPy and torch's dispatch: rebatch's
    measured on ``meta`` tensors (the device path without data), a trainer's own function, which reads
    device data, on CPU tensors (its per-row operations are dispatch-bound). The defaults are those of
    the calibration (`calibrate`: ``docs/gpu_calibration.json``) against an H200's measured rows."""

    #: 4.3 TB/s: NVIDIA's H200 datasheet gives 4.8 TB/s of HBM3e peak bandwidth; a device-to-device copy
    # : reaches about 90% of a peak in practice (``rebatch.bench.cuda_check`` measures a ``clone`` to check
    # it).
    bandwidth_bytes_s: float = 4.3e12
    #: The cost of one launch beyond its host dispatch (fitted; the H200 measured 6.86 us for a small
    #: operation from Python, dispatch included).
    per_launch_s: float = 5e-6
    #: A host read of device data: the queue drains, then a device-to-host copy's round trip (fitted).
    sync_s: float = 10e-6
    #: This machine's host seconds to a GPU host's (fitted; 0: host time left out, the old model).
    host_scale: float = 0.0


def _ratio(theirs: float, ours: float) -> str:
    """``theirs / ours`` as the page writes it; ``n/a`` where rebatch's prediction is nothing at all (a
    call with no device work and no host time measured)."""
    if ours == 0:
        return "n/a"
    return f"{theirs / ours:.2f}x"


def predict(side: dict[str, Any], model: Model) -> float:
    """The model's seconds for one traced side of a case (its ``host_s``, where measured)."""
    device = (
        side["launches"] * model.per_launch_s
        + side["bytes"] / model.bandwidth_bytes_s
        + side["syncs"] * model.sync_s
    )
    return model.host_scale * side.get("host_s", 0.0) + device


#: Calls of a case timed for its host seconds (the least is kept), after two warm-up calls.
HOST_REPEATS = 21


def host_seconds(call: Callable[[], Any], repeats: int = HOST_REPEATS) -> float:
    """The least wall seconds of ``call()`` over ``repeats`` calls, after two warm-up calls: the call's own
    cost (what the machine adds besides, another process or a page fault, only lengthens a call)."""
    for _ in range(2):
        call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return min(times)


def to_meta(x: Any) -> Any:
    """``x``'s tensors on ``meta`` (`to_device`): the device path without data."""
    return to_device(x, "meta")


def to_device(x: Any, device: str) -> Any:
    """``x``'s tensors (in lists and dicts) on ``device``, one copy of each tensor however often it occurs:
    keys built on one offsets tensor (as verl's engines build every per-token key of a micro-batch) keep
    one offsets tensor there."""
    import torch

    from torch_impl.testing import tree_map

    made: dict[int, Any] = {}

    def one(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        if id(t) not in made:
            if t.is_nested:
                offsets = one(t.offsets())  # type: ignore[attr-defined]
                made[id(t)] = torch.nested.nested_tensor_from_jagged(one(t.values()), offsets)
            else:
                made[id(t)] = t.to(device)
        return made[id(t)]

    return tree_map(one, x)


def host_of(trainer: str, b: int, keys: int, fn: Any) -> dict[str, float | None]:
    """A case's host seconds: rebatch's on ``meta``; the trainer's own ``fn`` (None: not installed) on the
    CPU."""
    from property_tests import sidebyside

    ours = host_seconds(sidebyside.pair(trainer, b, keys, to_meta).ours)
    theirs = None
    if fn is not None:
        call = sidebyside.pair(trainer, b, keys, lambda x: x, fn).theirs
        assert call is not None
        theirs = host_seconds(call, repeats=3 if b > 1024 else HOST_REPEATS)
    return {"rebatch": ours, "theirs": theirs}


def _side(trace: Any) -> dict[str, Any]:
    return {
        "launches": len(trace.launches),
        "ops": len(trace.ops),
        "bytes": trace.bytes,
        "syncs": trace.syncs,
        "allocations": trace.allocations,
        "mixed": len(trace.mixed),
        "op_set": sorted(trace.op_set),
    }


def _fake_like(x: Any, fc: Any) -> Any:
    from property_tests.fakecuda import fake_like

    return fake_like(x, fc)


def trace_trainer(trainer: str, sizes: tuple[int, ...] | None = None) -> dict[str, Any]:
    """Every case of ``trainer`` traced, both sides (ImportError where the trainer is not installed)."""
    import torch

    from property_tests import sidebyside
    from property_tests.fakecuda import FakeCuda

    fn, label = sidebyside.theirs(trainer)
    cases = []
    for b in sizes or sidebyside.SIZES:
        for keys in sidebyside.KEYS:
            fc = FakeCuda()
            pair = sidebyside.pair(trainer, b, keys, functools.partial(_fake_like, fc=fc), fn)
            sides: dict[str, Any] = {}
            for name, call in (("rebatch", pair.ours), ("theirs", pair.theirs)):
                assert call is not None  # the trainer was imported above
                with fc:
                    call()
                sides[name] = _side(fc.trace())
                fc.reset()
            host = host_of(trainer, b, keys, fn)
            sides["rebatch"]["host_s"] = host["rebatch"]
            sides["theirs"]["host_s"] = host["theirs"]
            micro_batches = sidebyside.micro_batches(b)
            case: dict[str, Any] = {"b": b, "keys": keys, "micro_batches": micro_batches}
            cases.append({**case, "output_bytes": pair.output_bytes, **sides})
    return {"label": label, "torch": torch.__version__, "cases": cases}


def probe() -> dict[str, Any]:
    """Every case of every trainer, as `trace_trainer` makes them, with the code on the path (an older
    commit's, for `calibrate`): rebatch's side, and the trainer's own where importable (verl's algorithm,
    `property_tests.baseline`, standing in for verl)."""
    from property_tests import sidebyside
    from property_tests.fakecuda import FakeCuda

    out: dict[str, Any] = {}
    for trainer in sidebyside.TRAINERS:
        try:
            fn: Any = sidebyside.theirs(trainer, stand_in=True)[0]
        except ImportError:
            fn = None
        cases = []
        for b in sidebyside.SIZES:
            for keys in sidebyside.KEYS:
                fc = FakeCuda()
                pair = sidebyside.pair(trainer, b, keys, functools.partial(_fake_like, fc=fc), fn)
                sides: dict[str, Any] = {}
                for name, call in (("rebatch", pair.ours), ("theirs", pair.theirs)):
                    if call is None:
                        continue
                    with fc:
                        call()
                    sides[name] = _side(fc.trace())
                    fc.reset()
                host = host_of(trainer, b, keys, fn)
                for name, side in sides.items():
                    side["host_s"] = host[name]
                cases.append({"b": b, "keys": keys, **sides})
        out[trainer] = cases
    return out


#: The commit whose code ran on the H200 (``docs/gpu_h200.json``).
H200_COMMIT = "7f5c5c9"


def calibrate(measured: dict[str, Any], probed: dict[str, Any]) -> dict[str, Any]:
    """`Model`'s ``host_scale``, ``per_launch_s`` and ``sync_s`` fitted (`fit`: the worst ratio either way
    made smallest) to a GPU's measured rows (``measured``: a ``cuda_check --out`` run), from the same
    code's cases as `probe` made them here (``probed``); each row's prediction beside its measurement."""
    bandwidth = Model().bandwidth_bytes_s
    rows = []
    for row in measured["timings"]["rows"]:
        case = next(c for c in probed[row["trainer"]] if (c["b"], c["keys"]) == (row["b"], row["keys"]))
        for side, seconds in (("rebatch", row["rebatch_s"]), ("theirs", row["theirs_s"])):
            if seconds is not None and side in case:
                rows.append(
                    {
                        "trainer": row["trainer"],
                        "b": row["b"],
                        "keys": row["keys"],
                        "side": side,
                        "measured_s": seconds,
                        **{k: case[side][k] for k in _FEATURES},
                    }
                )
    model = fit(rows, bandwidth)
    for r in rows:
        r["predicted_s"] = predict(r, model)
        r["measured_over_predicted"] = r["measured_s"] / r["predicted_s"]
    worst = max(max(r["measured_over_predicted"], 1 / r["measured_over_predicted"]) for r in rows)
    return {
        "commit": H200_COMMIT,
        "device_name": measured["device_name"],
        "model": model._asdict(),
        "worst_ratio": worst,
        "rows": rows,
    }


#: Where `fit` first looks for each factor (``host_scale``, ``per_launch_s``, ``sync_s``): from 0 to these.
_SEARCH = (2.0, 20e-6, 2e-3)
#: Points a factor's range is cut into, and rounds of narrowing it around the best point.
_GRID, _ROUNDS = 41, 6


def fit(rows: list[dict[str, Any]], bandwidth: float = Model().bandwidth_bytes_s) -> Model:
    """The `Model` whose ``host_scale``, ``per_launch_s`` and ``sync_s`` (non-negative) make the worst
    ratio of a prediction to its measurement over ``rows`` (each a side's `_FEATURES` and its
    ``measured_s``) smallest, either way, at ``bandwidth``: a grid over the three factors, narrowed
    around its best point round by round."""
    import numpy as np

    measured_s = np.array([r["measured_s"] for r in rows])
    features = np.array([[r["host_s"], r["launches"], r["syncs"]] for r in rows])
    moved = np.array([r["bytes"] / bandwidth for r in rows])
    low, high = np.zeros(3), np.array(_SEARCH)
    best = low
    for _ in range(_ROUNDS):
        axes = [np.linspace(lo, hi, _GRID) for lo, hi in zip(low, high, strict=True)]
        grid = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1).reshape(-1, 3)
        predicted = grid @ features.T + moved  # [points, rows]
        worst = np.max(np.abs(np.log(np.maximum(predicted, 1e-12) / measured_s)), axis=1)
        best = grid[int(np.argmin(worst))]
        step = (high - low) / (_GRID - 1)
        low, high = np.maximum(best - 2 * step, 0.0), best + 2 * step
    host_scale, per_launch_s, sync_s = (float(v) for v in best)
    return Model(bandwidth, per_launch_s=per_launch_s, sync_s=sync_s, host_scale=host_scale)


#: What a side of a case carries into the model (`predict`).
_FEATURES = ("host_s", "launches", "syncs", "bytes")


#: Where `calibrate`'s fit is stored (rendered into ``docs/gpu.md``).
CALIBRATION = Path(__file__).resolve().parents[2] / "docs" / "gpu_calibration.json"


def calibrated(path: Path = CALIBRATION) -> Model:
    """The `Model` fitted by `calibrate`, as stored (the defaults where no calibration is stored)."""
    if not path.exists():
        return Model()
    return Model(**json.loads(path.read_text())["model"])


def _write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o644)  # a page of the repository, readable as any other (mkstemp makes it private)
    os.replace(tmp, path)


def render(
    traces: dict[str, Any],
    model: Model | None = None,
    measured: dict[str, Any] | None = None,
    calibration: dict[str, Any] | None = None,
    devicepath: dict[str, Any] | None = None,
) -> str:
    """``docs/gpu.md`` from the traces (ValueError naming a trainer whose traces are missing): the model's
    predictions for today's code (``model``: the calibrated one where ``calibration`` is given), the
    calibration against a GPU's measured rows, the device path measured here beside an older commit
    (``devicepath``: a `rebatch.bench.devicepath` run), and the measurements of a ``cuda_check --out`` run
    (``measured``)."""
    if model is None:
        model = Model(**calibration["model"]) if calibration is not None else Model()
    from property_tests.sidebyside import TRAINERS

    missing = [t for t in TRAINERS if t not in traces]
    if missing:
        raise ValueError(f"no traces of {', '.join(missing)}: run `trace --trainer` in its environment first")
    lines = [
        "# rebatch on a GPU beside each trainer's own function: a model, calibrated, and what was measured",
        "",
        "Generated by `python -m rebatch.bench.gpu_model --write docs/gpu.md` from traces made on fake CUDA",
        "tensors (`property_tests.fakecuda`, no GPU) in each trainer's environment (`rebatch.bench.gpu_model",
        "trace --trainer NAME`, `docs/gpu_traces.json`), the model's calibration (`gpu_model calibrate`,",
        "`docs/gpu_calibration.json`), the device path measured on this machine (`rebatch.bench.devicepath`,",
        "`docs/devicepath.json`) and one GPU run (`docs/gpu_h200.json`); checked against them by",
        "`tests/test_gpu_model.py`. Each table says whether its times are **predictions** (the model) or",
        "**measurements**.",
        "",
        "## The model",
        "",
        f"time = {model.host_scale:.3g} x host seconds measured here + launches x "
        f"{model.per_launch_s * 1e6:.3g} us + bytes / {model.bandwidth_bytes_s / 1e12:g} TB/s + host reads "
        f"x {model.sync_s * 1e6:.3g} us",
        "(`rebatch.bench.gpu_model.Model`). The host seconds of a call are its Python, NumPy and torch's",
        "dispatch: rebatch's measured on `meta` tensors (the device path without data), a trainer's own",
        "function, which reads device data, on CPU tensors (its per-row operations are dispatch-bound).",
        "The three factors are fitted (`gpu_model calibrate`) to the GPU's measured rows below, with the",
        "host seconds, launches and reads of the code that ran there measured here. A caveat of `meta` as",
        "the host's stand-in: some of its kernels (`diff`, `sub` and other elementwise operations) run",
        "torch's Python reference implementations, 0.1-0.2 ms each here, where a GPU dispatches C++ ones;",
        "today's plan uses a few of them, so its predictions below lean high. The device path measured on",
        "this machine's CPU (below) is the other view of the same host work.",
        "",
        "Inputs (`property_tests.sidebyside`): B rows of float32 log-probs, lengths uniform in [1, 63],",
        "max(2, B // 256) micro-batches, the key repeated 1 or 5 times, each call in the trainer's own form",
        "(verl: `postprocess_batch_func`, jagged; AReaL: `reorder_and_pad_outputs`, once per key; SkyRL:",
        "`reorder_and_combine_batches`, padded). Launches: the traced operations that are not views or",
        "allocations; bytes: every operation reading its inputs and writing its outputs in full; host",
        "reads: reads of device data on the host (each a synchronisation).",
        "",
    ]
    for trainer in TRAINERS:
        t = traces[trainer]
        lines += [
            f"## {t['label']} (traced with torch {t['torch']}): predictions for today's code",
            "",
            "| B | keys | launches rebatch / theirs | MB moved rebatch / theirs | host reads rebatch / "
            "theirs | host ms here rebatch / theirs | predicted ms rebatch / theirs | theirs / rebatch |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for c in t["cases"]:
            ours, theirs = c["rebatch"], c["theirs"]
            p_ours, p_theirs = predict(ours, model), predict(theirs, model)
            lines.append(
                f"| {c['b']} | {c['keys']} | {ours['launches']} / {theirs['launches']} | "
                f"{ours['bytes'] / 1e6:.2f} / {theirs['bytes'] / 1e6:.2f} | {ours['syncs']} / "
                f"{theirs['syncs']} | {_ms(ours.get('host_s'))} / {_ms(theirs.get('host_s'))} | "
                f"{p_ours * 1e3:.3f} / {p_theirs * 1e3:.3f} | {_ratio(p_theirs, p_ours)} |"
            )
        lines.append("")
    if calibration is not None:
        lines += _calibration(calibration)
    if devicepath is not None:
        lines += _devicepath(devicepath)
    if measured is not None:
        lines += _measured(measured)
    return "\n".join(lines)


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1e3:.3f}"


def _calibration(fit: dict[str, Any]) -> list[str]:
    """The calibration's section: each measured row beside the fitted model's prediction for the same code."""
    lines = [
        f"## The calibration: the code of {fit['commit']} on an {fit['device_name']}, measured and predicted",
        "",
        f"The measured rows are those of `docs/gpu_h200.json` (the code of {fit['commit']}); the "
        "predictions are",
        "the fitted model's for the same code, its host seconds, launches and reads measured here",
        f"(`.venv-pins/bin/python -m rebatch.bench.gpu_model calibrate --commit {fit['commit']}`). Worst "
        f"measured / predicted: {fit['worst_ratio']:.2f}x either way; {_within(fit['rows'], 1.5)} of "
        f"{len(fit['rows'])} rows within 1.5x.",
        "The fit makes the worst ratio smallest; what it cannot fit is the host's mix: rebatch's host work "
        "is",
        "timed on `meta` and the trainer's on CPU tensors, and the GPU's host runs Python and NumPy at",
        "different speeds relative to this machine.",
        "",
        "| trainer | B | keys | side | host ms here | launches | reads | measured ms | predicted ms | "
        "measured / predicted |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in fit["rows"]:
        lines.append(
            f"| {r['trainer']} | {r['b']} | {r['keys']} | {r['side']} | {r['host_s'] * 1e3:.3f} | "
            f"{r['launches']} | {r['syncs']} | {r['measured_s'] * 1e3:.3f} | {r['predicted_s'] * 1e3:.3f} | "
            f"{r['measured_over_predicted']:.2f}x |"
        )
    return [*lines, ""]


def _within(rows: list[dict[str, Any]], bound: float) -> int:
    """How many ``rows`` have their measurement within ``bound`` of their prediction, either way."""
    return sum(1 for r in rows if 1 / bound <= r["measured_over_predicted"] <= bound)


def _devicepath(run: dict[str, Any]) -> list[str]:
    """`rebatch.bench.devicepath`'s section: measurements on this machine, today against an older commit."""
    lines = [
        f"## The device path measured here: today's code beside {run['commit']}'s",
        "",
        f"`{run['command']}` ({run['machine']}, torch {run['torch']}, {run['rounds']} rounds): "
        "**measurements** on this machine's CPU with the device kernel forced on CPU tensors (today's code "
        "also with the",
        "accelerator's plan, `Settings.plan_on_device`), each commit in a worker of its own, alternated turn",
        "by turn, results checked equal first; launches and reads traced on fake CUDA by each commit's own",
        "tracer. *checked*: `data` carries the batch's `input_ids` on the host, recorded by rebatch's split",
        "(the witness and exact provenance on).",
        "",
        "| call | M | before ms | today ms | before / today | launches before / today | reads before / "
        "today |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in run["rows"]:
        lines.append(
            f"| {r['case']} | {r['micro_batches']} | {r['before_ms']:.3f} | {r['today_ms']:.3f} "
            f"| {r['before_over_today']:.2f}x | {r['launches_before']} / {r['launches_today']} "
            f"| {r['reads_before']} / {r['reads_today']} |"
        )
    return [*lines, ""]


def _measured(run: dict[str, Any]) -> list[str]:
    """The section of a ``cuda_check --out`` run: what a GPU measured."""
    m = run["machine"]
    lines = [
        f"## Measured on an {run['device_name']} (`cuda_check --out docs/gpu_h200.json`, torch "
        f"{run['torch']})",
        "",
        f"**Measurements**: one run of `python -m rebatch.bench.cuda_check` on an {run['device_name']}: a "
        f"copy of {m['bytes'] / 2**20:.0f} MiB at {m['copy_bandwidth_bytes_s'] / 1e12:.2f} TB/s (clone "
        f"{m['clone_bandwidth_bytes_s'] / 1e12:.2f} TB/s), one small operation "
        f"{m['per_launch_s'] * 1e6:.2f} us from Python. Medians of `torch.utils.benchmark` "
        "(CUDA-synchronised); where the trainer was not installed there, verl's algorithm "
        "(`property_tests.baseline`) stands in for verl and the others have no row.",
        "",
        "| trainer | B | keys | rebatch ms | theirs ms | measured theirs / rebatch |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in run["timings"]["rows"]:
        theirs = "n/a" if row["theirs_s"] is None else f"{row['theirs_s'] * 1e3:.3f}"
        ratio = "n/a" if row["theirs_s"] is None else f"{row['theirs_s'] / row['rebatch_s']:.2f}x"
        lines.append(
            f"| {row['label']} | {row['b']} | {row['keys']} | {row['rebatch_s'] * 1e3:.3f} | {theirs} | "
            f"{ratio} |"
        )
    if "verl_calls" in run and "rows" in run["verl_calls"]:
        lines += ["", *_verl_calls_section(run["verl_calls"]["rows"])]
    uploads = run.get("uploads", {})
    if "pageable_s" in uploads:
        lines += [
            "",
            f"An upload of {uploads['bytes'] / 2**20:.0f} MiB queued behind {uploads['queued_s'] * 1e3:.0f} "
            f"ms of device work: the host waited {uploads['pageable_s'] * 1e3:.3f} ms for a pageable one, "
            f"{uploads['pinned_s'] * 1e3:.3f} ms for a pinned one.",
        ]
    failures = run.get("failures", [])
    lines += ["", f"That run's checks: {len(failures)} failure(s)."]
    lines += [f"- {f}" for f in failures]
    return [*lines, ""]


def _verl_calls_section(rows: list[dict[str, Any]]) -> list[str]:
    """``cuda_check``'s verl calls: synchronised and host times, phases, synchronisations, the profiled
    call."""
    lines = [
        "What a verl user runs (plain, and checked: `data` carrying `input_ids`, recorded by rebatch's "
        "split):",
        "",
        "| B | keys | checked | synchronised ms | host issue ms | check / plan / move / result ms | syncs "
        "| profiled wall ms | kernels' ms | kernels |",
        "|---:|---:|---|---:|---:|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        phases = " / ".join(f"{r['phases_s'][p] * 1e3:.3f}" for p in ("check", "plan", "move", "result"))
        lines.append(
            f"| {r['b']} | {r['keys']} | {'yes' if r['checked'] else 'no'} | {r['synced_s'] * 1e3:.3f} "
            f"| {r['host_s'] * 1e3:.3f} | {phases} | {r['syncs']} | {r['profiled_wall_s'] * 1e3:.3f} "
            f"| {r['kernel_s'] * 1e3:.3f} | {r['kernels']} |"
        )
    return lines


#: The device path measured here (`rebatch.bench.devicepath --out`), rendered into ``docs/gpu.md``.
DEVICEPATH = CALIBRATION.parent / "devicepath.json"


def page_sources(
    measured: Path, calibration: Path = CALIBRATION, devicepath: Path = DEVICEPATH
) -> dict[str, Any]:
    """`render`'s other inputs as stored (each left out where its file is missing)."""
    paths = {"measured": measured, "calibration": calibration, "devicepath": devicepath}
    return {k: json.loads(p.read_text()) for k, p in paths.items() if p.exists()}


def _probe_commit(commit: str) -> dict[str, Any]:
    """`probe` run with ``commit``'s ``ref``, ``torch_impl`` and ``property_tests`` (an extract, as the
    benchmark harness makes it: `rebatch.bench.workers.baseline_root`), in a process of its own."""
    import subprocess

    from .workers import ROOT, baseline_root

    root = baseline_root(commit)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(ROOT)])}
    command = [sys.executable, "-m", "rebatch.bench.gpu_model", "probe"]
    done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, check=True)
    probed: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return probed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rebatch.bench.gpu_model", description=__doc__)
    parser.add_argument(
        "command",
        nargs="?",
        choices=["trace", "probe", "calibrate"],
        help="trace a trainer (in its environment); probe: every case with the code on the path, as JSON "
        "(calibrate's worker); calibrate: fit the model to --measured with the code of --commit",
    )
    parser.add_argument("--commit", default=H200_COMMIT, help="calibrate: the code that ran on the GPU")
    parser.add_argument("--calibration", type=Path, default=CALIBRATION, help="calibrate's output")
    parser.add_argument("--trainer", choices=trainer_names())
    parser.add_argument("--out", type=Path, default=Path("docs/gpu_traces.json"), help="the traces' JSON")
    parser.add_argument("--traces", type=Path, default=Path("docs/gpu_traces.json"))
    parser.add_argument("--write", type=Path, help="write the page (docs/gpu.md) from --traces")
    parser.add_argument(
        "--measured", type=Path, default=Path("docs/gpu_h200.json"), help="a cuda_check --out run"
    )
    args = parser.parse_args(argv)
    if args.command == "probe":
        sys.stdout.write(json.dumps(probe()) + "\n")
        return 0
    if args.command == "calibrate":
        fit = calibrate(json.loads(args.measured.read_text()), _probe_commit(args.commit))
        _write_atomically(args.calibration, json.dumps(fit, indent=1, sort_keys=True) + "\n")
        print(f"calibrated against {args.measured}: worst measured/predicted {fit['worst_ratio']:.2f}x")
        return 0
    if args.command == "trace":
        if args.trainer is None:
            parser.error("trace needs --trainer")
        try:
            traced = trace_trainer(args.trainer)
        except ImportError as err:
            print(
                f"{args.trainer} is not installed in this environment ({err}): nothing traced",
                file=sys.stderr,
            )
            return 2
        stored = json.loads(args.out.read_text()) if args.out.exists() else {}
        stored[args.trainer] = traced
        _write_atomically(args.out, json.dumps(stored, indent=1, sort_keys=True) + "\n")
        print(f"{args.trainer}: {len(traced['cases'])} cases traced into {args.out}")
        return 0
    if args.write is None:
        parser.error("give `trace --trainer NAME` or --write PATH")
    try:
        page = render(json.loads(args.traces.read_text()), **page_sources(args.measured, args.calibration))
    except (FileNotFoundError, ValueError) as err:
        print(f"cannot write {args.write}: {err}", file=sys.stderr)
        return 2
    _write_atomically(args.write, page)
    print(f"wrote {args.write}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
