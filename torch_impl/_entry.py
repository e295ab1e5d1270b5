"""`entry`: what every public operation of ``torch_impl`` does before its own work.

- Under ``torch.compile`` the whole call runs eagerly (``torch.compiler.disable``: one graph break, with
  any backend and ``fullgraph=False``). The call is data movement whose sizes are read on the host
  (row lengths, partitions), which a graph could hold only by specialising on every batch; tracing the
  checks would also break the graph at each of them.
- Under a ``torch.func`` transform (``grad``, ``vmap``, ``jacrev``, ...) it raises
  `UnsupportedSettingError`: the transforms wrap each tensor, and a jagged tensor's ragged size then
  differs between micro-batches that really agree, so valid input would look malformed. Ordinary
  autograd (``loss.backward()``, ``torch.autograd.grad``) is supported.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import torch

from ref._torch_private import functorch_level
from ref.errors import UnsupportedSettingError

__all__ = ["entry", "check_no_functorch"]

P = ParamSpec("P")
R = TypeVar("R")


def check_no_functorch(name: str) -> None:
    """`UnsupportedSettingError` if a ``torch.func`` transform is active on this thread."""
    if functorch_level() is not None:
        raise UnsupportedSettingError(
            f"{name} is not supported under a torch.func transform (grad, vmap, jacrev, ...): use "
            "ordinary autograd (loss.backward() or torch.autograd.grad), which reaches every micro-batch"
        )


def entry(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn`` run eagerly under ``torch.compile`` and refused under ``torch.func`` transforms."""

    @functools.wraps(fn)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        check_no_functorch(fn.__name__)
        return fn(*args, **kwargs)

    return torch.compiler.disable(call)
