"""The split side: token-budget partitions and micro-batches of a TensorDict, as verl prepares them."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tensordict import TensorDictBase

from ref.errors import UnsupportedSettingError
from ref.partition import balanced_partitions as _balanced_partitions

from ._ops import split
from ._parts import JaggedPart, unpack

__all__ = ["balanced_partitions", "prepare_micro_batches", "row_lengths"]


def balanced_partitions(
    lengths: Sequence[int] | torch.Tensor,
    max_tokens: int,
    *,
    min_num_micro_batches: int | None = None,
    multiple_of: int | None = None,
    balance: bool = True,
) -> list[list[int]]:
    """``ref.balanced_partitions`` (pure Python, shared: the same partitions by construction) on a list
    or a tensor of row lengths. See ``ref.balanced_partitions`` for the meaning."""
    if isinstance(lengths, torch.Tensor):
        lengths = lengths.tolist()
    return _balanced_partitions(
        lengths, max_tokens, min_num_micro_batches=min_num_micro_batches, multiple_of=multiple_of, balance=balance
    )


def row_lengths(data: TensorDictBase, key: str | None = None) -> torch.Tensor:
    """Tokens per row: a jagged field's row lengths, or a dense 0/1 mask's row sums.

    ``key`` defaults to ``input_ids`` when it is jagged, else ``attention_mask``.
    """
    if key is None:
        key = "input_ids" if "input_ids" in data.keys() and data.get("input_ids").is_nested else "attention_mask"
    if key not in data.keys():
        raise UnsupportedSettingError(f"key {key!r}: no such field to count tokens with")
    part = unpack(data.get(key), key)
    if isinstance(part, JaggedPart):
        return part.offsets.diff()
    return part.values.reshape(part.rows, -1).sum(dim=1).to(torch.int64)


def prepare_micro_batches(
    data: TensorDictBase,
    *,
    max_token_len: int | None = None,
    micro_batch_size: int | None = None,
    length_key: str | None = None,
    min_num_micro_batches: int | None = None,
    multiple_of: int | None = None,
    balance: bool = True,
) -> tuple[list[TensorDictBase], list[list[int]] | None]:
    """Micro-batches of ``data`` and their ``indices``, as verl's engines make them.

    Dynamic (``max_token_len``): rows partitioned by `balanced_partitions` on `row_lengths`, returned
    with the partitions. Fixed (``micro_batch_size``): consecutive chunks, ``indices`` None (as verl,
    with ``use_dynamic_bsz`` off). Either way ``postprocess_batch_func`` on the micro-batches' outputs
    with these ``indices`` gives rows in ``data``'s order.
    """
    b = int(data.batch_size[0])
    if micro_batch_size is not None and max_token_len is None:
        if micro_batch_size <= 0:
            raise UnsupportedSettingError(f"micro_batch_size must be positive, got {micro_batch_size}")
        chunks = [list(range(i, min(i + micro_batch_size, b))) for i in range(0, b, micro_batch_size)]
        return split(data, chunks), None
    if max_token_len is None or micro_batch_size is not None:
        raise UnsupportedSettingError("give exactly one of max_token_len (dynamic) and micro_batch_size (fixed)")
    parts = balanced_partitions(
        row_lengths(data, length_key),
        int(max_token_len),
        min_num_micro_batches=min_num_micro_batches,
        multiple_of=multiple_of,
        balance=balance,
    )
    return split(data, parts), parts
