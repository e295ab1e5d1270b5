"""Dense outputs ``[b_m, *F]``: joined along the batch dimension, optionally into original order."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ._parts import DensePart

__all__ = ["assemble_dense"]


def assemble_dense(parts: Sequence[DensePart], perm: torch.Tensor | None) -> torch.Tensor:
    """``[B, *F]``: the parts' rows in micro-batch order (``perm`` None), or with row ``k`` of that
    order at row ``perm[k]`` (one ``index_copy_`` per part). Always a new tensor (never an input)."""
    first = parts[0].values
    if perm is None:
        return torch.cat([p.values for p in parts])
    out = first.new_empty((perm.numel(), *first.shape[1:]))
    start = 0
    for p in parts:
        out.index_copy_(0, perm[start : start + p.rows], p.values)
        start += p.rows
    return out
