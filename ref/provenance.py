"""Exact provenance (pure Python, shared by both implementations): what a split handed out, as values.

A split knows which original rows each micro-batch holds, in which order. Handed to the restore with
the outputs, that is a proof the restore can check whatever the row lengths (where the alignment
witness is blind: rows of equal length). ``docs/spec.md``, "Exact provenance", states the rule; this
module holds its value (`Provenance`), its concrete check of the indices (`check_indices`) and the
words of its errors (`stray_output`, `stray_indices`), so that ``ref`` and ``torch_impl`` raise the same
`MisalignmentError` with the same message. JAX-free and torch-free.
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
    "mixed_splits",
    "provenance_of",
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
    them (a 1-D integer array or sequence; `PADDING` for a padding micro-batch), and ``name``, the split's
    name (a static hashable, distinct among the splits of one batch given together; ``torch_impl`` numbers
    its records). A NamedTuple, so a JAX pytree: a value ``jax.jit`` takes and returns."""

    rows: tuple[Any, ...]
    name: Hashable = 0


class Carried(NamedTuple):
    """What an output carries (``output_lst[m]["provenance"]``): the name of the split that made its
    micro-batch and the rows it was computed on (`PADDING` for a padding micro-batch's). Bare rows, not
    a `Carried`, are carried from the first split given."""

    split: Hashable
    rows: Any


def provenance_of(partitions: Sequence[Any], name: Hashable = 0) -> Provenance:
    """The provenance of a split by ``partitions`` (each micro-batch's rows, as the split took them).

    >>> provenance_of([[2, 0], [1]]).rows
    ((2, 0), (1,))
    """
    return Provenance(tuple(p if p is PADDING else tuple(int(i) for i in p) for p in partitions), name)


def real_rows(provenance: Provenance) -> list[Any]:
    """``provenance.rows`` without its padding micro-batches (as the restore leaves their outputs out)."""
    return [r for r in provenance.rows if r is not PADDING]


def _whose(holder: Any) -> str:
    """Whose rows an output holds, in an error's words: micro-batch ``holder``'s, a padding micro-batch's
    (`PADDING`) or none of the split's (None)."""
    if holder is None:
        return "rows no micro-batch of this split holds"
    if holder is PADDING:
        return "a padding micro-batch's rows"
    return f"micro-batch {holder}'s rows"


def stray_output(key: Any, slot: int, holder: Any) -> MisalignmentError:
    """Output ``slot``'s rows are not its micro-batch's: they are micro-batch ``holder``'s (`PADDING`: a
    padding micro-batch's; None: no micro-batch of this split holds them). ``key``: the key that says so
    (``ref``: the output's first jagged key, else its first key; ``torch_impl``: the jagged key whose
    nested int does: the first where all of an output's carry one)."""
    whose = _whose(holder)
    return MisalignmentError(
        f"{where(key, slot)}this output holds {whose}, by the split's provenance, not micro-batch {slot}'s "
        f"(outputs in the wrong order, or computed on another micro-batch; {_OFF})"
    )


def mixed_splits(
    key: Any,
    slot: int,
    split: Hashable,
    first: int,
    first_split: Hashable,
) -> MisalignmentError:
    """Output ``slot`` holds rows of split ``split``, while output ``first`` (the first output carrying
    a split's rows) holds split ``first_split``'s: outputs of two splits restored as one batch."""
    return MisalignmentError(
        f"{where(key, slot)}this output holds rows of split {split!r}, by the splits' provenance, while "
        f"micro-batch {first}'s holds rows of split {first_split!r} (outputs of two splits of the batch "
        f"restored together; {_OFF})"
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
