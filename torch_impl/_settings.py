"""The tuning knobs of ``torch_impl``, in one immutable object, with a scoped override.

The current `Settings` live in a `contextvars.ContextVar`: `use_settings` changes them for the calling
thread (or asyncio task) only, inside its ``with`` block, and restores them on exit, even on an
exception. Nothing process-wide is ever changed; a new thread starts from the defaults.

The knobs choose between data-movement paths that give identical results (see ``docs/kernels.md``);
they trade speed and peak memory, never correctness. Each default cites the measurement behind it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

__all__ = ["Settings", "get_settings", "use_settings"]


@dataclasses.dataclass(frozen=True)
class Settings:
    """How ``torch_impl`` moves data (identical results whatever the values)."""

    #: Mean elements per row (values per row times the trailing size) from which CPU row copies (one
    #: contiguous copy per row, on the calling thread) are used instead of element indices. Measured on
    #: 2 cores, B=1024, M=16, float32, fresh heap pages each call, with row copies as NumPy byte slices
    #: (`python -m rebatch.bench.crossover --lengths 16 32 64 128 256 512 1024`, torch 2.13): quiet,
    #: indices/rows 0.94 at 32 elements, 1.04 at 64, 1.11-1.15 from 128; with two busy processes,
    #: 0.97 at 32, 1.21 at 64. Row copies never go parallel, so they also hold under contention,
    #: where the element-index kernels (OpenMP) collapsed at large outputs (0.13x the per-row baseline
    #: at B=4096, L=512, M=1, when this was 1024). 0 forces row copies wherever they apply;
    #: ``math.inf`` never.
    row_copy_min_elements: float = 64
    #: The element-index path's destination buffer (int64, one per value) is built for at most this
    #: fraction of the output's bytes at a time, so its peak memory stays near the output's (measured:
    #: peak at most 1.07x the output on the standard grid; chunks add no measurable time from 1/16).
    index_bytes_fraction: float = 1 / 16
    #: ... but never fewer values per chunk than this (small outputs take one chunk per micro-batch).
    index_min_chunk: int = 2**16

    def __post_init__(self) -> None:
        if not self.row_copy_min_elements >= 0:
            raise ValueError(f"row_copy_min_elements must be >= 0, got {self.row_copy_min_elements}")
        if not self.index_bytes_fraction >= 0:
            raise ValueError(f"index_bytes_fraction must be >= 0, got {self.index_bytes_fraction}")
        if self.index_min_chunk < 1:
            raise ValueError(f"index_min_chunk must be >= 1, got {self.index_min_chunk}")


_current: ContextVar[Settings] = ContextVar("torch_impl_settings", default=Settings())  # noqa: B039 (frozen)


def get_settings() -> Settings:
    """The settings in force for the calling thread (or task)."""
    return _current.get()


@contextlib.contextmanager
def use_settings(**changes: Any) -> Iterator[Settings]:
    """Within the block, the calling thread's settings with ``changes`` applied (names of `Settings`)::

    with torch_impl.use_settings(row_copy_min_elements=math.inf):  # element indices only
        torch_impl.postprocess_batch_func(output_lst, indices, data)
    """
    token = _current.set(dataclasses.replace(_current.get(), **changes))
    try:
        yield _current.get()
    finally:
        _current.reset(token)
