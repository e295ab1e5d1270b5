"""The CUDA path in one command (under 5 minutes on one GPU): bit-exact results, no host-device
synchronisation, and bandwidth against a copy of the same bytes.

For a few cases of the benchmark grid (jagged 2-D and 3-D, float32 and bfloat16, several keys, a dense
key, a micro-batch with no rows), on each element-index variant (one chunk per micro-batch, and many
small chunks):

1. ``postprocess_batch_func`` on the device under ``torch.cuda.set_sync_debug_mode("error")`` (any
   synchronising call raises), then its result compared bit for bit with the CPU's and with verl's
   algorithm row by row (`property_tests.baseline`);
2. its median time against a ``clone`` of the output's bytes on the same device (effective bandwidth);
3. the alignment witness: the same call with ``data`` holding the batch's ``input_ids`` on the host (as
   verl leaves it) makes exactly one synchronisation (its verdict, read after every launch; counted
   under ``set_sync_debug_mode("warn")``), gives the same result, and the outputs left in micro-batch
   order raise `ref.errors.MisalignmentError`.

Then, each section on its own (one that fails is reported and the others still run):

4. every drop-in and public call (`property_tests.device_calls`) and every kernel of the registry forced,
   on the device against the CPU, bit for bit;
5. the kernels ``torch.profiler`` counts for rebatch's side of each side-by-side case against those traced
   on fake CUDA tensors (`property_tests.fakecuda`);
6. rebatch beside each trainer's own function (`property_tests.sidebyside`; a trainer not installed is a
   row saying so, verl's algorithm stands in for verl), timed with ``torch.utils.benchmark``;
7. what a verl user runs: verl's call plain and checked (``data`` carrying ``input_ids``, recorded by
   rebatch's split), B = 8, 1024, 16384 with one and five keys: the synchronised time beside the host's
   issue time, the host seconds of each phase (check, plan, move, result), the synchronisations of a
   warm call (0 plain, at most 1 checked: a failure otherwise), one call profiled (wall time against
   its kernels' summed time, their number);
8. a pageable beside a pinned upload, each queued behind device work (the host's wait for each);
9. a copy against ``clone()`` of the same bytes, and one small operation in a chain: the cost model's
   bandwidth and per-launch cost (`rebatch.bench.gpu_model.Model`).

One table sums it up (the measured ratio beside the model's, from ``docs/gpu_traces.json``); ``--out``
writes every section's results as JSON. Exits 1 on any mismatch, synchronisation or failed section, 0
otherwise, and 0 on a machine without CUDA (saying so). ``--dry-run`` runs the same steps on the CPU
(no synchronisation check, tiny cases): what the test suite runs, so the script stays runnable.

    python -m rebatch.bench.cuda_check            # on a machine with a GPU
    python -m rebatch.bench.cuda_check --dry-run  # anywhere
    python -m rebatch.bench.cuda_check --out cuda_check.json
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch

import torch_impl
from property_tests.baseline import verl_postprocess_batch_func
from property_tests.compare import first_difference
from torch_impl.testing import PHASES, phase_seconds

from .cases import Case, make_inputs
from .run import median_times
from .timing import SLOW_CALL_SECONDS, median_seconds

__all__ = ["check", "main"]

#: torch's threads while a function is timed alone: torch.utils.benchmark's default, as the committed
#: figures were measured.
TIMER_THREADS = 1

CASES = [
    Case(1024, 512, 16, 1, "float32", 2),
    Case(4096, 128, 16, 3, "bfloat16", 3),
    Case(64, 4096, 4, 1, "float32", 2),
]
DRY_CASES = [Case(64, 16, 4, 2, "float32", 2), Case(32, 8, 4, 1, "bfloat16", 3)]
VARIANTS: dict[str, dict[str, Any]] = {
    "element_indices": {"kernel": "element_indices"},
    "element_indices_small_chunks": {"kernel": "element_indices", "index_chunk_bytes": 2**16},
}


@contextlib.contextmanager
def _no_sync(device: str) -> Iterator[None]:
    """Any host-device synchronisation inside raises (CUDA only)."""
    if not device.startswith("cuda"):
        yield
        return
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()


@contextlib.contextmanager
def _syncs(device: str) -> Iterator[list[Any]]:
    """The synchronisations made inside, as torch's sync-debug warnings (CUDA; none elsewhere)."""
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        if device.startswith("cuda"):
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("warn")
        try:
            yield seen
        finally:
            if device.startswith("cuda"):
                torch.cuda.set_sync_debug_mode("default")
                torch.cuda.synchronize()


