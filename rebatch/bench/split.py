"""The split side: ``torch_impl.split`` of a TensorDict (one gather per field for all partitions) against
a per-partition ``index_select`` baseline (one gather per field per partition, rows unbound per
partition as verl does for jagged fields), timed in one run on the same inputs.

    python -m rebatch.bench.split [--out docs]      # writes split.json (and fills docs/split.md's table)

The table of ``docs/split.md`` is a region of the page filled from ``split.json`` by `rebatch.figures`;
the prose around it is the page's own.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict

import torch_impl

from .cases import Case, lengths_for
from .timing import SLOW_CALL_SECONDS, median_seconds

__all__ = ["per_partition_baseline", "main"]

#: Each side is timed (`timing.median_seconds`) for at least this many seconds.
MIN_RUN_TIME = 0.3


def per_partition_baseline(data: TensorDict, partitions: list[list[int]]) -> list[dict[str, torch.Tensor]]:
    """For every partition and field: dense fields by ``index_select``, jagged ones by unbinding the rows
    and rebuilding (what selecting a micro-batch costs verl today)."""
    out = []
    for part in partitions:
        idx = torch.tensor(part, dtype=torch.int64)
        fields: dict[Any, torch.Tensor] = {}
        for key in data.keys():
            x = data.get(key)
            if x.is_nested:
                rows = x.unbind()
                fields[key] = torch.nested.as_nested_tensor([rows[i] for i in part], layout=torch.jagged)
            else:
                fields[key] = x.index_select(0, idx)
        out.append(fields)
    return out


def _data(case: Case) -> tuple[TensorDict, list[int]]:
    lengths = lengths_for(case).tolist()
    offsets = torch.zeros(case.rows + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.tensor(lengths), 0)
    n = int(offsets[-1])
    fields: dict[str, Any] = {
        f"jagged{k}": torch.nested.nested_tensor_from_jagged(torch.randn(n), offsets)
        for k in range(case.keys)
    }
    fields["advantages"] = torch.randn(case.rows)
    return TensorDict(fields, batch_size=[case.rows]), lengths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rebatch.bench.split",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", default="docs")
    args = parser.parse_args(argv)
    rows = []
    for b in (64, 512, 4096):
        for length in (16, 512):
            for keys in (1, 3):
                case = Case(b, length, 1, keys, "float32", 2)
                data, lengths = _data(case)
                budget = max(max(lengths), 8 * length)
                parts = torch_impl.balanced_partitions(lengths, budget)
                t_impl = median_seconds(
                    lambda: torch_impl.split(data, parts),  # noqa: B023
                    min_run_time=MIN_RUN_TIME,
                )
                t_base = median_seconds(
                    lambda: per_partition_baseline(data, parts),  # noqa: B023
                    min_run_time=MIN_RUN_TIME,
                    once_over=SLOW_CALL_SECONDS,
                )
                rows.append(
                    {
                        "rows": b,
                        "mean_length": length,
                        "jagged_fields": keys,
                        "partitions": len(parts),
                        "torch_impl_s": t_impl,
                        "baseline_s": t_base,
                        "speedup": t_base / t_impl,
                    }
                )
                print(
                    f"B={b} L={length} fields={keys} P={len(parts)}: {t_base / t_impl:.1f}x",
                    file=sys.stderr,
                    flush=True,
                )
    folder = Path(args.out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "split.json").write_text(json.dumps(rows, indent=1))
    print(f"wrote {folder / 'split.json'}")
    from .. import figures

    if folder.resolve() == (figures.ROOT / "docs").resolve():  # its table is a region of docs/split.md
        figures.write(figures.ROOT, pages=("docs/split.md",))
        print(
            "filled docs/split.md's table; its run line (not in the JSON) is the page's, by hand: "
            f"{time.strftime('%Y-%m-%d')}, torch {torch.__version__}, {torch.get_num_threads()} threads."
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
