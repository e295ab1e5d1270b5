"""`take`: rows picked by index."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._bits import gather, move
from ._checked import check_in_range, check_is_permutation, traced_indices
from ._jagged import Jagged, is_concrete
from ._parts import Part, check_parts, num_rows
from ._x64 import exact
from .errors import RowIndexError, UnsupportedSettingError

__all__ = ["take"]


def _checked_rows(rows: Any, n: int) -> Any:
    """``rows`` as a 1-D int64 array, each entry an integer in ``range(n)`` (`RowIndexError`).

    Concrete rows are checked here; traced rows have their dtype and rank checked now and their
    values in the compiled program (``checkify``; see `ref.checked`).
    """
    if not is_concrete(rows):
        idx = traced_indices(rows, RowIndexError, "rows")
        check_in_range(idx, n, RowIndexError)
        return idx
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
    (`RowIndexError`; no wrap-around of negative indices). Returns ``[R, (j), *F]`` or ``[R, *F]``,
    jagged offsets int64.

    Under ``jax.jit`` the size of a jagged result must be static: it is computed from concrete
    offsets, or, when the offsets or ``rows`` are traced, ``rows`` must be a permutation of
    ``range(B)`` so that the result has ``N`` values. Concrete ``rows`` are checked in Python; traced
    ``rows`` have their dtype and rank checked at trace time and their values in the compiled
    program by ``checkify`` (range, and for jagged data no index twice): call through `ref.checked`.

    >>> x = Jagged.from_rows([[1, 2], [3], [], [4, 5, 6]])
    >>> rows = [3, 0, 2, 1]
    >>> rows_of = lambda y: [r.tolist() for r in y.rows()]
    >>> rows_of(take(x, rows)) == [rows_of(x)[i] for i in rows]
    True
    """
    (x,) = check_parts([x])
    b = num_rows(x)
    concrete_rows = is_concrete(rows)
    idx = _checked_rows(rows, b)
    if not isinstance(x, Jagged):
        return take_checked(x, idx)
    if is_concrete(x.offsets) and concrete_rows:
        lengths = np.diff(np.asarray(x.offsets).astype(np.int64))
        return take_checked(x, idx, total=int(lengths[np.asarray(rows, dtype=np.int64)].sum()))
    if idx.shape[0] != b:
        raise UnsupportedSettingError(
            f"under jax.jit, take on jagged data with traced offsets or rows needs a permutation of "
            f"range({b}) (a static result size), got {idx.shape[0]} rows"
        )
    if not concrete_rows:
        check_is_permutation(idx)
    elif sorted(np.asarray(rows).tolist()) != list(range(b)):
        raise UnsupportedSettingError(
            "under jax.jit, take on jagged data with traced offsets needs rows that are a permutation"
        )
    return take_checked(x, idx)


def take_checked(x: Part, idx: jax.Array, *, total: int | None = None) -> Part:
    """`take` of an ``idx`` already checked: int64, in range, and a permutation unless ``total``, the
    number of values of a jagged result, is given. No search over the values: each output row's shift
    (its source start minus its output start) is repeated over the row's values by ``jnp.repeat`` with
    a static total."""
    if not isinstance(x, Jagged):
        return move(gather, [x], idx)
    src_offsets = x.offsets.astype(jnp.int64)
    lengths = jnp.diff(src_offsets)[idx]
    new_offsets = jnp.concatenate([jnp.zeros((1,), jnp.int64), jnp.cumsum(lengths)])
    if total is None:  # a permutation (checked by the caller): as many values as the input
        total = int(x.values.shape[0])
    # Output value t of output row r comes from the same place in source row idx[r]:
    # src[t] = t + (offsets[idx[r]] - new_offsets[r]).
    shift = src_offsets[idx] - new_offsets[:-1]
    src = jnp.arange(total, dtype=jnp.int64) + jnp.repeat(shift, lengths, total_repeat_length=total)
    return Jagged.tree_unflatten(None, (move(gather, [x.values], src), new_offsets))
