"""The knobs that choose between ``torch_impl``'s kernels, in one immutable object, with a scoped override.

`use_settings` changes them for the calling thread (or asyncio task) only (a `contextvars.ContextVar`),
inside its ``with`` block: nothing process-wide. Every kernel gives the same result; the measurement
behind each default is in ``docs/kernels.md``, "Settings".
"""

from __future__ import annotations

import contextlib
import dataclasses
import numbers
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

__all__ = ["Settings", "get_settings", "use_settings"]


@dataclasses.dataclass(frozen=True)
class Settings:
    """Which kernel moves a key's data (identical results whatever the values)."""

    #: The kernel of `torch_impl._kernels.KERNELS` every key it serves takes (by name; where it cannot
    #: run, `UnsupportedSettingError`, never another kernel); None: each key takes the registry's
    #: choice. Tests and the benchmark harness force kernels with it.
    kernel: str | None = None
    #: True: every jagged key planned as on an accelerator (`torch_impl._devplan`), the CPU's too, where
    #: the default plans keys whose offsets are on the CPU with NumPy. The tests check the accelerator's
    #: plan on the CPU's values with it, and the benchmark harness measures that path here.
    plan_on_device: bool = False
    #: Output bytes each chunk of the index kernels covers (their int64 destinations are built a chunk
    #: at a time; on the CPU at most ``CPU_CHUNK_ROWS`` value rows): ``docs/kernels.md``, "Settings".
    index_chunk_bytes: int = 16 * 2**20
    #: Mean elements per row (values per row times the trailing size) from which a CPU jagged key that
    #: NumPy may move is copied a row at a time (``host_rows_copy``) rather than scattered by value rows
    #: (``docs/kernels.md``, "Settings"). ``math.inf``: never.
    cpu_row_copy_min_elements: float = 256
    #: Output elements from which a CPU dense key that NumPy may move is scattered by NumPy rather than
    #: torch's ``index_copy_`` (``docs/kernels.md``, "Settings"). ``math.inf``: never.
    cpu_dense_host_min_elements: float = 32768

    def __post_init__(self) -> None:
        if self.kernel is not None and not isinstance(self.kernel, str):
            raise ValueError(f"kernel must be a kernel's name or None, got {self.kernel!r}")
        if not isinstance(self.plan_on_device, bool):
            raise ValueError(f"plan_on_device must be a bool, got {self.plan_on_device!r}")
        for name, integer, least in _BOUNDS:  # in the fields' order: the first bad one is named
            value: Any = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int if integer else numbers.Real):
                raise ValueError(f"{name} must be {'an integer' if integer else 'a number'}, got {value!r}")
            if not float(value) >= least:
                raise ValueError(f"{name} must be >= {least}, got {value}")


#: Each numeric knob's bound, checked by `Settings.__post_init__`: (field, an integer?, least value).
_BOUNDS: tuple[tuple[str, bool, int], ...] = (
    ("index_chunk_bytes", True, 1),
    ("cpu_row_copy_min_elements", False, 0),
    ("cpu_dense_host_min_elements", False, 0),
)


_current: ContextVar[Settings] = ContextVar("torch_impl_settings", default=Settings())  # noqa: B039 (frozen)


def get_settings() -> Settings:
    """The settings in force for the calling thread (or task)."""
    return _current.get()


@contextlib.contextmanager
def use_settings(**changes: Any) -> Iterator[Settings]:
    """Within the block, the calling thread's settings with ``changes`` applied (names of `Settings`)::

    with torch_impl.use_settings(kernel="element_indices"):  # torch's index_copy_ on the CPU too
        torch_impl.postprocess_batch_func(output_lst, indices, data)
    """
    token = _current.set(dataclasses.replace(_current.get(), **changes))
    try:
        yield _current.get()
    finally:
        _current.reset(token)
