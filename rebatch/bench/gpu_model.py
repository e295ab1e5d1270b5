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
    python -m rebatch.bench.gpu_model --write docs/gpu.md --traces docs/gpu_traces.json
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, NamedTuple

__all__ = ["Model", "main", "predict", "render", "trace_trainer"]


class Model(NamedTuple):
    """Time of a call on one GPU = launches x ``per_launch_s`` + bytes / ``bandwidth_bytes_s`` + syncs x
    ``sync_s`` (additive: no overlap of host and device assumed). Defaults for an H200:"""

    #: 4.3 TB/s: NVIDIA's H200 datasheet gives 4.8 TB/s of HBM3e peak bandwidth; a device-to-device copy
    #: reaches about 90% of a peak in practice (``rebatch.bench.cuda_check`` measures a ``clone`` to check it).
    bandwidth_bytes_s: float = 4.3e12
    #: 5 us: eager PyTorch issues one CUDA kernel per operation from the host, about 2-3 us for the CUDA
    #: launch itself plus the dispatcher's and Python's share; chains of small kernels run at the host's
    #: pace (``cuda_check`` counts the kernels and times the calls to check it).
    per_launch_s: float = 5e-6
    #: 10 us: a host read of device data waits for the queue to drain, then a device-to-host copy's round
    #: trip (PCIe or NVLink-C2C latency, a few us, plus the copy's launch and the wake-up).
    sync_s: float = 10e-6


def predict(side: dict[str, Any], model: Model) -> float:
    """The model's seconds for one traced side of a case."""
    return (
        side["launches"] * model.per_launch_s + side["bytes"] / model.bandwidth_bytes_s + side["syncs"] * model.sync_s
    )


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
            micro_batches = sidebyside.micro_batches(b)
            case: dict[str, Any] = {"b": b, "keys": keys, "micro_batches": micro_batches}
            cases.append({**case, "output_bytes": pair.output_bytes, **sides})
    return {"label": label, "torch": torch.__version__, "cases": cases}


def _write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o644)  # a page of the repository, readable as any other (mkstemp makes it private)
    os.replace(tmp, path)


