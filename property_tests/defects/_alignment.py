"""Well-formed misalignments: inputs that pass every structural check but whose restored rows do not match the
batch's alignment witness (docs/spec.md, 'The alignment witness').

Each breaker changes which original row a concatenated row is restored as, keeping every structure
valid: two micro-batches of equal size swapped in ``output_lst``, two rows swapped inside a micro-batch's
indices, the inverse given for the forward permutation, another step's indices of the same sizes, the
outputs left in micro-batch order, fixed-size micro-batches swapped. Then (`_witnessed`) it gives the
call a witness and a per-token key that make the misalignment visible, as verl's engines make every
per-token output: the key ``aligned`` (first in key order) has, at each concatenated position, the
length of the row that position was computed for, and the witness the batch's lengths, all 1 but one
misplaced row's 2, so the restored row where that row lands disagrees with the witness whatever the
call (a breaker never leaves the rows in their place). Where a call has no room for the chosen
misalignment (no two micro-batches of equal size, an involution to invert), two rows are swapped instead.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch

from ref import errors as E

from ..data import jagged
from ._core import POSTPROCESS, Breaker, Call, Chooser, Defect

__all__ = ["ALIGNMENT"]

_NEEDS = "two rows (a key and the witness are added)"


def _sizes(call: Call) -> list[int]:
    return [len(p) for p in call.args[1]]


def _witnessed(
    call: Call, src: list[int], perm: list[int], sizes: list[int], *, dynamic: bool = True
) -> Call:
    """``call`` with a witness and the key ``aligned`` that show the misalignment: concatenated position
    ``k`` holds a row computed for original row ``src[k]`` and is restored as ``perm[k]`` (the partitions,
    ``perm`` cut into ``sizes``; None without dynamic batch size, where ``perm`` is the identity)."""
    k = next((k for k, (s, p) in enumerate(zip(src, perm, strict=True)) if s != p), None)
    if k is None:
        raise RuntimeError(
            "a breaker of the alignment family left every row in its place (a defect of the kit)"
        )
    witness = [1] * len(perm)
    witness[src[k]] = 2
    bounds = list(itertools.accumulate(sizes, initial=0))
    outs = call.args[0]
    for q, o in enumerate(outs):
        lengths = [witness[src[j]] for j in range(bounds[q], bounds[q + 1])]
        key = jagged(torch.arange(float(sum(lengths))), lengths)
        o["model_output"] = {"aligned": key, **{n: v for n, v in o["model_output"].items() if n != "aligned"}}
    indices = [perm[bounds[q] : bounds[q + 1]] for q in range(len(sizes))] if dynamic else None
    return Call(call.op, (outs, indices), {**call.kwargs, "use_dynamic_bsz": dynamic, "witness": witness})


def _swap_rows(call: Call, choose: Chooser) -> Call:
    """Two positions of the flattened indices swapped: two of one micro-batch where one has two rows."""
    sizes = _sizes(call)
    flat = [int(i) for p in call.args[1] for i in p]
    bounds = list(itertools.accumulate(sizes, initial=0))
    inside = [
        pair for q in range(len(sizes)) for pair in itertools.combinations(range(bounds[q], bounds[q + 1]), 2)
    ]
    a, b = choose.choice(inside or list(itertools.combinations(range(len(flat)), 2)))
    perm = list(flat)
    perm[a], perm[b] = perm[b], perm[a]
    return _witnessed(call, flat, perm, sizes)


def _swap_micro_batches(call: Call, choose: Chooser) -> Call:
    """Two micro-batches with the same (non-zero) row count swapped in ``output_lst``, the indices kept."""
    sizes = _sizes(call)
    pairs = [(m, n) for m, n in itertools.combinations(range(len(sizes)), 2) if sizes[m] == sizes[n] > 0]
    if not pairs:
        return _swap_rows(call, choose)
    flat = [int(i) for p in call.args[1] for i in p]
    src = [flat[j] for j in _outputs_swapped(call, sizes, *choose.choice(pairs))]
    return _witnessed(call, src, flat, sizes)


def _outputs_swapped(call: Call, sizes: list[int], m: int, n: int) -> list[int]:
    """Micro-batches ``m`` and ``n`` swapped in ``output_lst`` (in place); returns, for each concatenated
    position now, the position its row had before."""
    outs = call.args[0]
    outs[m], outs[n] = outs[n], outs[m]
    order = list(range(len(sizes)))
    order[m], order[n] = n, m
    bounds = list(itertools.accumulate(sizes, initial=0))
    return [j for q in order for j in range(bounds[q], bounds[q + 1])]


def _replaced(make: Callable[[list[int], Chooser], list[int]]) -> Breaker:
    """The flattened indices replaced by ``make(flat, choose)`` (a permutation of the same rows), cut
    into the same sizes; two rows swapped instead where that changes nothing."""

    def breaker(call: Call, choose: Chooser) -> Call:
        flat = [int(i) for p in call.args[1] for i in p]
        perm = make(flat, choose)
        if perm == flat:
            return _swap_rows(call, choose)
        return _witnessed(call, flat, perm, _sizes(call))

    return breaker


def _inverse(flat: list[int], choose: Chooser) -> list[int]:
    inv = [0] * len(flat)
    for k, i in enumerate(flat):
        inv[i] = k
    return inv


def _another_step(flat: list[int], choose: Chooser) -> list[int]:
    """Another step's indices of the same sizes: these rotated by a drawn amount (never by none)."""
    shift = choose.integer(1, len(flat) - 1)
    return flat[shift:] + flat[:shift]


