"""Indices under ``jax.jit``: their dtype and rank checked at trace time, their values by ``checkify``.

A traced index array has no values when ``ref`` is traced, so its values are checked in the compiled
program with ``jax.experimental.checkify.check``: a negative, out-of-range or duplicated index is
reported, never wrapped, clamped or trusted. ``checkify`` checks must be functionalized, so a traced
index inside a plain ``jax.jit`` (or any staging of the program, ``jax.make_jaxpr``, ``lax.scan``, ...)
with no ``checkify.checkify`` around it raises `UnsupportedSettingError` when it is traced, naming
`checked`: wrap the function with `checked` (or ``jax.jit(checkify.checkify(fn))`` yourself) instead.
Concrete indices are checked eagerly in Python, as before.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

import jax
import jax.numpy as jnp
from jax.experimental import checkify

from .errors import (
    InvalidJaggedError,
    MisalignmentError,
    NotAPermutationError,
    RebatchError,
    RowIndexError,
    UnsupportedSettingError,
)

__all__ = ["checked", "traced_indices", "check_in_range", "check_is_permutation"]

P = ParamSpec("P")
R = TypeVar("R")

#: The error classes a traced check can report; the message starts with the class name.
_CLASSES: dict[str, type[RebatchError]] = {
    c.__name__: c for c in (NotAPermutationError, RowIndexError, InvalidJaggedError, MisalignmentError)
}
_SUFFIX = " (`check` failed)"


def traced_indices(indices: Any, error: type[RebatchError], what: str) -> jax.Array:
    """A traced index array, its dtype and rank checked now (at trace time): 1-D integers, as int64."""
    arr = jnp.asarray(indices)
    if arr.ndim != 1:
        raise error(f"{what} must be 1-D, got shape {tuple(arr.shape)}")
    if arr.dtype == jnp.bool_ or not jnp.issubdtype(arr.dtype, jnp.integer):
        raise error(f"{what} must be integers, got dtype {arr.dtype}")
    return arr.astype(jnp.int64)


def _staged_without_checkify() -> bool:
    """True when a check bound now would be staged into a program that no ``checkify.checkify`` will
    functionalize (a plain ``jax.jit``, ``jax.make_jaxpr``, ``lax.scan`` ... outside ``checkify``), so
    compiling it would fail with JAX's "Cannot abstractly evaluate a checkify.check which was not
    functionalized".

    Read from JAX's trace state, from the current trace out to the eager one: a staging trace
    (``DynamicJaxprTrace``) of ``checkify`` anywhere in the chain functionalizes every check within it
    (``jax.jit(checkify.checkify(fn))``, ``checkify.checkify(jax.jit(fn))``, ``vmap`` or ``grad``
    inside ``checked``); otherwise any staging trace means the check is not functionalized. Eager
    transforms alone (``vmap``, ``grad``) check eagerly, and under
    ``jax_experimental_unsafe_xla_runtime_errors`` JAX compiles checks as runtime errors: neither is
    refused. False whenever the state cannot be read as expected (another JAX): JAX's own error then.
    """
    if getattr(jax.config, "jax_experimental_unsafe_xla_runtime_errors", False):
        return False
    try:
        from jax._src import core
        from jax._src.interpreters.partial_eval import DynamicJaxprTrace

        trace: Any = core.trace_ctx.trace
        eager = core.EvalTrace
    except (ImportError, AttributeError):  # pragma: no cover - JAX's internals moved
        return False
    staged = False
    while hasattr(trace, "parent_trace"):
        if isinstance(trace, DynamicJaxprTrace):
            traced_for = getattr(
                getattr(getattr(trace, "frame", None), "debug_info", None), "traced_for", None
            )
            if not isinstance(traced_for, str) or traced_for == "checkify":
                return False  # functionalized, or a staging we cannot name
            staged = True
        trace = trace.parent_trace
    return staged and isinstance(trace, eager)


def _check(pred: jax.Array, message: str, **fmt: Any) -> None:
    """``checkify.check(pred, message, **fmt)``, or `UnsupportedSettingError` at trace time where the
    check could not be compiled (see `_staged_without_checkify`)."""
    if _staged_without_checkify():
        raise UnsupportedSettingError(
            "traced indices under a plain jax.jit (staged with no checkify.checkify around it) have their "
            "values checked in the compiled program by checkify, which must functionalize the function: "
            "call it through ref.checked(fn) (a bad index then raises its RebatchError) or "
            "jax.jit(checkify.checkify(fn)) yourself; concrete indices (a list or NumPy array closed over, "
            "or a static argument) are checked in Python instead"
        )
    checkify.check(pred, message, **fmt)


def _first(mask: jax.Array) -> jax.Array:
    """The first position where ``mask`` holds (``len(mask)`` if none). Not ``jnp.argmax``: its
    lowering builds an int64 iota outside ``ref``'s scoped 64-bit context."""
    n = mask.shape[0]
    return jnp.min(jnp.where(mask, jnp.arange(n, dtype=jnp.int64), n))


