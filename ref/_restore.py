"""`restore` and `split`: between original sample order and micro-batch order."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._parts import Part, check_parts, num_rows
from ._permutation import _inverse, as_permutation, flatten_partitions
from ._take import take, take_checked
from ._x64 import exact

__all__ = ["restore", "split"]


@exact
def restore(x: Part, partitions: Any) -> Part:
    """Rows of ``x`` (micro-batch order) put back in original order.

    With ``perm = [i for p in partitions for i in p]``, output row ``perm[k]`` is input row ``k``:
    ``out = [x.rows()[perm.index(i)] for i in range(B)]``, i.e. ``take(x, inverse_permutation(perm))``.
    ``x``: ``[B, (j), *F]`` or ``[B, *F]``; ``partitions`` must flatten to a permutation of ``range(B)``
    (`NotAPermutationError`).

    ``partitions`` is a list of partitions (static under ``jax.jit``: each new one compiles anew) or
    ``perm`` itself, one 1-D integer array (as verl's ``restore_dynamic_batch`` takes a flat index
    list). Passed as a ``jax.jit`` argument, ``perm`` compiles once per shape and dtype, for every
    permutation: its dtype, rank and length are checked at trace time and its values by ``checkify``
    in the compiled program, so call it through `ref.checked`:
    ``ref.checked(lambda x, perm: ref.restore(x, perm))(x, jnp.asarray(perm))``.

    >>> x = Jagged.from_rows([[1, 2], [3], [], [4, 5, 6]])
    >>> P = [[2, 0], [3, 1]]
    >>> perm = [i for p in P for i in p]
    >>> rows_of = lambda y: [r.tolist() for r in y.rows()]
    >>> rows_of(restore(x, P)) == [rows_of(x)[perm.index(i)] for i in range(len(perm))]
    True
    >>> rows_of(restore(x, jnp.asarray(perm))) == rows_of(restore(x, P))
    True
    """
    (x,) = check_parts([x])
    perm = as_permutation(partitions, num_rows(x))
    return take_checked(x, _inverse(perm))


@exact
def split(x: Part, partitions: Sequence[Sequence[int]]) -> list[Part]:
    """``out = [take(x, p) for p in partitions]``: the micro-batches of ``x``, the inverse of `restore`.

    ``x``: ``[B, (j), *F]`` or ``[B, *F]``; ``partitions`` must flatten to a permutation of ``range(B)``
    (`NotAPermutationError`), so every row lands in exactly one micro-batch.

    >>> x = Jagged.from_rows([[1, 2], [3], [], [4, 5, 6]])
    >>> P = [[2, 0], [3, 1]]
    >>> rows_of = lambda y: [r.tolist() for r in y.rows()]
    >>> [rows_of(piece) for piece in split(x, P)] == [rows_of(take(x, p)) for p in P]
    True
    """
    (x,) = check_parts([x])
    flatten_partitions(partitions, num_rows(x))
    return [take(x, list(p)) for p in partitions]
