"""Exact provenance in torch: what rebatch's splits handed out for each batch, checked by the restore.

``docs/spec.md``, "Exact provenance" (the rule and the error's words are `ref.provenance`'s). Each split
(`torch_impl._prepare`, or a trainer's own split observed in shadow mode) `record`\\ s a `Split`: its
name (a number of this process), each micro-batch's ragged sizes (the nested ints of its jagged fields,
which torch keeps through device and dtype moves, ``detach``, ``clone`` and
``nested_tensor_from_jagged(v, moved.offsets())``; a padding micro-batch's too) and the indices it
returned. A batch keeps its last `MAX_SPLITS` splits (keyed by identity, held weakly: the records go with
the batch) in one read-only `Provenance`, replaced whole on each record, so a restore reads it without a
lock. The restore finds it from its ``data`` (`recorded`) and `Provenance.judge`\\ s the call before any
data moves: the outputs' nested ints decide which split the call answers to, the indices must be that
split's, and an output whose jagged keys carry micro-batch ``q``'s nested int must sit in slot ``q``.
Host-side facts only: no device read. Unproven (never an error) where no output carries a recorded
nested int. `provenance_stats` counts it.
"""

from __future__ import annotations

import itertools
import weakref
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from operator import index
from typing import Any, cast

import numpy as np
import torch

from rebatch_startup.forksafe import ForkSafeLock
from ref._torch_private import ragged_idx, ragged_size
from ref.errors import RebatchError
from ref.provenance import check_indices, mixed_splits, stray_output
from ref.structure import PADDING

from ._parts import JaggedPart, NestedTensor, Part
from ._permutation import as_bytes, plain_int_lists, plain_int_lists_of
from ._switch import witness_config
from ._tally import Tally

__all__ = [
    "MAX_BATCHES",
    "MAX_SPLITS",
    "UNRECORDED",
    "Provenance",
    "Split",
    "check_restore",
    "observe_split",
    "provenance_stats",
    "record",
    "recorded",
]

#: The splits kept for one batch, newest last: an older split's restore is unproven, never an error.
MAX_SPLITS = 8
#: The batches whose splits are kept at once (the batch recorded longest ago goes first): a bound on
#: memory where a trainer keeps its batches alive.
MAX_BATCHES = 64

_lock = ForkSafeLock()  # a forked child finds it free (`rebatch_startup.renew_at_fork`)
#: id(batch) -> its live splits (dropped with the batch), the batch recorded longest ago first.
_batches: OrderedDict[int, Provenance] = OrderedDict()
_names = itertools.count()  # each split's name, in this process
#: The counters (zeroed in a forked child: `torch_impl._tally.Tally`).
_STATS = Tally(("calls_proven", "calls_partly_proven", "calls_unproven", "keys_proven", "keys_unproven"))

#: A tag: what a recorded nested int says of the output that carries it, ``(split's name, slot)``
#: (the slot among the split's real micro-batches, or `PADDING`).
Tag = tuple[int, Any]


def _ragged(x: Any) -> Any:
    """A jagged nested tensor's ragged size, the nested int (a host object torch keeps through moves),
    else None."""
    if isinstance(x, NestedTensor) and ragged_idx(x) == 1:
        return ragged_size(x)
    return None


class Split:
    """One split's record: ``name``; ``slots`` (each micro-batch's slot among the real ones, or
    `PADDING`); ``sizes`` (each real micro-batch's rows); ``flat`` (its indices flattened, padding
    left out; for fixed-size chunks, the rows in order) and ``flat_bytes``; ``exact``, its indices as it
    handed them out, padding left out, as `plain_int_lists`' bytes (None unless lists of plain ints);
    ``kept``, each
    micro-batch's nested ints with their tags (held, so their ids stay theirs while the record lives);
    ``expected``, each real slot's own tag. Read-only once made; shared by threads. Raises ValueError
    for indices that are not a permutation (left unrecorded)."""

    __slots__ = ("exact", "expected", "flat", "flat_bytes", "kept", "name", "sizes", "slots")

    def __init__(self, name: int, micro_batches: Sequence[Any], indices: Sequence[Any] | None) -> None:
        self.name = name
        self.kept: list[tuple[Any, Tag]] = []
        self.slots: list[Any] = []  # each micro-batch's slot, in the split's order (`PADDING` for padding)
        sizes: list[int] = []
        for i, micro_batch in enumerate(micro_batches):
            padding = indices is not None and indices[i] is PADDING
            slot = PADDING if padding else len(sizes)
            self.slots.append(slot)
            if not padding:
                sizes.append(int(micro_batch.batch_size[0]) if micro_batch.batch_size else 0)
            fields = micro_batch.values() if hasattr(micro_batch, "values") else ()
            for value in fields:
                size = _ragged(value)
                if size is not None:
                    self.kept.append((size, (name, slot)))
        self.sizes: tuple[int, ...] = tuple(sizes)
        self.expected: list[Tag] = [(name, m) for m in range(len(sizes))]
        # fixed-size chunks (no indices): the rows in order
        self.flat = np.arange(sum(sizes), dtype=np.int64) if indices is None else _flat(indices, sum(sizes))
        self.flat_bytes = self.flat.tobytes()
        real = [p for p in indices if p is not PADDING] if indices is not None else None
        self.exact = plain_int_lists_of(real)

    def rows(self) -> list[list[int]]:
        """The split's indices, padding left out (for the error path)."""
        return _cut(self.flat.tolist(), self.sizes)


