"""Exact provenance in torch: what rebatch's splits handed out for each batch, checked by the restore.

``docs/spec.md``, "Exact provenance" (the rule and the error's words are `ref.provenance`'s). Each split
(`torch_impl._prepare`, or a trainer's own split observed in shadow mode) `record`\\ s a `Split`: its
name (a number of this process), each micro-batch's ragged sizes (the nested ints of its jagged fields,
which torch keeps through device and dtype moves, ``detach``, ``clone`` and
``nested_tensor_from_jagged(v, moved.offsets())``; a padding micro-batch's too), the indices it returned
and its rows' lengths. A batch (numbered too) keeps its last `MAX_SPLITS` splits in one read-only
`Record`, replaced whole on each record, so a restore reads it without a lock; it is found by the
batch's identity, else by its ``input_ids``' nested int (`recorded`), and kept while either lives. Every
live record's nested ints are indexed (`_everywhere`), so an output of another batch is known as such.
The restore `Record.judge`\\ s the call before any data moves: each output naming micro-batch ``q``
of a live split must hold its slot's rows. Host-side facts only: no device read. Unproven (never an
error) where no output names a micro-batch of the batch restored. `provenance_stats` counts it. A split
that hands out index lists (miles' ``get_data_iterator``) is kept the same way under what it handed them
to, the iterator (`record_handout`); its outputs carry no identity, so its own indices decide
(`Record.judge_handout`).
"""

from __future__ import annotations

import itertools
import operator
import weakref
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from operator import index
from typing import Any, cast

import numpy as np
import torch

from rebatch_startup.forksafe import ForkSafeLock
from ref._torch_private import ragged_idx, ragged_size, raw_lengths, raw_offsets, raw_values
from ref.errors import MisalignmentError, RebatchError
from ref.provenance import check_indices, other_batch, slot_difference, stray_output
from ref.structure import PADDING, witness_binds

from .._parts import JaggedPart, NestedTensor, Part
from .._permutation import as_bytes, plain_int_lists, plain_int_lists_of
from .._tally import Tally
from ._compare import first_difference, misaligned_row
from ._switch import witness_config

