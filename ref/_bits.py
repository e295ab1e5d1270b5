"""Exact data movement: floats are moved as the unsigned integers of their bit patterns.

XLA may canonicalise NaNs when it moves some float types (seen: bfloat16 ``concatenate`` on CPU), so
``ref`` reinterprets float data as same-width unsigned integers before any gather or concatenation and
reinterprets back afterwards: every bit, NaN payloads included, arrives unchanged. A custom VJP keeps
the move differentiable: its cotangent is the ordinary transpose of the same move.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from .dtypes import bits_dtype

__all__ = ["move"]


Mover = Callable[..., jax.Array]


def _on_bits(fn: Mover, arrays: Sequence[jax.Array], *args: Any) -> jax.Array:
    dtype = arrays[0].dtype
    as_int = getattr(jnp, bits_dtype(jnp.dtype(dtype).itemsize, dtype=dtype))
    moved = fn([jax.lax.bitcast_convert_type(a, as_int) for a in arrays], *args)
    return jax.lax.bitcast_convert_type(moved, dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _exact_float_move(fn: Mover, arrays: Sequence[jax.Array], *args: Any) -> jax.Array:
    return _on_bits(fn, arrays, *args)


def _fwd(fn: Mover, arrays: Sequence[jax.Array], *args: Any) -> tuple[jax.Array, Any]:
    return _on_bits(fn, arrays, *args), (arrays, args)


def _bwd(fn: Mover, residual: Any, cotangent: jax.Array) -> tuple[Any, ...]:
    arrays, args = residual
    with jax.enable_x64(True):  # the backward pass runs outside the forward's scoped 64-bit context
        _, transpose = jax.vjp(lambda xs: fn(xs, *args), arrays)
        (grads,) = transpose(cotangent)
    return (grads, *(None for _ in args))


_exact_float_move.defvjp(_fwd, _bwd)


def move(fn: Mover, arrays: Sequence[jax.Array], *args: Any) -> jax.Array:
    """``fn(arrays, *args)``, bit-exact: for floats it runs on the bit patterns (differentiable in ``arrays``).

    ``fn`` must be a module-level function that only moves data (gather, concatenate, index) and takes
    its index arrays as ``args``; all ``arrays`` share one dtype.
    """
    if not jnp.issubdtype(arrays[0].dtype, jnp.floating):
        return fn(list(arrays), *args)
    return _exact_float_move(fn, list(arrays), *args)


def concatenate(arrays: Sequence[jax.Array]) -> jax.Array:
    """Rows of ``arrays`` one after another (axis 0)."""
    return jnp.concatenate(arrays, axis=0)


def gather(arrays: Sequence[jax.Array], index: jax.Array) -> jax.Array:
    """``arrays[0][index]`` along axis 0."""
    return arrays[0][index]
