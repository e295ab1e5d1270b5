"""The host kernels: a CPU key's rows written to their places by NumPy fancy assignments, on the calling
thread.

NumPy on the tensors' own memory costs a fraction of torch's dispatch and opens no parallel region
(``docs/kernels.md``, "The host kernels"). Values move as unsigned integers or raw bytes of a value
row's width: every dtype bit for bit. Only for plain contiguous CPU tensors with no gradient to carry
(`host_movable`); the kernels validate nothing.
"""

from __future__ import annotations

import collections
import itertools
import math
import operator
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ._indexcopy import index_chunk
from ._jagged import host_offsets
from ._parts import Part, numpy_bridge
from ._plan import KeyPlan

__all__ = ["copy_rows", "host_movable", "scatter_rows", "scatter_values"]

#: torch dtypes whose ``Tensor.numpy()`` works (the others, bfloat16 and float8 among them, are read
#: through a ``uint8`` view first).
_REAL = ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64")
_NUMPY_DTYPES = frozenset(getattr(torch, name) for name in (*_REAL, "complex64", "complex128"))


def host_movable(parts: Sequence[Part]) -> bool:
    """Values NumPy may move: CPU plain tensors, contiguous, and no gradient to carry."""
    grad = torch.is_grad_enabled()
    return numpy_bridge() and all(
        type(p.values) is torch.Tensor
        and p.values.is_cpu
        and not (grad and p.values.requires_grad)
        and p.values.is_contiguous()
        for p in parts
    )


def _bytes(x: torch.Tensor) -> np.ndarray:
    """A contiguous CPU tensor's elements as a 1-D NumPy array of bytes (shared, not copied)."""
    if not x.requires_grad and x.dtype in _NUMPY_DTYPES:
        return x.numpy().reshape(-1).view(np.uint8)
    return x.detach().reshape(-1).view(torch.uint8).numpy()


def _value_rows(x: torch.Tensor, raw: np.ndarray | None = None) -> np.ndarray:
    """A contiguous CPU tensor ``[N, *F]`` as a 1-D NumPy array of ``N`` elements, each one value row's
    bytes (an unsigned integer of its width, or raw bytes), shared; ``raw``: bytes to read so instead
    (tensors shaped as ``x`` laid end to end)."""
    row_bytes = x.element_size() * math.prod(x.shape[1:])
    kind = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}.get(row_bytes)
    return (_bytes(x) if raw is None else raw).view(
        kind if kind is not None else np.dtype((np.void, row_bytes))
    )


def _output(plan: KeyPlan) -> torch.Tensor:
    """The fresh result of ``plan``'s key: ``[total, *F]``, the parts' dtype and device (torch's own
    memory: a NumPy array's was measured and retired, ``docs/kernels.md``, "The result's memory")."""
    first = plan.parts[0].values
    return first.new_empty((plan.total, *first.shape[1:]))


def scatter_values(plan: KeyPlan) -> torch.Tensor:
    """A jagged key's result values ``[N, *F]``: row ``k`` of its parts' rows end to end written at
    output row ``perm[k]`` (which starts at ``offsets[perm[k]]``). A key of at most
    one chunk (`torch_impl._indexcopy.index_chunk`) is laid end to end first and gathered at once (a constant
    number of operations whatever M); a larger one is scattered part by part, that many value rows
    at a time (the index buffer stays that small: int64 per value row)."""
    parts, total, first = plan.parts, plan.total, plan.parts[0].values
    out = _output(plan)
    if out.numel() == 0:
        return out
    assert plan.arrays is not None, "rebatch internal error: a host kernel given a key planned off the host"
    dest = _value_rows(out)
    perm, inv = plan.rows.host()
    lengths, restored, offsets = plan.arrays
    chunk = index_chunk(first)
    if total <= chunk:
        src = _value_rows(
            first, np.concatenate([_bytes(p.values) for p in parts]) if len(parts) > 1 else None
        )
        starts = host_offsets(lengths)[:-1]
        where = (starts[inv] - offsets[:-1]).repeat(restored)
        where += np.arange(total, dtype=np.int64)
        np.take(src, where, out=dest)
        return out
    dest_starts = offsets[perm]
    row = 0
    for p in parts:
        n, r = p.values.shape[0], p.rows
        if n:
            local = p.offsets.numpy()  # type: ignore[union-attr]  # jagged parts
            shift = dest_starts[row : row + r] - local[:-1]
            src = _value_rows(p.values)
            for a in range(0, n, chunk):
                b = min(n, a + chunk)
                r0 = int(np.searchsorted(local, a, "right")) - 1
                r1 = int(np.searchsorted(local, b, "left"))
                counts = np.minimum(local[r0 + 1 : r1 + 1], b) - np.maximum(local[r0:r1], a)
                where = shift[r0:r1].repeat(counts)
                where += np.arange(a, b, dtype=np.int64)
                _scatter(dest, where, src[a:b])
        row += r
    return out


def copy_rows(plan: KeyPlan) -> torch.Tensor:
    """A jagged key's result values ``[N, *F]``, each row one NumPy slice assignment of its bytes (the
    loops over rows run in C: ``map``), for rows long enough that a copy a row beats a destination a
    value row. NumPy checks every slice against its array: a wrong plan raises, it cannot write
    outside the output."""
    parts, out = plan.parts, _output(plan)
    if out.numel() == 0:
        return out
    width = out.element_size() * math.prod(out.shape[1:])
    assert plan.arrays is not None, "rebatch internal error: a host kernel given a key planned off the host"
    perm, (lengths, _, offsets) = plan.rows.host()[0], plan.arrays
    of_row = np.arange(len(parts)).repeat([p.rows for p in parts])
    # each row's start in its part (concatenation order): its start among all rows less its part's first
    starts = host_offsets(lengths)[:-1]
    starts -= np.array(list(itertools.accumulate((p.values.shape[0] for p in parts[:-1]), initial=0)))[of_row]
    targets = offsets[:-1][perm] * width  # row k of the concatenation goes to output row perm[k]
    part_of_row = of_row.tolist()
    src = (starts * width).tolist()
    dst = targets.tolist()
    n = (lengths * width).tolist()
    whole = [_bytes(p.values) for p in parts]
    # typed Any: NumPy's overloads of ``ndarray[slice]`` defeat ``map``'s inference
    get: Any = operator.getitem
    put: Any = operator.setitem
    pieces = map(get, map(whole.__getitem__, part_of_row), map(slice, src, map(operator.add, src, n)))
    into = map(slice, dst, map(operator.add, dst, n))
    collections.deque(map(put, itertools.repeat(_bytes(out)), into, pieces), maxlen=0)
    return out


def scatter_rows(plan: KeyPlan) -> torch.Tensor:
    """A dense key's result ``[B, *F]``: row ``k`` of its parts' values laid end to end written at row
    ``perm[k]``, one NumPy fancy assignment of whole rows per part."""
    out = _output(plan)
    if out.numel() == 0:
        return out
    dest, row = _value_rows(out), 0
    perm = plan.rows.host()[0]
    for p in plan.parts:
        n = p.values.shape[0]
        if n:
            dest[perm[row : row + n]] = _value_rows(p.values)
        row += n
    return out


def _scatter(dest: np.ndarray, where: np.ndarray, src: np.ndarray) -> None:
    """``dest[where] = src``: one chunk of `scatter_values`."""
    dest[where] = src