def _witness_data(outs: list[dict[str, Any]], indices: list[list[int]]) -> Any:
    """verl's ``data``: the batch's ``input_ids`` on the host, rows as long as the first jagged key's."""
    from tensordict import TensorDict

    key = next(k for k, v in outs[0]["model_output"].items() if v.is_nested)
    lengths = [0] * sum(len(p) for p in indices)
    for o, p in zip(outs, indices, strict=True):
        for i, n in zip(p, o["model_output"][key].offsets().diff().tolist(), strict=True):
            lengths[i] = n
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    offsets[1:] = torch.tensor(lengths, dtype=torch.int64).cumsum(0)
    ids = torch.nested.nested_tensor_from_jagged(torch.zeros(int(offsets[-1]), dtype=torch.int64), offsets)
    return TensorDict({"input_ids": ids}, batch_size=[])


def _check_witness(
    device: str, case: Case, on_device: list[dict[str, Any]], indices: list[list[int]], expected: Any
) -> list[str]:
    """Step 3: one synchronisation a witnessed call, the same result, a misalignment caught."""
    from ref.errors import MisalignmentError

    failures = []
    data = _witness_data(on_device, indices)
    with _syncs(device) as seen:
        got = torch_impl.postprocess_batch_func(on_device, indices, data)["model_output"]
    syncs = [w for w in seen if "synchroniz" in str(w.message).lower()]
    if device.startswith("cuda") and len(syncs) != 1:
        failures.append(f"{case.name}, witness: {len(syncs)} synchronisations, expected 1")
    for k, v in got.items():
        diff = first_difference(v.cpu(), expected[k])
        if diff is not None:
            failures.append(f"{case.name}, witness, key {k}: {diff}")
    in_order = [list(range(a, a + len(p))) for a, p in zip(_starts(indices), indices, strict=True)]
    if in_order != indices:
        try:
            torch_impl.postprocess_batch_func(on_device, in_order, data)
            failures.append(f"{case.name}, witness: the outputs left in micro-batch order were not caught")
        except MisalignmentError:
            pass
    print(f"{'FAIL' if failures else 'ok  '} {case.name}, witness: {len(syncs)} synchronisation(s) a call")
    return failures


def _starts(indices: list[list[int]]) -> list[int]:
    """Where each micro-batch starts in the concatenated rows."""
    return list(itertools.accumulate((len(p) for p in indices[:-1]), initial=0)) if indices else []


def _to(outs: list[dict[str, Any]], device: str) -> list[dict[str, Any]]:
    return [{**o, "model_output": {k: v.to(device) for k, v in o["model_output"].items()}} for o in outs]


def _with_extras(
    outs: list[dict[str, Any]], indices: list[list[int]]
) -> tuple[list[dict[str, Any]], list[list[int]]]:
    """A dense key in every micro-batch, and one micro-batch with no rows at the end."""
    g = torch.Generator().manual_seed(1)
    outs = [
        {**o, "model_output": {**o["model_output"], "dense": torch.randn(len(p), 3, generator=g)}}
        for o, p in zip(outs, indices, strict=True)
    ]
    first = outs[0]["model_output"]
    empty = {
        k: (
            v[:0]
            if not v.is_nested
            else torch.nested.nested_tensor_from_jagged(v.values()[:0], torch.zeros(1, dtype=torch.int64))
        )
        for k, v in first.items()
    }
    return [*outs, {"model_output": empty}], [*indices, []]


def _timed_pair(
    outs: list[dict[str, Any]], indices: list[list[int]], whole: list[torch.Tensor]
) -> dict[str, Callable[[], Any]]:
    """The call, and a clone of the same bytes on the same device."""
    return {
        "torch_impl": lambda: torch_impl.postprocess_batch_func(outs, indices, None),
        "copy": lambda: [w.clone() for w in whole],
    }


