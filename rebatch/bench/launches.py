"""Operations per call on the device path, and the device time they model: the launch table.

On a GPU a call of ``postprocess_batch_func`` is bound by its kernel launches, not by its bytes.
This counts the torch operations of one call of `torch_impl.postprocess_batch_func` on ``meta``
tensors (the device path, the element-index kernel, without data) for each B and M, with
`property_tests.opcount.CountOps`, and models the device time as

    operations x LAUNCH_SECONDS + estimated bytes moved / BANDWIDTH

with both constants assumptions (stated in docs/benchmarks.md). verl's own function is not counted here (it
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


def markdown(table: list[dict[str, Any]]) -> list[str]:
    """The launch table as Markdown lines (a region of ``docs/benchmarks.md``, filled by
    `rebatch.figures`, which states the assumptions too: `MEAN_LENGTH`, `LAUNCH_SECONDS`, `BANDWIDTH`)."""
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
    return markdown_table([*head, "modelled µs (launches + bytes)"], rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rebatch.bench.launches", description=__doc__)
    parser.add_argument("--rows", type=int, nargs="+", default=GRID[0])
    parser.add_argument("--micro-batches", type=int, nargs="+", default=GRID[1])
    parser.add_argument("--keys", type=int, nargs="+", default=GRID[2])
    args = parser.parse_args(argv)
    print(  # on the terminal; docs/benchmarks.md says it in its own prose
        f"Operations of one call on `meta` tensors, every row {MEAN_LENGTH} values; modelled: operations x "
        f"{LAUNCH_SECONDS * 1e6:g} µs plus estimated bytes over {BANDWIDTH / 1e12:g} TB/s (both assumed); "
        "verl's own function is not in this table (it runs only where verl is installed).\n"
    )
    print("\n".join(markdown(launch_rows(args.rows, args.micro_batches, args.keys))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
