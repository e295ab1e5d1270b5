"""Counting the torch operations a call dispatches (for tests that prove work does not grow with rows),
and an estimate of the bytes they move."""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch

from torch_impl.testing import TorchDispatchMode, tree_leaves

__all__ = ["CountOps"]


class CountOps(TorchDispatchMode):
    """``with CountOps() as c: ...`` then ``c.ops`` maps each ATen operation's name to its number of calls,
    and ``c.on_values`` counts only the calls whose first argument is a floating-point or complex
    tensor (the data moved, as opposed to int64 bookkeeping such as row lengths and offsets).

    ``c.bytes`` estimates the memory traffic: every operation that is not a view (nor an allocation,
    ``empty``) reads each tensor it is given and writes each tensor it returns that is not one of its
    arguments (an in-place result counts once), all in full (so a scatter into a large buffer counts
    the whole buffer, and an in-place running sum only once)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.on_values: Counter[str] = Counter()
        self.bytes = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops[str(func)] += 1
        first = args[0] if args else None
        if isinstance(first, torch.Tensor) and (first.dtype.is_floating_point or first.dtype.is_complex):
            self.on_values[str(func)] += 1
        out = func(*args, **(kwargs or {}))
        if not func.is_view and "empty" not in str(func):  # an empty tensor is allocated, not written
            given = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
            returned = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
            ids = {id(t) for t in given}
            self.bytes += sum(_nbytes(t) for t in given) + sum(
                _nbytes(t) for t in returned if id(t) not in ids
            )
        return out


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()
