"""Exact provenance in ``ref``: the split's `ref.provenance.Provenance` checked against the restore's
indices and each output's own provenance (``output_lst[m]["provenance"]``), before any data moves.

Step 6p of ``postprocess_batch``'s order of checks (``docs/spec.md``, "Exact provenance"); the value and
the error's words are `ref.provenance`'s, shared with ``torch_impl``. Concrete values are checked in
Python; traced ones (inside `ref.checked`) by ``checkify`` in the compiled program.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from ._checked import _check, _first, _shown
from ._jagged import is_concrete
from .provenance import (
    PROVENANCE,
    Carried,
    Provenance,
    check_indices,
    mixed_splits,
    real_rows,
    stray_indices,
    stray_output,
)
from .structure import PADDING

__all__ = ["check_provenance", "split_with_provenance"]


def split_with_provenance(
    x: Any, partitions: Sequence[Sequence[int]]
) -> tuple[list[Any], list[list[int]], Provenance]:
    """`ref.split` that also returns the indices and the split's `Provenance` (each micro-batch's rows):
    the restore checks outputs carrying ``provenance.rows[m]`` and these indices against it.

    >>> x = Jagged.from_rows([[1.0], [2.0, 3.0], [4.0]])
    >>> parts, indices, prov = split_with_provenance(x, [[2, 0], [1]])
    >>> indices, prov.rows
    ([[2, 0], [1]], ((2, 0), (1,)))
    """
    from ._restore import split

    parts = split(x, partitions)
    indices = [[int(i) for i in p] for p in partitions]
    return parts, indices, Provenance(tuple(tuple(p) for p in indices))


def _held(row: Any) -> bool:
    """Whether ``row`` (an array or a sequence of integers, a pytree's leaves) holds values now."""
    if isinstance(row, list | tuple):
        return all(is_concrete(i) for i in row)
    return is_concrete(row)


def _same(a: Any, b: Any) -> Any:
    """``a == b`` as rows (1-D integers): a Python bool where both are concrete, else a traced flag
    (shapes differ: False)."""
    if _held(a) and _held(b):
        return [int(i) for i in np.asarray(a).reshape(-1)] == [int(i) for i in np.asarray(b).reshape(-1)]
    a, b = jnp.asarray(a).reshape(-1), jnp.asarray(b).reshape(-1)
    if a.shape != b.shape:
        return False
    return jnp.all(a.astype(jnp.int64) == b.astype(jnp.int64))


def check_provenance(
    output_lst: Sequence[Mapping[str, Any]],
    indices: Sequence[Sequence[int]] | None,
    provenance: Provenance | Sequence[Provenance],
    key: Any,
) -> bool:
    """Step 6p: the split the outputs answer to, then the indices against that split's (with dynamic
    batch size), then every output carrying its provenance against its slot; returns whether every
    output carried one (then every key of the call is proven, dense keys included). ``provenance``: the
    split's `Provenance`, or every live split of the batch; ``output_lst`` and ``indices`` without
    padding micro-batches; ``key``: the first jagged model-output key (else the first key), named by an
    output's error.

    The split is the one whose rows the first output carrying any holds; an output carrying another
    given split's rows raises (two splits mixed); an output carrying none, or a split not given, is
    unproven; no output carrying any: nothing is checked (``docs/spec.md``, "Exact provenance").

    >>> prov = Provenance(((2, 0), (1,)))
    >>> check_provenance([{"provenance": [2, 0]}, {"provenance": [1]}], [[2, 0], [1]], prov, "lp")
    True
    >>> swapped = [{"provenance": [1]}, {"provenance": [2, 0]}]
    >>> check_provenance(swapped, [[2, 0], [1]], prov, "lp")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ref.errors.MisalignmentError: key 'lp', micro-batch 0: this output holds micro-batch 1's rows, ...
    >>> check_provenance([{}, {}], [[1], [0, 2]], prov, "lp")  # nothing carried: unproven, never an error
    False
    >>> a, b = Provenance(((0,), (1,)), "a"), Provenance(((1,), (0,)), "b")  # one batch split twice
    >>> outs = [{"provenance": Carried("a", [0])}, {"provenance": Carried("b", [0])}]
    >>> check_provenance(outs, [[0], [1]], (a, b), "lp")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ref.errors.MisalignmentError: key 'lp', micro-batch 1: this output holds rows of split 'b', ...
    """
    splits = _by_name(provenance)
    tags = [_carried(o, splits) for o in output_lst]
    first = next((m for m, tag in enumerate(tags) if tag is not None), None)
    if first is None:
        return False
    split = tags[first][0]  # type: ignore[index]
    for m, tag in enumerate(tags):
        if tag is not None and tag[0] is not split:
            raise mixed_splits(key, m, tag[0].name, first, split.name)
    rows = real_rows(split)
    if indices is not None:
        _check_indices(indices, rows)
    for m, tag in enumerate(tags):
        if tag is None:
            continue
        mine = tag[1]
        if mine is PADDING:
            raise stray_output(key, m, PADDING)
        same = _same(mine, rows[m]) if m < len(rows) else False
        if same is True:
            continue
        if same is False:
            raise stray_output(key, m, _holder(mine, rows, m))
        _check_slot(same, mine, rows, key, m)
    return all(tag is not None for tag in tags) and len(tags) > 0


def _by_name(provenance: Provenance | Sequence[Provenance]) -> dict[Hashable, Provenance]:
    """The splits given, by name (the first of a name kept), in the order given."""
    given = (provenance,) if isinstance(provenance, Provenance) else tuple(provenance)
    splits: dict[Hashable, Provenance] = {}
    for split in given:
        splits.setdefault(split.name, split)
    return splits


def _carried(
    output: Mapping[str, Any],
    splits: Mapping[Hashable, Provenance],
) -> tuple[Provenance, Any] | None:
    """``(split, rows)`` an output carries (bare rows: the first split's), or None where it carries none
    of a split given."""
    if PROVENANCE not in output or not splits:
        return None
    carried = output[PROVENANCE]
    if isinstance(carried, Carried):
        split = splits.get(carried.split)
        return None if split is None else (split, carried.rows)
    return next(iter(splits.values())), carried


def _holder(mine: Any, rows: Sequence[Any], m: int) -> int | None:
    """The micro-batch other than ``m`` whose rows ``mine`` are (concrete), or None."""
    return next((q for q, r in enumerate(rows) if q != m and _same(mine, r) is True), None)


def _check_slot(same: Any, mine: Any, rows: Sequence[Any], key: Any, m: int) -> None:
    """A traced output's provenance against its slot, in the compiled program: the micro-batch whose
    rows it holds computed there (-1 in the message where none of this split's does)."""
    flags = [_same(mine, r) for r in rows]
    holder = jnp.asarray(-1, dtype=jnp.int64)
    for q in reversed(range(len(rows))):
        if q != m:
            holder = jnp.where(jnp.asarray(flags[q]), q, holder)
    text = _escaped(str(stray_output(key, m, "\x00h\x00"))).replace("\x00h\x00", "{h}")
    _check(jnp.asarray(same), "MisalignmentError: " + text, h=_shown(holder))


def _escaped(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def _check_indices(indices: Sequence[Sequence[int]], rows: Sequence[Any]) -> None:
    """`ref.provenance.check_indices`, or, where either side is traced, the same rule in the compiled
    program (sizes at trace time, values by ``checkify``)."""
    if all(_held(p) for p in indices) and all(_held(r) for r in rows):
        check_indices(indices, rows)
        return
    if len(indices) != len(rows):
        check_indices([[0] * len(p) for p in indices], [[0] * len(r) for r in rows])  # raises the size error
    for m, (p, r) in enumerate(zip(indices, rows, strict=True)):
        a, b = jnp.asarray(p).reshape(-1).astype(jnp.int64), jnp.asarray(r).reshape(-1).astype(jnp.int64)
        if a.shape != b.shape:
            raise stray_indices(m, None, a.shape[0], b.shape[0])
        if not a.shape[0]:
            continue
        bad = a != b
        j = jnp.minimum(_first(bad), a.shape[0] - 1)
        text = _escaped(str(stray_indices(m, 0, "\x00got\x00", "\x00want\x00")))
        text = (
            text.replace("position 0", "position {j}")
            .replace("\x00got\x00", "{got}")
            .replace("\x00want\x00", "{want}")
        )
        _check(~jnp.any(bad), "MisalignmentError: " + text, j=_shown(j), got=_shown(a[j]), want=_shown(b[j]))


def _register_pytrees() -> None:
    """`Provenance` and `Carried` as pytrees whose names are static (aux data): a split's name is a
    Python value that decides which split a restore answers to at trace time; the rows are leaves."""
    from jax import tree_util

    tree_util.register_pytree_node(
        Provenance, lambda p: ((p.rows,), p.name), lambda name, children: Provenance(children[0], name)
    )
    tree_util.register_pytree_node(
        Carried, lambda c: ((c.rows,), c.split), lambda split, children: Carried(split, children[0])
    )


_register_pytrees()
