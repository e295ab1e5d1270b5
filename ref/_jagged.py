"""`Jagged`: a batch of variable-length rows as one values buffer and row offsets.

Layout ``[B, (j), *F]``: ``values`` has shape ``[N, *F]`` and ``offsets`` shape ``[B + 1]``; row ``i`` is
``values[offsets[i]:offsets[i + 1]]``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._x64 import exact
from .errors import InvalidJaggedError, where

__all__ = ["Jagged", "validate_jagged", "is_concrete"]


def is_concrete(x: Any) -> bool:
    """True when ``x`` holds values now (not a tracer inside ``jax.jit``)."""
    return not isinstance(x, jax.core.Tracer)


def validate_jagged(values: Any, offsets: Any, *, key: Any = None, micro_batch: int | None = None) -> None:
    """The one validator of the jagged invariants; raises `InvalidJaggedError` on the first broken one.

    1. ``values`` has at least one dimension (the packed ragged dimension ``N``);
    2. ``offsets`` is 1-D, of an integer dtype, with at least one entry;
    3. ``offsets[0] == 0``;
    4. ``offsets`` is non-decreasing;
    5. ``offsets[-1] == len(values)``.

    Invariants 3 to 5 read the offsets, so they are checked only when the offsets are concrete
    (under ``jax.jit`` they are tracers; the caller's un-traced inputs were checked when built).
    """
    at = where(key, micro_batch)
    if np.ndim(values) < 1:
        raise InvalidJaggedError(f"{at}values must have at least 1 dimension, got shape {np.shape(values)}")
    if np.ndim(offsets) != 1:
        raise InvalidJaggedError(f"{at}offsets must be 1-D, got shape {np.shape(offsets)}")
    dtype = np.dtype(offsets.dtype) if hasattr(offsets, "dtype") else np.asarray(offsets).dtype
    if not np.issubdtype(dtype, np.integer):
        raise InvalidJaggedError(f"{at}offsets must have an integer dtype, got {dtype}")
    if np.shape(offsets)[0] < 1:
        raise InvalidJaggedError(f"{at}offsets must have at least one entry (offsets[0] == 0), got none")
    if not is_concrete(offsets):
        return
    o = np.asarray(offsets).astype(np.int64)
    if o[0] != 0:
        raise InvalidJaggedError(f"{at}offsets[0] must be 0, got {o[0]}")
    steps = np.diff(o)
    if (steps < 0).any():
        i = int(np.argmax(steps < 0))
        raise InvalidJaggedError(
            f"{at}offsets must be non-decreasing, got offsets[{i}] = {o[i]} > offsets[{i + 1}] = {o[i + 1]}"
        )
    n = np.shape(values)[0]
    if o[-1] != n:
        raise InvalidJaggedError(f"{at}offsets[-1] must equal len(values) = {n}, got {o[-1]}")


@jax.tree_util.register_pytree_node_class
class Jagged:
    """An immutable JAX pytree of jagged rows ``[B, (j), *F]``.

    ``values``: ``[N, *F]``; ``offsets``: ``[B + 1]`` integers, validated on construction.
    ``rows() == [values[offsets[i]:offsets[i + 1]] for i in range(num_rows)]``.
    """

    __slots__ = ("offsets", "values")
    values: jax.Array
    offsets: jax.Array

    @exact
    def __init__(self, values: Any, offsets: Any, *, key: Any = None, micro_batch: int | None = None) -> None:
        values = jnp.asarray(values)
        offsets = jnp.asarray(offsets)
        validate_jagged(values, offsets, key=key, micro_batch=micro_batch)
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "offsets", offsets)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"Jagged is immutable: cannot set {name!r}")

    def tree_flatten(self) -> tuple[tuple[Any, Any], None]:
        return (self.values, self.offsets), None

    @classmethod
    def tree_unflatten(cls, aux: None, children: tuple[Any, Any]) -> Jagged:
        # JAX rebuilds pytrees with tracers or placeholders: no validation here.
        obj = object.__new__(cls)
        object.__setattr__(obj, "values", children[0])
        object.__setattr__(obj, "offsets", children[1])
        return obj

    @classmethod
    def from_rows(
        cls, rows: Sequence[Any], *, dtype: Any = None, feature_shape: tuple[int, ...] = ()
    ) -> Jagged:
        """``Jagged`` whose ``rows()`` are ``rows`` (each ``[len_i, *F]``, an array or a nested list).

        The dtype is ``dtype`` when given; otherwise the rows' common dtype by JAX's promotion, where an
        empty row never counts and a row given as a Python list takes JAX's default dtype for its values
        (int32 and float32 unless the caller enabled ``jax_enable_x64``); array rows keep theirs (int64 and
        float64 too). With no non-empty row it is JAX's default float dtype. ``feature_shape`` gives the
        trailing shape of a batch without non-empty rows; an empty row takes the others' trailing shape.

        >>> rows = [[1, 2], [], [3]]
        >>> x = Jagged.from_rows(rows)
        >>> [r.tolist() for r in x.rows()] == rows, str(x.dtype)
        (True, 'int32')
        """
        default_float = jnp.asarray(0.0).dtype  # JAX's default, in the caller's configuration
        arrays = []
        for i, r in enumerate(rows):
            try:
                a = np.asarray(r) if hasattr(r, "dtype") else np.asarray(jnp.asarray(r))
            except (TypeError, ValueError) as e:  # a ragged nested list, a string, ...
                raise InvalidJaggedError(f"row {i} is not an array of numbers: {e}") from None
            if a.ndim == 0:
                raise InvalidJaggedError(f"row {i} must have at least 1 dimension, got a scalar")
            arrays.append(a)
        filled = [a for a in arrays if a.size or a.ndim > 1]
        with jax.enable_x64(True):
            if dtype is None:
                dtype = (
                    functools.reduce(jnp.promote_types, [a.dtype for a in filled])
                    if filled
                    else default_float
                )
            dtype = jnp.dtype(dtype)
            if filled:
                feature_shape = tuple(filled[0].shape[1:])
            for i, a in enumerate(arrays):
                if (a.size or a.ndim > 1) and a.shape[1:] != feature_shape:
                    raise InvalidJaggedError(
                        f"row {i} has trailing shape {a.shape[1:]}, unlike the first non-empty row's "
                        f"{feature_shape}"
                    )
            pieces = [a.reshape(0, *feature_shape) if not (a.size or a.ndim > 1) else a for a in arrays]
            values = (
                np.concatenate([a.astype(dtype, copy=False) for a in pieces], axis=0)
                if pieces
                else np.zeros((0, *feature_shape), dtype=dtype)
            )
            return cls.from_lengths(jnp.asarray(values), [a.shape[0] for a in pieces])

    @classmethod
    @exact
    def from_lengths(cls, values: Any, lengths: Any) -> Jagged:
        """``Jagged`` with ``offsets = [0, l0, l0 + l1, ...]``: row ``i`` has ``lengths[i]`` entries."""
        lengths = jnp.asarray(lengths, dtype=jnp.int64).reshape(-1)
        offsets = jnp.concatenate([jnp.zeros((1,), jnp.int64), jnp.cumsum(lengths)])
        if is_concrete(lengths) and bool((lengths < 0).any()):
            i = int(np.argmax(np.asarray(lengths) < 0))
            raise InvalidJaggedError(
                f"row lengths must be non-negative, got lengths[{i}] = {int(lengths[i])}"
            )
        return cls(values, offsets)

    def map_values(self, fn: Callable[[jax.Array], Any]) -> Jagged:
        """The same rows with ``fn`` applied to the values: ``Jagged(fn(values), offsets)``, validated.

        Use it (not ``jax.tree_util.tree_map``, which maps the offsets too: ``tree_map(lambda a: a * 2, x)``
        doubles them) for elementwise work on jagged data. ``fn`` must keep the packed length ``N``.

        >>> x = Jagged.from_rows([[1, 2], [], [3]])
        >>> doubled = x.map_values(lambda v: v * 2)
        >>> [r.tolist() for r in doubled.rows()] == [[2 * a for a in r] for r in [[1, 2], [], [3]]]
        True
        """
        return Jagged(fn(self.values), self.offsets)

    @property
    def num_rows(self) -> int:
        """``B``, the number of rows (static, also under ``jax.jit``)."""
        return int(self.offsets.shape[0]) - 1

    @property
    def dtype(self) -> Any:
        return self.values.dtype

    @property
    def feature_shape(self) -> tuple[int, ...]:
        """``F``, the trailing shape of every row."""
        return tuple(self.values.shape[1:])

    @exact
    def lengths(self) -> jax.Array:
        """``[B]``: ``[offsets[i + 1] - offsets[i] for i in range(B)]``."""
        return jnp.diff(self.offsets)

    @exact
    def rows(self) -> list[jax.Array]:
        """``[values[offsets[i]:offsets[i + 1]] for i in range(B)]`` (needs concrete offsets)."""
        o = np.asarray(self.offsets)
        return [self.values[int(o[i]) : int(o[i + 1])] for i in range(self.num_rows)]

    def __repr__(self) -> str:
        return (
            f"Jagged(num_rows={self.num_rows}, values={self.values.dtype}{list(self.values.shape)}, "
            f"offsets={self.offsets.dtype}[{self.offsets.shape[0]}])"
        )
