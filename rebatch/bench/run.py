"""Run the benchmark grid: torch_impl, the per-row baseline (verl's algorithm), verl's own
``postprocess_batch_func`` (when verl is importable), the copy limit and the jit-compiled JAX
reference, timed in one run on the same inputs; peak extra memory for torch_impl and the baseline.
With ``--contended`` every case is timed twice, quiet and with one busy process per core (started and
stopped by the harness), and the table shows both ratios side by side. Writes ``benchmarks.json`` and
``benchmarks.png`` (time against B), and ``benchmarks.md``: the page's tables and figures of the run
filled from the JSON by `rebatch.figures` (the prose is the page's own, in ``docs/benchmarks.md``).

    python -m rebatch.bench.run [--grid quick|standard|large|full] [--contended] [--device cuda] [--out docs]
    rebatch bench [--quick]                      # the same, standard grid (quick with --quick)
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

import torch_impl
from property_tests.baseline import verl_postprocess_batch_func
from property_tests.trainer_import import import_trainer_module

from . import launches
from .cases import GRIDS, JAX_MAX_ELEMENTS, Case, grid, make_inputs
from .contention import busy_processes, core_count
from .memory import peak_rss_bytes, peak_tensor_bytes
from .tables import restore_table
from .timing import median_seconds, timed_alone

__all__ = ["main", "measure", "median_times", "run_bench", "write_page"]

#: The JAX reference is timed alone (`timing.median_seconds`) for at least this many seconds.
JAX_MIN_RUN_TIME = 0.3


def median_times(
    fns: dict[str, Callable[[], Any]],
    device: str,
    *,
    min_time: float = 0.5,
    min_rounds: int = 5,
    max_rounds: int = 15,
    seed: int = 0,
) -> dict[str, float]:
    """Median seconds per call of each function, timed in alternation: each round calls every
    function once, in an order shuffled afresh each round (``random.Random(seed)``), so all of them
    meet the same state of the machine (clock speed, allocator, page cache) and none always runs
    right after the same other one (a call that follows a ``clone`` meets different freed memory
    than one that follows a call of the baseline).

    One warm-up call each, then at least ``min_rounds`` rounds, more until ``min_time`` is spent or
    ``max_rounds``.
    """
    for fn in fns.values():
        timed_alone(fn, device)  # the warm-up call
    times: dict[str, list[float]] = {name: [] for name in fns}
    order = list(fns)
    rng = random.Random(seed)
    spent = 0.0
    rounds = 0
    while rounds < min_rounds or (spent < min_time and rounds < max_rounds):
        rng.shuffle(order)
        for name in order:
            elapsed = timed_alone(fns[name], device)
            times[name].append(elapsed)
            spent += elapsed
        rounds += 1
    return {name: statistics.median(t) for name, t in times.items()}


def _copy_limit(outs: list[dict[str, Any]]) -> Callable[[], Any]:
    """One clone of a buffer with the output's bytes (each key's values, concatenated beforehand)."""
    keys = list(outs[0]["model_output"])
    whole = [torch.cat([o["model_output"][k].values() for o in outs]) for k in keys]
    return lambda: [w.clone() for w in whole]


def _jax_reference(outs: list[dict[str, Any]], indices: list[list[int]]) -> Callable[[], Any] | None:
    import jax

    import ref
    from ref import interop

    converted = [{"model_output": o["model_output"]} for o in interop.outputs_from_torch(outs)]
    fn = jax.jit(lambda o: ref.postprocess_batch(o, indices)["model_output"])
    fn(converted)  # compile outside the timing

    def run() -> Any:
        return jax.block_until_ready(fn(converted))

    return run


#: The side-by-side restore row's size by grid: B rows, N values, M micro-batches (issue #15's size
#: everywhere but the test grids).
RESTORE_SIZES: dict[str, tuple[int, int, int]] = {"smoke": (64, 4096, 4), "quick": (1024, 2**16, 4)}
RESTORE_SIZE = (16384, 2**20, 4)


def restore_side_by_side(rows: int, elements: int, micro_batches: int, *, seed: int = 0) -> dict[str, Any]:
    """``jax.jit(ref.restore)`` against ``torch_impl.restore`` on the same data (CPU): one jagged float32
    batch ``[B, (j)]`` of N values in micro-batch order and its partitions. The JAX side takes the
    permutation as a traced argument (``ref.checked``: compiled once for every permutation, its values
    checked in the compiled program), compiled and warmed up before timing; the two alternate as in
    `median_times`. Results are checked bit-equal first."""
    import jax
    import jax.numpy as jnp

    import ref
    from property_tests.compare import bits
    from property_tests.data import offsets_of
    from ref import interop

    rng = np.random.default_rng(seed)
    lengths = rng.multinomial(elements, np.full(rows, 1.0 / rows))
    perm = rng.permutation(rows)
    bounds = np.linspace(0, rows, micro_batches + 1).astype(int)
    partitions = [sorted(perm[bounds[m] : bounds[m + 1]].tolist()) for m in range(micro_batches)]
    flat = [i for p in partitions for i in p]
    offsets = torch.zeros(rows + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.from_numpy(lengths), 0)
    values = torch.randn(elements, generator=torch.Generator().manual_seed(seed))
    x = torch.nested.nested_tensor_from_jagged(values, offsets)
    x_ref = interop.from_torch(x, copy=True)
    perm_j = jnp.asarray(flat, dtype=jnp.int32)
    jitted = ref.checked(lambda a, p: ref.restore(a, p))

    def jax_restore() -> Any:
        return jax.block_until_ready(jitted(x_ref, perm_j))

    def torch_restore() -> Any:
        return torch_impl.restore(x, partitions)

    want = torch_restore()
    got = interop.to_torch(jax_restore())
    if not (
        torch.equal(bits(got.values()), bits(want.values()))
        and torch.equal(offsets_of(got), offsets_of(want))
    ):
        raise AssertionError("jit(ref.restore) and torch_impl.restore differ")
    seconds = median_times({"torch_impl_restore": torch_restore, "jax_ref_restore_jit": jax_restore}, "cpu")
    return {
        "rows": rows,
        "elements": elements,
        "micro_batches": micro_batches,
        "seconds": seconds,
        "jit_over_torch": seconds["jax_ref_restore_jit"] / seconds["torch_impl_restore"],
    }


def verl_function() -> Callable[..., Any] | None:
    """verl's own ``postprocess_batch_func`` when verl is importable, else None (reported as absent)."""
    try:
        fn: Callable[..., Any] = import_trainer_module("verl.workers.engine.utils").postprocess_batch_func
    except Exception:  # not installed, or its imports fail: absent either way
        return None
    return fn


