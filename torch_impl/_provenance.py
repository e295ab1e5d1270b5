"""Exact provenance in torch: what rebatch's split handed out for each batch, checked by the restore.

``docs/spec.md``, "Exact provenance" (the rule and the error's words are `ref.provenance`'s). The split
(`torch_impl._prepare`, or a trainer's own split observed in shadow mode) `record`\\ s, for the batch it
split (keyed by identity, held weakly: the record goes with the batch), each micro-batch's ragged sizes
(the nested ints of its jagged fields, which torch keeps through device and dtype moves, ``detach``,
``clone`` and ``nested_tensor_from_jagged(v, moved.offsets())``) and the indices it returned. The restore
finds the record from its ``data`` (`recorded`) and `Provenance.judge`\\ s the call before any data moves:
the indices must be the split's, and an output whose jagged keys carry micro-batch ``q``'s nested int must
sit in slot ``q``. Host-side facts only: no device read. Unproven (never an error) where no output carries
a recorded nested int. `provenance_stats` counts it.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Mapping, Sequence
from operator import attrgetter, index
from typing import Any

import numpy as np
import torch

from rebatch_startup import ForkSafeLock
from ref.errors import RebatchError
from ref.provenance import check_indices, stray_indices, stray_output
from ref.structure import PADDING

from ._parts import JaggedPart, NestedTensor, Part
from ._permutation import as_bytes, check_permutation
from ._tally import Tally
from ._witness import witness_config

__all__ = ["UNRECORDED", "Provenance", "check_latest", "observe_split", "provenance_stats", "record", "recorded"]

_lock = ForkSafeLock()  # a forked child finds it free (`rebatch_startup.renew_at_fork`)
_records: dict[int, Provenance] = {}  # id(batch) -> its latest split's record (dropped with the batch)
_here = threading.local()  # ``latest``: this thread's latest split (`check_latest`)
_RAGGED = attrgetter("ragged")  # a `JaggedPart`'s nested int
#: The counters (zeroed in a forked child: `torch_impl._tally.Tally`).
_STATS = Tally(("calls_proven", "calls_partly_proven", "calls_unproven", "keys_proven", "keys_unproven"))


def _ragged(x: Any) -> Any:
    """A jagged nested tensor's ragged size, the nested int (a host object torch keeps through moves),
    else None."""
    return x._size[1] if isinstance(x, NestedTensor) and x._ragged_idx == 1 else None


class Provenance:
    """One split's record: ``tags`` (each micro-batch's nested ints -> its slot, padding left out),
    ``sizes`` (each real micro-batch's rows) and ``flat`` (its indices flattened, None for fixed-size
    chunks: the outputs in order are the batch). Read-only once made; shared by threads."""

    __slots__ = ("__weakref__", "batch", "flat", "flat_bytes", "kept", "sizes", "slots", "tags")

    def __init__(self, batch: Any, micro_batches: Sequence[Any], indices: Sequence[Any] | None) -> None:
        key = id(batch)
        self.batch = weakref.ref(batch, lambda ref: _forget(key, ref))
        real = [i for i, p in enumerate(indices) if p is not PADDING] if indices is not None else None
        kept = [micro_batches[i] for i in real] if real is not None else list(micro_batches)
        fields = ((m, v) for m, mb in enumerate(kept) for v in (mb.values() if hasattr(mb, "values") else ()))
        self.kept = [(m, size) for m, v in fields if (size := _ragged(v)) is not None]  # each micro-batch's nested ints
        self.tags = {id(size): m for m, size in self.kept}  # id(nested int) -> slot (``kept`` holds them: ids unique)
        self.sizes: tuple[int, ...] = tuple(int(mb.batch_size[0]) if mb.batch_size else 0 for mb in kept)
        self.slots: list[int | None] = list(range(len(kept)))  # each output's own slot
        parts = [indices[i] for i in real] if real is not None and indices is not None else None
        values = None if parts is None else map(index, itertools.chain.from_iterable(parts))  # integers only
        flat = None if values is None else np.fromiter(values, np.int64, sum(self.sizes))
        if flat is not None and not np.array_equal(np.sort(flat), np.arange(len(flat))):
            raise ValueError("the split's indices are not a permutation")  # its calls unrecorded (`record`)
        self.flat, self.flat_bytes = flat, None if flat is None else flat.tobytes()

    def rows(self) -> list[list[int]]:
        """The split's indices, padding left out (for the error path)."""
        flat = self.flat.tolist() if self.flat is not None else []
        return [flat[a:b] for a, b in itertools.pairwise(itertools.accumulate(self.sizes, initial=0))]

    def judge(
        self, checked: Mapping[Any, Sequence[Part]], indices: Any, perm: torch.Tensor | None, host: Any = None
    ) -> tuple[bool, RebatchError | None]:
        """``(proven, error)`` of a call (``checked``: each key's checked parts, one an output, padding
        left out; ``perm``: its checked permutation, None without dynamic batch size, ``host`` its NumPy
        view where read already: `torch_impl._rows.CallRows.given`): the indices against
        the split's, then each output's nested ints (its jagged keys' `JaggedPart.ragged`; dense keys
        carry none) against its slot; proven where every output holds a recorded nested int of its own
        slot. The error is returned, for the call to raise in the order of checks."""
        split = None if self.flat is None else (self.sizes, self.flat_bytes)  # with dynamic batch size, the split's
        if split and perm is not None and (tuple(map(len, indices or ())), as_bytes(perm, host)) != split:
            try:
                check_indices([list(p) for p in indices or ()], self.rows())
            except RebatchError as err:
                return False, err
        keys = [key for key, p in checked.items() if p and type(p[0]) is JaggedPart]  # dense keys carry none
        slots = [[*map(self.tags.get, map(id, map(_RAGGED, checked[key])))] for key in keys]  # None: not the split's
        outputs = len(next(iter(checked.values()), ()))
        proven = outputs if keys and slots.count(self.slots) == len(keys) else 0  # the common case at once
        for m in range(outputs) if not proven else ():
            for key, s in zip(keys, slots, strict=True):
                if s[m] is not None and s[m] != m:
                    return False, stray_output(key, m, s[m])
            proven += any(s[m] == m for s in slots)
        _count(proven, outputs, proven * len(checked), (outputs - proven) * len(checked))
        return bool(outputs) and proven == outputs, None


