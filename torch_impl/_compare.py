"""Bit-exact comparison of results: tensors (jagged or dense), losses and metrics.

Used by verl's shadow mode (`torch_impl.integrations.verl`) and, through `property_tests.compare`, by
the tests. A difference names its place (``result['model_output']['lp']``) and, for values, the first
row that differs and both values there.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from tensordict import NonTensorData, NonTensorStack, TensorDictBase

from ref._torch_private import cached_seqlen_bounds, raw_lengths
from ref.dtypes import bits_dtype

__all__ = ["bits", "cached_sizes", "same_tensor", "assert_same", "first_difference"]


def cached_sizes(x: Any) -> tuple[int | None, int | None, bool]:
    """What a jagged nested tensor caches that a consumer reads next (`same_tensor` compares it): its
    shortest and longest row (None where not cached: ``to_padded_tensor()`` then pads to the number of
    values) and whether it has holes (``lengths()``)."""
    shortest, longest = cached_seqlen_bounds(x)
    holes = raw_lengths(x) is not None
    return shortest, longest, holes


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits of a dense tensor, as integers of the same width (NaN payloads compare exactly)."""
    t = t.detach().contiguous()
    if t.is_complex():
        return bits(torch.view_as_real(t.resolve_conj()))
    if t.dtype == torch.bool:
        return t.to(torch.uint8)
    if t.dtype.is_floating_point:
        return t.view(getattr(torch, bits_dtype(t.element_size(), dtype=t.dtype)))
    return t


# Complex by design: one check for each property a consumer observes, in order.
def same_tensor(a: torch.Tensor, b: torch.Tensor, *, consumer: Any = None) -> str | None:  # noqa: C901
    """None when ``a`` and ``b`` are identical (layout, dtype, device, ``requires_grad``, shape, a
    jagged tensor's cached sizes and holes, offsets, bits), else why not (for values: the first row
    that differs, and both values there). ``consumer``: also what a consumer computes next from two
    jagged tensors (the tests' ``property_tests.compare.observed_difference``), which those determine."""
    if a.is_nested != b.is_nested:
        return f"layout differs: nested={a.is_nested} vs nested={b.is_nested}"
    if a.dtype != b.dtype:
        return f"dtype differs: {a.dtype} vs {b.dtype}"
    if a.device != b.device:
        return f"device differs: {a.device} vs {b.device}"
    if a.requires_grad != b.requires_grad:
        return f"requires_grad differs: {a.requires_grad} vs {b.requires_grad}"
    offsets = None
    if a.is_nested:
        sizes_a = cached_sizes(a)
        sizes_b = cached_sizes(b)
        if sizes_a != sizes_b:
            return f"cached (min_seqlen, max_seqlen, holes) differ: {sizes_a} vs {sizes_b}"
        why = consumer(a, b) if consumer is not None else None
        if why:
            return why
        if a.size(0) != b.size(0) or a.shape[2:] != b.shape[2:]:
            return f"shape differs: {tuple(a.shape)} vs {tuple(b.shape)}"
        a, b = a.contiguous(), b.contiguous()
        oa, ob = offsets_of(a).to(torch.int64), offsets_of(b).to(torch.int64)
        if not torch.equal(oa, ob):
            return f"offsets differ: {oa.tolist()} vs {ob.tolist()}"
        a, b, offsets = a.values(), b.values(), oa
    if a.shape != b.shape:
        return f"shape differs: {tuple(a.shape)} vs {tuple(b.shape)}"
    ba, bb = bits(a), bits(b)
    if torch.equal(ba, bb):
        return None
    if a.dim() == 0:
        return f"values differ: {a.item()!r} vs {b.item()!r}"
    first = int((ba != bb).reshape(a.shape[0], -1).any(dim=1).nonzero()[0, 0])
    if offsets is None:
        at = f"row {first}"
    else:
        row = int(torch.searchsorted(offsets[1:].cpu(), torch.tensor(first, device="cpu"), right=True))
        at = f"row {row} (value {first - int(offsets[row])} of it)"
    return f"values differ at {at}: {a[first].tolist()!r} vs {b[first].tolist()!r}"


