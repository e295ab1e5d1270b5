"""The data-movement paths of ``torch_impl`` and the settings that force each one (for tests and properties).

``torch_impl`` picks a path by device, autograd and shape (see ``docs/kernels.md``); small test inputs
would otherwise only ever take the element-index path in one chunk per micro-batch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import ModuleType

import torch

import torch_impl._assemble as _assemble
import torch_impl._rowcopy as _rowcopy

__all__ = ["KERNELS", "forced"]

#: path -> {setting: value}; each setting lives in ``torch_impl._assemble`` or ``torch_impl._rowcopy``
KERNELS: dict[str, dict[str, float]] = {
    "row_copies": {"ROW_COPY_MIN_ELEMENTS": 0, "THREADS_MIN_BYTES": 10**15},
    "row_copies_in_threads": {"ROW_COPY_MIN_ELEMENTS": 0, "THREADS_MIN_BYTES": 0},
    "row_copies_in_threads_pages_written": {"ROW_COPY_MIN_ELEMENTS": 0, "THREADS_MIN_BYTES": 0, "POPULATE": False},
    "element_indices": {"ROW_COPY_MIN_ELEMENTS": 10**12},
    "element_indices_one_value_per_chunk": {
        "ROW_COPY_MIN_ELEMENTS": 10**12,
        "INDEX_MIN_CHUNK": 1,
        "INDEX_BYTES_FRACTION": 0.0,
    },
}


def _home(name: str) -> ModuleType:
    return _assemble if hasattr(_assemble, name) else _rowcopy


@contextlib.contextmanager
def forced(path: str) -> Iterator[None]:
    """Within the block, ``torch_impl`` takes ``path`` (with at least two intra-op threads for the
    threaded one, so the copies are shared among threads as on any multi-core machine)."""
    saved = {name: getattr(_home(name), name) for name in KERNELS[path]}
    threads = torch.get_num_threads()
    try:
        for name, value in KERNELS[path].items():
            setattr(_home(name), name, value)
        if path.startswith("row_copies_in_threads") and threads < 2:
            torch.set_num_threads(2)
        yield
    finally:
        for name, value in saved.items():
            setattr(_home(name), name, value)
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
