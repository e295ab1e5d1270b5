"""Exact provenance (pure Python, shared by both implementations): what a split handed out, as values.

A split knows which original rows each micro-batch holds, in which order. Handed to the restore with
the outputs, that is a proof the restore can check whatever the row lengths (where the alignment
witness is blind: rows of equal length). ``docs/spec.md``, "Exact provenance", states the rule; this
module holds its values (`Provenance`, `Carried`), its concrete check of the indices (`check_indices`)
and the words of its errors (`stray_output`, `other_batch`, `stray_indices`), so that ``ref`` and
``torch_impl`` raise the same `MisalignmentError` with the same message. JAX-free and torch-free.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any, NamedTuple

from .errors import MisalignmentError, where
from .structure import PADDING

__all__ = [
    "PROVENANCE",
    "Carried",
    "Provenance",
    "check_indices",
    "other_batch",
    "provenance_of",
    "slot_difference",
    "stray_indices",
    "stray_output",
]

#: The key of an output dict that carries its micro-batch's provenance in ``ref`` (``output_lst[m]``:
#: ``{"model_output": ..., "provenance": rows}``, ``rows`` the original rows it was computed on).
PROVENANCE = "provenance"


#: How an error of provenance says to switch the check off (with the alignment witness: one switch).
_OFF = "switch the check off: provenance=None, torch_impl.set_witness(False) or REBATCH_WITNESS=off"


class Provenance(NamedTuple):
    """A split's provenance: ``rows[m]``, the original rows of micro-batch ``m`` in the order it holds
    them (a 1-D integer array or sequence; `PADDING` for a padding micro-batch); ``name``, the split's
    name (a static hashable, distinct among the splits of one batch; ``torch_impl`` numbers its records);
    ``batch``, the name of the batch it split (``torch_impl`` numbers its recorded batches). A NamedTuple,
    so a JAX pytree: a value ``jax.jit`` takes and returns."""

    rows: tuple[Any, ...]
    name: Hashable = 0
    batch: Hashable = 0


class Carried(NamedTuple):
    """What an output carries (``output_lst[m]["provenance"]``), its identity: the name of the split that
    made its micro-batch, the rows it was computed on (`PADDING` for a padding micro-batch's) and the name
    of the batch that split split. Bare rows, not a `Carried`, are carried from the first split given."""

    split: Hashable
    rows: Any
    batch: Hashable = 0


def provenance_of(partitions: Sequence[Any], name: Hashable = 0, batch: Hashable = 0) -> Provenance:
    """The provenance of a split by ``partitions`` (each micro-batch's rows, as the split took them).

    >>> provenance_of([[2, 0], [1]]).rows
    ((2, 0), (1,))
    """
    rows = tuple(p if p is PADDING else tuple(int(i) for i in p) for p in partitions)
    return Provenance(rows, name, batch)


def real_rows(provenance: Provenance) -> list[Any]:
    """``provenance.rows`` without its padding micro-batches (as the restore leaves their outputs out)."""
    return [r for r in provenance.rows if r is not PADDING]


def slot_difference(given: Sequence[int], held: Sequence[int]) -> str | None:
    """Where a slot's rows ``given`` differ from the rows ``held`` by the micro-batch its output names, in
    an error's words; None where they are the same.

    >>> slot_difference([0, 1], [0, 1]) is None
    True
    >>> slot_difference([0, 1], [3, 1])
    'the rows differ at position 0: row 0 in the slot, row 3 in the micro-batch'
    """
    given, held = [int(i) for i in given], [int(i) for i in held]
    if len(given) != len(held):
        return f"the slot has {len(given)} rows, the micro-batch {len(held)}"
    j = next((j for j, (a, b) in enumerate(zip(given, held, strict=True)) if a != b), None)
    if j is None:
        return None
    return f"the rows differ at position {j}: row {given[j]} in the slot, row {held[j]} in the micro-batch"


def stray_output(
    key: Any, slot: int, holder: Any, split: Hashable = None, difference: str = ""
) -> MisalignmentError:
    """Output ``slot`` names micro-batch ``holder`` of split ``split``, whose rows are not the slot's
    (``difference``: `slot_difference`'s words); `PADDING`: a padding micro-batch's; None: rows no
    micro-batch of the split holds. ``key``: the key that says so (``ref``: the output's first jagged key,
    else its first key; ``torch_impl``: the jagged key whose nested int does)."""
    if holder is PADDING:
        whose = "a padding micro-batch's rows"
    elif holder is None:
        whose = f"rows no micro-batch of split {split!r} holds"
    else:
        whose = f"micro-batch {holder}'s rows of split {split!r}"
    why = f": {difference}" if difference else ""
    return MisalignmentError(
        f"{where(key, slot)}this output holds {whose}, by the split's provenance, not its slot's{why} (an "
        f"output in another slot than its indices', duplicated or stale, or the indices another step's or "
        f"partition's; {_OFF})"
    )


def other_batch(
    key: Any, slot: int, split: Hashable, batch: Hashable, restored: Hashable
) -> MisalignmentError:
    """Output ``slot`` names a micro-batch of split ``split`` of batch ``batch``, while the batch restored
    is ``restored``: another step's (or another batch's) output."""
    return MisalignmentError(
        f"{where(key, slot)}this output holds rows of split {split!r} of batch {batch!r}, by the splits' "
        f"provenance, while the batch restored is batch {restored!r} (another step's output, or another "
        f"batch's; {_OFF})"
    )


def stray_indices(micro_batch: int, position: int | None, got: Any, want: Any) -> MisalignmentError:
    """The restore's indices are not the split's: at ``micro_batch``, ``position`` (None: its size differs)
    the restore was given ``got`` where the split put ``want``."""
    if position is None:
        at, what = f"micro-batch {micro_batch}: ", f"{got} indices, but the split gave it {want} rows"
    else:
        at, what = (
            f"micro-batch {micro_batch}, position {position}: ",
            f"index {got}, but the split put row {want} there",
        )
    return MisalignmentError(
        f"{at}{what} (the indices are not the split's: another step's, another partition's, or the inverse "
        f"given for the forward; {_OFF})"
    )


def check_indices(indices: Sequence[Sequence[int]], rows: Sequence[Sequence[int]]) -> None:
    """The restore's ``indices`` (padding left out) are the split's ``rows``, micro-batch by micro-batch
    (concrete values; `stray_indices` at the first that differs).

    >>> check_indices([[2, 0], [1]], [(2, 0), (1,)])
    >>> check_indices([[0, 2], [1]], [(2, 0), (1,)])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ref.errors.MisalignmentError: micro-batch 0, position 0: index 0, but the split put row 2 there (...)
    """
    if len(indices) != len(rows):
        m = min(len(indices), len(rows))
        got = len(list(indices[m])) if m < len(indices) else 0
        raise stray_indices(m, None, got, len(list(rows[m])) if m < len(rows) else 0)
    for m, (p, r) in enumerate(zip(indices, rows, strict=True)):
        p, r = [int(i) for i in p], [int(i) for i in r]
        if len(p) != len(r):
            raise stray_indices(m, None, len(p), len(r))
        for j, (a, b) in enumerate(zip(p, r, strict=True)):
            if a != b:
                raise stray_indices(m, j, a, b)
