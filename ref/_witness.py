"""The alignment witness: every bound key's restored rows checked against the batch's own row lengths.

Step 6 of ``postprocess_batch``'s order of checks (``docs/spec.md``, "The alignment witness"). The
binding rule and the error's words are `ref.structure`'s (`witness_binds`, `misalignment`), shared with
``torch_impl``. Concrete offsets and a concrete witness are checked in Python; a traced one (inside
`ref.checked`) by ``checkify`` in the compiled program, with the binding rule folded into the check.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from ._checked import _check, _first, _shown
from ._jagged import Jagged, is_concrete
from ._parts import Part
from .structure import (
    WITNESS,
    check_lengths,
    locate,
    misalignment,
    misalignment_text,
    witness_binds,
    witness_form,
)

__all__ = ["check_alignment", "witness_lengths"]


def witness_lengths(witness: Any, rows: int) -> list[int] | Any:
    """Step 6a: the witness ``[rows]`` as Python ints (checked by `ref.structure.check_lengths`), or,
    when it is traced, as an int64 array whose shape and dtype are checked now and whose values are
    checked (none negative) in the compiled program."""
    if hasattr(witness, "dtype") and not is_concrete(witness):
        witness_form(witness, rows)
        w = jnp.asarray(witness).astype(jnp.int64)
        if rows:
            neg = w < 0
            i = jnp.minimum(_first(neg), rows - 1)
            _check(
                ~jnp.any(neg),
                f"InvalidJaggedError: {WITNESS}[{{i}}] = {{v}} is negative",
                i=_shown(i),
                v=_shown(w[i]),
            )
        return w
    return check_lengths(witness, rows=rows, name=WITNESS)


def check_alignment(
    restored: Mapping[Any, Part],
    witness: Any,
    perm: Sequence[int],
    sizes: Sequence[int],
    unbound: Collection[Any] = (),
) -> None:
    """Step 6: every bound key's restored rows have the witness's lengths.

    ``restored``: each key's result in original order (``[B, (j), *F]`` or dense); ``witness``: ``[B]``
    lengths in original order; ``perm``: the flattened partitions (original row of each concatenated
    row); ``sizes``: each micro-batch's row count. For every key ``k`` the witness binds
    (`ref.structure.witness_binds`: jagged, not in ``unbound``, ``sum(witness)`` values):
    ``[len(r) for r in rows(restored[k])] == list(witness)``; else `MisalignmentError` for the first
    such key and its first original row (ascending) that differs.

    >>> lp = Jagged.from_rows([[1.0, 2.0], [3.0], []])  # restored rows of 2, 1 and 0 values
    >>> check_alignment({"lp": lp}, [2, 1, 0], [2, 0, 1], [2, 1])  # nothing raised
    >>> [len(r) for r in lp.rows()] == [2, 1, 0]
    True
    >>> check_alignment({"lp": lp}, [1, 2, 0], [2, 0, 1], [2, 1])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ref.errors.MisalignmentError: key 'lp', micro-batch 0, position 1: 2 values restored as original row 0,
    ...
    >>> check_alignment({"lp": lp}, [1, 2, 0], [2, 0, 1], [2, 1], unbound={"lp"})  # declared unbound
    """
    if not restored:
        return
    rows = len(perm)
    w = witness_lengths(witness, rows)
    inv = [0] * rows
    for n, i in enumerate(perm):
        inv[i] = n
    for key, out in restored.items():
        if not isinstance(out, Jagged) or key in unbound:
            continue
        total = int(out.values.shape[0])
        lengths = out.offsets[1:] - out.offsets[:-1]
        if isinstance(w, list) and is_concrete(out.offsets):
            if not witness_binds(key, True, total, sum(w), unbound):
                continue
            for i, (got, want) in enumerate(zip(np.asarray(lengths).tolist(), w, strict=True)):
                if got != want:
                    m, j = locate(inv[i], sizes)
                    raise misalignment(key, m, j, i, got, want)
        elif rows:
            starts = list(itertools.accumulate(sizes, initial=0))
            _check_traced(key, total, lengths, jnp.asarray(w, dtype=jnp.int64), inv, starts)


def _check_traced(key: Any, total: int, lengths: Any, w: Any, inv: list[int], starts: list[int]) -> None:
    """`check_alignment` of one key in the compiled program: the binding rule (its total) and the rule."""
    got = lengths.astype(jnp.int64)
    bad = (got != w) & (jnp.sum(w) == total)
    i = jnp.minimum(_first(bad), w.shape[0] - 1)
    n = jnp.asarray(inv, dtype=jnp.int64)[i]
    first = jnp.asarray(starts, dtype=jnp.int64)
    m = jnp.sum(first[1:] <= n)  # the micro-batch holding position n (empty ones hold none)
    marks = {name: f"\x00{name}\x00" for name in ("m", "j", "i", "got", "want")}
    text = misalignment_text(key, *marks.values()).replace("{", "{{").replace("}", "}}")
    for name, mark in marks.items():
        text = text.replace(mark, f"{{{name}}}")
    _check(
        ~jnp.any(bad),
        "MisalignmentError: " + text,
        m=_shown(m),
        j=_shown(n - first[m]),
        i=_shown(i),
        got=_shown(got[i]),
        want=_shown(w[i]),
    )
