"""Exact provenance in ``ref``: each output's own provenance (``output_lst[m]["provenance"]``) checked
against its slot's rows by the live splits of the batch restored, before any data moves.

Step 6p of ``postprocess_batch``'s order of checks (``docs/spec.md``, "Exact provenance"); the value and
the error's words are `ref.provenance`'s, shared with ``torch_impl``. Concrete values are checked in
Python; traced ones (inside `ref.checked`) by ``checkify`` in the compiled program.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from ._checked import _check, _shown
from ._jagged import is_concrete
from .provenance import (
    PROVENANCE,
    Carried,
    Provenance,
    other_batch,
    real_rows,
    slot_difference,
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
    slots: Sequence[Any],
    provenance: Provenance | Sequence[Provenance],
    key: Any,
) -> bool:
    """Step 6p: each slot's output against its rows; returns whether every slot is proven (then every key
    of the call is, dense keys included). ``slots[m]``: slot ``m``'s rows (``indices[m]`` with dynamic
    batch size, else the positions after the slots before it); ``provenance``: the split's `Provenance`,
    or every live split of the batch restored (one batch); ``output_lst`` and ``slots`` without padding
    micro-batches; ``key``: the first jagged model-output key (else the first key), named by an error.

    An output naming another batch raises; an output naming micro-batch ``q`` of a split given must hold
    its slot's rows (``split.rows[q] == slots[m]``); an output naming nothing, or a split not given, leaves
    its slot unproven (``docs/spec.md``, "Exact provenance").

    >>> prov = Provenance(((2, 0), (1,)))
    >>> check_provenance([{"provenance": [2, 0]}, {"provenance": [1]}], [[2, 0], [1]], prov, "lp")
    True
    >>> check_provenance([{"provenance": [1]}, {"provenance": [2, 0]}], [[1], [2, 0]], prov, "lp")  # moved
    True
    >>> swapped = [{"provenance": [1]}, {"provenance": [2, 0]}]
    >>> check_provenance(swapped, [[2, 0], [1]], prov, "lp")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ref.errors.MisalignmentError: key 'lp', micro-batch 0: this output holds micro-batch 1's rows of ...
    >>> check_provenance([{}, {}], [[1], [0, 2]], prov, "lp")  # nothing carried: unproven, never an error
    False
    >>> a, b = Provenance(((0,), (1,)), "a"), Provenance(((0,), (1,)), "b")  # one batch split twice alike
    >>> outs = [{"provenance": Carried("a", [0])}, {"provenance": Carried("b", [1])}]
    >>> check_provenance(outs, [[0], [1]], (a, b), "lp")  # interchangeable
    True
    >>> stale = [{"provenance": Carried("a", [0], batch=7)}, {"provenance": [1]}]
    >>> check_provenance(stale, [[0], [1]], (a, b), "lp")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ref.errors.MisalignmentError: key 'lp', micro-batch 0: this output holds rows of split 'a' of batch 7, ...
    """
    splits = _by_name(provenance)
    if not splits:
        return False
    restored = next(iter(splits.values())).batch
    proven = 0
    for m, output in enumerate(output_lst):
        carried = _carried(output, splits, restored, key, m)
        if carried is None:
            continue
        split, mine = carried
        if mine is PADDING:
            raise stray_output(key, m, PADDING, split.name)
        _check_slot(key, m, split, mine, slots[m] if m < len(slots) else ())
        proven += 1
    return proven == len(output_lst) and proven > 0


def _by_name(provenance: Provenance | Sequence[Provenance]) -> dict[Hashable, Provenance]:
    """The splits given, by name (the first of a name kept), in the order given."""
    given = (provenance,) if isinstance(provenance, Provenance) else tuple(provenance)
    splits: dict[Hashable, Provenance] = {}
    for split in given:
        splits.setdefault(split.name, split)
    return splits


def _carried(
    output: Mapping[str, Any], splits: Mapping[Hashable, Provenance], restored: Hashable, key: Any, m: int
) -> tuple[Provenance, Any] | None:
    """``(split, rows)`` an output names (bare rows: the first split's), or None where it names none of
    the splits given; `other_batch` where it names another batch."""
    if PROVENANCE not in output:
        return None
    carried = output[PROVENANCE]
    if not isinstance(carried, Carried):
        return next(iter(splits.values())), carried
    if carried.batch != restored:
        raise other_batch(key, m, carried.split, carried.batch, restored)
    split = splits.get(carried.split)
    return None if split is None else (split, carried.rows)


def _check_slot(key: Any, m: int, split: Provenance, mine: Any, given: Any) -> None:
    """An output naming micro-batch ``q`` of ``split`` (the one whose rows it carries) holds slot ``m``'s
    rows ``given``: concrete values checked here, traced ones in the compiled program."""
    rows = real_rows(split)
    if _held(mine) and all(_held(r) for r in rows) and _held(given):
        holder = next((q for q, r in enumerate(rows) if _same(mine, r) is True), None)
        if holder is None:
            raise stray_output(key, m, None, split.name)
        difference = slot_difference(_ints(given), _ints(rows[holder]))
        if difference is not None:
            raise stray_output(key, m, holder, split.name, difference)
        return
    flags = [_same(mine, r) for r in rows]
    holder_at = jnp.asarray(-1, dtype=jnp.int64)
    for q in reversed(range(len(rows))):
        holder_at = jnp.where(jnp.asarray(flags[q]), q, holder_at)
    right = jnp.logical_and(
        jnp.asarray(_same(mine, given)), jnp.any(jnp.asarray([jnp.asarray(f) for f in flags]))
    )
    text = _escaped(str(stray_output(key, m, "\x00h\x00", split.name, "its rows differ")))
    text = text.replace("micro-batch \x00h\x00's", "micro-batch {h}'s")
    _check(right, "MisalignmentError: " + text, h=_shown(holder_at))


def _ints(rows: Any) -> list[int]:
    """Concrete rows as a list of ints."""
    return [int(i) for i in np.asarray(rows).reshape(-1)]


def _escaped(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def _register_pytrees() -> None:
    """`Provenance` and `Carried` as pytrees whose names are static (aux data): a split's and a batch's
    names are Python values that decide what a restore answers to at trace time; the rows are leaves."""
    from jax import tree_util

    tree_util.register_pytree_node(
        Provenance,
        lambda p: ((p.rows,), (p.name, p.batch)),
        lambda names, children: Provenance(children[0], *names),
    )
    tree_util.register_pytree_node(
        Carried,
        lambda c: ((c.rows,), (c.split, c.batch)),
        lambda names, children: Carried(names[0], children[0], names[1]),
    )


_register_pytrees()
