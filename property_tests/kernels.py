"""The data-movement paths of ``torch_impl`` and the settings that force each one (for tests and properties).

``torch_impl`` picks a path by device, autograd and shape (see ``docs/kernels.md``); small test inputs
would otherwise only ever take the few-rows path on the CPU, or the element-index path in one chunk per
micro-batch elsewhere. Each path is a set
of `torch_impl.Settings` values, applied with `torch_impl.use_settings` (scoped to the calling thread).
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Iterator
from typing import Any

import torch_impl

__all__ = ["KERNELS", "forced"]

#: path -> the `torch_impl.Settings` fields that force it
KERNELS: dict[str, dict[str, Any]] = {
    "row_copies": {"row_copy_min_elements": 0, "cpu_few_rows": 0, "cpu_join_min_neighbours": sys.maxsize},
    # neighbours in both a part and the output copied together (`torch_impl._rowcopy.join_runs`), a
    # joined run stopping where a page begins (its pages faulted in a page at a time)
    "row_copies_joined": {
        "row_copy_min_elements": 0,
        "cpu_few_rows": 0,
        "cpu_join_min_neighbours": 0,
        "cpu_prefault_min_bytes": 0,
        "cpu_fault_chunk_bytes": 4096,
        "cpu_fault_chunks_min_bytes": 0,
    },
    "element_indices": {"row_copy_min_elements": math.inf, "cpu_few_rows": 0},
    "element_indices_one_value_per_chunk": {
        "row_copy_min_elements": math.inf,
        "index_chunk_bytes": 1,
        "cpu_index_chunk": 1,
        "cpu_few_rows": 0,
    },
    # 3 value rows a chunk on the CPU; elsewhere 12 bytes: 3 float32 values, 6 bfloat16, 1 of a [b, (j), 3] float32 key
    "element_indices_few_values_per_chunk": {
        "row_copy_min_elements": math.inf,
        "index_chunk_bytes": 12,
        "cpu_index_chunk": 3,
        "cpu_few_rows": 0,
    },
    # a CPU jagged key's bookkeeping in Python ints and a copy a row, whatever its rows and bytes
    # (`torch_impl._fewrows`; without a page-faulting plan, which it does not make)
    "few_rows": {"cpu_few_rows": sys.maxsize, "cpu_prefault_min_bytes": math.inf},
}


@contextlib.contextmanager
def forced(path: str) -> Iterator[None]:
    """Within the block, ``torch_impl`` takes ``path`` (on the calling thread)."""
    with torch_impl.use_settings(**KERNELS[path]):
        yield
