"""Counting the torch operations a call dispatches (for tests that prove work does not grow with rows)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["CountOps"]


class CountOps(TorchDispatchMode):
    """``with CountOps() as c: ...`` then ``c.ops`` maps each ATen operation's name to its number of calls."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))