def _flat(indices: Sequence[Any], count: int) -> np.ndarray:
    """A split's indices flattened, padding left out, checked to be a permutation of ``range(count)``
    (ValueError otherwise: the split vouches for nothing)."""
    real = (p for p in indices if p is not PADDING)
    values = map(index, itertools.chain.from_iterable(real))  # integers only
    flat = np.fromiter(values, np.int64)  # every entry: a split whose micro-batches hold fewer rows is none
    if not np.array_equal(np.sort(flat), np.arange(count)):
        raise ValueError("the split's indices are not a permutation of its micro-batches' rows")
    return flat


def _cut(flat: Sequence[int], sizes: Sequence[int]) -> list[list[int]]:
    """``flat`` cut into consecutive pieces of ``sizes``."""
    bounds = itertools.pairwise(itertools.accumulate(sizes, initial=0))
    return [list(flat[a:b]) for a, b in bounds]


class Provenance:
    """The live splits of one batch (``splits``, oldest first, at most `MAX_SPLITS`), as the restore
    reads them: ``tags`` (each recorded nested int's id -> its tag; a newer split's wins), ``by_name``
    and ``vouchers`` (each split's indices as `plain_int_lists`' bytes, with their flattening, newest
    first: `permutation`). Read-only: a new split makes a new one."""

    __slots__ = ("batch", "by_name", "splits", "tags", "vouchers")

    def __init__(self, batch: weakref.ref[Any], splits: Sequence[Split]) -> None:
        self.batch = batch
        self.splits = tuple(splits)
        self.by_name = {split.name: split for split in self.splits}
        self.tags = {id(size): tag for split in self.splits for size, tag in split.kept}
        self.vouchers = tuple(
            (split.exact, split.flat) for split in reversed(self.splits) if split.exact is not None
        )

    def permutation(self, indices: Any) -> torch.Tensor | None:
        """``indices`` flattened (CPU int64 ``[B]``, a tensor of its own) where they are a live split's own
        lists of plain ints (`plain_int_lists`: the same bytes): that split checked them as a permutation
        when it recorded them, so the restore takes them with one C-level pass, not by reading and counting
        every index. None otherwise (the restore's own check runs)."""
        given = plain_int_lists(indices) if self.vouchers else None
        flat = next((flat for exact, flat in self.vouchers if given == exact), None) if given else None
        return None if flat is None else torch.from_numpy(flat.copy())

    def judge(
        self,
        checked: Mapping[Any, Sequence[Part]],
        sizes: Sequence[int] | None,
        perm: torch.Tensor | None,
        host: Any = None,
    ) -> tuple[bool, RebatchError | None]:
        """``(proven, error)`` of a call. ``checked``: each key's checked parts, one an output, padding
        left out; ``sizes``: each micro-batch's rows and ``perm`` its checked permutation (both None
        without dynamic batch size; ``host``, its NumPy view where read already: `CallRows.given`).

        The outputs' tags (their jagged keys' `JaggedPart.ragged`; dense keys carry none), outputs in
        order then keys in order, decide the split: the first tag's. Then, the first defect returned:
        a tag of another split (two splits mixed), the indices not that split's, a tag of another slot.
        Proven where every output carries a tag of its own slot. The error is returned, for the call to
        raise in the order of checks."""
        keys = [key for key, parts in checked.items() if parts and type(parts[0]) is JaggedPart]
        jagged = [cast("Sequence[JaggedPart]", checked[key]) for key in keys]  # a key's parts are of one kind
        found = [[self.tags.get(id(part.ragged)) for part in parts] for parts in jagged]
        outputs = len(next(iter(checked.values()), ()))
        first = _first_tag(found, outputs)
        if first is None:
            _count(0, outputs, 0, outputs * len(checked))
            return False, None
        split = self.by_name[first[1][0]]
        if all(tags == split.expected for tags in found):  # the common case at once
            error = _stray_indices(split, sizes, perm, host)
            if error is None:
                _count(outputs, outputs, outputs * len(checked), 0)
            return error is None, error
        mixed = _mixed(keys, found, outputs, first)
        if mixed is not None:
            return False, mixed
        error = _stray_indices(split, sizes, perm, host)
        if error is not None:
            return False, error
        proven = 0
        for m in range(outputs):
            for key, tags in zip(keys, found, strict=True):
                tag = tags[m]
                if tag is not None and tag[1] != m:
                    return False, stray_output(key, m, tag[1])
            proven += any(tags[m] is not None for tags in found)
        unproven = outputs - proven
        _count(proven, outputs, proven * len(checked), unproven * len(checked))
        return bool(outputs) and proven == outputs, None