def _fixed_size_swapped(call: Call, choose: Chooser) -> Call:
    """Without dynamic batch size (no indices: the outputs in order are the batch), two non-empty
    micro-batches swapped in ``output_lst``; two rows of the key swapped where fewer than two have rows."""
    sizes = _sizes(call)
    n_rows = sum(sizes)
    filled = [m for m, s in enumerate(sizes) if s]
    if len(filled) < 2:
        a, b = choose.choice(list(itertools.combinations(range(n_rows), 2)))
        src = list(range(n_rows))
        src[a], src[b] = src[b], src[a]
        return _witnessed(call, src, list(range(n_rows)), sizes, dynamic=False)
    m, n = choose.choice(list(itertools.combinations(filled, 2)))
    src = _outputs_swapped(call, sizes, m, n)
    sizes[m], sizes[n] = sizes[n], sizes[m]
    return _witnessed(call, src, list(range(n_rows)), sizes, dynamic=False)


_AT = (
    r"key 'aligned', micro-batch {m}, position {j}: {got} values restored as original row {row}, "
    r"whose length the alignment witness gives as {want}"
)


def _misaligned(
    name: str, breaker: Breaker, m: int, j: int, got: int, row: int, want: int, script: tuple[int, ...] = ()
) -> Defect:
    """A defect of the family: `MisalignmentError` at micro-batch ``m``, position ``j`` of the named case
    (``got`` values restored as original row ``row``, whose witnessed length is ``want``)."""
    message = _AT.format(m=m, j=j, got=got, row=row, want=want)
    return Defect(
        name,
        POSTPROCESS,
        E.MisalignmentError,
        message,
        _NEEDS,
        breaker,
        base="postprocess_three",
        script=script,
    )


#: The family: each raises `MisalignmentError` naming the key ``aligned`` (named cases on
#: ``VALID["postprocess_three"]``: micro-batches of 2, 2 and 1 rows, indices ``[[1, 2], [0, 4], [3]]``).
ALIGNMENT: tuple[Defect, ...] = (
    _misaligned("micro_batches_swapped", _swap_micro_batches, 1, 0, 1, 0, 2),
    _misaligned("rows_swapped_in_a_micro_batch", _swap_rows, 1, 1, 1, 0, 2, script=(1,)),
    _misaligned("inverse_for_forward", _replaced(_inverse), 1, 0, 1, 1, 2),
    _misaligned("another_steps_indices", _replaced(_another_step), 2, 0, 1, 1, 2),
    _misaligned(
        "outputs_in_micro_batch_order", _replaced(lambda flat, choose: list(range(len(flat)))), 0, 0, 2, 0, 1
    ),
    _misaligned("fixed_size_micro_batches_swapped", _fixed_size_swapped, 0, 0, 2, 0, 1),
)
