"""Misalignments only exact provenance sees (docs/spec.md, "Exact provenance"): on a fixed-length batch
(every row one length, where the alignment witness is blind, and dense keys, which it never binds).

Each breaker starts from a split call (`split_call`: a fixed-length batch split by rebatch's split, each
output built on its micro-batch's offsets and carrying its rows, the witness and the split's
`SplitProvenance` given; the call's own where it has one, else one of the call's row count with a drawn
length and budget) and misaligns it, every structure valid and every row length right: two micro-batches
of identical lengths swapped in ``output_lst``; a row of one micro-batch transposed with a row of another
in the indices; another partition of the same batch (its rows in order, cut into the split's sizes);
another step's indices (the split's rotated); the inverse given for the forward permutation; two rows of
one micro-batch transposed in the indices (the dense key's rows restored as each other's). Where a call
has no room for the chosen misalignment (no two micro-batches of one size, an involution, no micro-batch
of two rows), a row is transposed across micro-batches instead. Both implementations raise `MisalignmentError`
given the
split's provenance (``ref``: the rows each output carries and ``ref.Provenance``; ``torch_impl``: the
nested ints and ``torch_impl.recorded(data)``); without it, both are silent.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable

from ref import errors as E

from ._alignment import _another_step, _inverse
from ._core import POSTPROCESS, Breaker, Call, Chooser, Defect, split_call

__all__ = ["PROVENANCE"]

_NEEDS = "two rows (made a fixed-length batch split by rebatch's split, its provenance given)"


def _split_of(call: Call, choose: Chooser) -> Call:
    """``call`` if it carries a split's provenance, else a fixed-length split of its row count (a drawn
    length of 1 to 4 tokens, a budget of at most half the rows: two micro-batches or more)."""
    if "provenance" in call.kwargs:
        return call
    rows = sum(len(p) for p in call.args[1])
    return split_call(rows, choose.integer(1, 4), choose.integer(1, max(1, rows // 2)))


def _sizes(call: Call) -> list[int]:
    return [len(p) for p in call.args[1]]


def _cut(flat: list[int], sizes: list[int]) -> list[list[int]]:
    bounds = list(itertools.accumulate(sizes, initial=0))
    return [flat[a:b] for a, b in itertools.pairwise(bounds)]


def _transposed(call: Call, choose: Chooser) -> Call:
    """A row of micro-batch ``m`` and a row of micro-batch ``n`` transposed in the indices."""
    sizes, indices = _sizes(call), call.args[1]
    m, n = choose.choice(list(itertools.combinations([q for q, s in enumerate(sizes) if s], 2)))
    a, b = choose.integer(0, sizes[m] - 1), choose.integer(0, sizes[n] - 1)
    indices[m][a], indices[n][b] = indices[n][b], indices[m][a]
    return call


def _swapped(call: Call, choose: Chooser) -> Call:
    """Two micro-batches of one (non-zero) row count, so of identical lengths, swapped in ``output_lst``."""
    sizes, outs = _sizes(call), call.args[0]
    pairs = [(m, n) for m, n in itertools.combinations(range(len(sizes)), 2) if sizes[m] == sizes[n] > 0]
    if not pairs:
        return _transposed(call, choose)
    m, n = choose.choice(pairs)
    outs[m], outs[n] = outs[n], outs[m]
    return call


def _indices(make: Callable[[list[int], Chooser], list[int]]) -> Breaker:
    """The indices replaced by ``make(flat, choose)`` (another permutation of the same rows) cut into the
    split's sizes; a row transposed across micro-batches instead where that changes nothing."""

    def breaker(call: Call, choose: Chooser) -> Call:
        call = _split_of(call, choose)
        flat = [i for p in call.args[1] for i in p]
        perm = make(flat, choose)
        if perm == flat:
            return _transposed(call, choose)
        call.args[1][:] = _cut(perm, _sizes(call))
        return call

    return breaker


def _another_partition(flat: list[int], choose: Chooser) -> list[int]:
    """The same batch partitioned otherwise: its rows in order (reversed where that is the split's)."""
    ordered = sorted(flat)
    return ordered if ordered != flat else ordered[::-1]


def _dense_rows(call: Call, choose: Chooser) -> Call:
    """Two rows of one micro-batch transposed in the indices: the dense key's rows (which the witness never
    binds) restored as each other's, as the jagged key's. The jagged key's nested int names the split the
    call answers to (a call of dense keys alone carries no provenance in torch: unproven, never an error)."""
    call = _split_of(call, choose)
    sizes, indices = _sizes(call), call.args[1]
    wide = [m for m, s in enumerate(sizes) if s >= 2]
    if not wide:
        return _transposed(call, choose)
    m = choose.choice(wide)
    a, b = choose.choice(list(itertools.combinations(range(sizes[m]), 2)))
    indices[m][a], indices[m][b] = indices[m][b], indices[m][a]
    return call


def _on_a_split(breaker: Breaker) -> Breaker:
    return lambda call, choose: breaker(_split_of(call, choose), choose)


def _stray(m: int, q: int, j: int, got: int, want: int) -> str:
    """The pattern of output ``m``'s error: it holds micro-batch ``q``'s rows of the split (its name a
    number of the process), which differ from its slot's at position ``j`` (``got`` in the slot, ``want``
    in the micro-batch)."""
    before = f"key 'log_probs', micro-batch {m}: this output holds micro-batch {q}'s rows of split "
    after = (
        f", by the split's provenance, not its slot's: the rows differ at position {j}: row {got} in the "
        f"slot, row {want} in the micro-batch"
    )
    return re.escape(before) + r"\d+" + re.escape(after)


def _row(name: str, breaker: Breaker, pattern: str, script: tuple[int, ...] = ()) -> Defect:
    """A defect of the family: `MisalignmentError` whose message matches ``pattern`` on the named case
    (``VALID["postprocess_split"]``: 6 rows of 3 tokens, indices ``[[0, 5], [2, 3], [1, 4]]``)."""
    return Defect(
        name,
        POSTPROCESS,
        E.MisalignmentError,
        pattern,
        _NEEDS,
        breaker,
        "postprocess_split",
        script,
    )


#: The family, in the order of the issue's named misalignments.
PROVENANCE: tuple[Defect, ...] = (
    _row("fixed_length_micro_batches_swapped", _on_a_split(_swapped), _stray(0, 1, 0, 0, 2)),
    _row(
        "fixed_length_rows_transposed_across_micro_batches",
        _on_a_split(_transposed),
        _stray(0, 0, 0, 2, 0),
    ),
    _row(
        "fixed_length_another_partitions_indices",
        _indices(_another_partition),
        _stray(0, 0, 1, 1, 5),
    ),
    _row(
        "fixed_length_another_steps_indices",
        _indices(_another_step),
        _stray(0, 0, 0, 5, 0),
    ),
    _row("fixed_length_inverse_for_forward", _indices(_inverse), _stray(0, 0, 1, 4, 5)),
    _row("fixed_length_dense_key_rows", _dense_rows, _stray(0, 0, 0, 5, 0)),
)