__all__ = [
    "MAX_BATCHES",
    "MAX_SPLITS",
    "UNRECORDED",
    "Record",
    "Split",
    "check_restore",
    "named_by",
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
#: Each live batch's record by its name, the batch recorded longest ago first.
_records: OrderedDict[int, Record] = OrderedDict()
#: id(batch) -> its record's name; id(its input_ids' nested int) -> its record's name.
_by_batch: dict[int, int] = {}
_by_ids: dict[int, int] = {}
#: id(a recorded nested int) -> (its batch's name, its split's name), over every live record.
_everywhere: dict[int, tuple[int, int]] = {}
_names = itertools.count()  # each split's name, in this process
_batch_names = itertools.count()  # each recorded batch's name, in this process
#: The counters (zeroed in a forked child: `torch_impl._tally.Tally`).
_STATS = Tally(
    (
        "calls_proven",
        "calls_partly_proven",
        "calls_unproven",
        "keys_proven",
        "keys_unproven",
        "restores_indices_proven",
        "restores_rows_witnessed",
        "restores_unproven",
    )
)

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
    left out; for fixed-size chunks, the rows in order), ``flat_bytes`` and ``in_order`` (whether it is
    the rows in order); ``exact``, its indices as it handed them out, padding left out, as
    `plain_int_lists`' bytes (None unless lists of plain ints); ``kept``, each micro-batch's nested ints
    with their tags (held, so their ids stay theirs while the record lives); ``expected``, each real
    slot's own tag; ``lengths``, each original row's length where the split knew them (int64, else
    None); ``outputs``, the micro-batch outputs its restore takes (its micro-batches, unless a split that
    hands out index lists says otherwise: miles' rollout count); ``held``, the rows its batch held when
    it split. ``micro_batches`` None: a split that hands out index lists (each micro-batch its
    ``indices``). Read-only once made (its `order` made once, on first use); shared by threads. Raises
    ValueError for indices that are not a permutation (left unrecorded)."""

    __slots__ = (
        "_order",
        "_rows",
        "exact",
        "expected",
        "flat",
        "flat_bytes",
        "held",
        "in_order",
        "kept",
        "lengths",
        "name",
        "outputs",
        "sizes",
        "slots",
    )

    def __init__(
        self,
        name: int,
        micro_batches: Sequence[Any] | None,
        indices: Sequence[Any] | None,
        lengths: Sequence[int] | None = None,
        *,
        outputs: int | None = None,
        held: int | None = None,
    ) -> None:
        self.name = name
        self._order: ItemOrder | None = None
        self._rows: list[list[int]] | None = None
        if micro_batches is None:  # a split handing out index lists (miles'): each micro-batch its indices
            micro_batches = [] if indices is None else [_Handed(len(p)) for p in indices]
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
        total = sum(sizes)
        self.flat = np.arange(total, dtype=np.int64) if indices is None else _flat(indices, total)
        self.flat_bytes = self.flat.tobytes()
        self.in_order = self.flat_bytes == np.arange(total, dtype=np.int64).tobytes()
        real = [p for p in indices if p is not PADDING] if indices is not None else None
        self.exact = plain_int_lists_of(real)
        known = lengths is not None and len(lengths) == total
        self.lengths = np.asarray(lengths, dtype=np.int64) if known else None
        self.outputs = len(sizes) if outputs is None else outputs
        self.held = total if held is None else held

    def order(self) -> ItemOrder:
        """The `ItemOrder` putting values laid end to end in the split's micro-batches back in original
        row order (made once)."""
        if self._order is None:
            inverse = np.empty_like(self.flat)
            inverse[self.flat] = np.arange(self.flat.shape[0], dtype=np.int64)
            self._order = ItemOrder(inverse.tolist())
        return self._order

    def rows(self) -> list[list[int]]:
        """The split's indices, padding left out (made once: miles' restore and its judge both read them;
        not to be changed by the caller)."""
        if self._rows is None:
            self._rows = _cut(self.flat.tolist(), self.sizes)
        return self._rows

    def rows_bytes(self, q: int) -> bytes:
        """Micro-batch ``q``'s rows as int64 bytes."""
        start = sum(self.sizes[:q])
        return self.flat[start : start + self.sizes[q]].tobytes()


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


class _Handed:
    """A micro-batch of a split that hands out index lists: its rows (``batch_size``, as a TensorDict's)."""

    __slots__ = ("batch_size",)

    def __init__(self, rows: int) -> None:
        self.batch_size = (rows,)


class ItemOrder:
    """``[values[k] for k in positions]`` in one C-level call (`operator.itemgetter` of the positions):
    ``positions[i]`` the position among the values laid end to end of result row ``i``. A list's items
    put back in original row order (miles' per-sample values)."""

    __slots__ = ("_get", "positions")

    def __init__(self, positions: list[int]) -> None:
        self.positions = positions
        self._get = operator.itemgetter(*positions) if len(positions) > 1 else None

    def __call__(self, values: list[Any]) -> list[Any]:
        if self._get is None:  # one row or none: itemgetter would not give a tuple
            return [values[k] for k in self.positions]
        return list(self._get(values))