def _first_tag(found: Sequence[Sequence[Tag | None]], outputs: int) -> tuple[int, Tag] | None:
    """``(output, tag)`` of the first tag, outputs in order then keys in order; None where none."""
    for m in range(outputs):
        for tags in found:
            tag = tags[m]
            if tag is not None:
                return m, tag
    return None


def _mixed(
    keys: Sequence[Any],
    found: Sequence[Sequence[Tag | None]],
    outputs: int,
    first: tuple[int, Tag],
) -> Any:
    """The error of the first tag (outputs in order, then keys) of a split other than the first tag's."""
    first_output, (name, _slot) = first
    for m in range(outputs):
        for key, tags in zip(keys, found, strict=True):
            tag = tags[m]
            if tag is not None and tag[0] != name:
                return mixed_splits(key, m, tag[0], first_output, name)
    return None


def _stray_indices(split: Split, sizes: Sequence[int] | None, perm: torch.Tensor | None, host: Any) -> Any:
    """The error where the call's indices (with dynamic batch size) are not ``split``'s (a split of
    fixed-size chunks: the rows in order), else None (also for a call without dynamic batch size: no
    indices to compare)."""
    if perm is None or sizes is None:
        return None
    if tuple(sizes) == split.sizes and as_bytes(perm, host) == split.flat_bytes:
        return None
    given = host if host is not None else perm.tolist()
    try:
        check_indices(_cut([int(i) for i in given], sizes), split.rows())
    except RebatchError as err:
        return err
    return None


def _forget(key: int, ref: weakref.ref[Any]) -> None:
    """The batch ``ref`` died: its splits go (unless a newer batch of the same id has some already)."""
    with _lock:
        kept = _batches.get(key)
        if kept is not None and kept.batch is ref:
            del _batches[key]


def record(batch: Any, micro_batches: Sequence[Any], indices: Sequence[Any] | None) -> None:
    """What a split of ``batch`` handed out: its ``micro_batches`` and ``indices`` (None: fixed-size
    chunks in order), kept beside the batch's other live splits (the oldest beyond `MAX_SPLITS` goes).
    A batch that cannot be held weakly, micro-batches without a batch size, or indices that are not a
    permutation are left unrecorded (their calls stay unproven). Never raises."""
    try:
        split = Split(next(_names), micro_batches, indices)
    except (TypeError, AttributeError, ValueError, IndexError, OverflowError):  # odd, or not a permutation
        return
    key = id(batch)
    with _lock:
        kept = _batches.get(key)
        if kept is not None and kept.batch() is not batch:
            kept = None  # a dead batch's id reused before its callback ran
        try:
            ref = kept.batch if kept is not None else weakref.ref(batch, lambda ref: _forget(key, ref))
        except TypeError:  # not weakly held
            return
        splits = (*(kept.splits if kept is not None else ()), split)[-MAX_SPLITS:]
        _batches[key] = Provenance(ref, splits)  # replaced whole: a reader sees the old or the new
        _batches.move_to_end(key)  # recorded most recently
        while len(_batches) > MAX_BATCHES:
            _batches.popitem(last=False)


