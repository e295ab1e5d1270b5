"""`CallRows`: what every key of one call shares, built once per call (and device).

Every key of a call has the same row counts and permutation, so what derives from them alone (the one
inverse, computed on the host; copies on the keys' device; the accelerator's plan's host layout) is
built once, on first use.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

import numpy as np
import torch

from ._parts import numpy_bridge
from ._permutation import invert, is_identity

__all__ = ["CallRows"]

T = TypeVar("T")


class CallRows:
    """``rows``: each micro-batch's row count; ``perm``: the checked permutation ``[B]`` (CPU int64), or
    None (the parts' rows are already in order: no dynamic batch size, or the identity)."""

    def __init__(self, rows: Sequence[int], perm: torch.Tensor | None) -> None:
        self.rows = list(rows)
        self.given = (
            perm.numpy() if perm is not None and numpy_bridge() else None
        )  # its NumPy view, read once
        self.perm: torch.Tensor | None = None if perm is None or is_identity(perm, self.given) else perm
        self._made: dict[tuple[Hashable, torch.device], Any] = {}
        self._inverse: torch.Tensor | None = None
        self._host: tuple[np.ndarray, np.ndarray] | None = None

    def inverse(self) -> torch.Tensor:
        """``inv[perm[k]] == k`` (CPU int64 ``[B]``): the one inverse of the call."""
        if self._inverse is None:
            assert self.perm is not None, "rebatch internal error: an inverse asked of rows in order"
            self._inverse = invert(self.perm, self.given)
        return self._inverse

    def host(self) -> tuple[np.ndarray, np.ndarray]:
        """The permutation and its inverse as NumPy arrays (views, no copy) for the host kernels."""
        if self._host is None:
            assert self.perm is not None, "rebatch internal error: no permutation on the host"
            self._host = self.perm.numpy() if self.given is None else self.given, self.inverse().numpy()
        return self._host

    def once(self, what: Hashable, device: torch.device, make: Callable[[], T]) -> T:
        """``make()``'s tensor, made once a call for ``(what, device)`` (a kernel's bookkeeping that
        depends only on the rows and a group's offsets: `torch_impl._plan.KeyPlan.group`)."""
        if (what, device) not in self._made:
            self._made[what, device] = make()
        return self._made[what, device]

    def perm_on(self, device: torch.device) -> torch.Tensor:
        """The permutation on ``device`` (a copy from the host, never a read of the device)."""
        assert self.perm is not None, "rebatch internal error: a permutation asked of rows in order"
        return self._on("perm", self.perm, device)

    def inverse_on(self, device: torch.device) -> torch.Tensor:
        """The inverse on ``device`` (copied from the host's)."""
        return self._on("inverse", self.inverse(), device)

    def _on(self, what: str, host: torch.Tensor, device: torch.device) -> torch.Tensor:
        if device.type == "cpu":
            return host
        return self.once(what, device, lambda: host.to(device, non_blocking=True))