class Record:
    """The live splits of one batch (``splits``, oldest first, at most `MAX_SPLITS`), as the restore
    reads them: ``name`` (the batch's number), ``batch`` and ``ids`` (weak references to the batch and
    to its ``input_ids``, None where it has no jagged one), ``ids_size`` (that nested int, held),
    ``tags`` (each recorded nested int's id -> its tag), ``by_name`` and ``vouchers`` (each split's
    indices as `plain_int_lists`' bytes, with the split, newest first: `vouching`). Read-only:
    a new split makes a new one."""

    __slots__ = ("batch", "by_name", "ids", "ids_size", "name", "splits", "tags", "vouchers")

    def __init__(
        self,
        name: int,
        batch: weakref.ref[Any],
        ids: weakref.ref[Any] | None,
        ids_size: Any,
        splits: Sequence[Split],
    ) -> None:
        self.name = name
        self.batch = batch
        self.ids = ids
        self.ids_size = ids_size
        self.splits = tuple(splits)
        self.by_name = {split.name: split for split in self.splits}
        self.tags = {id(size): tag for split in self.splits for size, tag in split.kept}
        self.vouchers = tuple(
            (split.exact, split) for split in reversed(self.splits) if split.exact is not None
        )

    def alive(self) -> bool:
        """Whether the batch or its ``input_ids`` still lives."""
        return self.batch() is not None or (self.ids is not None and self.ids() is not None)

    def vouching(self, indices: Any) -> Split | None:
        """The newest live split whose own lists of plain ints ``indices`` are (`plain_int_lists`: the same
        bytes, one C-level pass; ``==`` would take ``3.0`` for ``3``): it checked them as a permutation
        when it recorded them. None otherwise (the restore's own check runs)."""
        given = plain_int_lists(indices) if self.vouchers else None
        return next((split for exact, split in self.vouchers if given == exact), None) if given else None

    def permutation(self, indices: Any) -> torch.Tensor | None:
        """``indices`` flattened (CPU int64 ``[B]``, a tensor of its own) where a live split vouches for
        them (`vouching`), so the restore takes them without reading and counting every index; else None."""
        split = self.vouching(indices)
        return None if split is None else torch.from_numpy(split.flat.copy())

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

        Each slot on its own, outputs in order then their jagged keys in order (`JaggedPart.ragged`;
        dense keys carry none): an output naming another batch's split, or micro-batch ``q`` of a live
        split whose rows are not the slot's (``indices[m]``, or without dynamic batch size the positions
        after the slots before it), is the error returned (for the call to raise in the order of
        checks). A slot is proven where one of its keys names a micro-batch and all that do pass."""
        keys = [key for key, parts in checked.items() if parts and type(parts[0]) is JaggedPart]
        jagged = [cast("Sequence[JaggedPart]", checked[key]) for key in keys]  # a key's parts are of one kind
        found = [[self.tags.get(id(part.ragged)) for part in parts] for parts in jagged]
        outputs = len(next(iter(checked.values()), ()))
        counts = [p.rows for p in next(iter(checked.values()), ())]
        first = found[0][0] if found and outputs else None
        split = self.by_name.get(first[0]) if first is not None else None
        # the common case at once: every output its split's own slot's, the indices the split's
        expected = split is not None and all(tags == split.expected for tags in found)
        if expected and _in_slots(cast("Split", split), sizes, perm, host, counts):
            _count(outputs, outputs, outputs * len(checked), 0)
            return True, None
        slots = _slot_rows(sizes, perm, host, counts)
        proven = 0
        for m in range(outputs):
            named = False
            for key, parts, tags in zip(keys, jagged, found, strict=True):
                tag = tags[m]
                if tag is None:
                    elsewhere = _everywhere.get(id(parts[m].ragged))
                    if elsewhere is not None and elsewhere[0] != self.name:
                        return False, other_batch(key, m, elsewhere[1], elsewhere[0], self.name)
                    continue
                error = self._slot_error(key, m, tag, slots[m])
                if error is not None:
                    return False, error
                named = True
            proven += named
        unproven = outputs - proven
        _count(proven, outputs, proven * len(checked), unproven * len(checked))
        return bool(outputs) and proven == outputs, None

    def _slot_error(self, key: Any, m: int, tag: Tag, given: np.ndarray) -> RebatchError | None:
        """The error of output ``m`` (its key ``key`` names ``tag``) where its micro-batch's rows are not
        the slot's ``given``, else None."""
        split, q = self.by_name[tag[0]], tag[1]
        if q is PADDING:
            return stray_output(key, m, PADDING, split.name)
        held = split.rows_bytes(q)
        if held == given.tobytes():
            return None
        difference = slot_difference(given.tolist(), np.frombuffer(held, dtype=np.int64).tolist())
        return stray_output(key, m, q, split.name, difference or "")

    def judge_handout(self, parts: Sequence[Sequence[Any]] | None, outputs: int) -> None:
        """The newest split's verdict on a restore whose outputs carry no identity (miles'): its indices
        (``parts``; None for micro-batches restored as they come) must be the split's micro-batches, in
        its order or another (a reorder is unproven: the witness judges it), and the outputs must number
        the split's (`Split.outputs`). `MisalignmentError` otherwise; nothing with the check switched off."""
        if not witness_config()[0]:
            return
        split = self.splits[-1]
        rows = split.rows()
        if parts is not None and parts != rows:
            reordered = sorted(map(list, parts)) == sorted(rows)
            if not reordered:
                check_indices(parts, rows)  # names the first index that differs
        if outputs != split.outputs:
            raise MisalignmentError(
                f"micro-batch {min(outputs, split.outputs)}: {outputs} micro-batch outputs, but the split "
                f"made {split.outputs} micro-batches (outputs of another pass or step; switch the check "
                "off: REBATCH_WITNESS=off)"
            )


