"""The measurements behind `torch_impl.Settings`: each registered kernel forced, timed side by side.

For each case (B, mean length, M, trailing shape, dense or jagged), `torch_impl.postprocess_batch` runs
with every kernel of the registry that serves the case forced (`property_tests.kernels.forced`), in
alternation on the same inputs (`rebatch.bench.run.median_times`), and the median times are printed
with each kernel's time over the registry's default choice. ``--chunks`` times the CPU chunk sizes of the
chunked kernels instead (``Settings.index_chunk_bytes``, up to ``CPU_CHUNK_ROWS`` value rows on the CPU).
``docs/kernels.md``, "Settings", cites these.

    python -m rebatch.bench.crossover [--cases jagged dense] [--min-time 0.3] [--json]
    python -m rebatch.bench.crossover --chunks [--values 1024 4096 16384 65536]

Figures taken on a busy machine are contended: rerun on a quiet one before changing a default.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

import torch

import torch_impl
from property_tests.kernels import forced

from .cases import Case, make_inputs
from .run import median_times

__all__ = ["chunk_sizes", "kernels_side_by_side", "main"]

#: (name, case, dense trailing size or None): jagged keys about ``Settings.cpu_row_copy_min_elements``
#: and the targets', and dense keys about ``Settings.cpu_dense_host_min_elements``.
CASES: dict[str, list[tuple[str, Case, int | None]]] = {
    "jagged": [
        ("B=8 L=16 M=4", Case(8, 16, 4, 1, "float32", 2), None),
        *(
            (f"B=1024 L={n} M=16", Case(1024, n, 16, 1, "float32", 2), None)
            for n in (64, 128, 256, 512, 1024)
        ),
        ("B=16384 L=16 M=16", Case(16384, 16, 16, 1, "float32", 2), None),
    ],
    "dense": [
        (f"dense B=1024 [{width}] M=16", Case(1024, 1, 16, 1, "float32", 2), width)
        for width in (4, 16, 32, 64, 512)
    ],
}


def _case_inputs(case: Case, dense: int | None) -> tuple[list[dict[str, Any]], list[list[int]]]:
    inputs = make_inputs(case)
    outs = inputs.output_lst
    if dense is not None:  # each micro-batch's rows as one dense [b, dense] key
        outs = [{"model_output": {"d": torch.ones(len(p), dense)}} for p in inputs.indices]
    return outs, inputs.indices


def _default(outs: list[dict[str, Any]], indices: list[list[int]]) -> Callable[[], Any]:
    return lambda: torch_impl.postprocess_batch(outs, indices)


def kernels_side_by_side(names: list[str], *, min_time: float = 0.3) -> list[dict[str, Any]]:
    """One row per case: seconds of the default choice and of each kernel that serves the case."""
    out = []
    for name, case, dense in (c for group in names for c in CASES[group]):
        outs, indices = _case_inputs(case, dense)
        layout = "dense" if dense is not None else "jagged"
        calls: dict[str, Callable[[], Any]] = {"default": _default(outs, indices)}
        for kernel in torch_impl.KERNELS.values():
            if kernel.permutes and layout in kernel.layouts:

                def call(k: str = kernel.name, o: Any = outs, i: Any = indices) -> Any:
                    with forced(k):
                        return torch_impl.postprocess_batch(o, i)

                calls[kernel.name] = call
        seconds = median_times(calls, "cpu", min_time=min_time)
        out.append(
            {
                "case": name,
                "seconds": seconds,
                "over_default": {k: s / seconds["default"] for k, s in seconds.items()},
            }
        )
    return out


def chunk_sizes(values: list[int], *, min_time: float = 0.3) -> list[dict[str, Any]]:
    """One row per chunk size (value rows): seconds of the chunked kernels at B=1024 L=512 M=16."""
    outs, indices = _case_inputs(Case(1024, 512, 16, 1, "float32", 2), None)
    calls: dict[str, Callable[[], Any]] = {}
    for chunk in values:
        for kernel in (k for k in torch_impl.KERNELS.values() if k.chunked):

            def call(k: str = kernel.name, c: int = chunk) -> Any:
                with torch_impl.use_settings(kernel=k, index_chunk_bytes=4 * c):  # float32 value rows
                    return torch_impl.postprocess_batch(outs, indices)

            calls[f"{kernel.name} {chunk}"] = call
    seconds = median_times(calls, "cpu", min_time=min_time)
    return [{"case": name, "seconds": {name: s}} for name, s in seconds.items()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rebatch.bench.crossover", description=__doc__)
    parser.add_argument("--cases", nargs="+", choices=sorted(CASES), default=sorted(CASES))
    parser.add_argument("--chunks", action="store_true", help="the chunked kernels' CPU chunk sizes")
    parser.add_argument("--values", type=int, nargs="+", default=[1024, 4096, 16384, 65536])
    parser.add_argument("--min-time", type=float, default=0.3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows = (
        chunk_sizes(args.values, min_time=args.min_time)
        if args.chunks
        else kernels_side_by_side(args.cases, min_time=args.min_time)
    )
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(
        f"float32, {torch.get_num_threads()} threads, torch {torch.__version__}, {torch_impl.get_settings()}"
    )
    for r in rows:
        times = ", ".join(f"{k} {s * 1e3:.3g} ms" for k, s in r["seconds"].items())
        ratios = ", ".join(f"{k} {v:.2f}x" for k, v in r.get("over_default", {}).items() if k != "default")
        print(f"{r['case']}: {times}" + (f" (over the default: {ratios})" if ratios else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
