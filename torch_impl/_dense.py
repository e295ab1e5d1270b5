"""Dense outputs ``[b_m, *F]``: joined along the batch dimension, optionally into original order."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ._bits import as_bits, from_bits
from ._parts import DensePart

__all__ = ["assemble_dense"]


def assemble_dense(parts: Sequence[DensePart], perm: torch.Tensor | None) -> torch.Tensor:
    """``[B, *F]``: the parts' rows in micro-batch order (``perm`` None: one ``cat``), or with row ``k``
    of that order at row ``perm[k]`` (``[B]`` on the parts' device: one ``cat`` of two or more parts,
    then one ``index_copy_``, whose backward gives each part exactly its rows' gradient). Always a new
    tensor (never an input). A dtype torch cannot index moves as its bits (`torch_impl._bits`)."""
    if perm is None:
        return torch.cat([p.values for p in parts])
    values = parts[0].values if len(parts) == 1 else torch.cat([p.values for p in parts])
    bits = as_bits(values)
    return from_bits(bits.new_empty(bits.shape).index_copy_(0, perm, bits), values.dtype)