def _in_slots(
    split: Split, sizes: Sequence[int] | None, perm: torch.Tensor | None, host: Any, counts: Sequence[int]
) -> bool:
    """Whether every slot ``m`` holds ``split``'s micro-batch ``m``'s rows: the indices are the split's
    (without dynamic batch size: the split is the rows in order, in the outputs' row counts)."""
    if perm is None or sizes is None:
        return split.in_order and tuple(counts) == split.sizes
    return tuple(sizes) == split.sizes and as_bytes(perm, host) == split.flat_bytes


def _slot_rows(
    sizes: Sequence[int] | None, perm: torch.Tensor | None, host: Any, counts: Sequence[int]
) -> list[np.ndarray]:
    """Each slot's rows (int64): ``indices[m]``, or without dynamic batch size the positions after the
    slots before it."""
    if perm is None or sizes is None:
        flat = np.arange(sum(counts), dtype=np.int64)
        pieces = counts
    else:
        flat = host if host is not None else np.asarray(perm.tolist(), dtype=np.int64)
        pieces = sizes
    bounds = itertools.pairwise(itertools.accumulate(pieces, initial=0))
    return [flat[a:b] for a, b in bounds]


def _drop(name: int) -> None:
    """A recorded batch or its ``input_ids`` died: its record goes once neither lives."""
    with _lock:
        kept = _records.get(name)
        if kept is not None and not kept.alive():
            _remove(name, kept)


def _remove(name: int, kept: Record) -> None:
    """Record ``name`` forgotten, and everything that finds it (under ``_lock``)."""
    _records.pop(name, None)
    for table in (_by_batch, _by_ids):
        for k in [k for k, v in table.items() if v == name]:
            del table[k]
    _unindex(kept.splits)


def _unindex(splits: Sequence[Split]) -> None:
    """``splits``' nested ints out of the process's index (under ``_lock``)."""
    for split in splits:
        for size, _ in split.kept:
            if _everywhere.get(id(size), (None, None))[1] == split.name:
                del _everywhere[id(size)]


def _input_ids(batch: Any) -> Any:
    """``batch["input_ids"]`` where it is a jagged nested tensor, else None (never raises)."""
    try:
        ids = batch.get("input_ids", None)
    except (AttributeError, TypeError, KeyError, RuntimeError):
        return None
    return ids if _ragged(ids) is not None else None


def _lengths_of(ids: Any) -> list[int] | None:
    """The row lengths of a jagged ``input_ids`` whose offsets the host holds, else None (never a device
    read)."""
    if ids is None:
        return None
    offsets = raw_offsets(ids)
    if offsets.device.type != "cpu" or raw_lengths(ids) is not None:
        return None
    host = offsets.numpy() if offsets.dtype == torch.int64 else offsets.to(torch.int64).numpy()
    return (host[1:] - host[:-1]).tolist()


def record(
    batch: Any,
    micro_batches: Sequence[Any],
    indices: Sequence[Any] | None,
    lengths: Sequence[int] | None = None,
) -> None:
    """What a split of ``batch`` handed out: its ``micro_batches`` and ``indices`` (None: fixed-size
    chunks in order), and its rows' ``lengths`` (the split's own reading of ``input_ids``; where None,
    read from a jagged ``input_ids`` the host holds), kept beside the batch's other live splits (the
    oldest beyond `MAX_SPLITS` goes). A batch that cannot be held weakly, micro-batches without a batch
    size, or indices that are not a permutation are left unrecorded (their calls stay unproven). Never
    raises."""
    ids = _input_ids(batch)
    if lengths is None:
        lengths = _lengths_of(ids)
    try:
        split = Split(next(_names), micro_batches, indices, lengths)
    except (TypeError, AttributeError, ValueError, IndexError, OverflowError):  # odd, or not a permutation
        return
    _keep(batch, ids, split)


