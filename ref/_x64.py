"""Exact 64-bit data in the reference, without touching the caller's JAX configuration.

JAX truncates int64 and float64 to 32 bits unless ``jax_enable_x64`` is on. Every public function of
``ref`` runs its body under the scoped ``jax.enable_x64(True)`` context, which is restored on exit, so
64-bit inputs stay 64-bit and the caller's global setting is never changed.
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import jax

P = ParamSpec("P")
R = TypeVar("R")


#: The caller's ``jax_enable_x64``, recorded by the outermost `exact` call (None outside any).
_CALLER_X64: contextvars.ContextVar[bool | None] = contextvars.ContextVar("rebatch_caller_x64", default=None)


def caller_x64() -> bool:
    """Whether the code that called ``ref`` has 64-bit types on (its own setting, not ``ref``'s scope)."""
    recorded = _CALLER_X64.get()
    return bool(jax.config.read("jax_enable_x64")) if recorded is None else recorded


def exact(fn: Callable[P, R]) -> Callable[P, R]:
    """Decorate ``fn`` so its body runs with 64-bit types enabled (scoped, thread-local)."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        token = _CALLER_X64.set(caller_x64())
        try:
            with jax.enable_x64(True):
                return fn(*args, **kwargs)
        finally:
            _CALLER_X64.reset(token)

    return wrapper
