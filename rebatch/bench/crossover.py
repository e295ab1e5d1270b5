"""Where one CPU path overtakes another: the measurements behind ``Settings.row_copy_min_elements``,
``Settings.cpu_few_rows`` and ``Settings.cpu_join_min_neighbours``.

Times `torch_impl.postprocess_batch_func` on the calling thread with each path forced, alternating (one
float32 key, the benchmark grid's long-tailed lengths), and prints the ratios: row copies against
element indices for a few mean row lengths at one B and M; with ``--few-rows``, the few-rows path
against the NumPy host paths for a few B at one mean length and M; with ``--join``, row copies with
runs of rows joined (`torch_impl._rowcopy.join_runs`) against one copy a row, for a few B and M.

    python -m rebatch.bench.crossover [--rows 1024] [--micro-batches 16] [--lengths 32 64 128 256 512 1024]
    python -m rebatch.bench.crossover --few-rows [--batches 8 16 32 64 128 256] [--micro-batches 4] [--lengths 16]
    python -m rebatch.bench.crossover --join [--batches 1024 4096 16384] [--counts 2 4 8 16] [--lengths 512 ...]

Figures taken on a busy machine are contended: rerun on a quiet one before changing the setting.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Callable
from typing import Any

import torch

import torch_impl
from property_tests.kernels import forced

from .cases import Case, make_inputs
from .run import _median_times

__all__ = ["crossover", "few_rows_crossover", "join_crossover", "main"]


def crossover(rows: int, micro_batches: int, lengths: list[int], *, min_time: float = 0.3) -> list[dict[str, Any]]:
    """One row per mean length: seconds of each path and ``indices / rows`` (above 1: row copies faster)."""
    out = []
    for length in lengths:
        inputs = make_inputs(Case(rows, length, micro_batches, 1, "float32", 2))
        calls: dict[str, Callable[[], Any]] = {}
        for path in ("row_copies", "element_indices"):

            def call(path: str = path, inputs: Any = inputs) -> Any:
                with forced(path):
                    return torch_impl.postprocess_batch_func(inputs.output_lst, inputs.indices, None)

            calls[path] = call
        seconds = _median_times(calls, "cpu", min_time=min_time)
        elements = inputs.output_elements / rows
        out.append(
            {
                "mean_length": length,
                "elements_per_row": elements,
                "seconds": seconds,
                "indices_over_rows": seconds["element_indices"] / seconds["row_copies"],
            }
        )
    return out


def few_rows_crossover(
    batches: list[int], micro_batches: int, length: int, *, min_time: float = 0.3
) -> list[dict[str, Any]]:
    """One row per B: seconds of the few-rows path and of the NumPy host paths (``cpu_few_rows`` 0), and
    ``numpy / few_rows`` (above 1: the few-rows path faster)."""
    out = []
    for rows in batches:
        inputs = make_inputs(Case(rows, length, min(micro_batches, rows), 1, "float32", 2))
        calls: dict[str, Callable[[], Any]] = {}
        for path, few in (("few_rows", rows), ("numpy", 0)):

            def call(few: int = few, inputs: Any = inputs) -> Any:
                with torch_impl.use_settings(cpu_few_rows=few):
                    return torch_impl.postprocess_batch_func(inputs.output_lst, inputs.indices, None)

            calls[path] = call
        seconds = _median_times(calls, "cpu", min_time=min_time)
        out.append({"rows": rows, "seconds": seconds, "numpy_over_few_rows": seconds["numpy"] / seconds["few_rows"]})
    return out


def join_crossover(
    batches: list[int], counts: list[int], lengths: list[int], *, min_time: float = 1.0
) -> list[dict[str, Any]]:
    """One row per (mean length, B, M): seconds of the row copies with runs joined
    (``cpu_join_min_neighbours`` 0) and without (``sys.maxsize``), and ``apart / joined`` (above 1:
    joining faster); ``neighbours``: the output rows whose micro-batch is the row before's (the grid's
    micro-batches list their indices in ascending order, so each continues that row in its values:
    what ``cpu_join_min_neighbours`` counts)."""
    out = []
    for length, rows, count in itertools.product(lengths, batches, counts):
        m = min(count, rows)
        inputs = make_inputs(Case(rows, length, m, 1, "float32", 2))
        calls: dict[str, Callable[[], Any]] = {}
        for name, least in (("joined", 0), ("apart", sys.maxsize)):

            def call(least: int = least, inputs: Any = inputs) -> Any:
                with forced("row_copies"), torch_impl.use_settings(cpu_join_min_neighbours=least):
                    return torch_impl.postprocess_batch_func(inputs.output_lst, inputs.indices, None)

            calls[name] = call
        seconds = _median_times(calls, "cpu", min_time=min_time, max_rounds=41)
        part = [k for k, p in enumerate(inputs.indices) for _ in p]  # each flat position's micro-batch
        order = sorted(range(rows), key=[i for p in inputs.indices for i in p].__getitem__)  # output order
        out.append(
            {
                "mean_length": length,
                "rows": rows,
                "micro_batches": m,
                "neighbours": sum(part[a] == part[b] for a, b in itertools.pairwise(order)),
                "seconds": seconds,
                "apart_over_joined": seconds["apart"] / seconds["joined"],
            }
        )
    return out


def _print_few_rows(results: list[dict[str, Any]], micro_batches: int, length: int) -> None:
    print(f"mean length {length}, M={micro_batches}, float32, torch {torch.__version__}")
    print("B | few rows ms | NumPy paths ms | NumPy / few rows")
    for r in results:
        s = r["seconds"]
        print(f"{r['rows']} | {s['few_rows'] * 1e3:.3g} | {s['numpy'] * 1e3:.3g} | {r['numpy_over_few_rows']:.2f}")
    print(f"Settings.cpu_few_rows = {torch_impl.get_settings().cpu_few_rows}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rebatch.bench.crossover", description=__doc__)
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--micro-batches", type=int, default=16)
    parser.add_argument("--lengths", type=int, nargs="+", default=None)
    parser.add_argument("--min-time", type=float, default=0.3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--few-rows", action="store_true", help="the few-rows path against the NumPy host paths")
    parser.add_argument("--batches", type=int, nargs="+", help="B: 8 to 256 (--few-rows), 1024 4096 16384 (--join)")
    parser.add_argument("--join", action="store_true", help="row copies with runs joined against one a row")
    parser.add_argument("--counts", type=int, nargs="+", default=[2, 4, 8, 16], help="micro-batch counts (--join)")
    args = parser.parse_args(argv)
    if args.join:
        joined = join_crossover(
            args.batches or [1024, 4096, 16384], args.counts, args.lengths or [512], min_time=args.min_time
        )
        if args.json:
            print(json.dumps(joined, indent=1))
            return 0
        print(f"float32, row copies, torch {torch.__version__}")
        print("mean length | B | M | neighbours | joined ms | apart ms | apart / joined")
        for r in joined:
            s = r["seconds"]
            print(
                f"{r['mean_length']} | {r['rows']} | {r['micro_batches']} | {r['neighbours']} | "
                f"{s['joined'] * 1e3:.3g} | {s['apart'] * 1e3:.3g} | {r['apart_over_joined']:.2f}"
            )
        print(f"Settings.cpu_join_min_neighbours = {torch_impl.get_settings().cpu_join_min_neighbours}")
        return 0
    if args.few_rows:
        args.batches = args.batches or [8, 16, 32, 64, 128, 256]
        found: list[dict[str, Any]] = []
        for length in args.lengths or [16]:
            found += few_rows_crossover(args.batches, args.micro_batches, length, min_time=args.min_time)
            if not args.json:
                _print_few_rows(found[-len(args.batches) :], args.micro_batches, length)
        if args.json:
            print(json.dumps(found, indent=1))
        return 0
    args.lengths = args.lengths or [32, 64, 128, 256, 512, 1024]
    results = crossover(args.rows, args.micro_batches, args.lengths, min_time=args.min_time)
    if args.json:
        print(json.dumps(results, indent=1))
        return 0
    print(
        f"B={args.rows}, M={args.micro_batches}, float32, {torch.get_num_threads()} threads, torch {torch.__version__}"
    )
    print("mean elements/row | row copies ms | element indices ms | indices / rows")
    for r in results:
        s = r["seconds"]
        print(
            f"{r['elements_per_row']:17.0f} | {s['row_copies'] * 1e3:13.3g} | {s['element_indices'] * 1e3:18.3g} | "
            f"{r['indices_over_rows']:.2f}"
        )
    wins = [r["elements_per_row"] for r in results if r["indices_over_rows"] > 1]
    first = f"{wins[0]:.0f}" if wins else "none of these"
    setting = torch_impl.get_settings().row_copy_min_elements
    print(f"row copies faster from: {first} elements per row (Settings.row_copy_min_elements = {setting})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
