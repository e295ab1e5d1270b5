"""`take`: rows picked by index."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from ._bits import gather, move
from ._jagged import Jagged, is_concrete
from ._parts import Part, check_parts, num_rows
from ._x64 import exact
from .errors import RowIndexError, UnsupportedSettingError

__all__ = ["take"]


def _checked_rows(rows: Any, n: int) -> Any:
    """``rows`` as a 1-D int64 array, each entry an integer in ``range(n)`` (`RowIndexError`)."""
    if not is_concrete(rows):
        return jnp.asarray(rows).reshape(-1).astype(jnp.int64)
    arr = np.asarray(rows)
    if arr.ndim != 1:
        raise RowIndexError(f"rows must be 1-D, got shape {arr.shape}")
    if arr.size and (arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer)):
        raise RowIndexError(f"rows must be integers, got dtype {arr.dtype}")
    for j, i in enumerate(arr.tolist()):
        if not 0 <= i < n:
            raise RowIndexError(f"position {j}: row index {i} is out of range for {n} rows (no wrap-around)")
    return jnp.asarray(arr.astype(np.int64))


@exact
def take(x: Part, rows: Any) -> Part:
    """``out = [x.rows()[i] for i in rows]`` (jagged) or ``x[rows]`` (dense).

    ``x``: `Jagged` ``[B, (j), *F]`` or dense ``[B, *F]``; ``rows``: ``[R]`` integers in ``range(B)``
    (checked when concrete: `RowIndexError`; no wrap-around of negative indices).
    Returns ``[R, (j), *F]`` or ``[R, *F]``.

    Under ``jax.jit`` the size of a jagged result must be static: it is computed from concrete
    offsets, or, when the offsets or ``rows`` are traced, ``rows`` must be a permutation of
    ``range(B)`` (checked if concrete, trusted if traced) so that the result has ``N`` values.
    """
    (x,) = check_parts([x])
    b = num_rows(x)
    idx = _checked_rows(rows, b)
    if not isinstance(x, Jagged):
        return move(gather, [x], idx)
    lengths = jnp.diff(x.offsets).astype(jnp.int64)
    new_lengths = lengths[idx]
    new_offsets = jnp.concatenate([jnp.zeros((1,), jnp.int64), jnp.cumsum(new_lengths)])
    if is_concrete(x.offsets) and is_concrete(idx):
        total = int(new_offsets[-1])
    elif idx.shape[0] == b and (not is_concrete(idx) or sorted(np.asarray(idx).tolist()) == list(range(b))):
        total = int(x.values.shape[0])
    else:
        raise UnsupportedSettingError(
            "under jax.jit, take on jagged data with traced offsets needs rows that are a permutation"
        )
    # Output value t lies in output row r = the last row starting at or before t (zero-length rows
    # share their start with the next row, so 'right' skips them); it is copied from the same place
    # in source row idx[r].
    t = jnp.arange(total, dtype=jnp.int64)
    r = jnp.searchsorted(new_offsets, t, side="right") - 1
    src = x.offsets.astype(jnp.int64)[idx[r]] + (t - new_offsets[r])
    return Jagged.tree_unflatten(None, (move(gather, [x.values], src), new_offsets))
