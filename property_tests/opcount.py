"""Counting the torch operations a call dispatches (for tests that prove work does not grow with rows)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["CountOps"]


class CountOps(TorchDispatchMode):
    """``with CountOps() as c: ...`` then ``c.ops`` maps each ATen operation's name to its number of calls,
    and ``c.on_values`` counts only the calls whose first argument is a floating-point or complex
    tensor (the data moved, as opposed to int64 bookkeeping such as row lengths and offsets)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.on_values: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops[str(func)] += 1
        first = args[0] if args else None
        if isinstance(first, torch.Tensor) and (first.dtype.is_floating_point or first.dtype.is_complex):
            self.on_values[str(func)] += 1
        return func(*args, **(kwargs or {}))
