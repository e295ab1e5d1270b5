"""`numpy_bridge`: whether this torch shares CPU storage with NumPy (the host paths need it)."""

from __future__ import annotations

import functools

import torch

__all__ = ["numpy_bridge"]


@functools.cache
def numpy_bridge() -> bool:
    """Whether this torch can share CPU storage with NumPy (it cannot when built against another NumPy
    ABI: then ``Tensor.numpy()`` raises, and the host paths are not used)."""
    try:
        torch.zeros(1).numpy()
    except (RuntimeError, ImportError, TypeError):  # "Numpy is not available"
        return False
    return True
