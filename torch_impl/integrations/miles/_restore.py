"""miles' restore: ``aggregate_forward_results``, each call read into the core's form and checked there.

The outputs' shape and counts are miles' own form; the indices' permutation check, the split's verdict
(`torch_impl._alignment.Record.judge_handout`) and the witness (`witness_keys`) are the core's.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from ref.errors import (
    KeyMismatchError,
    MisalignmentError,
    NotAPermutationError,
    PartitionMismatchError,
    ShapeMismatchError,
    UnsupportedSettingError,
    where,
)

from ..._alignment import ItemOrder, Record, Split, locate, recorded
from ..._entry import entry
from ..._permutation import check_permutation, invert
from ._split import index_lists, rows_held
from ._witness import witness_keys

__all__ = ["aggregate_forward_results", "check_aggregate_forward_results", "check_provenance"]


class _Plan(NamedTuple):
    """A checked call: ``keys``; ``values[key]`` the joined per-sample values (micro-batch order);
    ``order`` the `ItemOrder` putting each key's values in the result's row order (None: as joined)."""

    keys: list[Any]
    values: dict[Any, list[Any]]
    order: ItemOrder | None


@entry
def aggregate_forward_results(
    forward_data_store: list[dict[str, list[Any]]],
    data_iterator: Any,
    args: Any,
    store_prefix: str = "",
) -> dict[str, list[Any]]:
    """Drop-in for miles 0.0.2's ``log_utils.aggregate_forward_results``: ``{key: per-sample values}``.

    ``forward_data_store[m]``: micro-batch ``m``'s outputs, each key a list of per-sample values; under
    ``args.use_dynamic_batch_size`` (and an iterator with ``micro_batch_indices``) the values restored to
    the iterator's original row order, ``[joined[k] for k in inverse(flat indices)]``, else joined as they
    come. ``store_prefix`` is unused, as in miles. Every index, count and witnessed length is checked
    before the result is built (`check_aggregate_forward_results`).
    """
    plan = _checked(forward_data_store, data_iterator, args)
    if plan.order is None:
        return {key: plan.values[key] for key in plan.keys}
    return {key: plan.order(plan.values[key]) for key in plan.keys}


def check_aggregate_forward_results(
    forward_data_store: list[dict[str, list[Any]]],
    data_iterator: Any,
    args: Any,
    store_prefix: str = "",
) -> None:
    """Every check `aggregate_forward_results` makes of this call, without building the result (shadow
    mode runs it on unsampled calls): None or the same `ref.errors.RebatchError`."""
    _checked(forward_data_store, data_iterator, args)


def _checked(store: Any, data_iterator: Any, args: Any) -> _Plan:
    """The checks of a call, in order: the outputs' shape (lists, every key), the indices a permutation
    of the iterator's rows, each micro-batch's count, the recorded split, the length witness."""
    if not isinstance(store, Sequence) or isinstance(store, str | bytes):
        raise UnsupportedSettingError(
            f"forward_data_store must be a list of micro-batch outputs, got {type(store).__name__}"
        )
    if not store:
        return _Plan([], {}, None)
    keys, values, counts = _joined(store)
    if not keys:
        return _Plan([], {}, None)
    try:
        dynamic = bool(args.use_dynamic_batch_size)
    except AttributeError as err:
        raise UnsupportedSettingError(f"args has no use_dynamic_batch_size: {err}") from err
    if dynamic and hasattr(data_iterator, "micro_batch_indices"):
        return _restored(keys, values, counts, data_iterator, args)
    return _in_order(keys, values, counts, data_iterator, args)


def _restored(
    keys: list[Any], values: dict[Any, list[Any]], counts: dict[Any, list[int]], data_iterator: Any, args: Any
) -> _Plan:
    """Dynamic batch size: the iterator's indices a permutation of its rows, one output per micro-batch
    with one value per row, the recorded split, the witness; the order restoring them."""
    indices = data_iterator.micro_batch_indices
    if indices is None:
        raise UnsupportedSettingError(
            "args.use_dynamic_batch_size is set, but data_iterator.micro_batch_indices is None (an "
            "iterator of fixed-size micro-batches): miles cannot restore its order"
        )
    split = _vouched(data_iterator, indices)
    if split is not None:  # the split's rows, checked when it was made: no second check
        parts: list[list[Any]] = split.rows()
        order = split.order()
        flat: Callable[[], Any] = functools.partial(getattr, split, "flat")
    else:
        parts = index_lists(indices)
        rows = rows_held(data_iterator, sum(len(p) for p in parts))
        try:
            perm = check_permutation(parts, rows)
        except NotAPermutationError as err:  # the indices every key is restored by: named by the first
            raise NotAPermutationError(
                f"{where(keys[0])}data_iterator.micro_batch_indices, {err} (the iterator holds {rows} "
                "rows; miles would overwrite a row and leave a None, or drop one)"
            ) from err
        order = ItemOrder(invert(perm).tolist())
        flat = perm.tolist
    sizes = [len(p) for p in parts]
    _check_counts(keys, counts, sizes)
    check_provenance(data_iterator, parts, len(sizes))
    witness_keys(keys, values, flat, sizes, data_iterator, args)
    return _Plan(keys, values, order)


def _vouched(data_iterator: Any, indices: Any) -> Split | None:
    """The split recorded for ``data_iterator`` where it vouches for this restore (the core's
    `Record.vouching`: the iterator's indices still the split's own lists of plain ints), made over
    every row the iterator held and holds now; else None (checked as any other call)."""
    kept = recorded(data_iterator)
    split = kept.vouching(indices) if isinstance(kept, Record) else None
    if split is None or split.held != split.flat.shape[0]:
        return None
    return split if rows_held(data_iterator, split.held) == split.held else None


def _in_order(
    keys: list[Any], values: dict[Any, list[Any]], counts: dict[Any, list[int]], data_iterator: Any, args: Any
) -> _Plan:
    """No restore (miles joins the values as they come): the rows they are, micro-batch ``m`` the
    iterator's ``m``-th (its indices, which must then be in order, else fixed-size slices), checked as
    `_restored` checks them."""
    first, outputs = keys[0], len(counts[keys[0]])
    for key in keys[1:]:  # each key one value a row: the same total as the first (no order to hide behind)
        if sum(counts[key]) != sum(counts[first]):
            raise ShapeMismatchError(
                f"key {key!r}, micro-batch {len(counts[key]) - 1}: {sum(counts[key])} values in all, but key "
                f"{first!r} has {sum(counts[first])}: each key holds one value a row"
            )
    indices = getattr(data_iterator, "micro_batch_indices", None)
    size = getattr(data_iterator, "micro_batch_size", None)
    if indices is not None:  # the iterator handed its rows by these indices
        parts = index_lists(indices)[:outputs]
        sizes = [len(p) for p in parts]
        for j, i in enumerate(itertools.chain.from_iterable(parts)):
            if i != j:
                m, pos = locate(j, sizes)
                raise MisalignmentError(
                    f"key {first!r}, micro-batch {m}, position {pos}: args.use_dynamic_batch_size is off, so "
                    "the values stay in micro-batch order, but data_iterator.micro_batch_indices handed "
                    f"original row {i} there, not row {j} (turn use_dynamic_batch_size on, or make the "
                    "iterator with micro_batch_size)"
                )
    elif isinstance(size, int) and not isinstance(size, bool) and size > 0:
        sizes = [size] * outputs
        held = rows_held(data_iterator, sum(sizes))
        if sum(sizes) > held:
            raise PartitionMismatchError(
                f"key {first!r}, micro-batch {held // size}: {outputs} micro-batches of {size} rows, but "
                f"the iterator holds {held} rows"
            )
    else:  # no split to hold the outputs to: joined as they come, rows 0, 1, ... (witnessed below)
        sizes = list(counts[first])
    _check_counts(keys, counts, sizes)
    check_provenance(data_iterator, None, outputs)
    witness_keys(keys, values, functools.partial(list, range(sum(sizes))), sizes, data_iterator, args)
    return _Plan(keys, values, None)


def _joined(store: Sequence[Any]) -> tuple[list[Any], dict[Any, list[Any]], dict[Any, list[int]]]:
    """``(keys of micro-batch 0, each key's values joined, each key's count per micro-batch)``: every
    micro-batch's output a mapping with every key of the first, each a list (miles asserts it). Outputs
    that are dicts of lists, miles' own, are read key by key in C-level loops; anything else goes
    micro-batch by micro-batch (`_key_lists`), which names the first defect."""
    if set(map(type, store)) != {dict}:
        for m, out in enumerate(store):
            if not isinstance(out, Mapping):
                raise UnsupportedSettingError(
                    f"micro-batch {m}: its output must be a dict of per-sample lists, got "
                    f"{type(out).__name__}"
                )
    keys = list(store[0].keys())
    values: dict[Any, list[Any]] = {}
    counts: dict[Any, list[int]] = {}
    for key in keys:
        lists = _key_lists(store, key)
        values[key] = list(itertools.chain.from_iterable(lists))
        counts[key] = list(map(len, lists))
    return keys, values, counts


def _key_lists(store: Sequence[Any], key: Any) -> list[list[Any]]:
    """Each micro-batch's list of ``key``'s per-sample values (`KeyMismatchError` where one lacks the key,
    `UnsupportedSettingError` where one is not a list)."""
    lists = [out.get(key, _MISSING) for out in store]
    if set(map(type, lists)) == {list}:
        return lists
    for m, value in enumerate(lists):
        if value is _MISSING:
            raise KeyMismatchError(f"key {key!r}, micro-batch {m}: missing (micro-batch 0 has it)")
        if not isinstance(value, list):
            raise UnsupportedSettingError(
                f"key {key!r}, micro-batch {m}: miles' outputs are lists of per-sample values, got "
                f"{type(value).__name__}"
            )
    return lists


#: What `_key_lists` reads for a key a micro-batch's output lacks.
_MISSING = object()


def _check_counts(keys: Sequence[Any], counts: Mapping[Any, list[int]], sizes: Sequence[int]) -> None:
    """One output per micro-batch, each key with one value per row of its micro-batch."""
    for key in keys:
        got = counts[key]
        if got == sizes:
            continue
        if len(got) != len(sizes):
            raise PartitionMismatchError(
                f"key {key!r}, micro-batch {min(len(got), len(sizes))}: {len(got)} micro-batch outputs, but "
                f"the iterator has {len(sizes)} micro-batches"
            )
        for m, (n, held) in enumerate(zip(got, sizes, strict=True)):
            if n != held:
                raise PartitionMismatchError(
                    f"key {key!r}, micro-batch {m}: {n} values, but the micro-batch holds {held} rows (miles "
                    f"would {'drop' if n < held else 'shift'} rows silently)"
                )


def check_provenance(data_iterator: Any, parts: Sequence[Sequence[Any]] | None, outputs: int) -> None:
    """Where miles' ``get_data_iterator`` made ``data_iterator`` while rebatch was installed, the core's
    judge of the split (`Record.judge_handout`): the restore's indices (``parts``, None for
    micro-batches restored as they come) must be the split's micro-batches, in its order or another, and
    the outputs must number the split's. An iterator no recorded split made is unproven, never an error."""
    kept = recorded(data_iterator)
    if isinstance(kept, Record):
        kept.judge_handout(parts, outputs)
