"""`concat`, `take`, `restore`, `split` on jagged nested tensors, dense tensors and TensorDicts.

Same names and meanings as in ``ref``; shapes ``[B, (j), *F]`` (jagged) or ``[B, *F]`` (dense).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any, NamedTuple, TypeVar, overload

import numpy as np
import torch
from tensordict import TensorDictBase

from ref.errors import RowIndexError, UnsupportedSettingError

from ._bits import as_bits, from_bits
from ._entry import entry
from ._jagged import (
    Gather,
    Seqlens,
    cached_seqlens,
    gather_values,
    plan_gather,
    result_njt,
    seqlens_of,
    size_cache,
)
from ._kernels import assemble
from ._parts import DensePart, JaggedPart, Part, check_parts, numpy_bridge, unpack
from ._permutation import check_permutation
from ._tally import skipped

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


class _Gathers:
    """One call's checked ``rows`` (int64, on the host or where given) of a tensor of ``n`` rows, and what
    derives from them alone, made once a call, never once a field: their copy on each device, whether
    they are a permutation (off the CPU, where that keeps a field's values and cached sizes), and one
    gather plan (`plan_gather`) for each jagged field's offsets tensor, which the fields on it share,
    with the cut of its result into micro-batches (`_Cut`)."""

    def __init__(self, rows: torch.Tensor, n: int, permutation: bool | None = None) -> None:
        self.rows = rows
        self.n = n
        self._on: dict[torch.device, torch.Tensor] = {rows.device: rows}
        self._permutation = permutation  # where the caller checked it (split's partitions), else found once
        # by offsets tensor: the part planned first (held, so that its offsets' id stays theirs) and its plan
        self._plans: dict[tuple[Any, ...], tuple[JaggedPart, Gather]] = {}
        self._handed: set[int] = set()  # the plans whose offsets a result already holds
        self._cuts: dict[int, _Cut] = {}

    def on(self, device: torch.device) -> torch.Tensor:
        """The rows on ``device`` (an upload from the host, once a call; a download blocks)."""
        if device not in self._on:
            self._on[device] = self.rows.to(device, non_blocking=self.rows.is_cpu)
        return self._on[device]

    def is_permutation(self) -> bool:
        """Whether the rows hold each of ``range(n)`` once; False off the CPU (unread)."""
        if self._permutation is None:
            rows = self.rows
            self._permutation = (
                rows.device.type == "cpu"
                and rows.numel() == self.n
                and bool((torch.bincount(rows, minlength=self.n) == 1).all())
            )
        return self._permutation

    def plan(self, x: JaggedPart, source: Any, key: Any = None, total: int | None = None) -> Gather:
        """The gather plan of field ``x`` (``source``: the field as given, whose cached sizes a permutation
        keeps off the CPU): its offsets tensor's, made and checked by its first field of as many values;
        on the CPU, that of offsets equal to its own (the same checks' result)."""
        on_host = x.values.device.type == "cpu"
        if total is None and not on_host and self.is_permutation():
            total = int(x.values.shape[0])  # a permutation keeps the values: no read of the device
        if total is None and x.values.device.type == "meta":
            raise UnsupportedSettingError(
                f"take of rows that are not a permutation of range({x.rows}) on the meta device: the "
                "result's number of values depends on the row lengths, which a meta tensor does not hold"
            )
        kept = not on_host and total == x.values.shape[0] and self.is_permutation()
        seqlens = cached_seqlens([source]) if kept else None
        group = (id(x.offsets), int(x.values.shape[0]), total, seqlens)
        found = self._plans.get(group)
        if found is None and on_host:  # another offsets tensor with the same values: its plan, no read
            found = next((f for g, f in self._plans.items() if g[1:] == group[1:] and _equal(f[0], x)), None)
        if found is None:
            found = x, plan_gather(x, self.on(x.values.device), total, seqlens, key)
        elif not on_host:  # this field's offsets trusted too, and counted (`check_offsets`)
            skipped("skipped_device_offsets")
        self._plans.setdefault(group, (x, found[1]))
        return found[1]

    def offsets(self, plan: Gather) -> torch.Tensor:
        """``plan``'s result offsets for one more field: the plan's own for its first, a copy for each
        further one (each field's offsets its own, as each trainer's own functions make them)."""
        if id(plan) in self._handed:
            return plan.offsets.clone()
        self._handed.add(id(plan))
        return plan.offsets

    def cut(self, plan: Gather, sizes: list[int]) -> _Cut:
        """``plan``'s result cut into pieces of ``sizes`` rows (`_Cut`), once a plan."""
        if id(plan) not in self._cuts:
            self._cuts[id(plan)] = _Cut.of(plan, sizes)
        return self._cuts[id(plan)]


def _equal(a: JaggedPart, b: JaggedPart) -> bool:
    """Whether two jagged fields' offsets, both on the CPU, hold the same values."""
    return (
        a.offsets.device.type == "cpu"
        and a.offsets.shape == b.offsets.shape
        and torch.equal(a.offsets, b.offsets)
    )


class _Cut(NamedTuple):
    """A gather plan's result cut into consecutive pieces (`_Gathers.cut`): for each piece its first and
    end value, its first and end row in the result, and its cached sizes (`Seqlens`, and their
    `size_cache`, which the pieces of the plan's fields share)."""

    pieces: list[tuple[int, int, int, int, Seqlens, dict[str, torch.Tensor]]]

    @classmethod
    def of(cls, plan: Gather, sizes: list[int]) -> _Cut:
        """The pieces of ``sizes`` rows from the plan's offsets on the host (read once, where they are on
        a device: one synchronisation a plan)."""
        host = plan.host
        if host is None:
            host = (
                plan.offsets.cpu().numpy()
                if numpy_bridge()
                else np.array(plan.offsets.tolist(), dtype=np.int64)
            )
        lengths = np.diff(host)
        row_bounds = list(itertools.accumulate(sizes, initial=0))
        at = host[row_bounds].tolist()  # each piece's first value, and the end
        pieces = list(zip(at, at[1:], row_bounds, row_bounds[1:], strict=False))  # consecutive bounds
        seqlens = [seqlens_of(lengths[r:e]) for _, _, r, e in pieces]
        return cls([(*bounds, s, size_cache(s)) for bounds, s in zip(pieces, seqlens, strict=True)])


def _take_part(x: Part, call: _Gathers, source: Any = None, key: Any = None) -> torch.Tensor:
    """Field ``x`` at the call's rows: a dense one by one ``index_select``, a jagged one by its offsets'
    plan and one gather of its values."""
    if isinstance(x, DensePart):
        return from_bits(as_bits(x.values).index_select(0, call.on(x.values.device)), x.values.dtype)
    plan = call.plan(x, source, key)
    return result_njt(gather_values(x.values, plan), call.offsets(plan), plan.seqlens, plan.sizes)


def _tensor_keys(td: TensorDictBase) -> list[Any]:
    return [k for k in td.keys() if isinstance(td.get(k), torch.Tensor)]


def _take_tensordict(td: TensorDictBase, rows: Any) -> TensorDictBase:
    idx = _checked_rows(rows, int(td.batch_size[0]), torch.device("cpu"))
    call = _Gathers(idx, int(td.batch_size[0]))
    keys = _tensor_keys(td)
    fields = {k: _take_part(unpack(td.get(k), k), call, td.get(k), k) for k in keys}
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
    no wrap-around). Jagged fields are gathered with one ``index_select`` each, a TensorDict's fields on
    one offsets tensor (or, on the CPU, equal ones) planned once (`plan_gather`); each field's result
    holds offsets of its own.
    """
    if isinstance(x, TensorDictBase):
        return _take_tensordict(x, rows)
    part = unpack(x)
    device = rows.device if isinstance(rows, torch.Tensor) else torch.device("cpu")
    return _take_part(part, _Gathers(_checked_rows(rows, part.rows, device), part.rows), x)


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
    views per partition; a TensorDict's jagged fields on one offsets tensor (or, on the CPU, equal
    ones) share one plan of that gather and of the cut. ``partitions`` must flatten to a permutation of
    ``range(B)``.
    """
    if isinstance(x, TensorDictBase):
        perm = check_permutation(partitions, int(x.batch_size[0]))
        return _split_tensordict(x, perm, partitions)
    part = unpack(x)
    perm = check_permutation(partitions, part.rows)
    return _split_part(part, _Gathers(perm, part.rows, permutation=True), [len(p) for p in partitions], x)


def _split_part(
    part: Part, call: _Gathers, sizes: list[int], source: Any, key: Any = None
) -> list[torch.Tensor]:
    """One field's micro-batches: its rows in micro-batch order (the call's permutation), gathered once,
    then cut into pieces of ``sizes`` rows (views of the gathered values; a jagged field's pieces cut
    where its offsets' plan cuts them, `_Gathers.cut`)."""
    if isinstance(part, DensePart):
        return list(torch.split(_take_part(part, call), sizes))
    if part.offsets.device.type == "meta":
        raise UnsupportedSettingError(
            "split on the meta device: each micro-batch's number of values depends on the row lengths, "
            "which a meta tensor does not hold"
        )
    plan = call.plan(part, source, key, int(part.values.shape[0]))  # a permutation keeps the values
    values = gather_values(part.values, plan)
    return [
        result_njt(values[a:b], plan.offsets[r : e + 1] - a, seqlens, cache)
        for a, b, r, e, seqlens, cache in call.cut(plan, sizes).pieces
    ]


def _split_tensordict(
    td: TensorDictBase, perm: torch.Tensor, partitions: Sequence[Sequence[int]]
) -> list[TensorDictBase]:
    """Each tensor field gathered once for all partitions and cut, fields on one offsets tensor planned
    once; other fields indexed per partition."""
    sizes = [len(p) for p in partitions]
    keys = _tensor_keys(td)
    call = _Gathers(perm, int(td.batch_size[0]), permutation=True)
    cut = {k: _split_part(unpack(td.get(k), k), call, sizes, td.get(k), k) for k in keys}
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
