"""`CallRows`: what every key of one call shares, built once per call and device.

Every key of a call has the same micro-batches' row counts (checked) and the same permutation, so the
tensors derived from them alone (the permutation on the keys' device, its inverse, `row_steps`) are
built on first use and kept for the other keys: a call's operations grow by a constant per key.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import torch

from ._parts import row_steps
from ._permutation import invert, is_identity

__all__ = ["CallRows", "HostRows"]


class HostRows(NamedTuple):
    """The host (NumPy) side of a call's rows, for CPU parts: ``part_of_row`` (``[B]``: each row's
    micro-batch, rows in concatenation order), ``steps`` (``[B]``: row ``r`` of part ``m`` is step
    ``r + m`` of the parts' offsets laid end to end, `row_steps`), ``bounds`` (``[2M]``: where each
    part's offsets begin there, then where each ends), ``perm``/``inv`` (``[B]``, or None without a
    permutation)."""

    part_of_row: np.ndarray
    steps: np.ndarray
    bounds: np.ndarray
    perm: np.ndarray | None
    inv: np.ndarray | None


class CallRows:
    """``rows``: each micro-batch's row count; ``perm``: the checked permutation ``[B]`` (CPU), or None."""

    def __init__(self, rows: Sequence[int], perm: torch.Tensor | None) -> None:
        self.rows = list(rows)
        self._perm = perm
        self._made: dict[tuple[str, torch.device], torch.Tensor] = {}
        self._host: HostRows | None = None
        self._in_order: bool | None = None
        self._inverse_list: list[int] | None = None

    def in_order(self) -> bool:
        """Whether the permutation is the identity, so the parts laid end to end already are in original
        order (one micro-batch of sorted indices, or sorted contiguous micro-batches); checked once."""
        if self._in_order is None:
            self._in_order = self._perm is not None and is_identity(self._perm)
        return self._in_order

    def host(self) -> HostRows:
        """The `HostRows` of this call (built on first use): a few NumPy operations, whatever B and M."""
        if self._host is None:
            rows = np.asarray(self.rows, dtype=np.int64)
            part_of_row = np.arange(len(rows), dtype=np.int64).repeat(rows)
            bounds = np.zeros(2 * len(rows), dtype=np.int64)
            firsts, ends = bounds[: len(rows)], bounds[len(rows) :]
            (rows[:-1] + 1).cumsum(out=firsts[1:])
            np.add(firsts, rows, out=ends)
            perm = inv = None
            if self._perm is not None:
                perm = self._perm.numpy()
                inv = np.empty_like(perm)
                inv[perm] = np.arange(perm.shape[0], dtype=perm.dtype)
            steps = np.arange(part_of_row.shape[0], dtype=np.int64) + part_of_row
            self._host = HostRows(part_of_row, steps, bounds, perm, inv)
        return self._host

    def inverse_list(self) -> list[int]:
        """``inv[perm[k]] == k`` as Python ints (built on first use; the few-rows path, `torch_impl._fewrows`)."""
        if self._inverse_list is None:
            assert self._perm is not None
            perm = self._perm.tolist()
            inv = [0] * len(perm)
            for k, i in enumerate(perm):
                inv[i] = k
            self._inverse_list = inv
        return self._inverse_list

    def _once(self, what: str, device: torch.device, make: Callable[[], torch.Tensor]) -> torch.Tensor:
        key = (what, device)
        if key not in self._made:
            self._made[key] = make()
        return self._made[key]

    def perm(self, device: torch.device) -> torch.Tensor:
        """The permutation on ``device`` (a copy from the host, not a read of the device)."""
        assert self._perm is not None
        perm = self._perm
        return self._once("perm", device, lambda: perm.to(device, non_blocking=True))

    def inverse(self, device: torch.device) -> torch.Tensor:
        """``inv[perm[k]] == k``, on ``device``."""
        return self._once("inverse", device, lambda: invert(self.perm(device)))

    def steps(self, device: torch.device) -> torch.Tensor | None:
        """`row_steps` of the row counts on ``device``; None for one micro-batch (nothing to leave out)."""
        if len(self.rows) < 2:
            return None
        return self._once("steps", device, lambda: row_steps(self.rows, device))