def check(device: str, cases: list[Case], *, min_time: float = 0.2) -> list[str]:
    """The failures (empty when all is well); prints one line per case and variant."""
    failures = []
    for case in cases:
        inputs = make_inputs(case, "cpu")
        outs, indices = _with_extras(inputs.output_lst, inputs.indices)
        expected = torch_impl.postprocess_batch_func(outs, indices, None)["model_output"]
        jagged_keys = {k: v for k, v in expected.items() if outs[0]["model_output"][k].is_nested}
        verl = verl_postprocess_batch_func(
            [{"model_output": {k: o["model_output"][k] for k in jagged_keys}} for o in outs], indices, None
        )
        for k, v in verl["model_output"].items():
            diff = first_difference(expected[k], v)
            if diff is not None:
                failures.append(f"{case.name}: CPU result differs from verl's algorithm, key {k}: {diff}")
        on_device = _to(outs, device)
        failures += _check_witness(device, case, on_device, indices, expected)
        whole = [torch.cat([o["model_output"][k].values() for o in on_device]) for k in jagged_keys]
        for variant, settings in VARIANTS.items():
            with torch_impl.use_settings(**settings):
                try:
                    with _no_sync(device):
                        got = torch_impl.postprocess_batch_func(on_device, indices, None)["model_output"]
                except RuntimeError as err:
                    failures.append(f"{case.name}, {variant}: {err}")
                    print(f"FAIL {case.name}, {variant}: {err}")
                    continue
                for k, v in got.items():
                    if v.device.type != torch.device(device).type:
                        failures.append(
                            f"{case.name}, {variant}, key {k}: result on {v.device}, not {device}"
                        )
                    diff = first_difference(v.cpu(), expected[k])
                    if diff is not None:
                        failures.append(f"{case.name}, {variant}, key {k}: {diff}")
                seconds = median_times(_timed_pair(on_device, indices, whole), device, min_time=min_time)
            gib_s = inputs.output_bytes / seconds["torch_impl"] / 2**30
            ok = "ok  " if not any(f.startswith(f"{case.name}, {variant}") for f in failures) else "FAIL"
            print(
                f"{ok} {case.name}, {variant}: {seconds['torch_impl'] * 1e3:.3g} ms, "
                f"{seconds['torch_impl'] / seconds['copy']:.2f}x a copy of the same bytes, {gib_s:.1f} GiB/s"
            )
    return failures


def _device_calls(device: str) -> list[dict[str, Any]]:
    """Every drop-in and public call (`property_tests.device_calls`) and every kernel of the registry
    forced, on ``device`` against the CPU, bit for bit (results on the inputs' device)."""
    from property_tests.device_calls import CALLS, tensors_of
    from property_tests.kernels import KERNELS, forced
    from torch_impl.testing import tree_map

    def move(x: Any) -> Any:
        return tree_map(lambda t: t.to(device) if isinstance(t, torch.Tensor) else t, x)

    rows = []
    runs = [(name, None) for name in CALLS] + [("verl.postprocess_batch_func+witness", p) for p in KERNELS]
    for name, path in runs:
        with forced(path) if path else contextlib.nullcontext():
            on_cpu, _ = CALLS[name](lambda x: x, 64)
            on_device, where = CALLS[name](move, 64)
            want, got = on_cpu(), on_device()
        diffs = [first_difference(a.cpu(), b) for a, b in zip(tensors_of(got), tensors_of(want), strict=True)]
        where_ok = all(
            t.device.type == (torch.device(device).type if where == "in" else where) for t in tensors_of(got)
        )
        problem = next((d for d in diffs if d is not None), None) or (
            None if where_ok else "result on another device"
        )
        rows.append({"call": name, "kernel": path or "default", "ok": problem is None, "problem": problem})
    return rows


def _launches(device: str, sizes: tuple[int, ...]) -> list[dict[str, Any]]:
    """rebatch's side of each side-by-side case: the kernels torch.profiler sees on ``device`` against
    those traced on fake CUDA tensors (`property_tests.fakecuda`) for the same inputs."""
    from torch.profiler import ProfilerActivity, profile

    from property_tests import sidebyside
    from property_tests.fakecuda import FakeCuda, fake_like

    rows = []
    for trainer in sidebyside.TRAINERS:
        for b in sizes:
            for keys in sidebyside.KEYS:
                fc = FakeCuda()
                traced = sidebyside.pair(trainer, b, keys, functools.partial(fake_like, fc=fc))
                with fc:
                    traced.ours()
                predicted = fc.trace()
                measured = None
                if device.startswith("cuda"):
                    call = sidebyside.pair(trainer, b, keys, lambda x: _moved(x, device)).ours
                    call()
                    torch.cuda.synchronize()
                    with profile(activities=[ProfilerActivity.CUDA]) as prof:
                        call()
                        torch.cuda.synchronize()
                    measured = sum(
                        1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                    )
                rows.append(
                    {
                        "trainer": trainer,
                        "b": b,
                        "keys": keys,
                        "traced_launches": len(predicted.launches),
                        "traced_allocations": predicted.allocations,
                        "traced_syncs": predicted.syncs,
                        "measured_kernels": measured,
                    }
                )
    return rows


