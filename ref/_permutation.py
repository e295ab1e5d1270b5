"""Permutations: flattening partitions, checking them, inverting them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._checked import check_is_permutation, traced_indices
from ._jagged import is_concrete
from ._x64 import exact
from .errors import NotAPermutationError
from .structure import check_partition, check_partitions, check_readable

__all__ = ["flatten_partitions", "inverse_permutation", "check_permutation", "is_flat", "as_permutation"]


def _as_index_list(part: Any, m: int | None) -> list[Any]:
    """One partition (checked 1-D) as a Python list of its entries; a 0-d array entry counts as its value
    (iterating a tensor gives 0-d tensors), an entry that is itself a sequence is then not an integer."""
    check_partition(part, m)
    entries = list(np.asarray(part, dtype=object)) if hasattr(part, "ndim") else list(part)
    return [x.item() if hasattr(x, "item") and np.ndim(x) == 0 else x for x in entries]


def check_permutation(partitions: Sequence[Any], num_rows: int) -> list[int]:
    """The partitions flattened, checked to be a permutation of ``range(num_rows)``.

    ``[i for p in partitions for i in p]``; raises `NotAPermutationError` for an entry that is not an
    integer, negative, ``>= num_rows``, a duplicate, or a missing index (in that order of checking).
    """
    flat: list[int] = []
    seen: dict[int, tuple[int, int]] = {}
    for m, part in enumerate(check_partitions(partitions)):
        for j, i in enumerate(_as_index_list(part, m)):
            at = f"micro-batch {m}, position {j}: index {i!r}"
            if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
                raise NotAPermutationError(f"{at} is not an integer")
            if i < 0:
                raise NotAPermutationError(f"{at} is negative (negative indices are not wrapped)")
            if i >= num_rows:
                raise NotAPermutationError(f"{at} is out of range for {num_rows} rows")
            i = int(i)
            if i in seen:
                m0, j0 = seen[i]
                raise NotAPermutationError(f"{at} duplicates micro-batch {m0}, position {j0}")
            seen[i] = (m, j)
            flat.append(int(i))
    if len(flat) != num_rows:
        missing = [i for i in range(num_rows) if i not in seen]
        raise NotAPermutationError(
            f"index {missing[0]} is missing: the partitions hold {len(flat)} indices for {num_rows} rows"
        )
    return flat


def is_flat(partitions: Any) -> bool:
    """True when ``partitions`` is one array of indices (the partitions already flattened), not a list
    of partitions: a traced array, or a JAX or NumPy array of one dimension and a non-object dtype."""
    if not is_concrete(partitions):
        return True
    return (
        isinstance(partitions, (jax.Array, np.ndarray))
        and partitions.ndim == 1
        and partitions.dtype != object
    )


def as_permutation(partitions: Any, num_rows: int) -> jax.Array:
    """``perm = [i for p in partitions for i in p]`` as an int64 ``[B]`` array, checked to be a
    permutation of ``range(num_rows)``; ``partitions`` may be a list of partitions or, already
    flattened, one 1-D integer array (traced under ``jax.jit``: dtype, rank and length are checked at
    trace time, the values by ``checkify`` in the compiled program)."""
    if is_concrete(partitions):
        return flatten_partitions([partitions] if is_flat(partitions) else partitions, num_rows)
    perm = traced_indices(partitions, NotAPermutationError, "a flattened permutation")
    if perm.shape[0] != num_rows:
        raise NotAPermutationError(f"the permutation holds {perm.shape[0]} indices for {num_rows} rows")
    check_is_permutation(perm)
    return perm


@exact
def flatten_partitions(partitions: Sequence[Any], num_rows: int) -> jax.Array:
    """``perm = [i for p in partitions for i in p]``, an int64 ``[B]`` array.

    Checked to be a permutation of ``range(num_rows)`` (`NotAPermutationError` otherwise).

    >>> P = [[2, 0], [3, 1]]
    >>> flatten_partitions(P, 4).tolist() == [i for p in P for i in p]
    True
    """
    return jnp.asarray(np.asarray(check_permutation(partitions, num_rows), dtype=np.int64).reshape(-1))


@exact
def inverse_permutation(perm: Any) -> jax.Array:
    """``inv = [perm.index(i) for i in range(len(perm))]``, i.e. ``inv[perm[k]] == k``.

    ``perm``: ``[B]`` integers, checked to be a permutation (`NotAPermutationError`): in Python when
    concrete; under ``jax.jit`` its dtype and rank at trace time and its values by ``checkify`` (see
    `ref.checked`). Returns int64.

    >>> perm = [2, 0, 3, 1]
    >>> inverse_permutation(perm).tolist() == [perm.index(i) for i in range(len(perm))]
    True
    """
    if is_concrete(perm):
        check_readable(perm)
        perm = jnp.asarray(check_permutation([np.asarray(perm).reshape(-1)], int(np.size(perm))), jnp.int64)
    else:
        perm = traced_indices(perm, NotAPermutationError, "a permutation")
        check_is_permutation(perm)
    return _inverse(perm)


def _inverse(perm: jax.Array) -> jax.Array:
    """``inv[perm[k]] = k`` for a ``perm`` already checked to be a permutation."""
    n = perm.shape[0]
    return (
        jnp.zeros((n,), jnp.int64)
        .at[perm]
        .set(jnp.arange(n, dtype=jnp.int64), mode="promise_in_bounds", unique_indices=True)
    )