def _shown(v: jax.Array) -> jax.Array:
    """An index as shown in a message, int32 (saturated): ``checkify`` keeps its message arguments
    beside values made in the caller's configuration, where int64 may not exist."""
    return jnp.clip(v, -(2**31), 2**31 - 1).astype(jnp.int32)


def check_in_range(idx: jax.Array, n: int, error: type[RebatchError]) -> None:
    """In the compiled program: every ``idx[k]`` in ``range(n)`` (negative indices are not wrapped)."""
    if idx.shape[0] == 0:
        return
    bad = (idx < 0) | (idx >= n)
    k = jnp.minimum(_first(bad), idx.shape[0] - 1)
    _check(
        ~jnp.any(bad),
        f"{error.__name__}: position {{k}}: index {{i}} is out of range for {n} rows (no wrap-around)",
        k=_shown(k),
        i=_shown(idx[k]),
    )


def check_is_permutation(perm: jax.Array) -> None:
    """In the compiled program: ``perm`` is a permutation of ``range(len(perm))`` (`NotAPermutationError`).

    In range and no index twice: then, with as many indices as rows, none is missing either.
    """
    n = perm.shape[0]
    if n == 0:
        return
    check_in_range(perm, n, NotAPermutationError)
    pos = jnp.arange(n, dtype=jnp.int64)
    safe = jnp.clip(perm, 0, n - 1)
    first = jnp.full((n,), n, jnp.int64).at[safe].min(pos)  # the first position holding each index
    dup = first[safe] != pos
    k = jnp.minimum(_first(dup), n - 1)
    _check(
        ~jnp.any(dup),
        "NotAPermutationError: position {k}: index {i} duplicates position {j}",
        k=_shown(k),
        i=_shown(perm[k]),
        j=_shown(first[safe[k]]),
    )


def _as_rebatch_error(message: str) -> RebatchError:
    text = message.removesuffix(_SUFFIX)
    name, _, rest = text.partition(": ")
    return _CLASSES[name](rest)


def checked(fn: Callable[P, R], *, jit: bool = True) -> Callable[P, R]:
    """``fn`` with the traced index checks of ``ref`` on: a bad index raises its `RebatchError`.

    ``ref.checked(lambda x, perm: ref.restore(x, perm))`` is ``jax.jit(checkify.checkify(fn))`` (``jit=False``
    leaves out the ``jax.jit``), called, and a failed check raised as `NotAPermutationError` or
    `RowIndexError` with its message (position and index named); other ``checkify`` errors are raised
    by ``checkify`` itself. It compiles once per shape and dtype of the arguments, whatever their values.

    Like every function of ``ref``, ``fn`` is traced and checked under the scoped 64-bit context
    (``jax.enable_x64(True)``, restored on return): ``checkify`` interprets the traced program after
    ``ref``'s own functions return, and their int64 index arithmetic must still be there. To keep the
    error value instead (for example inside a larger ``checkify``-ed step), call
    ``checkify.checkify(fn, errors=checkify.user_checks)`` yourself, inside ``jax.enable_x64(True)``.
    """
    inner = checkify.checkify(fn, errors=checkify.user_checks)
    run_inner = jax.jit(inner) if jit else inner

    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        with jax.enable_x64(True):  # checkify interprets the traced program here: in ref's 64-bit scope
            err, out = run_inner(*args, **kwargs)
            message = err.get()
        if message is not None:
            name = message.partition(": ")[0]
            if name in _CLASSES:
                raise _as_rebatch_error(message)
            err.throw()
        return out

    return run