def _moved(x: Any, device: str) -> Any:
    from torch_impl.testing import tree_map

    return tree_map(lambda t: t.to(device) if isinstance(t, torch.Tensor) else t, x)


def _timings(device: str, sizes: tuple[int, ...], min_time: float) -> list[dict[str, Any]]:
    """rebatch beside each trainer's own function (`property_tests.sidebyside`), timed with
    torch.utils.benchmark (which synchronises CUDA); a trainer that is not installed is a row saying so
    (verl's algorithm stands in for verl)."""
    from property_tests import sidebyside

    def seconds(fn: Callable[[], Any]) -> float:  # a slow call (a per-row loop at large B): once is enough
        return median_seconds(fn, min_run_time=min_time, once_over=SLOW_CALL_SECONDS, threads=TIMER_THREADS)

    rows = []
    for trainer in sidebyside.TRAINERS:
        try:
            fn, label = sidebyside.theirs(trainer, stand_in=True)
        except ImportError:
            fn, label = None, f"{trainer}: not installed"
        for b in sizes:
            for keys in sidebyside.KEYS:
                pair = sidebyside.pair(trainer, b, keys, lambda x: _moved(x, device), fn)
                row: dict[str, Any] = {"trainer": trainer, "label": label, "b": b, "keys": keys}
                row["rebatch_s"] = seconds(pair.ours)
                row["theirs_s"] = None if pair.theirs is None else seconds(pair.theirs)
                rows.append(row)
    return rows


def _verl_call(device: str, b: int, keys: int, checked: bool) -> Callable[[], Any]:
    """verl's call of `rebatch.bench.devicepath`'s inputs (every key of a micro-batch on its one offsets
    tensor) on ``device``; ``checked``: ``data`` holding the batch's ``input_ids`` on the host (as verl's
    engines leave it) and recorded by rebatch's split (the witness and exact provenance on)."""
    from .devicepath import Case, _batch, _verl_data
    from .gpu_model import to_device

    case = Case("verl", b, keys, checked)
    lengths, partitions, keyed = _batch(case)
    outs = to_device([{"model_output": {f"k{k}": x for k, x in enumerate(ks)}} for ks in keyed], device)
    data = _verl_data(case, lengths, outs, partitions)
    return lambda: torch_impl.postprocess_batch_func(outs, partitions, data)