def observe_split(result: Any, *args: Any, **kwargs: Any) -> None:
    """A trainer's own split of its first argument (``data`` or ``batch``, by keyword too, as verl's
    engines pass it) returned ``result`` (``(micro_batches, indices)``): recorded as rebatch's split
    records its own (shadow mode, `torch_impl.integrations`); anything else, unrecorded. Never raises."""
    batch = args[0] if args else kwargs.get("data", kwargs.get("batch"))
    if (
        batch is not None
        and isinstance(result, tuple)
        and len(result) == 2
        and isinstance(result[0], list | tuple)
    ):
        record(batch, *result)


def recorded(batch: Any) -> Provenance | _Unrecorded:
    """The live splits of ``batch`` by rebatch (or observed in shadow mode), or `UNRECORDED`."""
    kept = _batches.get(id(batch)) if batch is not None else None
    if kept is not None and kept.batch() is batch:
        return kept
    return UNRECORDED


def live_splits() -> list[Split]:
    """Every live split of this process, of every batch (a snapshot)."""
    with _lock:
        kept = [p for p in _batches.values() if p.batch() is not None]
    return [split for p in kept for split in p.splits]


def check_restore(partitions: Sequence[Any]) -> None:
    """`restore_dynamic_batch`'s check, after the restore's own (``partitions`` a permutation of its rows;
    it has no outputs to decide the split): proven where ``partitions`` are a live split's indices;
    `MisalignmentError` where they are the inverse of one (its sizes, its permutation inverted, not
    itself a live split's, and not ascending within every micro-batch as a split's own indices are: the
    inverse given for the forward); else unproven, never an error."""
    if not witness_config()[0] or any(p is PADDING for p in partitions):
        return
    try:
        sizes = tuple(len(p) for p in partitions)
        pieces = [_host_ints(p) for p in partitions]
    except (TypeError, ValueError, OverflowError, RuntimeError):
        return  # not a form this check reads: unproven
    given = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
    splits = [split for split in live_splits() if split.sizes == sizes]
    if any(split.flat_bytes == given.tobytes() for split in splits):
        _count(1, 1, 0, 0)
        return
    if not all(_ascending(piece) for piece in pieces):
        inverse = np.empty_like(given)
        inverse[given] = np.arange(given.shape[0])
        for split in splits:
            if split.flat_bytes == inverse.tobytes():
                check_indices(_cut(given.tolist(), sizes), split.rows())
    _count(0, 1, 0, 0)


def _host_ints(partition: Any) -> np.ndarray:
    """One checked partition's indices as host int64 (a tensor read once, whole)."""
    if isinstance(partition, torch.Tensor):
        partition = partition.detach().cpu().numpy()
    return np.asarray(partition, dtype=np.int64).reshape(-1)


def _ascending(piece: np.ndarray) -> bool:
    """Whether a micro-batch's indices ascend, as every split of rebatch's and verl's lists them."""
    return bool((piece[1:] > piece[:-1]).all())


def _count(proven: int, outputs: int, keys_proven: int, keys_unproven: int) -> None:
    with _STATS.lock:
        stats = _STATS.counts
        if not outputs or proven == outputs:
            stats["calls_proven" if outputs and proven else "calls_unproven"] += 1
        else:
            stats["calls_partly_proven" if proven else "calls_unproven"] += 1
        stats["keys_proven"] += keys_proven
        stats["keys_unproven"] += keys_unproven


class _Unrecorded:
    """The record of a drop-in call whose ``data`` no split of rebatch's recorded: unproven, counted."""

    def permutation(self, indices: Any) -> None:
        """No split vouches for the indices: the restore's own check runs."""
        return None

    def judge(self, checked: Mapping[Any, Sequence[Any]], *_: Any) -> tuple[bool, None]:
        outputs = len(next(iter(checked.values()), ()))
        _count(0, outputs, 0, outputs * len(checked))
        return False, None


#: `recorded`'s answer for verl's drop-in where nothing was recorded.
UNRECORDED = _Unrecorded()


def provenance_stats(reset: bool = False) -> dict[str, int]:
    """What exact provenance proved in this process: ``calls_proven`` (every output in its slot, the
    indices the split's), ``calls_partly_proven``, ``calls_unproven`` (no record, or no output carrying a
    recorded nested int: the witness alone applies), ``keys_proven`` and ``keys_unproven``."""
    return _STATS.read(reset)
