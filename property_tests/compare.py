"""Bit-exact comparison of results: tensors (jagged or dense), losses and metrics (`torch_impl._compare`,
which verl's shadow mode uses too), here with what a consumer observes of two jagged results compared
as well (`observed_difference`: padded shape and values, ``unbind``; the cached sizes, holes and
``requires_grad`` are `torch_impl._compare.same_tensor`'s own)."""

from __future__ import annotations

from typing import Any

import torch

from torch_impl import testing
from torch_impl.testing import bits, cached_sizes, raw_values

__all__ = ["bits", "cached_sizes", "observed_difference", "same_tensor", "assert_same", "first_difference"]


def _observed(x: torch.Tensor) -> list[Any]:
    """What a consumer computes next from a jagged ``x``: ``to_padded_tensor(0)`` without an output size
    (its shape and bits, or the error's class) and the rows of ``unbind()``, as bits; an inference
    tensor read in inference mode."""
    raw: Any = x
    seen: list[Any] = []
    with torch.inference_mode(raw_values(raw).is_inference()):
        nested = raw.detach()
        try:
            padded = nested.to_padded_tensor(0)
            seen.append((tuple(padded.shape), bits(padded)))
        except (RuntimeError, NotImplementedError, TypeError) as err:
            seen.append(type(err).__name__)
        seen.extend((tuple(row.shape), bits(row)) for row in nested.unbind())
    return seen


def _same_seen(x: Any, y: Any) -> bool:
    if isinstance(x, tuple) and isinstance(y, tuple):
        return x[0] == y[0] and torch.equal(x[1], y[1])
    return isinstance(x, str) and x == y


def observed_difference(a: torch.Tensor, b: torch.Tensor) -> str | None:
    """None when a consumer computes the same from jagged ``a`` and ``b`` (`_observed`; nothing on
    ``meta``, which holds no values), else which computation differs."""
    if a.device.type == "meta":
        return None
    seen_a, seen_b = _observed(a), _observed(b)
    if not _same_seen(seen_a[0], seen_b[0]):
        return "to_padded_tensor(0) without an output size differs (shape or values)"
    if len(seen_a) != len(seen_b) or not all(map(_same_seen, seen_a[1:], seen_b[1:])):
        return "unbind() differs"
    return None


def same_tensor(a: torch.Tensor, b: torch.Tensor) -> str | None:
    """`torch_impl._compare.same_tensor` with `observed_difference`."""
    return testing.same_tensor(a, b, consumer=observed_difference)


def first_difference(a: Any, b: Any) -> str | None:
    """`torch_impl._compare.first_difference` with `observed_difference`."""
    return testing.first_difference(a, b, consumer=observed_difference)


def assert_same(a: Any, b: Any) -> None:
    """`torch_impl._compare.assert_same` with `observed_difference`."""
    testing.assert_same(a, b, consumer=observed_difference)
