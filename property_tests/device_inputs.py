"""The inputs of the device calls (`property_tests.device_calls`): one host batch of ``b`` rows, and the
types of a call's builder; shared by the kit's own calls and each trainer's (its kit module's
``DEVICE_CALLS``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .data import jagged

__all__ = ["Builder", "Move", "host_batch", "randn"]

#: A tree of host tensors -> the same on the device under test.
Move = Callable[[Any], Any]
#: (move, rows) -> (the call, the device type of each tensor result: "in" for the inputs' device)
Builder = Callable[[Move, int], tuple[Callable[[], Any], str]]

_MICRO_BATCHES = 3


def host_batch(b: int, keys: int = 1) -> tuple[list[list[int]], list[int], list[torch.Tensor]]:
    """``(indices, each row's length in original order, each micro-batch's jagged float32 output)``:
    ``b`` rows of lengths 2 to 9 in three micro-batches, rows in reverse order."""
    lengths = [2 + (i * 5) % 8 for i in range(b)]
    order = list(range(b))[::-1]
    cuts = [round(b * m / _MICRO_BATCHES) for m in range(_MICRO_BATCHES + 1)]
    indices = [order[cuts[m] : cuts[m + 1]] for m in range(_MICRO_BATCHES)]
    g = torch.Generator(device="cpu").manual_seed(b)
    outs = [
        jagged(torch.randn(sum(lengths[i] for i in p), generator=g, device="cpu"), [lengths[i] for i in p])
        for p in indices
    ]
    return indices, lengths, outs


def randn(*shape: int) -> torch.Tensor:
    """Normal float32 values on the host, the same for the same shape (each call's inputs reproducible)."""
    return torch.randn(*shape, generator=torch.Generator(device="cpu").manual_seed(sum(shape)), device="cpu")
