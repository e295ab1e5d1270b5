"""Batches of any size on the ``meta`` device, and the torch operations one call dispatches on them.

On a GPU a call is bound by its kernel launches; `count_call` counts the operations of one call of
`torch_impl.postprocess_batch` (or verl's drop-in, `torch_impl.postprocess_batch_func`) with
`property_tests.opcount.CountOps`. ``meta`` tensors have shapes and no data, so batches of any size
cost nothing to build, and any read of device data on the host would fail.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, NamedTuple

import torch
from tensordict import NonTensorData, TensorDict

import torch_impl
from torch_impl.testing import raw_values

from .opcount import CountOps

__all__ = ["LAYOUTS", "Count", "count_call", "meta_batch", "output_bytes"]

#: Each key's layout: name -> (jagged, trailing shape per value row, or per row for dense outputs)
LAYOUTS: dict[str, tuple[bool, tuple[int, ...]]] = {
    "[b, (j)]": (True, ()),
    "[b, (j), k]": (True, (4,)),
    "[b]": (False, ()),
    "[b, S]": (False, (64,)),
}


class Count(NamedTuple):
    """One call's operations (all of them, and those on floating-point data) and its estimated traffic."""

    ops: int
    on_values: int
    bytes: int


def meta_batch(
    rows: int,
    micro_batches: int,
    *,
    keys: int = 1,
    layout: str = "[b, (j)]",
    length: int = 32,
    device: str = "meta",
) -> tuple[list[dict[str, Any]], list[list[int]]]:
    """``(output_lst, indices)``: ``rows`` rows cut into ``micro_batches`` of about equal row counts
    (the first ones one row longer; empty ones when there are more micro-batches than rows), ``keys``
    float32 keys of ``layout`` (`LAYOUTS`), every jagged row ``length`` values long (all keys of a
    micro-batch are one tensor: each key is moved on its own all the same); ``indices`` put the rows
    in reverse order. On ``meta`` the offsets hold no data; elsewhere they are real."""
    jagged, trailing = LAYOUTS[layout]
    counts = [rows // micro_batches + (m < rows % micro_batches) for m in range(micro_batches)]
    order = list(range(rows))[::-1]
    bounds = list(itertools.accumulate(counts, initial=0))
    indices = [order[bounds[m] : bounds[m + 1]] for m in range(micro_batches)]
    outs = []
    for b in counts:
        if jagged:
            values = torch.zeros(b * length, *trailing, device=device)
            offsets = torch.arange(0, (b + 1) * length, length, dtype=torch.int64, device=device)
            x = torch.nested.nested_tensor_from_jagged(values, offsets)
        else:
            x = torch.zeros(b, *trailing, device=device)
        outs.append({"model_output": {f"k{k}": x for k in range(keys)}, "loss": 1.0})
    return outs, indices


def output_bytes(rows: int, *, layout: str = "[b, (j)]", length: int = 32) -> int:
    """Bytes of one key's output of `meta_batch` (float32)."""
    jagged, trailing = LAYOUTS[layout]
    return 4 * rows * (length if jagged else 1) * math.prod(trailing)


def count_call(
    output_lst: list[dict[str, Any]],
    indices: list[list[int]] | None,
    *,
    drop_in: bool = False,
    fn: Any = None,
    witness: bool = True,
) -> Count:
    """The operations of one call: ``torch_impl.postprocess_batch(output_lst, indices,
    use_dynamic_bsz=indices is not None)``, or with ``drop_in`` verl's call ``postprocess_batch_func(
    output_lst, indices, data)`` (``data`` a TensorDict carrying ``use_dynamic_bsz`` and, with
    ``witness``, the batch's ``input_ids`` on the host, as verl's engines leave them: the alignment
    witness, whose comparison is launched and counted, its read skipped on ``meta``) of ``fn``
    (default `torch_impl.postprocess_batch_func`)."""
    dynamic = indices is not None
    entries: dict[str, Any] = {"use_dynamic_bsz": NonTensorData(dynamic)}
    if witness and drop_in:
        entries["input_ids"] = _host_input_ids(output_lst, indices)
    data = TensorDict(entries, batch_size=[])
    with CountOps() as counter:
        if drop_in:
            (fn or torch_impl.postprocess_batch_func)(output_lst, indices, data)
        else:
            torch_impl.postprocess_batch(output_lst, indices, use_dynamic_bsz=dynamic)
    return Count(sum(counter.ops.values()), sum(counter.on_values.values()), counter.bytes)


def _host_input_ids(output_lst: list[dict[str, Any]], indices: list[list[int]] | None) -> torch.Tensor:
    """A CPU jagged ``input_ids`` ``[B, (j)]`` whose rows are as long as `meta_batch`'s (all alike:
    the first jagged key's values over its rows), as verl's engines leave ``data`` on the host."""
    rows = length = 0
    for o in output_lst:
        mo = o.get("model_output", {})
        x = mo[next(iter(mo))] if mo else None
        if x is not None:
            rows += int(x.size(0))
            if x.is_nested and not length and int(x.size(0)):
                length = int(raw_values(x).shape[0]) // int(x.size(0))
    if indices is not None:
        rows = sum(len(p) for p in indices)
    offsets = torch.arange(rows + 1, dtype=torch.int64) * length
    return torch.nested.nested_tensor_from_jagged(torch.zeros(rows * length, dtype=torch.int64), offsets)
