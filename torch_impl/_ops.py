"""`concat`, `take`, `restore`, `split` on jagged nested tensors, dense tensors and TensorDicts.

Same names and meanings as in ``ref``; shapes ``[B, (j), *F]`` (jagged) or ``[B, *F]`` (dense).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any, TypeVar, overload

import numpy as np
import torch
from tensordict import TensorDictBase

from ref.errors import RowIndexError, UnsupportedSettingError

from ._bits import as_bits, from_bits
from ._entry import entry
from ._jagged import cached_seqlens, gather_jagged, njt, seqlens_of
from ._kernels import assemble
from ._parts import DensePart, Part, check_parts, numpy_bridge, unpack
from ._permutation import check_permutation

__all__ = ["concat", "take", "restore", "split"]

T = TypeVar("T", torch.Tensor, TensorDictBase)


@entry
def concat(parts: Sequence[torch.Tensor], *, key: Any = None) -> torch.Tensor:
    """``out = [row for p in parts for row in p.unbind()]``: micro-batch order, then row order.

    ``parts``: jagged ``[b_m, (j), *F]`` or dense ``[b_m, *F]``, one layout, dtype, device and trailing
    shape (checked). Returns ``[sum(b_m), (j), *F]`` or ``[sum(b_m), *F]``.
    """
    checked = check_parts(parts, key)
    if not checked:
        raise UnsupportedSettingError("concat needs at least one part, got none")
    return assemble(checked, None, key, parts)


def _checked_rows(rows: Any, n: int, device: torch.device) -> torch.Tensor:
    """``rows`` as int64 on ``device``; each an integer in ``range(n)`` (`RowIndexError`, no wrap-around)."""
    try:
        r = rows if isinstance(rows, torch.Tensor) else torch.as_tensor(rows, device="cpu")
    except (OverflowError, RuntimeError, ValueError, TypeError):
        r = None
    if r is None or r.dtype == torch.uint64:  # past int64 (never wrapped), or not numbers at all
        listed = rows.tolist() if isinstance(rows, torch.Tensor) else list(rows)
        for j, i in enumerate(listed):
            if isinstance(i, bool) or not isinstance(i, int | np.integer):
                raise RowIndexError(f"position {j}: row index {i!r} is not an integer")
            if not 0 <= int(i) < n:
                raise RowIndexError(
                    f"position {j}: row index {int(i)} is out of range for {n} rows (no wrap-around)"
                )
        r = torch.tensor([int(i) for i in listed], dtype=torch.int64, device="cpu")
    if r.dim() != 1:
        raise RowIndexError(f"rows must be 1-D, got shape {tuple(r.shape)}")
    if r.numel() and (r.dtype == torch.bool or r.dtype.is_floating_point or r.dtype.is_complex):
        raise RowIndexError(f"rows must be integers, got dtype {r.dtype}")
    r = r.to(torch.int64)
    if r.numel() and r.device.type == "cpu":
        bad = (r < 0) | (r >= n)
        if bool(bad.any()):
            j = int(bad.nonzero()[0, 0])
            raise RowIndexError(
                f"position {j}: row index {int(r[j])} is out of range for {n} rows (no wrap-around)"
            )
    return r.to(device, non_blocking=r.is_cpu)  # an upload waits for nothing; a download blocks


def _is_permutation(rows: torch.Tensor, n: int) -> bool:
    """``rows`` (checked, in ``range(n)``) hold each of ``range(n)`` once; False off the CPU (unread)."""
    return (
        rows.device.type == "cpu"
        and rows.numel() == n
        and bool((torch.bincount(rows, minlength=n) == 1).all())
    )


def _take_part(x: Part, rows: Any, *, total: int | None = None, source: Any = None) -> torch.Tensor:
    host = _checked_rows(rows, x.rows, rows.device if isinstance(rows, torch.Tensor) else torch.device("cpu"))
    idx = host.to(x.values.device, non_blocking=True) if host.device != x.values.device else host
    if isinstance(x, DensePart):
        return from_bits(as_bits(x.values).index_select(0, idx), x.values.dtype)
    if total is None and x.values.device.type != "cpu" and _is_permutation(host, x.rows):
        total = int(x.values.shape[0])  # a permutation keeps the values: no read of the device
    if total is None and x.values.device.type == "meta":
        raise UnsupportedSettingError(
            f"take of rows that are not a permutation of range({x.rows}) on the meta device: the result's "
            "number of values depends on the row lengths, which a meta tensor does not hold"
        )
    # off the CPU a permutation keeps the rows, so the sizes ``source`` (as given) caches
    kept = x.values.device.type != "cpu" and total == x.values.shape[0] and _is_permutation(host, x.rows)
    return gather_jagged(x, idx, total, cached_seqlens([source]) if kept else None)


def _tensor_keys(td: TensorDictBase) -> list[Any]:
    return [k for k in td.keys() if isinstance(td.get(k), torch.Tensor)]


def _take_tensordict(td: TensorDictBase, rows: Any) -> TensorDictBase:
    idx = _checked_rows(rows, int(td.batch_size[0]), torch.device("cpu"))
    keys = _tensor_keys(td)
    fields = {k: _take_part(unpack(td.get(k), k), idx, source=td.get(k)) for k in keys}
    if len(keys) == len(list(td.keys())):
        return type(td)(fields, batch_size=[idx.numel(), *td.batch_size[1:]], device=td.device)
    out = td.exclude(*keys)[idx]
    for k, v in fields.items():
        out.set(k, v)
    return out


@entry
def take(x: T, rows: Any) -> T:
    """``out = [x.unbind()[i] for i in rows]`` (jagged), ``x[rows]`` (dense), or each field so (TensorDict).

    ``rows``: ``[R]`` integers in ``range(B)`` (`RowIndexError` for a negative or out-of-range one:
    no wrap-around). Jagged fields are gathered with one ``index_select`` each.
    """
    if isinstance(x, TensorDictBase):
        return _take_tensordict(x, rows)
    return _take_part(unpack(x), rows, source=x)


@entry
def restore(x: torch.Tensor, partitions: Any) -> torch.Tensor:
    """Rows of ``x`` (micro-batch order) back in original order: output row ``perm[k]`` is input row ``k``.

    With ``perm = [i for p in partitions for i in p]``: ``out = [x.unbind()[perm.index(i)] for i in
    range(B)]``.
    ``partitions`` must flatten to a permutation of ``range(B)`` (`NotAPermutationError`).
    """
    (part,) = check_parts([x])
    return assemble([part], check_permutation(_as_partitions(partitions), part.rows), None, [x])


def _as_partitions(partitions: Any) -> Any:
    """``partitions``, or ``perm`` itself (one 1-D integer array or tensor, as ``docs/spec.md`` allows
    `restore` to take it) as its one partition: `ref.restore`'s forms."""
    flat = hasattr(partitions, "__array__") and not isinstance(partitions, list)  # a tensor or an array
    if flat and getattr(partitions, "ndim", None) == 1 and str(getattr(partitions, "dtype", "")) != "object":
        return [partitions]
    return partitions


