"""Dtypes torch's kernels cannot index, moved as the integers of their bits.

torch has no CPU ``index_copy_``, ``index_select``, ``index_put_`` or ``scatter_`` for ``uint16``, ``uint32``,
``uint64`` and several of the float8 variants, all of them in `ref.dtypes.SUPPORTED_DTYPES`: the kernels move
such values as a view of the signed integer type of the same width (`ref.dtypes.bits_dtype`), which moves
every
bit and costs one view each way. Every other dtype is moved as it is (no operation added). A view of another
dtype carries no gradient, so a part of such a dtype that requires one is refused by every public function
(the one dtype rule: `ref.dtypes.check_dtype`, `ref.dtypes.NO_GRADIENT`).
"""

from __future__ import annotations

import torch

from ref.dtypes import SUPPORTED_DTYPES, bits_dtype

__all__ = ["MOVED_AS_BITS", "as_bits", "from_bits"]

#: The torch dtypes of `ref.dtypes.SUPPORTED_DTYPES` that the kernels move as the integers of their bits.
MOVED_AS_BITS: frozenset[torch.dtype] = frozenset(
    d
    for d in (getattr(torch, name, None) for name in SUPPORTED_DTYPES if name.startswith(("uint", "float8")))
    if isinstance(d, torch.dtype) and d != torch.uint8
)


def as_bits(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself, or for a dtype of `MOVED_AS_BITS` a view of it as the integers of its bits."""
    if t.dtype not in MOVED_AS_BITS:
        return t
    return t.view(getattr(torch, bits_dtype(t.element_size(), dtype=t.dtype)))


def from_bits(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The inverse of `as_bits`: ``t`` itself, or ``t`` (the integers of a ``dtype``'s bits) viewed as
    ``dtype``."""
    return t if t.dtype == dtype else t.view(dtype)