def render(traces: dict[str, Any], model: Model | None = None, measured: dict[str, Any] | None = None) -> str:
    """``docs/gpu.md`` from the traces (ValueError naming a trainer whose traces are missing), and the
    measurements of a ``cuda_check --out`` run beside the model's predictions where ``measured`` is given."""
    model = model or Model()
    from property_tests.sidebyside import TRAINERS

    missing = [t for t in TRAINERS if t not in traces]
    if missing:
        raise ValueError(f"no traces of {', '.join(missing)}: run `trace --trainer` in its environment first")
    lines = [
        "# rebatch on a GPU beside each trainer's own function: a model",
        "",
        "Generated by `python -m rebatch.bench.gpu_model --write docs/gpu.md --traces docs/gpu_traces.json`",
        "from traces made on fake CUDA tensors (`property_tests.fakecuda`, no GPU) in each trainer's",
        "environment (`rebatch.bench.gpu_model trace --trainer NAME`); checked against them by",
        "`tests/test_gpu_model.py`. **The times are a model's predictions, not measurements**:",
        f"time = launches x {model.per_launch_s * 1e6:g} us + bytes / {model.bandwidth_bytes_s / 1e12:g} TB/s"
        f" + host reads x {model.sync_s * 1e6:g} us (`rebatch.bench.gpu_model.Model`, H200 defaults and",
        "their sources there). `python -m rebatch.bench.cuda_check` measures the real ones on a GPU.",
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
            f"## {t['label']} (traced with torch {t['torch']})",
            "",
            "| B | keys | launches rebatch / theirs | MB moved rebatch / theirs | host reads rebatch / theirs "
            "| predicted us rebatch / theirs | theirs / rebatch |",
            "|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for c in t["cases"]:
            ours, theirs = c["rebatch"], c["theirs"]
            p_ours, p_theirs = predict(ours, model), predict(theirs, model)
            lines.append(
                f"| {c['b']} | {c['keys']} | {ours['launches']} / {theirs['launches']} "
                f"| {ours['bytes'] / 1e6:.2f} / {theirs['bytes'] / 1e6:.2f} | {ours['syncs']} / {theirs['syncs']} "
                f"| {p_ours * 1e6:.1f} / {p_theirs * 1e6:.1f} | {p_theirs / p_ours:.2f}x |"
            )
        lines.append("")
    if measured is not None:
        lines += _measured(traces, model, measured)
    return "\n".join(lines)


def _measured(traces: dict[str, Any], model: Model, run: dict[str, Any]) -> list[str]:
    """The section of a ``cuda_check --out`` run (``docs/gpu_h200.json``): what a GPU measured, beside the
    model's ratio for the same case."""
    m = run["machine"]
    lines = [
        f"## Measured on an {run['device_name']} (`cuda_check --out docs/gpu_h200.json`, torch {run['torch']})",
        "",
        f"One run of `python -m rebatch.bench.cuda_check` on an {run['device_name']}: a copy of "
        f"{m['bytes'] / 2**20:.0f} MiB at {m['copy_bandwidth_bytes_s'] / 1e12:.2f} TB/s (clone "
        f"{m['clone_bandwidth_bytes_s'] / 1e12:.2f} TB/s), one small operation {m['per_launch_s'] * 1e6:.2f} us "
        "from Python (the model's launch cost). Medians of `torch.utils.benchmark` (CUDA-synchronised); "
        "where the trainer was not installed there, verl's algorithm (`property_tests.baseline`) stands in "
        "for verl and the others have no row. rebatch's measured time includes its host work (the checks "
        "and the plan, in Python and NumPy), which the model leaves out: the model's ratios are upper bounds.",
        "",
        "| trainer | B | keys | rebatch ms | theirs ms | measured theirs / rebatch | model theirs / rebatch |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    cases = {(t, c["b"], c["keys"]): c for t, v in traces.items() for c in v["cases"]}
    for row in run["timings"]["rows"]:
        if row["theirs_s"] is None:
            continue
        c = cases[row["trainer"], row["b"], row["keys"]]
        predicted = predict(c["theirs"], model) / predict(c["rebatch"], model)
        lines.append(
            f"| {row['label']} | {row['b']} | {row['keys']} | {row['rebatch_s'] * 1e3:.3f} "
            f"| {row['theirs_s'] * 1e3:.3f} | {row['theirs_s'] / row['rebatch_s']:.2f}x | {predicted:.2f}x |"
        )
    failures = run.get("failures", [])
    lines += ["", f"That run's checks: {len(failures)} failure(s)."]
    lines += [f"- {f}" for f in failures]
    lines += [
        "",
        "The synchronisations it found match the blocking host-to-device uploads that the fake-CUDA traces",
        "showed once taught to count them (`torch.tensor(..., device=)`, `.to(device)` from the host, at",
        "the same call sites and in the same numbers); every upload of rebatch's is now non-blocking, and",
        "`property_tests.fakecuda` counts a blocking one as a synchronisation, so `tests/test_fake_cuda.py`",
        "fails on a new one. The `launches` failure was in the tracer itself, on a real CUDA build (a CUDA",
        "tensor among its host shadows, made by such an upload in `row_steps`, now gone). Neither fix has run",
        "on a GPU yet: no GPU was lent again in that session.",
        "",
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rebatch.bench.gpu_model", description=__doc__)
    parser.add_argument("command", nargs="?", choices=["trace"], help="trace a trainer (in its environment)")
    parser.add_argument("--trainer", choices=["verl", "areal", "skyrl"])
    parser.add_argument("--out", type=Path, default=Path("docs/gpu_traces.json"), help="the traces' JSON")
    parser.add_argument("--traces", type=Path, default=Path("docs/gpu_traces.json"))
    parser.add_argument("--write", type=Path, help="write the page (docs/gpu.md) from --traces")
    parser.add_argument("--measured", type=Path, default=Path("docs/gpu_h200.json"), help="a cuda_check --out run")
    args = parser.parse_args(argv)
    if args.command == "trace":
        if args.trainer is None:
            parser.error("trace needs --trainer")
        try:
            traced = trace_trainer(args.trainer)
        except ImportError as err:
            print(f"{args.trainer} is not installed in this environment ({err}): nothing traced", file=sys.stderr)
            return 2
        stored = json.loads(args.out.read_text()) if args.out.exists() else {}
        stored[args.trainer] = traced
        _write_atomically(args.out, json.dumps(stored, indent=1, sort_keys=True) + "\n")
        print(f"{args.trainer}: {len(traced['cases'])} cases traced into {args.out}")
        return 0
    if args.write is None:
        parser.error("give `trace --trainer NAME` or --write PATH")
    try:
        measured = json.loads(args.measured.read_text()) if args.measured.exists() else None
        page = render(json.loads(args.traces.read_text()), measured=measured)
    except (FileNotFoundError, ValueError) as err:
        print(f"cannot write {args.write}: {err}", file=sys.stderr)
        return 2
    _write_atomically(args.write, page)
    print(f"wrote {args.write}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