def offsets_of(x: torch.Tensor) -> torch.Tensor:
    """A jagged nested tensor's offsets ``[B + 1]`` (``x.offsets()``, which torch's type stubs lack)."""
    nested: Any = x
    return nested.offsets()


def _same_tensordict(a: TensorDictBase, b: TensorDictBase, path: str, consumer: Any) -> str | None:
    """Same class, batch size and keys; entries compared as values (non-tensor data by value). The keys'
    order is not compared: it is an artefact of how tensordict builds a TensorDict (verl's own
    selection and chunking order them differently), never a key's meaning."""
    if type(a) is not type(b) or a.batch_size != b.batch_size:
        return f"{path}: {type(a).__name__}{list(a.batch_size)} vs {type(b).__name__}{list(b.batch_size)}"
    keys_a, keys_b = sorted(a.keys(), key=str), sorted(b.keys(), key=str)
    if keys_a != keys_b:
        return f"{path}: keys {keys_a} vs {keys_b}"
    for k in keys_a:
        x, y = a.get(k), b.get(k)
        if isinstance(x, NonTensorData) or isinstance(y, NonTensorData):
            x, y = getattr(x, "data", x), getattr(y, "data", y)
        elif isinstance(x, NonTensorStack) and isinstance(y, NonTensorStack):
            x, y = x.tolist(), y.tolist()
        why = _same(x, y, f"{path}[{k!r}]", consumer)
        if why:
            return why
    return None


# Complex by design: one check for each kind of value a result holds, in order.
def _same(a: Any, b: Any, path: str, consumer: Any = None) -> str | None:  # noqa: C901
    if isinstance(a, TensorDictBase) or isinstance(b, TensorDictBase):
        if not (isinstance(a, TensorDictBase) and isinstance(b, TensorDictBase)):
            return f"{path}: {type(a).__name__} vs {type(b).__name__}"
        return _same_tensordict(a, b, path, consumer)
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return f"{path}: {type(a).__name__} vs {type(b).__name__}"
        why = same_tensor(a, b, consumer=consumer)
        return None if why is None else f"{path}: {why}"
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        if list(a) != list(b):
            return f"{path}: keys {list(a)} vs {list(b)}"
        for k in a:
            why = _same(a[k], b[k], f"{path}[{k!r}]", consumer)
            if why:
                return why
        return None
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if type(a) is not type(b) or len(a) != len(b):
            return f"{path}: {type(a).__name__}[{len(a)}] vs {type(b).__name__}[{len(b)}]"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            why = _same(x, y, f"{path}[{i}]", consumer)
            if why:
                return why
        return None
    if hasattr(a, "values") and hasattr(a, "aggregation"):  # Metric-like
        if type(a) is not type(b) or a.aggregation != b.aggregation:
            return f"{path}: {a!r} vs {b!r}"
        return _same(list(a.values), list(b.values), f"{path}.values", consumer)
    if a is b:
        return None
    try:
        equal = bool(a == b) and type(a) is type(b)
    except Exception as err:  # a comparison that raises is a difference, its error in the message
        return f"{path}: {a!r} vs {b!r} (comparing them raised {type(err).__name__}: {err})"
    return None if equal else f"{path}: {a!r} vs {b!r}"


def first_difference(a: Any, b: Any, *, consumer: Any = None) -> str | None:
    """None when ``a`` and ``b`` (nested dicts/lists of tensors and plain values) are identical
    (``consumer``: `same_tensor`'s)."""
    return _same(a, b, "result", consumer)


def assert_same(a: Any, b: Any, *, consumer: Any = None) -> None:
    """Raise ``AssertionError`` naming the first difference between ``a`` and ``b`` (``consumer``:
    `same_tensor`'s)."""
    why = first_difference(a, b, consumer=consumer)
    if why is not None:
        raise AssertionError(why)
