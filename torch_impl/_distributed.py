"""Many ranks: micro-batch counts synchronised over data parallelism (with marked padding micro-batches),
the last pipeline stage's result broadcast, and the global batch gathered, on ``torch.distributed``.

Tensors travel as raw bytes in one buffer per rank (``dist.broadcast`` / ``dist.all_gather``), never
pickled: only a skeleton of the result (its Python structure, and each tensor's dtype, shape and place
in the buffer) goes through the object collectives, and it doubles as the size exchange.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from tensordict import TensorDictBase

from ref.errors import (
    DtypeMismatchError,
    KeyMismatchError,
    RebatchError,
    ShapeMismatchError,
    UnsupportedSettingError,
    where,
)
from ref.metrics import fold_metrics

from ._agree import Failure, agree, raise_first_failure
from ._jagged import cached_seqlens, njt
from ._ops import concat
from ._prepare import DistSync, rearrange_micro_batches

__all__ = ["sync_micro_batch_count", "prepare_micro_batches_dp", "broadcast_from_last_stage", "gather_batch"]

_ALIGN = 16  # byte alignment of each tensor in the buffer (any dtype can view its slice)


def _comm_device(group: Any) -> torch.device:
    return (
        torch.device("cuda", torch.cuda.current_device())
        if dist.get_backend(group) == "nccl"
        else torch.device("cpu")
    )


def sync_micro_batch_count(count: int, group: Any = None) -> int:
    """The largest ``count`` over the ranks of ``group`` (an all-reduce MAX, as verl does)."""
    (agreed,) = DistSync(group).max([count])
    return agreed


class MicroBatches(NamedTuple):
    """``batches[m]`` is micro-batch ``m``; ``indices[m]`` its rows, or `PADDING` for a padding
    micro-batch."""

    batches: list[TensorDictBase]
    indices: list[Any]


def prepare_micro_batches_dp(
    data: TensorDictBase,
    *,
    max_token_len: int,
    group: Any = None,
    length_key: str | None = None,
    min_num_micro_batches: int | None = None,
    multiple_of: int | None = None,
    balance: bool = True,
    force_group_size: int = 1,
) -> MicroBatches:
    """Token-budget micro-batches with one count for every rank of the data-parallel ``group``.

    verl's rule (`ref.partition.plan_micro_batches`, counts agreed by all-reduces); a rank with fewer
    rows than the count gets padding micro-batches (a copy of its first row, or no rows if it has
    none), marked `PADDING` in ``indices``; ``postprocess_batch_func`` leaves their outputs, losses and
    metrics out. A row over budget on any rank raises `TokenBudgetError` on every rank.
    """
    batches, parts = rearrange_micro_batches(
        data,
        max_token_len,
        group if group is not None else dist.group.WORLD,
        multiple_of,
        True,
        min_num_micro_batches,
        balance,
        force_group_size,
        length_key=length_key,
        pad_micro_batches=True,
    )
    return MicroBatches(batches, parts)


# -- tensors as bytes -----------------------------------------------------------------------------


class _Slot(NamedTuple):
    """Where a tensor's bytes sit in the buffer; ``offsets`` is the slot of a jagged tensor's offsets,
    ``seqlens`` the sizes it caches (`torch_impl._jagged.cached_seqlens`), carried as they are."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int
    nbytes: int
    offsets: Any = None
    seqlens: Any = None


class _Skeleton(NamedTuple):
    tree: Any
    nbytes: int


