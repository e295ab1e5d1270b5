"""miles' alignment witness read from its call: each row's per-token output length, and each key's.

The comparison is the core's (`torch_impl._alignment.RowWitness`); this module reads miles' data into
its form: the rows' ``response_lengths`` (this rank's share under context parallelism) and each key's
per-sample values' lengths.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ..._alignment import RowWitness, witness_config
from ..._tally import skipped

__all__ = ["PARALLEL", "cp_size", "length_witness", "witness_keys"]

#: The miles module holding its parallel state (context parallelism's rank and size, for the witness).
PARALLEL = "miles.backends.training_utils.parallel"


def length_witness(data_iterator: Any, args: Any) -> list[int] | None:
    """Each row's per-token output length as miles' loss functions make it (``get_responses``): the row's
    ``response_lengths`` (``data_iterator.rollout_data``); under context parallelism (miles' parallel
    state, ``cp.size > 1``) this rank's two zigzag chunks of it (``get_logits_and_tokens_offset_with_cp``
    over ``total_lengths``, and ``max_seq_lens`` for ``qkv_format="bshd"``), the lengths
    ``slice_log_prob_with_cp`` keeps. None (counted) without those lists of the rows' ints, or with the
    witness switched off."""
    if not witness_config()[0]:
        return None
    data = getattr(data_iterator, "rollout_data", None)
    data = data if isinstance(data, Mapping) else {}
    response = data.get("response_lengths")
    lengths = _as_ints(response) if isinstance(response, Sequence) else None
    if lengths is None:
        skipped("calls_without_witness")
        return None
    if cp_size() == 1:
        return lengths
    return _cp_lengths(data, lengths, getattr(args, "qkv_format", "thd"))


def _cp_lengths(data: Mapping[str, Any], response: list[int], qkv: Any) -> list[int] | None:
    """`length_witness` under context parallelism: this rank's share of each row's response. None
    (counted) where a field it needs is absent (``calls_without_witness``) or unreadable: not a list of
    the rows' ints, or one miles' own offsets function refuses (``skipped_unreadable_witness``)."""
    total = _row_ints(data, "total_lengths", len(response))
    max_lens = _row_ints(data, "max_seq_lens", len(response)) if qkv == "bshd" else [None] * len(response)
    if total is None or max_lens is None:
        return None
    from miles.backends.training_utils.cp_utils import get_logits_and_tokens_offset_with_cp

    out = []
    try:
        for t, r, m in zip(total, response, max_lens, strict=True):
            _, _, logits, _ = get_logits_and_tokens_offset_with_cp(t, r, qkv, m)
            out.append(sum(b - a for a, b in logits))
    except (AssertionError, ArithmeticError, LookupError, TypeError, ValueError):
        # miles' own function refuses these lengths: this call's witness is unreadable
        skipped("skipped_unreadable_witness")
        return None
    return out


def _row_ints(data: Mapping[str, Any], field: str, rows: int) -> list[int] | None:
    """``data[field]`` as a list of ``rows`` ints; None (counted) where it is absent
    (``calls_without_witness``) or is not that (``skipped_unreadable_witness``)."""
    values = data.get(field)
    if values is None:
        skipped("calls_without_witness")
        return None
    ints = _as_ints(values) if isinstance(values, Sequence) and len(values) == rows else None
    if ints is None:
        skipped("skipped_unreadable_witness")
    return ints


def _as_ints(values: Sequence[Any]) -> list[int] | None:
    """``values`` as a list of ints where every one is an integer (not a bool), else None; plain Python
    ints, miles' usual lists, checked by their types in one pass and copied as they are."""
    if set(map(type, values)) <= {int}:
        return list(values)
    return [int(n) for n in values] if all(_is_int(n) for n in values) else None


def _is_int(n: Any) -> bool:
    return isinstance(n, int | np.integer) and not isinstance(n, bool)


def cp_size() -> int:
    """Context parallelism's size in miles' parallel state (1 where none is set: no CP slicing)."""
    parallel = sys.modules.get(PARALLEL)
    state = getattr(parallel, "_parallel_state", None)
    size = getattr(getattr(state, "cp", None), "size", 1)
    return int(size) if isinstance(size, int) else 1


def _length(value: Any) -> int | None:
    """A per-token value's length (a tensor or array with a row dimension, a list or tuple), else None."""
    if isinstance(value, torch.Tensor | np.ndarray):
        return int(value.shape[0]) if value.ndim >= 1 else None
    if isinstance(value, list | tuple):
        return len(value)
    return None


def _lengths(values: list[Any]) -> list[int | None]:
    """`_length` of each value; for a list of plain tensors (miles' per-sample outputs) in C-level passes:
    where every one is 1-D (miles' per-token values), its element count, the cheapest read torch has;
    else each first dimension (a 0-d one among them: value by value)."""
    if set(map(type, values)) == {torch.Tensor}:
        if set(map(torch.Tensor.dim, values)) == {1}:  # 1-D: the length is the element count
            return list(map(torch.Tensor.numel, values))
        try:
            return [v.shape[0] for v in values]
        except IndexError:  # a 0-d tensor has no length
            pass
    return [_length(v) for v in values]


def witness_keys(
    keys: Sequence[Any],
    values: Mapping[Any, list[Any]],
    flat: Any,
    sizes: Sequence[int],
    data_iterator: Any,
    args: Any,
) -> None:
    """Step 6 for miles (``docs/spec.md``, "The alignment witness"), by the core's rule: each key's
    per-sample values' lengths, in micro-batch order, against the witness of the rows they are
    (``flat()[j]``: the row joined value ``j`` is, read only where a witness is found; ``sizes``: the
    micro-batches' row counts). Their lengths are read from lists, so a key whose values all have one
    length where the rows' differ is unproven (a fixed-width value)."""
    witness = length_witness(data_iterator, args)
    if witness is None:
        return
    judge = RowWitness(witness, flat(), sizes, witness_config()[1])
    for key in keys:
        judge.compare(key, _lengths(values[key]), inferred=True)
