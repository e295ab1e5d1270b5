"""`concat`: micro-batch outputs joined along the batch dimension."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from ._bits import concatenate, move
from ._jagged import Jagged
from ._parts import Part, check_parts
from ._x64 import exact
from .errors import UnsupportedSettingError

__all__ = ["concat"]


@exact
def concat(parts: Sequence[Part], *, key: Any = None) -> Part:
    """``out = [row for p in parts for row in p.rows()]``: micro-batch order, then row order.

    ``parts``: `Jagged` ``[b_m, (j), *F]`` or dense ``[b_m, *F]``, all of one layout, dtype, device and
    trailing shape (checked by `check_parts`; ``key`` only names the output in error messages).
    Returns ``[sum(b_m), (j), *F]`` (jagged, offsets int64) or ``[sum(b_m), *F]`` (dense).

    >>> parts = [Jagged.from_rows([[1, 2], []]), Jagged.from_rows([[3], [4, 5]])]
    >>> rows_of = lambda y: [r.tolist() for r in y.rows()]
    >>> rows_of(concat(parts)) == [row for p in parts for row in rows_of(p)]
    True
    """
    checked = check_parts(parts, key)
    if not checked:
        raise UnsupportedSettingError("concat needs at least one part, got none")
    jagged = [p for p in checked if isinstance(p, Jagged)]
    if not jagged:  # all dense (check_parts: one layout)
        return move(concatenate, [p for p in checked if not isinstance(p, Jagged)])
    values = move(concatenate, [p.values for p in jagged])
    # Row boundaries of part m, shifted by the values of the parts before it (a static count).
    pieces: list[jax.Array] = [jnp.zeros((1,), jnp.int64)]
    base = 0
    for p in jagged:
        pieces.append(p.offsets[1:].astype(jnp.int64) + base)
        base += int(p.values.shape[0])
    offsets = jnp.concatenate(pieces)
    return Jagged.tree_unflatten(None, (values, offsets))
