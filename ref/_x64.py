"""Exact 64-bit data in the reference, without touching the caller's JAX configuration.

JAX truncates int64 and float64 to 32 bits unless ``jax_enable_x64`` is on. Every public function of
``ref`` runs its body under the scoped ``jax.enable_x64(True)`` context, which is restored on exit, so
64-bit inputs stay 64-bit and the caller's global setting is never changed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import jax

P = ParamSpec("P")
R = TypeVar("R")


def exact(fn: Callable[P, R]) -> Callable[P, R]:
    """Decorate ``fn`` so its body runs with 64-bit types enabled (scoped, thread-local)."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with jax.enable_x64(True):
            return fn(*args, **kwargs)

    return wrapper