def _timings(fns: dict[str, Callable[[], Any]], device: str) -> dict[str, Any]:
    """Median seconds of each function (alternating), and the ratios against torch_impl."""
    seconds = median_times(fns, device)
    out: dict[str, Any] = {"seconds": seconds}
    out["speedup_vs_baseline"] = seconds["per_row_baseline"] / seconds["torch_impl"]
    out["ratio_to_copy_limit"] = seconds["torch_impl"] / seconds["copy_limit"]
    if "verl" in seconds:
        out["speedup_vs_verl"] = seconds["verl"] / seconds["torch_impl"]
    return out


def measure(
    case: Case, device: str = "cpu", *, with_jax: bool = True, contended: bool = False
) -> dict[str, Any]:
    inputs = make_inputs(case, device)
    outs, indices = inputs.output_lst, inputs.indices
    row: dict[str, Any] = {
        "case": case._asdict(),
        "name": case.name,
        "output_bytes": inputs.output_bytes,
        "output_elements": inputs.output_elements,
    }
    impl = lambda: torch_impl.postprocess_batch_func(outs, indices, None)  # noqa: E731
    base = lambda: verl_postprocess_batch_func(outs, indices, None)  # noqa: E731
    # The functions alternate (shuffled order each round), so the ratios compare like with like.
    fns = {"torch_impl": impl, "copy_limit": _copy_limit(outs), "per_row_baseline": base}
    verl = verl_function()
    if verl is not None:
        from tensordict import TensorDict

        settings = TensorDict({}, batch_size=[])
        fns["verl"] = lambda: verl(outs, indices, settings)
    row.update(_timings(fns, device))
    seconds = row["seconds"]
    if with_jax and device == "cpu" and inputs.output_elements <= JAX_MAX_ELEMENTS:
        jax_fn = _jax_reference(outs, indices)
        if jax_fn is not None:
            seconds["jax_reference_jit"] = median_seconds(jax_fn, min_run_time=JAX_MIN_RUN_TIME)
    if contended:
        with busy_processes() as procs:
            row["contended"] = {"busy_processes": len(procs), **_timings(fns, device)}
    gc.collect()
    row["peak_extra_bytes"] = {  # live tensor bytes, from the allocator's records
        "torch_impl": peak_tensor_bytes(impl, device),
        "per_row_baseline": peak_tensor_bytes(base, device),
    }
    if "verl" in fns:
        row["peak_extra_bytes"]["verl"] = peak_tensor_bytes(fns["verl"], device)
    row["peak_extra_over_output"] = row["peak_extra_bytes"]["torch_impl"] / max(inputs.output_bytes, 1)
    row["peak_rss_bytes"] = {  # what the operating system sees (None on an accelerator)
        "torch_impl": peak_rss_bytes(impl, device),
        "per_row_baseline": peak_rss_bytes(base, device),
    }
    return row


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = [
        r
        for r in results["rows"]
        if r["case"]["keys"] == 1 and r["case"]["dtype"] == "float32" and r["case"]["ndim"] == 2
    ]
    lengths = sorted({r["case"]["mean_length"] for r in base})
    fig, axes = plt.subplots(1, len(lengths), figsize=(5 * len(lengths), 4), squeeze=False)
    styles = {"torch_impl": "o-", "per_row_baseline": "s--", "copy_limit": "k:", "jax_reference_jit": "^-."}
    for ax, length in zip(axes[0], lengths, strict=True):
        # the panel's M: the most micro-batches up to 16 that this length was run with
        mb = max(
            {
                r["case"]["micro_batches"]
                for r in base
                if r["case"]["mean_length"] == length and r["case"]["micro_batches"] <= 16
            }
            or {1}
        )
        rows = sorted(
            (r for r in base if r["case"]["mean_length"] == length and r["case"]["micro_batches"] == mb),
            key=lambda r: r["case"]["rows"],
        )
        for impl, style in styles.items():
            pts = [(r["case"]["rows"], r["seconds"][impl]) for r in rows if impl in r["seconds"]]
            if pts:
                ax.plot(*zip(*pts, strict=True), style, label=impl.replace("_", " "))
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("rows B")
        ax.set_ylabel("seconds (median)")
        ax.set_title(f"mean length {length}, M={mb}, 1 key float32")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_bench(
    *,
    quick: bool = False,
    device: str = "cpu",
    out: str = "docs",
    as_json: bool = False,
    grid_name: str | None = None,
    with_jax: bool = True,
    contended: bool = False,
) -> int:
    name = grid_name or ("quick" if quick else "standard")
    cases = grid(name)
    results: dict[str, Any] = {
        "grid": name,
        "device": device,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "machine": f"{platform.machine()}, {torch.get_num_threads()} threads",
        "date": time.strftime("%Y-%m-%d"),
        "verl": "importable" if verl_function() is not None else "absent",
        "busy_processes": core_count() if contended else 0,
        "rows": [],
    }
    start = time.perf_counter()
    for i, case in enumerate(cases, 1):
        row = measure(case, device, with_jax=with_jax, contended=contended)
        results["rows"].append(row)
        elapsed = time.perf_counter() - start
        bar = "#" * int(20 * i / len(cases))
        print(
            f"\r[{bar:<20}] {i}/{len(cases)} {elapsed:6.0f}s  {case.name}: "
            f"{row['speedup_vs_baseline']:.1f}x vs baseline, {row['ratio_to_copy_limit']:.2f}x copy",
            end="\n" if not sys.stderr.isatty() else "",
            file=sys.stderr,
            flush=True,
        )
    if with_jax and device == "cpu":
        size = RESTORE_SIZES.get(name, RESTORE_SIZE)
        results["restore_side_by_side"] = restore_side_by_side(*size)
        print(
            f"jit(ref.restore) / torch_impl.restore: {results['restore_side_by_side']['jit_over_torch']:.2f}",
            file=sys.stderr,
        )
    results["launches"] = launches.launch_rows(*(launches.SMOKE_GRID if name == "smoke" else launches.GRID))
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "benchmarks.json").write_text(json.dumps(results, indent=1))
    write_page(results, folder / "benchmarks.md")
    plot(results, folder / "benchmarks.png")
    if as_json:
        print(json.dumps(results, indent=1))
    else:
        print(f"wrote {folder / 'benchmarks.json'}, {folder / 'benchmarks.md'}, {folder / 'benchmarks.png'}")
    return 0