def _keep(batch: Any, ids: Any, split: Split) -> None:
    """``split`` kept beside ``batch``'s other live splits (``ids``: its jagged ``input_ids``, else None);
    the oldest beyond `MAX_SPLITS`, and the batch recorded longest ago beyond `MAX_BATCHES`, go."""
    with _lock:
        kept = recorded(batch)
        if isinstance(kept, Record):
            name, batch_ref, ids_ref, ids_size = kept.name, kept.batch, kept.ids, kept.ids_size
            if batch_ref() is not batch:  # a shallow clone, found by its input_ids: it finds the record too
                _by_batch[id(batch)] = name
            older = kept.splits
        else:
            name = next(_batch_names)
            try:
                batch_ref = weakref.ref(batch, lambda _: _drop(name))
                ids_ref = weakref.ref(ids, lambda _: _drop(name)) if ids is not None else None
            except TypeError:  # not weakly held
                return
            ids_size = _ragged(ids) if ids is not None else None
            _by_batch[id(batch)] = name
            if ids_size is not None:
                _by_ids[id(ids_size)] = name
            older = ()
        splits = (*older, split)
        _unindex(splits[:-MAX_SPLITS])
        splits = splits[-MAX_SPLITS:]
        _records[name] = Record(name, batch_ref, ids_ref, ids_size, splits)  # replaced whole
        _records.move_to_end(name)  # recorded most recently
        for size, _ in split.kept:
            _everywhere[id(size)] = (name, split.name)
        while len(_records) > MAX_BATCHES:
            oldest, gone = _records.popitem(last=False)
            _remove(oldest, gone)


def record_handout(owner: Any, indices: Sequence[Any] | None, outputs: int, held: int) -> None:
    """What a split handing out index lists (miles' ``get_data_iterator``) gave ``owner`` (its iterator):
    ``indices`` (each micro-batch's rows; None for fixed-size micro-batches), ``outputs`` (the
    micro-batch outputs its restore takes) and ``held`` (the rows ``owner`` held then), kept as `record`
    keeps a batch's splits. Indices that are not
    a permutation, or an owner that cannot be held weakly, are left unrecorded. Never raises."""
    try:
        split = Split(next(_names), None, indices, outputs=outputs, held=held)
    except (TypeError, AttributeError, ValueError, IndexError, OverflowError):  # odd, or not a permutation
        return
    _keep(owner, None, split)


def named_by(x: Any) -> tuple[int, int] | None:
    """``(batch, split)``, the names of the live record and split whose micro-batch a jagged tensor's
    nested int names, else None."""
    size = _ragged(x)
    return None if size is None else _everywhere.get(id(size))


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


def recorded(batch: Any) -> Record | _Unrecorded:
    """The live splits of ``batch`` by rebatch (or observed in shadow mode), found by its identity, else
    by its ``input_ids``' nested int (a shallow clone's too); or `UNRECORDED`."""
    if batch is None:
        return UNRECORDED
    name = _by_batch.get(id(batch))
    kept = _records.get(name) if name is not None else None
    if kept is not None and kept.batch() is batch:
        return kept
    ids = _input_ids(batch)
    size = _ragged(ids) if ids is not None else None
    name = _by_ids.get(id(size)) if size is not None else None
    kept = _records.get(name) if name is not None else None
    if kept is not None and kept.ids_size is size:
        return kept
    return UNRECORDED


def live_splits() -> list[Split]:
    """Every live split of this process, of every batch (a snapshot)."""
    with _lock:
        kept = [p for p in _records.values() if p.alive()]
    return [split for p in kept for split in p.splits]


