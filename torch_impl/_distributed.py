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

from ref.metrics import fold_metrics
from ref.partition import plan_micro_batches
from ref.structure import PADDING

from ._jagged import njt
from ._ops import concat, split, take
from ._prepare import DistSync, row_lengths

__all__ = ["sync_micro_batch_count", "prepare_micro_batches_dp", "broadcast_from_last_stage", "gather_batch"]

_ALIGN = 16  # byte alignment of each tensor in the buffer (any dtype can view its slice)


def _comm_device(group: Any) -> torch.device:
    return (
        torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else torch.device("cpu")
    )


def sync_micro_batch_count(count: int, group: Any = None) -> int:
    """The largest ``count`` over the ranks of ``group`` (an all-reduce MAX, as verl does)."""
    (agreed,) = DistSync(group).max([count])
    return agreed


class MicroBatches(NamedTuple):
    """``batches[m]`` is micro-batch ``m``; ``indices[m]`` its rows, or `PADDING` for a padding micro-batch."""

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
    lengths_t = row_lengths(data, length_key)
    parts: list[Any] = plan_micro_batches(
        lengths_t.tolist(),
        max_token_len,
        num_batches_divided_by=multiple_of,
        min_num_micro_batch=min_num_micro_batches,
        use_dynamic_bsz_balance=balance,
        force_group_size=force_group_size,
        sync=DistSync(group),
        pad_to_count=True,
    )
    real = [p for p in parts if p is not PADDING]
    pieces = iter(split(data, real)) if real else iter(())
    filler = take(data, [0] if lengths_t.numel() else [])
    return MicroBatches([filler if p is PADDING else next(pieces) for p in parts], parts)


# -- tensors as bytes -----------------------------------------------------------------------------


class _Slot(NamedTuple):
    """Where a tensor's bytes sit in the buffer; ``offsets`` is the slot of a jagged tensor's offsets."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int
    nbytes: int
    offsets: Any = None


class _Skeleton(NamedTuple):
    tree: Any
    nbytes: int


def _pack(tree: Any) -> tuple[_Skeleton, torch.Tensor]:
    """``tree`` with its tensors (in dicts, lists, tuples) replaced by `_Slot`s, and all their bytes."""
    chunks: list[torch.Tensor] = []
    size = [0]

    def put(t: torch.Tensor) -> _Slot:
        t = t.detach().contiguous()
        raw = t.reshape(-1).view(torch.uint8) if t.numel() else torch.zeros(0, dtype=torch.uint8, device=t.device)
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
                return values._replace(offsets=offsets)
            return put(x)
        if isinstance(x, Mapping):
            return {k: walk(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)) and not hasattr(x, "_fields"):
            return type(x)(walk(v) for v in x)
        return x

    skeleton = _Skeleton(walk(tree), size[0])
    buffer = torch.cat([c.cpu() for c in chunks]) if chunks else torch.zeros(0, dtype=torch.uint8)
    return skeleton, buffer


def _unpack(skeleton: _Skeleton, buffer: torch.Tensor) -> Any:
    def get(slot: _Slot) -> torch.Tensor:
        raw = buffer[slot.start : slot.start + slot.nbytes]
        if not slot.nbytes:
            return torch.empty(slot.shape, dtype=slot.dtype, device=buffer.device)
        return raw.view(slot.dtype).reshape(slot.shape).clone()

    def walk(x: Any) -> Any:
        if isinstance(x, _Slot):
            return njt(get(x), get(x.offsets)) if x.offsets is not None else get(x)
        if isinstance(x, Mapping):
            return {k: walk(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)) and not hasattr(x, "_fields"):
            return type(x)(walk(v) for v in x)
        return x

    return walk(skeleton.tree)


def broadcast_from_last_stage(result: Mapping[str, Any], group: Any = None) -> dict[str, Any]:
    """The last pipeline stage's ``result`` on every rank of ``group`` (others pass ``{}``, as verl returns)."""
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
    src = ranks[-1]
    device = _comm_device(group)
    holder: list[Any] = [None]
    if dist.get_rank() == src:
        skeleton, buffer = _pack(result)
        holder = [skeleton]
    dist.broadcast_object_list(holder, src=src, group=group)
    skeleton = holder[0]
    if dist.get_rank() != src:
        buffer = torch.empty(skeleton.nbytes, dtype=torch.uint8)
    payload = buffer.to(device)
    dist.broadcast(payload, src=src, group=group)
    return _unpack(skeleton, payload.cpu())


def gather_batch(result: Mapping[str, Any], group: Any = None) -> dict[str, Any]:
    """Every rank's ``result`` joined, in rank order, on every rank of ``group``: each key's rows of all
    ranks (jagged values of any length: sizes travel in the skeletons first), the losses, the metrics."""
    world = dist.get_world_size(group)
    device = _comm_device(group)
    skeleton, buffer = _pack(result)
    skeletons: list[Any] = [None] * world
    dist.all_gather_object(skeletons, skeleton, group=group)
    largest = max(s.nbytes for s in skeletons)
    mine = torch.zeros(largest, dtype=torch.uint8, device=device)
    mine[: buffer.numel()] = buffer.to(device)
    gathered = [torch.empty(largest, dtype=torch.uint8, device=device) for _ in range(world)]
    dist.all_gather(gathered, mine, group=group)
    trees = [_unpack(s, g[: s.nbytes].cpu()) for s, g in zip(skeletons, gathered, strict=True)]
    outputs = [t.get("model_output", {}) for t in trees]
    keys = next((list(o) for o in outputs if o), [])
    model_output = {k: concat([o[k] for o in outputs if o], key=k) for k in keys}
    losses = [loss for t in trees for loss in t.get("loss", [])]
    metrics = fold_metrics(t.get("metrics", {}) for t in trees)
    return {"model_output": model_output, "loss": losses, "metrics": metrics}