def _synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _verl_calls(device: str, sizes: tuple[int, ...], min_time: float) -> list[dict[str, Any]]:
    """What a verl user runs, plain and checked, at each B with one and five keys: the synchronised time
    (`torch.utils.benchmark`) beside the host's issue time (until the call returns, the device idle
    before it), the host seconds of each phase (`torch_impl.testing.PHASES`), the synchronisations of a warm
    call (0 plain,
    at most 1 checked), and one call profiled (its wall time against its kernels' summed time, and
    their number)."""
    import time

    rows = []
    for checked in (False, True):
        for b in sizes:
            for keys in (1, 5):
                call = _verl_call(device, b, keys, checked)
                call()
                synced = median_seconds(call, min_run_time=min_time, threads=TIMER_THREADS)
                issued = []
                for _ in range(5 if min_time else 2):
                    _synchronize(device)
                    start = time.perf_counter()
                    call()
                    issued.append(time.perf_counter() - start)
                _synchronize(device)
                with phase_seconds() as phases:
                    call()
                    _synchronize(device)
                with _syncs(device) as found:
                    call()
                row: dict[str, Any] = {"b": b, "keys": keys, "checked": checked, "synced_s": float(synced)}
                row["host_s"] = sorted(issued)[len(issued) // 2]
                row["phases_s"] = phases
                row["syncs"] = len(found)
                row["syncs_ok"] = len(found) <= (1 if checked else 0)
                row.update(_profiled(device, call))
                rows.append(row)
    return rows


def _profiled(device: str, call: Callable[[], Any]) -> dict[str, Any]:
    """One warm call under ``torch.profiler``: its wall seconds, its device kernels' summed seconds and
    their number (none on the CPU, where nothing is launched)."""
    import time

    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.startswith("cuda"):
        activities.append(ProfilerActivity.CUDA)
    _synchronize(device)
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        call()
        _synchronize(device)
        wall = time.perf_counter() - start
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return {
        "profiled_wall_s": wall,
        "kernel_s": sum(e.device_time_total for e in kernels) / 1e6,
        "kernels": len(kernels),
    }


def _uploads(device: str) -> dict[str, Any]:
    """A pageable and a pinned upload of 4 MiB, each queued behind about 20 ms of device work: the host
    seconds until each ``to(device, non_blocking=True)`` returns (a pageable one may wait for the queue,
    the driver copying it synchronously; a pinned one returns at once). Not measured off CUDA."""
    import time

    if not device.startswith("cuda"):
        return {"skipped": "no CUDA device: an upload has nothing to wait for"}
    n = 2**20
    pageable = torch.randn(n, device="cpu")
    pinned = pageable.pin_memory()
    cycles = int(20e-3 * torch.cuda.get_device_properties(device).clock_rate * 1e3)
    out: dict[str, Any] = {"bytes": 4 * n, "queued_s": 20e-3}
    for name, host in (("pageable", pageable), ("pinned", pinned)):
        times = []
        for _ in range(5):
            torch.cuda.synchronize()
            torch.cuda._sleep(cycles)
            start = time.perf_counter()
            host.to(device, non_blocking=True)
            times.append(time.perf_counter() - start)
        torch.cuda.synchronize()
        out[f"{name}_s"] = sorted(times)[2]
    return out


def _machine(device: str, min_time: float) -> dict[str, Any]:
    """The cost model's parameters measured: a copy's bandwidth against ``clone()`` of the same bytes,
    and the time of one small operation in a chain (the per-launch cost)."""
    from .gpu_model import Model

    n = (256 if device.startswith("cuda") else 4) * 2**20 // 4
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    tiny = torch.zeros(1, device=device)

    def chain() -> None:
        for _ in range(200):
            tiny.add_(1)

    def time(fn: Callable[[], Any]) -> float:
        return median_seconds(fn, min_run_time=min_time, threads=TIMER_THREADS)

    copy_s, clone_s, chain_s = time(lambda: dst.copy_(src)), time(src.clone), time(chain)
    model = Model()
    return {
        "bytes": 4 * n,
        "copy_bandwidth_bytes_s": 2 * 4 * n / copy_s,
        "clone_bandwidth_bytes_s": 2 * 4 * n / clone_s,
        "copy_over_clone": copy_s / clone_s,
        "per_launch_s": chain_s / 200,
        "model": model._asdict(),
    }


def _sync_failure(row: dict[str, Any]) -> str:
    kind = "checked" if row["checked"] else "plain"
    return f"verl B={row['b']} keys={row['keys']} {kind}: {row['syncs']} synchronisations in a warm call"


def _verl_calls_table(rows: list[dict[str, Any]]) -> list[str]:
    """`_verl_calls`' rows, one line each."""
    lines = [f"{'verl call':<22} {'synced ms':>10} {'host ms':>8} {'syncs':>5} {'kernels':>7}  phases (ms)"]
    for r in rows:
        name = f"B={r['b']} keys={r['keys']}{' checked' if r['checked'] else ''}"
        phases = " ".join(f"{p} {r['phases_s'][p] * 1e3:.3f}" for p in PHASES)
        lines.append(
            f"{name:<22} {r['synced_s'] * 1e3:>10.3f} {r['host_s'] * 1e3:>8.3f} {r['syncs']:>5} "
            f"{r['kernels']:>7}  {phases}"
        )
    return lines


def _table(results: dict[str, Any]) -> list[str]:
    """The one table: per trainer and case, the measured times, their ratio, the model's ratio (from the
    traces in docs/gpu_traces.json, where present) and the kernels counted against those traced."""
    import json
    from pathlib import Path

    from .gpu_model import calibrated, predict

    fitted = calibrated()
    traces_path = Path(__file__).resolve().parents[2] / "docs" / "gpu_traces.json"
    traces = json.loads(traces_path.read_text()) if traces_path.exists() else {}
    launches = {(r["trainer"], r["b"], r["keys"]): r for r in results.get("launches", {}).get("rows", [])}
    lines = [
        f"{'trainer':<8} {'B':>6} {'keys':>4} {'rebatch ms':>11} {'theirs ms':>10} {'measured':>9} "
        f"{'model':>7} {'kernels traced/counted':>23}"
    ]
    for r in results.get("timings", {}).get("rows", []):
        key = (r["trainer"], r["b"], r["keys"])
        theirs = "n/a" if r["theirs_s"] is None else f"{r['theirs_s'] * 1e3:.3f}"
        ratio = "n/a" if r["theirs_s"] is None else f"{r['theirs_s'] / r['rebatch_s']:.2f}x"
        case = next(
            (c for c in traces.get(r["trainer"], {}).get("cases", []) if (c["b"], c["keys"]) == key[1:]), None
        )
        model = (
            "n/a"
            if case is None
            else f"{predict(case['theirs'], fitted) / predict(case['rebatch'], fitted):.2f}x"
        )
        counted = launches.get(key)
        kernels = "n/a" if counted is None else f"{counted['traced_launches']}/{counted['measured_kernels']}"
        lines.append(
            f"{r['trainer']:<8} {r['b']:>6} {r['keys']:>4} {r['rebatch_s'] * 1e3:>11.3f} {theirs:>10} "
            f"{ratio:>9} {model:>7} {kernels:>23}"
        )
    labels = sorted({r["label"] for r in results.get("timings", {}).get("rows", [])})
    return [*lines, *(f"  theirs: {label}" for label in labels)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rebatch.bench.cuda_check", description=__doc__)
    parser.add_argument("--dry-run", action="store_true", help="on the CPU, tiny cases (no GPU needed)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", help="write the full results as JSON to this path")
    args = parser.parse_args(argv)
    device = "cpu" if args.dry_run else args.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device here: nothing checked (run with --dry-run, or on a machine with a GPU)")
        return 0
    sizes = (8, 64) if args.dry_run else (8, 1024, 16384)
    min_time = 0.0 if args.dry_run else 0.2
    sections: dict[str, Callable[[], Any]] = {
        "properties": lambda: check(device, DRY_CASES if args.dry_run else CASES, min_time=min_time),
        "device_calls": lambda: _device_calls(device),
        "launches": lambda: _launches(device, sizes[:2]),
        "timings": lambda: _timings(device, sizes, min_time),
        "verl_calls": lambda: _verl_calls(device, sizes, min_time),
        "uploads": lambda: _uploads(device),
        "machine": lambda: _machine(device, min_time),
    }
    results: dict[str, Any] = {"device": device, "torch": torch.__version__}
    if device.startswith("cuda"):
        results["device_name"] = torch.cuda.get_device_name()
    failures: list[str] = []
    for name, run in sections.items():
        try:
            got = run()
        except Exception as err:  # one failing section must not hide the others' output
            import traceback

            results[name] = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}
            failures.append(f"section {name}: {type(err).__name__}: {err}")
            print(f"FAIL section {name}: {type(err).__name__}: {err}")
            continue
        if name == "properties":
            failures += got
            results[name] = {"failures": got}
        elif name == "verl_calls":
            failures += [_sync_failure(r) for r in got if not r["syncs_ok"]]
            results[name] = {"rows": got}
            print("\n".join(_verl_calls_table(got)))
        elif name == "device_calls":
            failures += [f"{r['call']} ({r['kernel']}): {r['problem']}" for r in got if not r["ok"]]
            results[name] = {"rows": got}
            print(
                f"{'ok  ' if all(r['ok'] for r in got) else 'FAIL'} device calls: {len(got)} checked on "
                f"{device}"
            )
        else:
            results[name] = {"rows": got} if isinstance(got, list) else got
    if "machine" in results and "error" not in results["machine"]:
        m = results["machine"]
        print(
            f"copy {m['copy_bandwidth_bytes_s'] / 1e12:.3g} TB/s, clone "
            f"{m['clone_bandwidth_bytes_s'] / 1e12:.3g} TB/s (copy/clone {m['copy_over_clone']:.2f}x), one "
            f"small operation {m['per_launch_s'] * 1e6:.2f} us (model: "
            f"{m['model']['bandwidth_bytes_s'] / 1e12:g} TB/s, {m['model']['per_launch_s'] * 1e6:g} us)"
        )
    try:
        print("\n".join(_table(results)))
    except Exception as err:
        failures.append(f"table: {type(err).__name__}: {err}")
    for f in failures:
        print(f"FAIL {f}", file=sys.stderr)
    results["failures"] = failures
    if args.out:
        import json

        with open(args.out, "w") as stream:
            json.dump(results, stream, indent=1, default=str)
    print(f"{'FAILED' if failures else 'passed'}: {len(failures)} failure(s) on {device}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