def _pack(tree: Any) -> tuple[_Skeleton, torch.Tensor]:
    """``tree`` with its tensors (in dicts, lists, tuples) replaced by `_Slot`s, and all their bytes."""
    chunks: list[torch.Tensor] = []
    size = [0]

    def put(t: torch.Tensor) -> _Slot:
        t = t.detach().contiguous()
        raw = (
            t.reshape(-1).view(torch.uint8)
            if t.numel()
            else torch.zeros(0, dtype=torch.uint8, device=t.device)
        )
        start = size[0]
        pad = (-(start + raw.numel())) % _ALIGN
        chunks.append(raw)
        if pad:
            chunks.append(torch.zeros(pad, dtype=torch.uint8, device=t.device))
        size[0] += raw.numel() + pad
        return _Slot(t.dtype, tuple(t.shape), start, raw.numel())

    def walk(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            if x.is_nested:
                x = x.contiguous()
                values, offsets = put(x.values()), put(x.offsets())
                return values._replace(offsets=offsets, seqlens=cached_seqlens([x]))
            return put(x)
        if isinstance(x, Mapping):
            return {k: walk(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)) and not hasattr(x, "_fields"):
            return type(x)(walk(v) for v in x)
        return x

    skeleton = _Skeleton(walk(tree), size[0])
    buffer = (
        torch.cat([c.cpu() for c in chunks]) if chunks else torch.zeros(0, dtype=torch.uint8, device="cpu")
    )
    return skeleton, buffer


def _unpack(skeleton: _Skeleton, buffer: torch.Tensor) -> Any:
    def get(slot: _Slot) -> torch.Tensor:
        raw = buffer[slot.start : slot.start + slot.nbytes]
        if not slot.nbytes:
            return torch.empty(slot.shape, dtype=slot.dtype, device=buffer.device)
        return raw.view(slot.dtype).reshape(slot.shape).clone()

    def walk(x: Any) -> Any:
        if isinstance(x, _Slot):
            return njt(get(x), get(x.offsets), None, x.seqlens) if x.offsets is not None else get(x)
        if isinstance(x, Mapping):
            return {k: walk(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)) and not hasattr(x, "_fields"):
            return type(x)(walk(v) for v in x)
        return x

    return walk(skeleton.tree)


def _check_result(result: Any) -> None:
    """A result as `postprocess_batch` returns it (`UnsupportedSettingError` otherwise): a dict whose
    ``model_output`` is a dict of tensors, ``loss`` a list and ``metrics`` a dict (each optional)."""
    if not isinstance(result, Mapping):
        raise UnsupportedSettingError(f"a result must be a dict, got {type(result).__name__}")
    mo = result.get("model_output", {})
    if not isinstance(mo, Mapping):
        raise UnsupportedSettingError(f"model_output must be a dict, got {type(mo).__name__}")
    for key, value in mo.items():
        if not isinstance(value, torch.Tensor):
            raise UnsupportedSettingError(
                f"{where(key)}an output must be a tensor, got {type(value).__name__}"
            )
        if not value.is_nested and value.dim() == 0:
            raise ShapeMismatchError(
                f"{where(key)}a dense output needs a leading batch dimension, got a scalar"
            )
    if not isinstance(result.get("loss", []), list):
        raise UnsupportedSettingError(f"loss must be a list, got {type(result['loss']).__name__}")
    if not isinstance(result.get("metrics", {}), Mapping):
        raise UnsupportedSettingError(f"metrics must be a dict, got {type(result['metrics']).__name__}")


def _check_ranks_agree(skeletons: list[_Skeleton]) -> None:
    """Every rank's outputs can be joined (the same checks on every rank, from the same skeletons, so
    the same error everywhere): ranks with outputs have the same keys as the first of them, and each
    key the same layout, dtype and trailing shape (messages name the rank, not a micro-batch)."""
    outputs = [(r, s.tree.get("model_output", {})) for r, s in enumerate(skeletons)]
    outputs = [(r, o) for r, o in outputs if o]
    if not outputs:
        return
    r0, first = outputs[0]
    for r, mo in outputs[1:]:
        for key in first:
            if key not in mo:
                raise KeyMismatchError(f"{where(key, rank=r)}missing, while rank {r0} has it")
        for key in mo:
            if key not in first:
                raise KeyMismatchError(f"{where(key, rank=r)}present, while rank {r0} lacks it")
        for key, slot in mo.items():
            slot0, at = first[key], where(key, rank=r)
            kind, kind0 = ("jagged" if x.offsets is not None else "dense" for x in (slot, slot0))
            if kind != kind0:
                raise ShapeMismatchError(f"{at}layout {kind} differs from rank {r0}'s {kind0}")
            if slot.dtype != slot0.dtype:
                raise DtypeMismatchError(f"{at}dtype {slot.dtype} differs from rank {r0}'s {slot0.dtype}")
            if slot.shape[1:] != slot0.shape[1:]:
                raise ShapeMismatchError(
                    f"{at}trailing shape {tuple(slot.shape[1:])} differs from rank {r0}'s "
                    f"{tuple(slot0.shape[1:])}"
                )


def broadcast_from_last_stage(result: Mapping[str, Any], group: Any = None) -> dict[str, Any]:
    """The last pipeline stage's ``result`` on every rank of ``group`` (others pass ``{}``, as verl returns).

    The last stage checks and packs its result first; if that fails, every rank raises (see `agree`).
    """
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
    src = ranks[-1]
    device = _comm_device(group)
    holder: list[Any] = [None]
    failure: BaseException | None = None
    buffer = torch.zeros(0, dtype=torch.uint8, device="cpu")
    if dist.get_rank() == src:
        try:
            _check_result(result)
            skeleton, buffer = _pack(result)
            holder = [skeleton]
        except Exception as err:
            failure = err
            holder = [Failure(type(err).__name__, isinstance(err, RebatchError), str(err))]
    dist.broadcast_object_list(holder, src=src, group=group)
    statuses = [None] * len(ranks)
    statuses[-1] = holder[0]
    raise_first_failure(statuses, failure, ranks.index(dist.get_rank()))
    skeleton = holder[0]
    if dist.get_rank() != src:
        buffer = torch.empty(skeleton.nbytes, dtype=torch.uint8, device="cpu")
    payload = buffer.to(device, non_blocking=True)
    dist.broadcast(payload, src=src, group=group)
    return _unpack(skeleton, payload.cpu())


def gather_batch(result: Mapping[str, Any], group: Any = None) -> dict[str, Any]:
    """Every rank's ``result`` joined, in rank order, on every rank of ``group``: each key's rows of all
    ranks (jagged values of any length: sizes travel in the skeletons first), the losses, the metrics.

    Each rank checks and packs its result; the skeletons (or a rank's error) are exchanged, and every
    rank checks that the ranks' outputs agree (keys, layouts, dtypes, trailing shapes) before any data
    moves: a failure on one rank, or a disagreement, raises the same error on every rank."""
    world = dist.get_world_size(group)
    device = _comm_device(group)
    mine: Any = None
    failure: BaseException | None = None
    buffer = torch.zeros(0, dtype=torch.uint8, device="cpu")
    try:
        _check_result(result)
        mine, buffer = _pack(result)
    except Exception as err:
        failure = err
    skeletons = agree(mine, failure, group)
    _check_ranks_agree(skeletons)
    largest = max(s.nbytes for s in skeletons)
    padded = torch.zeros(largest, dtype=torch.uint8, device=device)
    padded[: buffer.numel()] = buffer.to(device, non_blocking=True)
    gathered = [torch.empty(largest, dtype=torch.uint8, device=device) for _ in range(world)]
    dist.all_gather(gathered, padded, group=group)
    trees = [_unpack(s, g[: s.nbytes].cpu()) for s, g in zip(skeletons, gathered, strict=True)]
    outputs = [t.get("model_output", {}) for t in trees]
    keys = next((list(o) for o in outputs if o), [])
    model_output = {k: concat([o[k] for o in outputs if o], key=k) for k in keys}
    losses = [loss for t in trees for loss in t.get("loss", [])]
    metrics = fold_metrics(t.get("metrics", {}) for t in trees)
    return {"model_output": model_output, "loss": losses, "metrics": metrics}
