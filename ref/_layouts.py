"""The packed and padded layouts: `from_packed`, `to_packed`, `to_padded`, `from_padded`.

Packed: values ``[N, *F]`` with per-row lengths ``[B]`` (or ``cu_seqlens``, the offsets); padded:
``[B, max_len, *F]``, each row right-padded. The lengths' rule is `ref.structure.check_lengths`, shared
with ``torch_impl``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._bits import concatenate, gather, move
from ._jagged import Jagged, is_concrete
from ._parts import Part, check_parts
from ._x64 import exact
from .dtypes import check_dtype
from .errors import ShapeMismatchError, UnsupportedSettingError
from .structure import check_lengths, check_max_len, check_pad_value

__all__ = ["from_packed", "from_padded", "to_packed", "to_padded"]


def _host_lengths(lengths: Any, name: str, **rule: Any) -> list[int]:
    """``lengths`` checked by `check_lengths` (they must be concrete: they give the result's sizes)."""
    if not is_concrete(lengths):
        raise UnsupportedSettingError(
            f"under jax.jit, {name} needs concrete lengths (they set the result's shape)"
        )
    if hasattr(lengths, "dtype") and not isinstance(lengths, np.ndarray):
        lengths = np.asarray(lengths)
    return check_lengths(lengths, **rule)


def _jagged(x: Part, name: str) -> Jagged:
    (x,) = check_parts([x])
    if not isinstance(x, Jagged):
        raise ShapeMismatchError(
            f"{name} needs jagged data [B, (j), *F], got a dense array of shape {tuple(x.shape)}"
        )
    return x


@exact
def from_packed(values: Any, lengths: Any = None, *, cu_seqlens: Any = None) -> Jagged:
    """Packed rows as jagged ``[B, (j), *F]``: ``values`` ``[N, *F]`` cut by ``lengths`` ``[B]`` (or by
    ``cu_seqlens`` ``[B + 1]``, validated as offsets). A fresh `Jagged`.

    ``rows(out) == [values[sum(lengths[:i]):sum(lengths[:i + 1])] for i in range(len(lengths))]``

    >>> values, lengths = jnp.arange(5), [2, 0, 3]
    >>> [r.tolist() for r in from_packed(values, lengths).rows()] == [
    ...     values[sum(lengths[:i]) : sum(lengths[:i + 1])].tolist() for i in range(len(lengths))]
    True
    """
    if (lengths is None) == (cu_seqlens is None):
        raise UnsupportedSettingError("from_packed needs exactly one of lengths and cu_seqlens")
    values = jnp.asarray(values)
    if values.ndim < 1:
        raise ShapeMismatchError(f"packed values need a leading dimension, got shape {tuple(values.shape)}")
    check_dtype(values.dtype)  # the one dtype rule, as every other function applies it (`check_parts`)
    if cu_seqlens is not None:
        return Jagged(values, cu_seqlens)
    host = _host_lengths(lengths, "from_packed", total=int(values.shape[0]))
    return Jagged.from_lengths(values, np.asarray(host, dtype=np.int64))


@exact
def to_packed(x: Part) -> tuple[jax.Array, jax.Array]:
    """Jagged ``[B, (j), *F]`` as packed ``(values [N, *F], lengths [B] int64)``.

    ``list(values) == [v for r in rows(x) for v in r]`` and ``lengths == [len(r) for r in rows(x)]``

    >>> x = Jagged.from_rows([[1, 2], [], [3]])
    >>> values, lengths = to_packed(x)
    >>> values.tolist() == [v for r in x.rows() for v in r.tolist()]
    True
    >>> lengths.tolist() == [len(r) for r in x.rows()]
    True
    """
    x = _jagged(x, "to_packed")
    return x.values, jnp.diff(x.offsets.astype(jnp.int64))  # JAX arrays are immutable: no copy needed


@exact
def to_padded(x: Part, *, pad_value: bool | int | float = 0, max_len: int | None = None) -> jax.Array:
    """Jagged ``[B, (j), *F]`` right-padded to dense ``[B, max_len, *F]`` (``max_len``: the longest row by
    default, 0 without rows; static under ``jax.jit``).

    ``out[i] == list(rows(x)[i]) + [pad] * (max_len - len(rows(x)[i]))``, ``pad`` an entry of ``pad_value``

    >>> x = Jagged.from_rows([[1, 2], [], [3]])
    >>> rows, m = [r.tolist() for r in x.rows()], 2
    >>> to_padded(x, pad_value=-1).tolist() == [r + [-1] * (m - len(r)) for r in rows]
    True
    """
    x = _jagged(x, "to_padded")
    check_pad_value(pad_value, x.dtype)
    b, n = x.num_rows, int(x.values.shape[0])
    longest = None
    if is_concrete(x.offsets):
        lengths_np = np.diff(np.asarray(x.offsets).astype(np.int64))
        longest = int(lengths_np.max()) if b else 0
    if max_len is None:
        if longest is None:
            raise UnsupportedSettingError("under jax.jit, to_padded of traced offsets needs a static max_len")
        max_len = longest
    max_len = check_max_len(max_len, longest)
    offsets = x.offsets.astype(jnp.int64)
    j = jnp.arange(max_len, dtype=jnp.int64)
    inside = j[None, :] < jnp.diff(offsets)[:, None]  # [B, max_len]
    # Entry (i, j) is value offsets[i] + j inside row i, else the pad row appended after the N values.
    src = jnp.where(inside, offsets[:-1, None] + j[None, :], n).reshape(-1)
    pad = jnp.full((1, *x.feature_shape), pad_value, dtype=x.dtype)
    with_pad = move(concatenate, [x.values, pad])
    return move(gather, [with_pad], src).reshape(b, max_len, *x.feature_shape)


@exact
def from_padded(x: Any, lengths: Any) -> Jagged:
    """Dense ``[B, S, *F]`` rows cut to ``lengths`` ``[B]`` (each at most ``S``) as jagged ``[B, (j), *F]``.

    ``rows(out) == [x[i][:lengths[i]] for i in range(B)]``

    >>> x, lengths = jnp.asarray([[1, 2, 0], [0, 0, 0], [3, 0, 0]]), [2, 0, 1]
    >>> rows = from_padded(x, lengths).rows()
    >>> [r.tolist() for r in rows] == [x[i][: lengths[i]].tolist() for i in range(3)]
    True
    """
    (x,) = check_parts([x])
    if isinstance(x, Jagged) or x.ndim < 2:
        got = "jagged data" if isinstance(x, Jagged) else f"shape {tuple(x.shape)}"
        raise ShapeMismatchError(f"from_padded needs dense data [B, S, *F], got {got}")
    b, s = int(x.shape[0]), int(x.shape[1])
    host = _host_lengths(lengths, "from_padded", rows=b, limit=s)
    total = sum(host)
    lens = jnp.asarray(host, dtype=jnp.int64)
    offsets = jnp.concatenate([jnp.zeros((1,), jnp.int64), jnp.cumsum(lens)])
    # Value t of row i sits at i * S + (t - offsets[i]) of the flattened rows.
    shift = jnp.arange(b, dtype=jnp.int64) * s - offsets[:-1]
    src = jnp.arange(total, dtype=jnp.int64) + jnp.repeat(shift, lens, total_repeat_length=total)
    flat = x.reshape(b * s, *x.shape[2:])
    return Jagged.tree_unflatten(None, (move(gather, [flat], src), offsets))
