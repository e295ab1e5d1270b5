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
        order: the original row at each position of the micro-batches laid end to end (None: the rows in
            order); a row past the witness's makes it witness nothing (counted).
        sizes: each micro-batch's rows.
        unbound: the keys declared unbound.
        rows: the call's rows, where the witness must give each of them a length (a witness of another
            count of rows is another batch's: it witnesses nothing, counted).
    """

    __slots__ = ("_expected", "_flat", "_list", "sizes", "total", "unbound", "usable")

    def __init__(
        self,
        want: Sequence[int] | np.ndarray,
        order: Sequence[int] | np.ndarray | None,
        sizes: Sequence[int],
        unbound: Collection[Any],
        rows: int | None = None,
    ) -> None:
        lengths = np.asarray(want, dtype=np.int64)
        count = lengths.shape[0]
        flat = np.arange(count, dtype=np.int64) if order is None else np.asarray(order, dtype=np.int64)
        self.usable = (rows is None or count == rows) and (not flat.size or int(flat.max()) < count)
        if not self.usable:
            skipped("calls_without_witness")  # lengths of other rows than the call's: nothing to witness
            flat = flat[:0]
        self._flat = flat
        self._expected = lengths[flat]  # the witness in the micro-batches' order
        self._list: list[int] | None = None
        self.total = int(np.add.reduce(self._expected))
        self.sizes = sizes
        self.unbound = unbound

    def expected(self) -> list[int]:
        """The witness in the micro-batches' order, as a list (made once)."""
        if self._list is None:
            self._list = self._expected.tolist()
        return self._list

    def compare(self, key: Any, got: Any, *, declared: bool = False, inferred: bool = False) -> bool:
        """Whether the witness bound ``key``; raises `MisalignmentError` at its first misaligned original row.

        Args:
            key: the key the error names.
            got: the key's row lengths in the micro-batches' order: a list (None where a value has no
                length), an int64 array, or a tensor on any device (one flag read there).
            declared: the lengths are the rows' own by the trainer's form (AReaL's micro-batches), so the
                key binds unless declared unbound; else the binding rule's totals decide (`witness_binds`).
            inferred: the key's per-token nature is read from list lengths (miles' and SkyRL's per-sample
                values): a key whose values all have one length where the rows' differ is a fixed-width
                value, unproven (counted), never an error.
        """
        if not self.usable or (declared and key in self.unbound):
            return False
        if isinstance(got, list) and got == self.expected():  # the common case: one C-level comparison
            return key not in self.unbound
        if isinstance(got, torch.Tensor):
            on = torch.from_numpy(self._expected).to(got.device, non_blocking=True)
            if not bool(got.to(torch.int64).ne(on).any()):  # the one read
                return True
            got = got.tolist()  # the error path
        if isinstance(got, list) and None in got:
            return False  # a value without a length: not per-token
        lengths = np.asarray(got, dtype=np.int64)
        values = int(np.add.reduce(lengths))
        if not declared and not witness_binds(key, True, values, self.total, self.unbound):
            return False
        expected = self._expected
        bad = np.flatnonzero(lengths != expected)
        if not bad.size:
            return True
        if inferred and np.unique(lengths).size == 1 and np.unique(expected).size > 1:
            skipped("calls_without_witness")  # one length for every value: a fixed-width value, not per-token
            return False
        j = int(bad[np.argmin(self._flat[bad])])  # the first original row among the misaligned ones
        m, inside = locate(j, self.sizes)
        raise misalignment(key, m, inside, int(self._flat[j]), int(lengths[j]), int(expected[j]))
