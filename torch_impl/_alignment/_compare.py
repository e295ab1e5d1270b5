"""The alignment witness's comparison: restored row lengths against the batch's own, and its error.

``docs/spec.md``, "The alignment witness". Every trainer's check ends here: verl's planned keys
(`torch_impl._alignment.Witness`, which plans them), ``restore_dynamic_batch``'s rows, miles'
per-sample lists, SkyRL's items and AReaL's micro-batches. The binding rule and the error's words are
`ref.structure`'s (`witness_binds`, `misalignment`); where rows differ, the error names the first original
row.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import numpy as np
import torch

from ref.errors import MisalignmentError
from ref.structure import locate, misalignment, witness_binds

from .._devplan import upload
from .._tally import skipped

__all__ = ["RowWitness", "first_difference", "misaligned_row"]


def first_difference(got: Any, want: Any) -> int:
    """The first position where two row-length sequences of one length differ, else -1.

    ``got``, ``want``: lists of ints or int64 NumPy arrays (compared as bytes first).
    """
    if isinstance(got, np.ndarray) and isinstance(want, np.ndarray):
        if got.tobytes() == want.tobytes():
            return -1
        return int(np.flatnonzero(got != want)[0])
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        if a != b:
            return i
    return -1


def misaligned_row(
    key: Any, row: int, got: int, want: int, order: Any, sizes: Sequence[int]
) -> MisalignmentError:
    """The witness's error for original row ``row`` of ``key``, restored with ``got`` values where the
    witness gives ``want``.

    Args:
        order: the original row at each position of the micro-batches laid end to end (a list, an int64
            array or a CPU tensor), or None where they hold the rows in order.
        sizes: each micro-batch's rows, to name where ``row`` came from (`ref.structure.locate`).
    """
    if order is None:
        position = row
    elif isinstance(order, np.ndarray):
        position = int(np.flatnonzero(order == row)[0])
    elif isinstance(order, torch.Tensor):
        position = order.tolist().index(row)
    else:
        position = list(order).index(row)
    m, inside = locate(position, sizes)
    return misalignment(key, m, inside, row, got, want)


class RowWitness:
    """The witness of one call whose restored row lengths the host reads (or one device flag gives).

    Args:
        want: the witness, each original row's length.
        order: the original row at each position of the micro-batches laid end to end (a list, an int64
            array or a CPU tensor; None: the rows in order); a row past the witness's makes it witness
            nothing (counted).
        sizes: each micro-batch's rows.
        unbound: the keys declared unbound.
        rows: the call's rows, where the witness must give each of them a length (a witness of another
            count of rows is another batch's: it witnesses nothing, counted).
        expected: the witness in the micro-batches' order, where the caller holds it already.
    """

    __slots__ = ("_expected", "_order", "_usable", "_want", "sizes", "unbound")

    def __init__(
        self,
        want: Sequence[int] | np.ndarray,
        order: Any,
        sizes: Sequence[int],
        unbound: Collection[Any],
        rows: int | None = None,
        expected: list[int] | None = None,
    ) -> None:
        self._want: list[int] = want if type(want) is list else np.asarray(want, dtype=np.int64).tolist()
        self._order = order  # read as a list where it is needed (`_rows`)
        self._expected = expected
        self.sizes = sizes
        self.unbound = unbound
        self._usable = rows is None or len(self._want) == rows
        if not self._usable:
            skipped("calls_without_witness")  # lengths of another count of rows: nothing to witness

    def _rows(self) -> list[int] | None:
        """``order`` as a list (made once), None for the rows in order."""
        if self._order is not None and type(self._order) is not list:
            self._order = self._order.tolist()
        return self._order

    def _in_order(self) -> list[int] | None:
        """The witness in the micro-batches' order (made once), or None where it witnesses nothing."""
        if self._expected is None and self._usable:
            order = self._rows()
            if order is None:
                self._expected = self._want
            else:
                try:
                    self._expected = [self._want[i] for i in order]
                except IndexError:  # a row past the witness's: lengths of other rows than the call's
                    self._usable = False
                    skipped("calls_without_witness")
        return self._expected

    def compare(
        self,
        key: Any,
        got: Any,
        *,
        declared: bool = False,
        inferred: bool = False,
        restored: bool = False,
        on_device: torch.Tensor | None = None,
    ) -> bool:
        """Whether the witness bound ``key``; raises `MisalignmentError` at its first misaligned original row.

        Args:
            key: the key the error names.
            got: the key's row lengths in the micro-batches' order (or, ``restored``, in original row order):
                a list (None where a value has no length), an int64 array, or a tensor on any device (one
                flag read there).
            declared: the lengths are the rows' own by the trainer's form (AReaL's micro-batches), so the
                key binds unless declared unbound; else the binding rule's totals decide (`witness_binds`).
            inferred: the key's per-token nature is read from list lengths (miles' and SkyRL's per-sample
                values): a key whose values all have one length where the rows' differ is a fixed-width
                value, unproven (counted), never an error.
            restored: ``got`` is in original row order.
            on_device: the witness in ``got``'s order, already on ``got``'s device (uploaded by the caller
                with its own data: one upload a call); else uploaded here.
        """
        if declared and key in self.unbound:
            return False
        expected = self._want if restored and self._usable else self._in_order()
        if expected is None:
            return False
        if type(got) is list and got == expected:  # the common case: one C-level comparison
            return key not in self.unbound
        if isinstance(got, torch.Tensor):
            on = (
                on_device
                if on_device is not None
                else upload(np.asarray(expected, dtype=np.int64), got.device)
            )
            if not bool(got.to(torch.int64).ne(on).any()):  # the one read
                return key not in self.unbound
            got = got.tolist()  # the error path
        lengths: list[Any] = got.tolist() if isinstance(got, np.ndarray) else list(got)
        if None in lengths:
            return False  # a value without a length: not per-token
        if not declared and not witness_binds(key, True, sum(lengths), sum(expected), self.unbound):
            return False
        bad = [j for j, (a, b) in enumerate(zip(lengths, expected, strict=True)) if a != b]
        if not bad:
            return True
        if inferred and len(set(lengths)) == 1 and len(set(expected)) > 1:
            skipped("calls_without_witness")  # one length for every value: a fixed-width value, not per-token
            return False
        if restored:  # positions are original rows: the first is the first misaligned row
            row = bad[0]
            raise misaligned_row(key, row, lengths[row], expected[row], self._rows(), self.sizes)
        rows = self._rows()
        order = rows if rows is not None else range(len(lengths))
        j = min(bad, key=order.__getitem__)  # the first original row among the misaligned ones
        m, inside = locate(j, self.sizes)
        raise misalignment(key, m, inside, order[j], lengths[j], expected[j])
