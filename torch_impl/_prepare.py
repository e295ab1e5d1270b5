"""The split side: verl's micro-batches of a TensorDict (engine ``prepare_micro_batches``, the
partitioner ``rearrange_micro_batches``) and its ``restore_dynamic_batch``, with verl's signatures.

The partitions come from `ref.partition` (pure Python, shared with the reference): the same partitions,
in the same order, as verl 0.9.1 (or, with ``one_pass=True``, as verl 0.8.0 and 0.9.0), and `TokenBudgetError`
where verl fails an ``assert`` or raises
``ValueError``. The micro-batches are cut by `torch_impl.split` (one gather per field). Across
data-parallel ranks the counts are agreed with all-reduces (`DistSync`), as verl does, and a fatal
problem on any rank is raised on every rank, never left to a collective's timeout.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from tensordict import TensorDictBase

from ref.errors import UnsupportedSettingError
from ref.partition import (
    balanced_partitions as _balanced_partitions,
    check_counts,
    check_rows,
    fixed_partitions,
    plan_micro_batches,
)
from ref.structure import PADDING, as_flag, as_integer

from ._agree import agree
from ._alignment import check_restore, record
from ._ops import restore, split, take
from ._parts import JaggedPart, unpack
from ._postprocess import read_setting

__all__ = [
    "DistSync",
    "balanced_partitions",
    "prepare_micro_batches",
    "rearrange_micro_batches",
    "restore_dynamic_batch",
    "row_lengths",
]


def balanced_partitions(
    lengths: Sequence[int] | torch.Tensor,
    max_tokens: int,
    *,
    min_num_micro_batches: int | None = None,
    multiple_of: int | None = None,
    balance: bool = True,
    force_group_size: int = 1,
) -> list[list[int]]:
    """``ref.balanced_partitions`` (pure Python, shared: the same partitions by construction) on a list
    or a tensor of row lengths. See ``ref.balanced_partitions`` for the meaning."""
    if isinstance(lengths, torch.Tensor):
        lengths = lengths.tolist()
    return _balanced_partitions(
        lengths,
        max_tokens,
        min_num_micro_batches=min_num_micro_batches,
        multiple_of=multiple_of,
        balance=balance,
        force_group_size=force_group_size,
    )


def row_lengths(data: TensorDictBase, key: str | None = None) -> torch.Tensor:
    """Tokens per row: a jagged field's row lengths, or a dense 0/1 mask's row sums.

    ``key`` defaults to ``input_ids`` when it is jagged, else ``attention_mask``.
    """
    if key is None:
        key = (
            "input_ids"
            if "input_ids" in data.keys() and data.get("input_ids").is_nested
            else "attention_mask"
        )
    if key not in data.keys():
        raise UnsupportedSettingError(f"key {key!r}: no such field to count tokens with")
    part = unpack(data.get(key), key)
    if isinstance(part, JaggedPart):
        return part.offsets.diff()
    return part.values.reshape(part.rows, -1).sum(dim=1).to(torch.int64)


def _longest(data: TensorDictBase, lengths: torch.Tensor, key: str | None) -> int:
    """The longest row as verl measures it: a jagged row's length, or a dense batch's padded width."""
    if key is None and not ("input_ids" in data.keys() and data.get("input_ids").is_nested):
        return int(data.get("attention_mask").shape[-1]) if data.get("attention_mask").dim() > 1 else 1
    return int(lengths.max()) if lengths.numel() else 0


class DistSync:
    """`ref.partition.CountSync` over ``torch.distributed``: element-wise all-reduces on ``group``
    (on the current CUDA device for NCCL, else the CPU)."""

    def __init__(self, group: Any) -> None:
        self.group = group
        nccl = dist.get_backend(group) == "nccl"
        self.device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")

    def _reduce(self, values: list[int], op: Any) -> list[int]:
        t = torch.tensor(values, dtype=torch.int64, device="cpu").to(self.device, non_blocking=True)
        dist.all_reduce(t, op=op, group=self.group)
        return [int(v) for v in t.tolist()]

    def max(self, values: list[int]) -> list[int]:
        return self._reduce(values, dist.ReduceOp.MAX)

    def min(self, values: list[int]) -> list[int]:
        return self._reduce(values, dist.ReduceOp.MIN)


def prepare_micro_batches(
    data: TensorDictBase,
    dp_group: Any = None,
    num_batches_divided_by: int | None = None,
    same_micro_num_in_dp: bool = True,
    min_num_micro_batch: int | None = None,
    use_dynamic_bsz_balance: bool = True,
    *,
    max_token_len: int | None = None,
    micro_batch_size: int | None = None,
    length_key: str | None = None,
    pad_micro_batches: bool = False,
    one_pass: bool = False,
) -> tuple[Sequence[TensorDictBase], list[Any] | None]:
    """verl's engine ``prepare_micro_batches``: the micro-batches of ``data`` and their ``indices``.

    Called as verl's engines call it, the settings come from ``data`` (non-tensor entries, as verl reads
    them): ``use_dynamic_bsz`` (default True), ``max_token_len_per_gpu`` times ``sp_size`` (default 1)
    as the token budget, ``micro_batch_size_per_gpu`` without dynamic batch size, and
    ``force_group_size`` (default 1). Dynamic: `rearrange_micro_batches`'s partitions (verl's, in
    verl's order; the count agreed over ``dp_group``). Fixed: consecutive chunks of
    ``micro_batch_size_per_gpu * force_group_size`` rows, which must divide the batch (a tuple, as
    verl's), and ``indices`` None. Either way ``postprocess_batch_func`` on the micro-batches' outputs
    with these ``indices`` gives the rows in ``data``'s order.

    Keyword-only extensions: ``max_token_len`` (the whole budget) or ``micro_batch_size`` (chunks; the
    last may be shorter) override what ``data`` says. What they restore (``docs/spec.md``, "Exact
    provenance"): ``max_token_len=`` makes a dynamic split, whose restore needs ``data`` to say
    ``use_dynamic_bsz`` (verl's default; restored as fixed, it raises `MisalignmentError`);
    ``micro_batch_size=`` returns its chunks' indices (`ref.partition.fixed_partitions`), so its restore is
    right whatever ``data`` says. ``length_key`` names the field to count tokens with;
    ``pad_micro_batches``: a rank with fewer rows than the count agreed over ``dp_group`` gets
    `PADDING` micro-batches (a copy of its first row, or no rows) instead of verl's error. The engine
    must then leave their loss out of the gradient; `postprocess_batch_func` drops their outputs.
    ``one_pass``: verl 0.8.0's and 0.9.0's count rule (see `rearrange_micro_batches`).
    """
    use_dynamic = (
        as_flag(read_setting(data, "use_dynamic_bsz", True), "use_dynamic_bsz")
        if micro_batch_size is None
        else False
    )
    if max_token_len is not None:
        use_dynamic = True
    force_group_size = as_integer(read_setting(data, "force_group_size", 1), "force_group_size")
    b = int(data.batch_size[0]) if data.batch_size else 0
    if not use_dynamic:
        if micro_batch_size is not None:  # its chunks' indices: right whatever ``data`` says
            chunks = fixed_partitions(b, micro_batch_size)
            return _recorded(data, split(data, chunks), chunks)
        mbs = read_setting(data, "micro_batch_size_per_gpu", None)
        if mbs is None:
            raise UnsupportedSettingError("micro_batch_size_per_gpu must be set when use_dynamic_bsz is off")
        size = as_integer(mbs, "micro_batch_size_per_gpu") * force_group_size
        if size <= 0 or b % size:
            raise UnsupportedSettingError(
                f"the batch size {b} must be divisible by force_group_size * micro_batch_size_per_gpu = "
                f"{size}"
            )
        # verl chunks the TensorDict (a tuple of micro-batches)
        return _recorded(data, tuple(split(data, fixed_partitions(b, size))), None)
    if max_token_len is None:
        per_gpu = read_setting(data, "max_token_len_per_gpu", None)
        if per_gpu is None:
            raise UnsupportedSettingError("max_token_len_per_gpu must be set when use_dynamic_bsz is on")
        sp_size = as_integer(read_setting(data, "sp_size", 1), "sp_size")
        max_token_len = as_integer(per_gpu, "max_token_len_per_gpu") * sp_size
    return rearrange_micro_batches(
        data,
        as_integer(max_token_len, "max_token_len"),
        dp_group,
        num_batches_divided_by,
        same_micro_num_in_dp,
        min_num_micro_batch,
        use_dynamic_bsz_balance,
        force_group_size,
        length_key=length_key,
        pad_micro_batches=pad_micro_batches,
        one_pass=one_pass,
    )


def rearrange_micro_batches(
    batch: TensorDictBase,
    max_token_len: int,
    dp_group: Any = None,
    num_batches_divided_by: int | None = None,
    same_micro_num_in_dp: bool = True,
    min_num_micro_batch: int | None = None,
    use_dynamic_bsz_balance: bool = True,
    force_group_size: int = 1,
    *,
    length_key: str | None = None,
    pad_micro_batches: bool = False,
    one_pass: bool = False,
) -> tuple[list[TensorDictBase], list[Any]]:
    """verl's ``rearrange_micro_batches``: ``batch`` split into micro-batches of at most ``max_token_len``
    tokens (`ref.partition.plan_micro_batches`: verl's partitions and order), and their indices.

    Tokens per row: jagged ``input_ids``' row lengths, else ``attention_mask``'s row sums (and, as in
    verl, a dense batch's padded width must fit the budget). With ``dp_group`` (and
    ``same_micro_num_in_dp``, ``torch.distributed`` initialised) the ranks agree on the count.
    Keyword-only extensions: ``length_key`` (the field to count tokens with),
    ``pad_micro_batches`` (see `prepare_micro_batches`) and ``one_pass``: verl 0.8.0's and 0.9.0's rule,
    one partitioning pass with the first count, so a micro-batch may exceed the budget (verl 0.9.1 raises
    the count until every micro-batch fits; `ref.partition.plan_micro_batches`).
    """
    synced = same_micro_num_in_dp and dp_group is not None and dist.is_available() and dist.is_initialized()
    lengths_t, failure = torch.zeros(0, dtype=torch.int64, device="cpu"), None
    try:  # this rank's own checks, then (with a group) every rank's verdict before any collective of the plan
        max_token_len, force_group_size, min_num_micro_batch, num_batches_divided_by = check_counts(
            max_token_len,
            force_group_size=force_group_size,
            min_num_micro_batch=min_num_micro_batch,
            num_batches_divided_by=num_batches_divided_by,
        )
        lengths_t = row_lengths(batch, length_key)
        longest = _longest(batch, lengths_t, length_key)
        check_rows(lengths_t.tolist(), max_token_len, force_group_size=force_group_size, max_seq_len=longest)
    except Exception as err:
        if not synced:
            raise
        failure = err
    if synced:
        agree(None, failure, dp_group)  # a failure anywhere: every rank raises it ("rank r: ...")
    parts: list[Any] = plan_micro_batches(
        lengths_t.tolist(),
        max_token_len,
        num_batches_divided_by=num_batches_divided_by,
        min_num_micro_batch=min_num_micro_batch,
        use_dynamic_bsz_balance=use_dynamic_bsz_balance,
        force_group_size=force_group_size,
        max_seq_len=longest,
        sync=DistSync(dp_group) if synced else None,
        pad_to_count=pad_micro_batches,
        one_pass=one_pass,
    )
    real = [p for p in parts if p is not PADDING]
    pieces = iter(split(batch, real)) if real else iter(())
    # the rows' lengths, where they are the batch's own (its jagged input_ids'): the record keeps them
    own = length_key in (None, "input_ids") and _jagged_ids(batch)
    lengths = lengths_t.tolist() if own else None
    if len(real) == len(parts):
        return _recorded(batch, [next(pieces) for _ in parts], parts, lengths)
    filler = take(batch, [0] if lengths_t.numel() else [])
    return _recorded(batch, [filler if p is PADDING else next(pieces) for p in parts], parts, lengths)


def _jagged_ids(batch: TensorDictBase) -> bool:
    """Whether ``batch`` holds a jagged ``input_ids``."""
    return "input_ids" in batch.keys() and batch.get("input_ids").is_nested


def _recorded(
    batch: TensorDictBase, micro_batches: Any, indices: Any, lengths: list[int] | None = None
) -> tuple[Any, Any]:
    """``(micro_batches, indices)``, recorded as what this split of ``batch`` handed out, with its rows'
    ``lengths`` where the split read them (the restore checks its provenance: `torch_impl._alignment`)."""
    record(batch, micro_batches, indices, lengths)
    return micro_batches, indices


def restore_dynamic_batch(data: torch.Tensor, batch_idx_list: Sequence[Sequence[int]]) -> torch.Tensor:
    """verl's ``restore_dynamic_batch``: rows of ``data`` (micro-batch order) back in original order.

    `torch_impl.restore`, validated: ``batch_idx_list`` must flatten to a permutation of ``range(B)``
    (`NotAPermutationError`, where verl would silently misalign a duplicate or wrap a negative index);
    its indices proven where they are a live split's, and then its rows' lengths checked against the
    split's (`MisalignmentError` at a row of another length: micro-batches' rows swapped before the
    join); `MisalignmentError` where they are the inverse of a live split's (``docs/spec.md``, "Exact
    provenance"); else unproven.
    """
    result = restore(data, batch_idx_list)  # every defect of the indices raised first, typed
    if isinstance(batch_idx_list, list | tuple):
        check_restore(batch_idx_list, result)
    return result