def write_page(results: dict[str, Any], page: Path) -> None:
    """``page`` (the repository's ``docs/benchmarks.md``, or a copy of it where ``page`` is not yet) with
    its regions of ``results`` filled by `rebatch.figures` (the prose is the page's own, the regions of the
    other runs rendered from the repository's JSON)."""
    from .. import figures

    template = page if page.exists() else figures.ROOT / "docs/benchmarks.md"
    load = figures.loader(figures.ROOT, {"docs/benchmarks.json": results})
    page.write_text(figures.fill(template.read_text(), "docs/benchmarks.md", load))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rebatch.bench.run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--grid", choices=GRIDS, default="standard")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default="docs")
    parser.add_argument("--no-jax", action="store_true", help="leave out the JAX reference")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--restore-only",
        action="store_true",
        help="only the side-by-side row, jit(ref.restore) against torch_impl.restore (B=16384, N=2^20, M=4)",
    )
    parser.add_argument(
        "--contended", action="store_true", help="also time every case with one busy process per core"
    )
    args = parser.parse_args(argv)
    if args.restore_only:
        row = restore_side_by_side(*RESTORE_SIZE)
        print("\n".join(restore_table(row)))
        return 0
    return run_bench(
        device=args.device,
        out=args.out,
        as_json=args.json,
        grid_name=args.grid,
        with_jax=not args.no_jax,
        contended=args.contended,
    )


if __name__ == "__main__":
    sys.exit(main())