def check_restore(partitions: Sequence[Any], restored: Any = None) -> None:
    """`restore_dynamic_batch`'s check, after the restore's own (``partitions`` a permutation of its rows;
    it has no outputs to decide the split): the indices proven where ``partitions`` are a live split's
    indices, and then ``restored``'s row lengths checked against that split's recorded lengths where every
    split they match recorded the same ones and the binding rule binds (`MisalignmentError` at the first
    row of another length); `MisalignmentError` where they are the inverse of one (its sizes, its
    permutation inverted, not itself a live split's, and not ascending within every micro-batch as a
    split's own indices are: the inverse given for the forward); else unproven, never an error."""
    if not witness_config()[0] or any(p is PADDING for p in partitions):
        return
    try:
        sizes = tuple(len(p) for p in partitions)
        pieces = [_host_ints(p) for p in partitions]
    except (TypeError, ValueError, OverflowError, RuntimeError):
        _restored(indices=False, rows=False)
        return  # not a form this check reads: unproven
    given = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
    splits = [split for split in live_splits() if split.sizes == sizes]
    matched = [split for split in splits if split.flat_bytes == given.tobytes()]
    if matched:
        witnessed = _check_rows(restored, matched, given, sizes)
        _restored(indices=True, rows=witnessed)
        return
    if not all(_ascending(piece) for piece in pieces):
        inverse = np.empty_like(given)
        inverse[given] = np.arange(given.shape[0])
        for split in splits:
            if split.flat_bytes == inverse.tobytes():
                check_indices(_cut(given.tolist(), sizes), split.rows())
    _restored(indices=False, rows=False)


#: The key `restore_dynamic_batch`'s errors name: its tensor, by verl's parameter name.
RESTORED_KEY = "data"


def _check_rows(restored: Any, splits: Sequence[Split], given: np.ndarray, sizes: Sequence[int]) -> bool:
    """``restored``'s row lengths against the lengths every split in ``splits`` recorded alike, where the
    binding rule binds (a jagged tensor whose values add up to their total, its key not unbound):
    `MisalignmentError` at the first original row of another length; whether it compared them."""
    known = {split.lengths.tobytes() if split.lengths is not None else None for split in splits}
    if len(known) != 1 or None in known or _ragged(restored) is None:
        return False
    want = splits[0].lengths
    assert want is not None
    offsets = raw_offsets(restored)
    if raw_lengths(restored) is not None or offsets.device.type == "meta":
        return False
    values = int(raw_values(restored).shape[0])
    if not witness_binds(RESTORED_KEY, True, values, int(want.sum()), witness_config()[1]):
        return False
    if offsets.device.type == "cpu":
        host = offsets.to(torch.int64).numpy()
        got = host[1:] - host[:-1]
    else:  # one comparison on the device, one small read
        expected = torch.from_numpy(want).to(offsets.device, non_blocking=True)
        if not bool(offsets.diff().ne(expected).any()):
            return True
        got = offsets.diff().cpu().numpy().astype(np.int64, copy=False)
    i = first_difference(got, want)
    if i < 0:
        return True
    raise misaligned_row(RESTORED_KEY, i, int(got[i]), int(want[i]), given, sizes)


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


def _restored(*, indices: bool, rows: bool) -> None:
    """One `restore_dynamic_batch` counted: its indices proven (a live split's), and its rows witnessed
    (their lengths the split's); else unproven."""
    with _STATS.lock:
        stats = _STATS.counts
        if indices:
            stats["restores_indices_proven"] += 1
            stats["restores_rows_witnessed"] += int(rows)
        else:
            stats["restores_unproven"] += 1


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
    """What exact provenance proved in this process: ``calls_proven`` (every slot's output naming a
    micro-batch whose rows are the slot's), ``calls_partly_proven``, ``calls_unproven`` (no record, or no
    output naming a recorded micro-batch: the witness alone applies), ``keys_proven`` and
    ``keys_unproven``; `restore_dynamic_batch`'s, apart: ``restores_indices_proven`` (a live split's
    indices), ``restores_rows_witnessed`` (and its rows' lengths the split's) and ``restores_unproven``."""
    return _STATS.read(reset)
