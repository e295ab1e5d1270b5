"""`restore` and `split`: between original sample order and micro-batch order."""

from __future__ import annotations

from collections.abc import Sequence

from ._parts import Part, check_parts, num_rows
from ._permutation import flatten_partitions, inverse_permutation
from ._take import take
from ._x64 import exact

__all__ = ["restore", "split"]


@exact
def restore(x: Part, partitions: Sequence[Sequence[int]]) -> Part:
    """Rows of ``x`` (micro-batch order) put back in original order.

    With ``perm = [i for p in partitions for i in p]``, output row ``perm[k]`` is input row ``k``:
    ``out = [x.rows()[perm.index(i)] for i in range(B)]``, i.e. ``take(x, inverse_permutation(perm))``.
    ``x``: ``[B, (j), *F]`` or ``[B, *F]``; ``partitions`` must flatten to a permutation of ``range(B)``
    (`NotAPermutationError`). ``partitions`` are static under ``jax.jit``.
    """
    (x,) = check_parts([x])
    perm = flatten_partitions(partitions, num_rows(x))
    return take(x, inverse_permutation(perm))


@exact
def split(x: Part, partitions: Sequence[Sequence[int]]) -> list[Part]:
    """``out = [take(x, p) for p in partitions]``: the micro-batches of ``x``, the inverse of `restore`.

    ``x``: ``[B, (j), *F]`` or ``[B, *F]``; ``partitions`` must flatten to a permutation of ``range(B)``
    (`NotAPermutationError`), so every row lands in exactly one micro-batch.
    """
    (x,) = check_parts([x])
    flatten_partitions(partitions, num_rows(x))
    return [take(x, list(p)) for p in partitions]