def _forget(key: int, ref: weakref.ref[Any]) -> None:
    """The batch ``ref`` died: its record goes (unless a newer batch of the same id has one already)."""
    with _lock:
        rec = _records.get(key)
        if rec is not None and rec.batch is ref:
            del _records[key]


def record(batch: Any, micro_batches: Sequence[Any], indices: Sequence[Any] | None) -> None:
    """What a split of ``batch`` handed out: its ``micro_batches`` and ``indices`` (None: fixed-size
    chunks in order), the latest split of ``batch`` and of this thread. A batch that cannot be held
    weakly, or micro-batches without a batch size, are left unrecorded (their calls stay unproven)."""
    try:
        rec = Provenance(batch, micro_batches, indices)
    except (TypeError, AttributeError, ValueError, IndexError, OverflowError):  # not weakly held, odd, no permutation
        return
    with _lock:
        _records[id(batch)] = rec
    _here.latest = rec


def observe_split(result: Any, *args: Any, **kwargs: Any) -> None:
    """A trainer's own split of its first argument (``data`` or ``batch``, by keyword too, as verl's
    engines pass it) returned ``result`` (``(micro_batches, indices)``): recorded as rebatch's split
    records its own (shadow mode, `torch_impl.integrations`); anything else, unrecorded. Never raises."""
    batch = args[0] if args else kwargs.get("data", kwargs.get("batch"))
    if batch is not None and isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], list | tuple):
        record(batch, *result)


def recorded(batch: Any) -> Provenance | _Unrecorded:
    """The record of the latest split of ``batch`` by rebatch (or observed in shadow mode), or
    `UNRECORDED`."""
    rec = _records.get(id(batch)) if batch is not None else None
    return rec if rec is not None and rec.batch() is batch else UNRECORDED


def check_latest(partitions: Sequence[Any], num_rows: int) -> None:
    """`restore_dynamic_batch`'s check: ``partitions`` against this thread's latest split, where that
    split's batch is alive and its micro-batches have the same sizes (else unproven, never an error)."""
    rec = getattr(_here, "latest", None)
    if not witness_config()[0] or rec is None or rec.flat is None or rec.batch() is None or sum(rec.sizes) != num_rows:
        return
    if any(p is PADDING for p in partitions) or tuple(len(p) for p in partitions) != rec.sizes:
        return
    try:
        given = np.fromiter(itertools.chain.from_iterable(partitions), dtype=np.int64, count=num_rows)
    except (TypeError, ValueError, OverflowError):
        return  # not integers: the restore's own checks say so
    if np.array_equal(given, rec.flat):
        _count(1, 1, 0, 0)
        return
    check_permutation(partitions, num_rows)  # a structural defect first, as the order of checks says
    check_indices([list(p) for p in partitions], rec.rows())
    raise stray_indices(0, None, num_rows, num_rows)  # unreachable: the values differ somewhere


def _count(proven: int, outputs: int, keys_proven: int, keys_unproven: int) -> None:
    with _STATS.lock:
        stats = _STATS.counts
        if not outputs or proven == outputs:
            stats["calls_proven" if outputs else "calls_unproven"] += 1
        else:
            stats["calls_partly_proven" if proven else "calls_unproven"] += 1
        stats["keys_proven"] += keys_proven
        stats["keys_unproven"] += keys_unproven


class _Unrecorded:
    """The record of a drop-in call whose ``data`` no split of rebatch's recorded: unproven, counted."""

    def judge(self, checked: Mapping[Any, Sequence[Any]], *_: Any) -> tuple[bool, None]:
        _count(0, (outputs := len(next(iter(checked.values()), ()))) or 1, 0, outputs * len(checked))
        return False, None


#: `recorded`'s answer for verl's drop-in where nothing was recorded.
UNRECORDED = _Unrecorded()


def provenance_stats(reset: bool = False) -> dict[str, int]:
    """What exact provenance proved in this process: ``calls_proven`` (every output in its slot, the
    indices the split's), ``calls_partly_proven``, ``calls_unproven`` (no record, or no output carrying a
    recorded nested int: the witness alone applies), ``keys_proven`` and ``keys_unproven``."""
    return _STATS.read(reset)
