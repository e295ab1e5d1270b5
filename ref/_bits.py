"""Exact data movement: floats are moved as the unsigned integers of their bit patterns.

XLA may canonicalise NaNs when it moves some float types (seen: bfloat16 ``concatenate`` on CPU), so
``ref`` reinterprets float data as same-width unsigned integers before any gather or concatenation and
reinterprets back afterwards: every bit, NaN payloads included, arrives unchanged. A custom JVP keeps
the move differentiable in both modes: its tangent is the same move applied to the tangents (``jvp``,
``jacfwd``), and JAX transposes that linear move for reverse mode (``vjp``, ``grad``, ``jacrev``).
One exception: float64 data of a caller without ``jax_enable_x64`` (possible only because ``ref`` makes
64-bit data in its own scope) takes a custom VJP, whose backward pass runs in a 64-bit scope; forward
mode there needs the caller's ``jax_enable_x64``, as any float64 ``jacfwd`` in JAX does.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from ._x64 import caller_x64
from .dtypes import bits_dtype

__all__ = ["move"]


Mover = Callable[..., jax.Array]


def _on_bits(fn: Mover, arrays: Sequence[jax.Array], *args: Any) -> jax.Array:
    dtype = arrays[0].dtype
    as_int = getattr(jnp, bits_dtype(jnp.dtype(dtype).itemsize, dtype=dtype))
    moved = fn([jax.lax.bitcast_convert_type(a, as_int) for a in arrays], *args)
    return jax.lax.bitcast_convert_type(moved, dtype)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _exact_float_move(fn: Mover, arrays: Sequence[jax.Array], *args: Any) -> jax.Array:
    return _on_bits(fn, arrays, *args)


@_exact_float_move.defjvp
def _jvp(fn: Mover, primals: tuple[Any, ...], tangents: tuple[Any, ...]) -> tuple[jax.Array, jax.Array]:
    # The primal moves bits (exact); the tangent is the same move of the tangents: ``fn`` only moves
    # data, so it is linear, and JAX transposes it for reverse mode (vjp, grad) as well.
    arrays, *args = primals
    tangent_arrays = tangents[0]
    return _on_bits(fn, arrays, *args), fn(list(tangent_arrays), *args)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _exact_float_move_rev(fn: Mover, arrays: Sequence[jax.Array], *args: Any) -> jax.Array:
    return _on_bits(fn, arrays, *args)


def _fwd(fn: Mover, arrays: Sequence[jax.Array], *args: Any) -> tuple[jax.Array, Any]:
    return _on_bits(fn, arrays, *args), (arrays, args)


def _bwd(fn: Mover, residual: Any, cotangent: jax.Array) -> tuple[Any, ...]:
    arrays, args = residual
    with jax.enable_x64(True):  # the backward pass runs outside the forward's scoped 64-bit context
        _, transpose = jax.vjp(lambda xs: fn(xs, *args), arrays)
        (grads,) = transpose(cotangent)
    return (grads, *(None for _ in args))


_exact_float_move_rev.defvjp(_fwd, _bwd)


def move(fn: Mover, arrays: Sequence[jax.Array], *args: Any) -> jax.Array:
    """``fn(arrays, *args)``, bit-exact: floats move as their bit patterns (differentiable in ``arrays``).

    ``fn`` must be a module-level function that only moves data (gather, concatenate, index) and takes
    its index arrays as ``args``; all ``arrays`` share one dtype.
    """
    dtype = jnp.dtype(arrays[0].dtype)
    if not jnp.issubdtype(dtype, jnp.floating):
        return fn(list(arrays), *args)
    if dtype.itemsize == 8 and not caller_x64():
        # float64 for a caller without 64-bit types: JAX's own transpose (reverse mode) would build
        # float64 zeros in the caller's 32-bit configuration, so reverse mode uses a custom VJP whose
        # backward runs in a 64-bit scope; forward mode (jvp, jacfwd) of float64 needs the caller's
        # jax_enable_x64, as it does everywhere in JAX.
        return _exact_float_move_rev(fn, list(arrays), *args)
    return _exact_float_move(fn, list(arrays), *args)


def concatenate(arrays: Sequence[jax.Array]) -> jax.Array:
    """Rows of ``arrays`` one after another (axis 0)."""
    return jnp.concatenate(arrays, axis=0)


def gather(arrays: Sequence[jax.Array], index: jax.Array) -> jax.Array:
    """``arrays[0][index]`` along axis 0, for an ``index`` already checked to lie in
    ``range(len(arrays[0]))``.

    One ``lax.gather`` that promises in-bounds indices: no wrap-around of negative indices and no
    clamping (both would hide a bad index), nothing spent on either.
    """
    a = arrays[0]
    dims = jax.lax.GatherDimensionNumbers(
        offset_dims=tuple(range(1, a.ndim)), collapsed_slice_dims=(0,), start_index_map=(0,)
    )
    return jax.lax.gather(
        a,
        index[:, None],
        dims,
        slice_sizes=(1, *a.shape[1:]),
        mode=jax.lax.GatherScatterMode.PROMISE_IN_BOUNDS,
    )