@overload
def split(x: TensorDictBase, partitions: Sequence[Sequence[int]]) -> list[TensorDictBase]: ...
@overload
def split(x: torch.Tensor, partitions: Sequence[Sequence[int]]) -> list[torch.Tensor]: ...
@entry
def split(
    x: torch.Tensor | TensorDictBase, partitions: Sequence[Sequence[int]]
) -> list[torch.Tensor] | list[TensorDictBase]:
    """``out = [take(x, p) for p in partitions]``: the micro-batches of ``x``, the inverse of `restore`.

    One gather per field for all partitions together (the rows in micro-batch order), then cheap
    views per partition. ``partitions`` must flatten to a permutation of ``range(B)``.
    """
    if isinstance(x, TensorDictBase):
        perm = check_permutation(partitions, int(x.batch_size[0]))
        return _split_tensordict(x, perm, partitions)
    part = unpack(x)
    perm = check_permutation(partitions, part.rows)
    return _cut(_whole_in_order(part, perm, x), [len(p) for p in partitions])


def _whole_in_order(part: Part, perm: torch.Tensor, source: Any) -> torch.Tensor:
    """All rows in micro-batch order, one gather (a permutation keeps the number of values)."""
    return _take_part(
        part, perm, total=None if isinstance(part, DensePart) else part.values.shape[0], source=source
    )


def _cut(x: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
    """``x`` cut into consecutive pieces of ``sizes`` rows (views of its data)."""
    part = unpack(x)
    if isinstance(part, DensePart):
        return list(torch.split(x, sizes))
    row_bounds = list(itertools.accumulate(sizes, initial=0))
    if part.offsets.device.type == "meta":
        raise UnsupportedSettingError(
            "split on the meta device: each micro-batch's number of values depends on the row lengths, "
            "which a meta tensor does not hold"
        )
    # one read of the offsets: each piece's bounds and cached sizes
    offsets = (
        part.offsets.cpu().numpy() if numpy_bridge() else np.array(part.offsets.tolist(), dtype=np.int64)
    )
    lengths = np.diff(offsets)
    at = offsets[row_bounds].tolist()  # each piece's first value, and the end
    pieces = zip(at, at[1:], row_bounds, row_bounds[1:], strict=False)  # consecutive bounds
    return [
        njt(part.values[a:b], part.offsets[r : e + 1] - a, None, seqlens_of(lengths[r:e]))
        for a, b, r, e in pieces
    ]


def _split_tensordict(
    td: TensorDictBase, perm: torch.Tensor, partitions: Sequence[Sequence[int]]
) -> list[TensorDictBase]:
    """Each tensor field gathered once for all partitions and cut; other fields indexed per partition."""
    sizes = [len(p) for p in partitions]
    keys = _tensor_keys(td)
    cut = {k: _cut(_whole_in_order(unpack(td.get(k), k), perm, td.get(k)), sizes) for k in keys}
    rest = td.exclude(*keys) if len(keys) < len(list(td.keys())) else None
    out = []
    for i, part in enumerate(partitions):
        fields = {k: pieces[i] for k, pieces in cut.items()}
        if rest is None:
            out.append(type(td)(fields, batch_size=[sizes[i], *td.batch_size[1:]], device=td.device))
        else:
            piece = rest[torch.as_tensor(list(part), dtype=torch.int64, device="cpu")]
            for k, v in fields.items():
                piece.set(k, v)
            out.append(piece)
    return out
