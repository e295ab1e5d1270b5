"""Where CPU row copies overtake element indices: the measurement behind ``Settings.row_copy_min_elements``.

Times `torch_impl.postprocess_batch_func` on the calling thread with each path forced (row copies,
element indices), alternating, for a few mean row lengths at one B and M (one float32 key, the
benchmark grid's long-tailed lengths), and prints the ratio and the first length where row copies win.

    python -m rebatch.bench.crossover [--rows 1024] [--micro-batches 16] [--lengths 32 64 128 256 512 1024]

Figures taken on a busy machine are contended: rerun on a quiet one before changing the setting.
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
from .run import _median_times

__all__ = ["crossover", "main"]


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rebatch.bench.crossover", description=__doc__)
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--micro-batches", type=int, default=16)
    parser.add_argument("--lengths", type=int, nargs="+", default=[32, 64, 128, 256, 512, 1024])
    parser.add_argument("--min-time", type=float, default=0.3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
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
