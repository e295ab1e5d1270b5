"""Exact data movement: floats are moved as the unsigned integers of their bit patterns.

XLA may canonicalise NaNs when it moves some float types (seen: bfloat16 ``concatenate`` on CPU), so
``ref`` reinterprets float data as same-width unsigned integers before any gather or concatenation and
reinterprets back afterwards: every bit, NaN payloads included, arrives unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp

__all__ = ["move"]

_UINT = {2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}


def move(fn: Callable[..., jax.Array], arrays: Sequence[jax.Array], *args: object) -> jax.Array:
    """``fn(arrays, *args)`` computed on the arrays' bit patterns, with the result of their dtype.

    ``fn`` may only move data (gather, concatenate, index); all ``arrays`` share one dtype.
    """
    dtype = arrays[0].dtype
    if not jnp.issubdtype(dtype, jnp.floating):
        return fn(arrays, *args)
    uint = _UINT[jnp.dtype(dtype).itemsize]
    moved = fn([jax.lax.bitcast_convert_type(a, uint) for a in arrays], *args)
    return jax.lax.bitcast_convert_type(moved, dtype)
