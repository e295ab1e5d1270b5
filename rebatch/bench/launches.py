"""Operations per call on the device path, and the device time they model: the launch table.

On a GPU a call of ``postprocess_batch_func`` is bound by its kernel launches, not by its bytes.
This counts the torch operations of one call of `torch_impl.postprocess_batch_func` on ``meta``
tensors (the device path, the element-index kernel, without data) for each B and M, with
`property_tests.opcount.CountOps`, and models the device time as

    operations x LAUNCH_SECONDS + estimated bytes moved / BANDWIDTH

with both constants assumptions (stated in the table). verl's own function is not counted here (it
runs only where verl is installed, and reads row lengths on the host, which ``meta`` cannot).

    python -m rebatch.bench.launches [--rows 64 1024 16384] [--micro-batches 1 16 64 256] [--keys 1 5]
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from property_tests.launches import count_call, meta_batch, output_bytes
from property_tests.markdown import table as markdown_table

__all__ = ["BANDWIDTH", "GRID", "LAUNCH_SECONDS", "SMOKE_GRID", "launch_rows", "markdown", "main"]

#: Assumed cost of one operation on a GPU: a kernel launch with its Python dispatch (about 5 µs).
LAUNCH_SECONDS = 5e-6
#: Assumed memory bandwidth: an H200's HBM3e, 4.8 TB/s.
BANDWIDTH = 4.8e12
MEAN_LENGTH = 32
#: (B values, M values, key counts) of the table in docs/benchmarks.md, and of the harness's smoke run
GRID = ([64, 1024, 16384], [1, 16, 64, 256], [1, 5])
SMOKE_GRID = ([8], [1, 2], [1])


def launch_rows(
    rows: list[int], micro_batches: list[int], keys: list[int], *, length: int = MEAN_LENGTH
) -> list[dict[str, Any]]:
    """One dict per (B, M, keys): operations, those on values, estimated bytes, output bytes, modelled
    seconds."""
    out = []
    for b in rows:
        for m in micro_batches:
            outs, indices = meta_batch(b, m, keys=max(keys), length=length)
            for k in keys:
                trimmed = [{**o, "model_output": dict(list(o["model_output"].items())[:k])} for o in outs]
                count = count_call(trimmed, indices, drop_in=True)
                launch, traffic = count.ops * LAUNCH_SECONDS, count.bytes / BANDWIDTH
                out.append(
                    {
                        "rows": b,
                        "micro_batches": m,
                        "keys": k,
                        "ops": count.ops,
                        "ops_on_values": count.on_values,
                        "bytes": count.bytes,
                        "output_bytes": k * output_bytes(b, length=length),
                        "launch_seconds": launch,
                        "traffic_seconds": traffic,
                        "modelled_seconds": launch + traffic,
                    }
                )
    return out


def markdown(table: list[dict[str, Any]], *, length: int = MEAN_LENGTH) -> list[str]:
    """The launch table as Markdown lines (a section of ``docs/benchmarks.md``)."""
    lines = [
        "## Launches: operations per call on the device path",
        "",
        "Torch operations dispatched by one call of `torch_impl.postprocess_batch_func` (dynamic batch "
        f"size, float32 `[b, (j)]` keys, every row {length} values, the partitions a reversal), counted "
        "with `property_tests.opcount.CountOps` on `meta` tensors: the device path and its element-index "
        "kernel, without data, `data` holding the batch's `input_ids` on the host as verl's engines leave "
        "it (the alignment witness's comparison included: 4 to 6 operations a call; its one read of the "
        "verdict cannot happen on `meta`). *on values* are those whose first argument is floating-point "
        "(the data moved; the rest is int64 bookkeeping of B or fewer elements). The modelled device time "
        f"is operations x {LAUNCH_SECONDS * 1e6:g} µs (an assumed launch with its Python dispatch) plus the "
        f"estimated bytes moved over {BANDWIDTH / 1e12:g} TB/s (assumed: an H200's HBM3e); bytes are "
        "estimated by `CountOps` (each operation that is not a view reads its tensors and writes its "
        "results in full). verl's own function is not in this table (it runs only where verl is "
        "installed). Regenerate with `python -m rebatch.bench.launches`.",
        "",
    ]
    head = ["B", "M", "keys", "operations", "on values", "output MiB", "est. MiB moved"]
    rows = [
        [
            r["rows"],
            r["micro_batches"],
            r["keys"],
            r["ops"],
            r["ops_on_values"],
            f"{r['output_bytes'] / 2**20:.2f}",
            f"{r['bytes'] / 2**20:.2f}",
            f"{r['modelled_seconds'] * 1e6:.0f} ({r['launch_seconds'] * 1e6:.0f} + "
            f"{r['traffic_seconds'] * 1e6:.1f})",
        ]
        for r in table
    ]
    return [*lines, *markdown_table([*head, "modelled µs (launches + bytes)"], rows)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rebatch.bench.launches", description=__doc__)
    parser.add_argument("--rows", type=int, nargs="+", default=GRID[0])
    parser.add_argument("--micro-batches", type=int, nargs="+", default=GRID[1])
    parser.add_argument("--keys", type=int, nargs="+", default=GRID[2])
    args = parser.parse_args(argv)
    print("\n".join(markdown(launch_rows(args.rows, args.micro_batches, args.keys))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
