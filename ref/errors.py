"""The typed errors of rebatch, shared by the reference (`ref`) and production (`torch_impl`).

Pure Python: importing this module imports neither JAX nor torch, so `torch_impl` can raise the
same classes as `ref` without pulling in JAX.

Every class is a `ValueError` (through `RebatchError`), and every message names where the defect is
(the output key and the micro-batch, where they apply) and the offending value.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "RebatchError",
    "NotAPermutationError",
    "PartitionMismatchError",
    "OutputMismatchError",
    "KeyMismatchError",
    "DtypeMismatchError",
    "DeviceMismatchError",
    "ShapeMismatchError",
    "InvalidJaggedError",
    "UnsupportedSettingError",
    "RowIndexError",
    "TokenBudgetError",
    "RankFailedError",
    "MisalignmentError",
    "where",
]


class RebatchError(ValueError):
    """Base class of every input rejected by rebatch."""


class NotAPermutationError(RebatchError):
    """The flattened partitions are not a permutation of ``range(B)``.

    Raised for a duplicate, negative, out-of-range or missing index, or an index that is not an integer.
    """


class PartitionMismatchError(RebatchError):
    """The partitions do not match the micro-batches.

    Raised when the number of partitions differs from the number of micro-batches that carry outputs,
    or when a micro-batch's row count differs from the size of its partition.
    """


class OutputMismatchError(RebatchError):
    """The outputs of different micro-batches disagree (base of the four classes below)."""


class KeyMismatchError(OutputMismatchError):
    """A key is present in some micro-batches' outputs and absent from others."""


class DtypeMismatchError(OutputMismatchError):
    """One key's outputs have different dtypes in different micro-batches (no silent promotion)."""


class DeviceMismatchError(OutputMismatchError):
    """One key's outputs sit on different devices in different micro-batches."""


class ShapeMismatchError(OutputMismatchError):
    """One key's outputs differ in layout (jagged or dense) or trailing shape between micro-batches."""


class InvalidJaggedError(RebatchError):
    """Jagged data that breaks an invariant of the jagged layout (see ``docs/spec.md``).

    Offsets must be 1-D integers with ``offsets[0] == 0``, non-decreasing, and
    ``offsets[-1] == len(values)``; a torch nested tensor must use the jagged layout with its ragged
    dimension at 1.
    """


class UnsupportedSettingError(RebatchError):
    """A setting rebatch does not support: an unknown ``pad_mode``, jagged outputs with a padded
    ``pad_mode``, or ``indices`` missing while ``use_dynamic_bsz`` is on."""


class RowIndexError(RebatchError):
    """A row index given to ``take`` that is negative, out of range or not an integer.

    Negative indices are rejected rather than wrapped: a wrapped index is how misaligned rows go unseen.
    """


class TokenBudgetError(RebatchError):
    """Rows that cannot be packed under the token budget: a single row longer than the budget, or more
    micro-batches needed than there are rows."""


class RankFailedError(RebatchError):
    """Another rank of a process group failed inside a distributed helper of ``torch_impl`` with an error
    that is not a `RebatchError` (an out-of-memory error, say): raised on every other rank, naming the
    failing rank and its error, so that none of them waits for the process group's timeout. (A
    `RebatchError` on one rank is raised with its own class on every rank, its message prefixed with
    ``"rank r: "``.)"""


class MisalignmentError(RebatchError):
    """A well-formed misalignment: the input passes every structural check (the indices are a
    permutation, each micro-batch has its partition's row count), but a restored jagged row does not
    have the length the batch's own alignment witness gives that original row (in verl, the row's
    ``input_ids`` length): a wrong permutation, micro-batches in the wrong order, or another step's
    indices. The message names the key, the micro-batch and the position in it, the original row, both
    lengths, and how to switch the check off (see ``docs/spec.md``, "The alignment witness")."""


def where(key: Any = None, micro_batch: int | None = None, *, rank: int | None = None) -> str:
    """The location prefix of an error message: ``"key 'x', micro-batch 2: "`` or, between the ranks of
    a process group, ``"key 'x', rank 1: "`` (parts left out when None)."""
    parts = []
    if key is not None:
        parts.append(f"key {key!r}")
    if micro_batch is not None:
        parts.append(f"micro-batch {micro_batch}")
    if rank is not None:
        parts.append(f"rank {rank}")
    return (", ".join(parts) + ": ") if parts else ""
