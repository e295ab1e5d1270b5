"""miles 0.0.2's table for the trainer contract (`_integration.Integration`): `install()` turns rebatch on.

miles (``miles-rl``, the slime family) splits each rollout's rows into micro-batches in
``miles.backends.training_utils.data.get_data_iterator`` (per step, ``get_seqlen_balanced_partitions`` over
``total_lengths`` under dynamic batch size, else fixed contiguous slices) and puts the per-sample outputs
back in ``miles.backends.training_utils.log_utils.aggregate_forward_results(forward_data_store,
data_iterator, args, store_prefix)``: each key's per-sample lists joined over micro-batches, then, under
``args.use_dynamic_batch_size``, ``origin_values[origin_index] = value`` over ``sum(micro_batch_indices,
[])`` with ``zip(..., strict=False)``. Megatron's ``forward_only`` (``miles.backends.megatron_utils.model``)
and the FSDP actor (``miles.backends.experimental.fsdp_utils.actor``) bind it at import. `install` replaces
it there and wherever else it is bound, and records each split ``get_data_iterator`` makes (miles' own,
unchanged: its result's iterators, their indices and micro-batch count); a lazy install (``REBATCH``) also
wraps ``miles.ray.actor_group.RayTrainGroup._allocate_gpus_for_actor`` so that the driver passes rebatch's
variables on to the training actors (through ``args.train_env_vars``, the environment miles gives them).

Same result as miles on every input it handles correctly (the same value objects, keys in the first
micro-batch's order, ``store_prefix`` unused as miles leaves it); a `ref.errors.RebatchError` naming the
key, the micro-batch and the value where miles silently misaligns: indices that are not a permutation of
the iterator's rows (a duplicate overwrites a row and leaves a ``None``), a micro-batch output with more or
fewer values than its rows (miles drops or shifts rows), outputs in the wrong order (each per-sample
value's length against the row's own, `length_witness`), a split's indices changed since it was made or
outputs not one per micro-batch it handed out (`check_provenance`).
"""

from __future__ import annotations

import functools
import itertools
import operator
import sys
import types
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, cast

import numpy as np
import torch

from rebatch_startup.forksafe import ForkSafeLock
from ref.errors import (
    KeyMismatchError,
    MisalignmentError,
    NotAPermutationError,
    PartitionMismatchError,
    RebatchError,
    ShapeMismatchError,
    UnsupportedSettingError,
    where,
)
from ref.provenance import check_indices
from ref.structure import locate, misalignment, witness_binds

from .._entry import entry
from .._permutation import check_permutation, invert, plain_int_lists, plain_int_lists_of
from .._switch import witness_config
from .._tally import skipped
from ._integration import Installed, Integration, NotReplayable, Replaced
from ._patch import Versions

__all__ = [
    "ACTOR_GROUP",
    "CARRY",
    "DATA",
    "INTEGRATION",
    "LOG_UTILS",
    "VERSIONS",
    "Installed",
    "aggregate_forward_results",
    "check_aggregate_forward_results",
    "check_provenance",
    "install",
    "installed",
    "length_witness",
    "mode",
    "recorded_split",
    "replacements",
    "stats",
    "uninstall",
]

#: The miles module that defines the function `install` replaces.
LOG_UTILS = "miles.backends.training_utils.log_utils"
#: The miles module whose ``get_data_iterator`` (the split) `install` records.
DATA = "miles.backends.training_utils.data"
#: The miles module whose ``RayTrainGroup`` starts the training actors with ``args.train_env_vars``.
ACTOR_GROUP = "miles.ray.actor_group"
#: What a lazy install wraps to pass rebatch's variables on to the training actors.
CARRY = (ACTOR_GROUP, "RayTrainGroup._allocate_gpus_for_actor")
#: The miles module holding its parallel state (context parallelism's rank and size, for the witness).
_PARALLEL = "miles.backends.training_utils.parallel"


# ---------------------------------------------------------------------------------------------------
# The split's record: which rows each micro-batch of an iterator miles' get_data_iterator made is handed
# ---------------------------------------------------------------------------------------------------


class Split(NamedTuple):
    """What ``get_data_iterator`` made an iterator hand out: ``rows`` (each micro-batch's rows, in the
    order ``DataIterator.get_next`` hands them, over every step; a copy of the iterator's lists) and
    ``micro_batches`` (the rollout's micro-batches:
    ``sum(num_microbatches)``); ``order``: where ``rows`` were checked, when recorded, to be a permutation
    of the ``held`` rows the iterator holds, the `ItemOrder` restoring them, else None; ``exact``: ``rows``
    as `plain_int_lists`' bytes (None unless lists of plain ints). A restore whose indices still give
    those bytes and whose iterator still holds ``held`` rows takes ``order`` as checked (`_vouched`)."""

    rows: list[list[int]] | None
    micro_batches: int
    order: ItemOrder | None = None
    held: int = 0
    exact: bytes | None = None


_splits: weakref.WeakKeyDictionary[Any, Split] = weakref.WeakKeyDictionary()
_splits_lock = ForkSafeLock()  # a forked child finds it free


def _record(result: Any) -> None:
    """Record the split ``get_data_iterator`` returned (``(iterators, num_microbatches)``): each iterator's
    indices as made, the micro-batch count. Anything else, unrecorded. Never raises."""
    try:
        iterators, counts = result
        total = sum(int(n) for n in counts)
        for it in iterators:
            indices = it.micro_batch_indices
            rows = None if indices is None else _parts(indices)
            held = 0 if rows is None else _rows_held(it, sum(map(len, rows)))
            order = None if rows is None else _checked_order(rows, held)
            exact = plain_int_lists_of(rows)
            split = Split(rows, total, order, held, exact)
            with _splits_lock:
                _splits[it] = split
    except (TypeError, AttributeError, ValueError):  # not miles' shape, or not weakly held: unproven
        return


def _checked_order(rows: list[list[Any]], held: int) -> ItemOrder | None:
    """The `ItemOrder` restoring ``held`` original rows from ``rows`` laid end to end, where they are a
    permutation of ``range(held)``; None otherwise (the restore then checks them, and raises)."""
    try:
        perm = check_permutation(rows, held)
    except RebatchError:
        return None
    return ItemOrder(invert(perm).tolist())


class ItemOrder:
    """``[values[k] for k in positions]`` in one C-level call (`operator.itemgetter` of the positions),
    made once for a call's keys, or for every restore a recorded split vouches for: ``positions[i]`` the
    position among the joined values of result row ``i``."""

    __slots__ = ("_get", "positions")

    def __init__(self, positions: list[int]) -> None:
        self.positions = positions
        self._get = operator.itemgetter(*positions) if len(positions) > 1 else None

    def __call__(self, values: list[Any]) -> list[Any]:
        if self._get is None:  # one row or none: itemgetter would not give a tuple
            return [values[k] for k in self.positions]
        return list(self._get(values))


def recorded_split(data_iterator: Any) -> Split | None:
    """The split recorded for ``data_iterator`` (made by ``get_data_iterator`` while installed), or None."""
    try:
        with _splits_lock:
            return _splits.get(data_iterator)
    except TypeError:  # not weakly held, or unhashable
        return None


def _recording(get_data_iterator: Callable[..., Any]) -> Callable[..., Any]:
    """miles' own ``get_data_iterator``, its result recorded (`_record`): the split is miles', unchanged."""

    @functools.wraps(get_data_iterator)
    def recording(*args: Any, **kwargs: Any) -> Any:
        result = get_data_iterator(*args, **kwargs)
        _record(result)
        return result

    return recording


def _carrying(allocate: Callable[..., Any]) -> Callable[..., Any]:
    """``RayTrainGroup._allocate_gpus_for_actor``, with rebatch's variables set here
    (`rebatch_startup.carried`) added to ``self.args.train_env_vars`` (the training actors' Ray
    ``runtime_env``) for the call, where it does not set them itself; ``args`` is as it was after."""
    import rebatch_startup

    @functools.wraps(allocate)
    def allocating(self: Any, *args: Any, **kwargs: Any) -> Any:
        env = getattr(self.args, "train_env_vars", None)
        extra = {
            k: v for k, v in rebatch_startup.carried().items() if not isinstance(env, dict) or k not in env
        }
        if not isinstance(env, dict) or not extra:
            return allocate(self, *args, **kwargs)
        self.args.train_env_vars = {**extra, **env}
        try:
            return allocate(self, *args, **kwargs)
        finally:
            self.args.train_env_vars = env

    return allocating


# ---------------------------------------------------------------------------------------------------
# The restore
# ---------------------------------------------------------------------------------------------------


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
        parts: list[list[Any]] = split.rows or []
        order = split.order
        flat: Callable[[], list[int]] = functools.partial(_laid_end_to_end, parts)
    else:
        parts = _parts(indices)
        rows = _rows_held(data_iterator, sum(len(p) for p in parts))
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
    _witness(keys, values, flat, sizes, data_iterator, args)
    return _Plan(keys, values, order)


def _laid_end_to_end(parts: list[list[Any]]) -> list[int]:
    """A split's rows laid end to end (integers, checked when it was recorded)."""
    return list(itertools.chain.from_iterable(parts))


def _vouched(data_iterator: Any, indices: Any) -> Split | None:
    """The split recorded for ``data_iterator`` where it vouches for this restore: its rows checked to be a
    permutation when it was made, the iterator's indices still the same lists of plain ints (the same
    `plain_int_lists` bytes: one C-level pass; ``==`` would take ``3.0`` for ``3``), and the iterator
    holding as many rows; else None (checked as any other call)."""
    split = recorded_split(data_iterator)
    if split is None or split.order is None or split.exact is None:
        return None
    if plain_int_lists(indices) != split.exact:
        return None
    return split if _rows_held(data_iterator, split.held) == split.held else None


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
        parts = _parts(indices)[:outputs]
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
        held = _rows_held(data_iterator, sum(sizes))
        if sum(sizes) > held:
            raise PartitionMismatchError(
                f"key {first!r}, micro-batch {held // size}: {outputs} micro-batches of {size} rows, but "
                f"the iterator holds {held} rows"
            )
    else:  # no split to hold the outputs to: joined as they come, rows 0, 1, ... (witnessed below)
        sizes = list(counts[first])
    _check_counts(keys, counts, sizes)
    check_provenance(data_iterator, None, outputs)
    _witness(keys, values, functools.partial(list, range(sum(sizes))), sizes, data_iterator, args)
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


def _parts(indices: Any) -> list[list[Any]]:
    """The iterator's ``micro_batch_indices`` as lists (each entry checked by `check_permutation`)."""
    if type(indices) is list and all(type(p) is list for p in indices):  # miles' own, without the ABC
        return [list(p) for p in indices]
    if not isinstance(indices, Sequence) or not all(isinstance(p, Sequence) for p in indices):
        raise UnsupportedSettingError(
            f"data_iterator.micro_batch_indices must be a list of index lists, got {type(indices).__name__}"
        )
    return [list(p) for p in indices]


def _rows_held(data_iterator: Any, default: int) -> int:
    """How many rows the iterator holds: ``len(rollout_data["total_lengths"])`` (what miles' split counts),
    else ``response_lengths``'s, else ``default`` (the indices' count)."""
    data = getattr(data_iterator, "rollout_data", None)
    if isinstance(data, Mapping):
        for name in ("total_lengths", "response_lengths"):
            lengths = data.get(name)
            if isinstance(lengths, str | bytes):  # a string is no list of rows
                continue
            if type(lengths) is list or isinstance(lengths, Sequence | torch.Tensor | np.ndarray):
                return len(lengths)
    return default


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
        for m, (n, want) in enumerate(zip(got, sizes, strict=True)):
            if n != want:
                raise PartitionMismatchError(
                    f"key {key!r}, micro-batch {m}: {n} values, but the micro-batch holds {want} rows (miles "
                    f"would {'drop' if n < want else 'shift'} rows silently)"
                )


def check_provenance(data_iterator: Any, parts: Sequence[Sequence[Any]] | None, outputs: int) -> None:
    """Where miles' ``get_data_iterator`` made ``data_iterator`` while rebatch was installed (`Split`
    recorded), the split's indices decide: the restore's (``parts``, None for fixed-size micro-batches)
    must be the split's micro-batches, in its order or another (miles' outputs carry no identity, so a
    reorder is unproven: the witness judges it), and the outputs must number the split's micro-batches.
    `MisalignmentError` otherwise. The iterator's hand-out counter is no evidence (a reset between the
    forward pass and the aggregation is right). An iterator no recorded split made is unproven, never an
    error."""
    split = recorded_split(data_iterator)
    if split is None or not witness_config()[0]:
        return
    if split.rows is not None and parts is not None and parts != split.rows:
        reordered = sorted(map(list, parts)) == sorted(map(list, split.rows))
        if not reordered:
            check_indices(parts, split.rows)  # names the first index that differs
    if outputs != split.micro_batches:
        raise MisalignmentError(
            f"micro-batch {min(outputs, split.micro_batches)}: {outputs} micro-batch outputs, but the split "
            f"made {split.micro_batches} micro-batches (outputs of another pass or step; switch the check "
            "off: REBATCH_WITNESS=off)"
        )


# ---------------------------------------------------------------------------------------------------
# The alignment witness: each per-sample value's length against its row's own, in the iterator
# ---------------------------------------------------------------------------------------------------


def length_witness(data_iterator: Any, args: Any) -> list[int] | None:
    """Each row's per-token output length as miles' loss functions make it (``get_responses``): the row's
    ``response_lengths`` (``data_iterator.rollout_data``); under context parallelism (miles' parallel
    state, ``cp.size > 1``) this rank's two zigzag chunks of it (``get_logits_and_tokens_offset_with_cp``
    over ``total_lengths``, and ``max_seq_lens`` for ``qkv_format="bshd"``), the lengths
    ``slice_log_prob_with_cp`` keeps. None (counted) without those lists of the rows' ints, or with the
    witness switched off."""
    if not witness_config()[0]:
        return None
    data = getattr(data_iterator, "rollout_data", None)
    data = data if isinstance(data, Mapping) else {}
    response = data.get("response_lengths")
    lengths = _as_ints(response) if isinstance(response, Sequence) else None
    if lengths is None:
        skipped("calls_without_witness")
        return None
    if _cp_size() == 1:
        return lengths
    return _cp_lengths(data, lengths, getattr(args, "qkv_format", "thd"))


def _cp_lengths(data: Mapping[str, Any], response: list[int], qkv: Any) -> list[int] | None:
    """`length_witness` under context parallelism: this rank's share of each row's response. None
    (counted) where a field it needs is absent (``calls_without_witness``) or unreadable: not a list of
    the rows' ints, or one miles' own offsets function refuses (``skipped_unreadable_witness``)."""
    total = _row_ints(data, "total_lengths", len(response))
    max_lens = _row_ints(data, "max_seq_lens", len(response)) if qkv == "bshd" else [None] * len(response)
    if total is None or max_lens is None:
        return None
    from miles.backends.training_utils.cp_utils import get_logits_and_tokens_offset_with_cp

    out = []
    try:
        for t, r, m in zip(total, response, max_lens, strict=True):
            _, _, logits, _ = get_logits_and_tokens_offset_with_cp(t, r, qkv, m)
            out.append(sum(b - a for a, b in logits))
    except (AssertionError, ArithmeticError, LookupError, TypeError, ValueError):
        # miles' own function refuses these lengths: this call's witness is unreadable
        skipped("skipped_unreadable_witness")
        return None
    return out


def _row_ints(data: Mapping[str, Any], field: str, rows: int) -> list[int] | None:
    """``data[field]`` as a list of ``rows`` ints; None (counted) where it is absent
    (``calls_without_witness``) or is not that (``skipped_unreadable_witness``)."""
    values = data.get(field)
    if values is None:
        skipped("calls_without_witness")
        return None
    ints = _as_ints(values) if isinstance(values, Sequence) and len(values) == rows else None
    if ints is None:
        skipped("skipped_unreadable_witness")
    return ints


def _as_ints(values: Sequence[Any]) -> list[int] | None:
    """``values`` as a list of ints where every one is an integer (not a bool), else None; plain Python
    ints, miles' usual lists, checked by their types in one pass and copied as they are."""
    if set(map(type, values)) <= {int}:
        return list(values)
    return [int(n) for n in values] if all(_is_int(n) for n in values) else None


def _is_int(n: Any) -> bool:
    return isinstance(n, int | np.integer) and not isinstance(n, bool)


def _cp_size() -> int:
    """Context parallelism's size in miles' parallel state (1 where none is set: no CP slicing)."""
    parallel = sys.modules.get(_PARALLEL)
    state = getattr(parallel, "_parallel_state", None)
    size = getattr(getattr(state, "cp", None), "size", 1)
    return int(size) if isinstance(size, int) else 1


def _length(value: Any) -> int | None:
    """A per-token value's length (a tensor or array with a row dimension, a list or tuple), else None."""
    if isinstance(value, torch.Tensor | np.ndarray):
        return int(value.shape[0]) if value.ndim >= 1 else None
    if isinstance(value, list | tuple):
        return len(value)
    return None


def _lengths(values: list[Any]) -> list[int | None]:
    """`_length` of each value; for a list of plain tensors (miles' per-sample outputs) in C-level passes:
    where every one is 1-D (miles' per-token values), its element count, the cheapest read torch has;
    else each first dimension (a 0-d one among them: value by value)."""
    if set(map(type, values)) == {torch.Tensor}:
        if set(map(torch.Tensor.dim, values)) == {1}:  # 1-D: the length is the element count
            return list(map(torch.Tensor.numel, values))
        try:
            return [v.shape[0] for v in values]
        except IndexError:  # a 0-d tensor has no length
            pass
    return [_length(v) for v in values]


def _witness(
    keys: Sequence[Any],
    values: Mapping[Any, list[Any]],
    flat_rows: Callable[[], list[int]],
    sizes: Sequence[int],
    data_iterator: Any,
    args: Any,
) -> None:
    """Step 6 for miles (``docs/spec.md``, "The alignment witness"): every key bound by
    `ref.structure.witness_binds` (each value per-token, their lengths adding up to the witness's total
    over the rows restored, not declared unbound) must give restored row ``i`` the witness's length; the
    first key, at its first row in micro-batch order, with another raises `MisalignmentError`.
    ``flat_rows()[j]``: the row joined value ``j`` is (read only where a witness is found); ``sizes``: the
    micro-batches' row counts."""
    witness = length_witness(data_iterator, args)
    if witness is None:
        return
    flat = flat_rows()
    if flat and max(flat) >= len(witness):
        skipped("calls_without_witness")  # lengths of other rows than the iterator's: nothing to witness
        return
    want = [witness[i] for i in flat]  # in joined (micro-batch) order
    total = sum(want)
    unbound = witness_config()[1]
    for key in keys:
        lengths = _lengths(values[key])
        jagged = None not in lengths
        got = cast("list[int]", lengths) if jagged else [n if n is not None else -1 for n in lengths]
        if not witness_binds(key, jagged, sum(got), total, unbound) or got == want:
            continue
        if len(set(got)) == 1 and len(set(want)) > 1:
            # every value the same length where the rows' differ: a fixed-width per-sample value (a vector
            # a row), not a per-token one whose total happens to match; nothing proven, nothing raised
            skipped("calls_without_witness")
            continue
        j = next(j for j, (a, b) in enumerate(zip(got, want, strict=True)) if a != b)
        m, pos = locate(j, sizes)
        raise misalignment(key, m, pos, flat[j], got[j], want[j])


# ---------------------------------------------------------------------------------------------------
# Adapters and the declaration
# ---------------------------------------------------------------------------------------------------


def _keys(forward_data_store: Any, *args: Any, **kwargs: Any) -> list[Any]:
    """The keys a misaligned call misaligns (micro-batch 0's)."""
    first = forward_data_store[0] if isinstance(forward_data_store, Sequence) and forward_data_store else None
    return list(first.keys()) if isinstance(first, Mapping) else ["forward_data_store"]


def _rows(forward_data_store: Any, data_iterator: Any, *args: Any, **kwargs: Any) -> int:
    """The rows of a call (``on`` mode's counters): the iterator's indices, else micro-batch 0's first
    key's values over every micro-batch."""
    indices = getattr(data_iterator, "micro_batch_indices", None)
    if indices is not None:
        return sum(len(p) for p in indices)
    keys = _keys(forward_data_store)
    return sum(len(out.get(keys[0], ())) for out in forward_data_store) if forward_data_store else 0


def _dumped(forward_data_store: Any, data_iterator: Any, args: Any, store_prefix: str = "") -> dict[str, Any]:
    """A call's inputs as rebatch's dump holds them (`_files.save_dump`): ``forward_data_store`` (plain
    dicts of lists), ``data_iterator`` (its ``micro_batch_size``, ``micro_batch_indices``, ``offset`` and
    the rows' ``response_lengths``, ``total_lengths``, ``max_seq_lens``, a plain dict), ``args`` (the
    settings read: ``use_dynamic_batch_size``, ``qkv_format``, and the parallel state's CP size),
    ``store_prefix``."""
    data = getattr(data_iterator, "rollout_data", None)
    data = data if isinstance(data, Mapping) else {}
    indices = getattr(data_iterator, "micro_batch_indices", None)
    return {
        "forward_data_store": [dict(out) for out in forward_data_store],
        "data_iterator": {
            "micro_batch_size": getattr(data_iterator, "micro_batch_size", None),
            "micro_batch_indices": None if indices is None else [list(p) for p in indices],
            "offset": getattr(data_iterator, "offset", None),
            "rollout_data": {
                k: list(data[k]) for k in ("response_lengths", "total_lengths", "max_seq_lens") if k in data
            },
        },
        "args": {
            "use_dynamic_batch_size": getattr(args, "use_dynamic_batch_size", None),
            "qkv_format": getattr(args, "qkv_format", None),
            "cp_size": _cp_size(),
        },
        "store_prefix": store_prefix,
    }


def _replay(function: str, inputs: Mapping[str, Any]) -> Callable[[], Any]:
    """A call of rebatch's drop-in on a dump's inputs (`_dumped`'s form; ``rebatch check``): the iterator
    and ``args`` as plain namespaces holding what the dump kept. A call under context parallelism is not
    replayed (its witness needs the rank's parallel state)."""
    settings = inputs["args"]
    if settings.get("cp_size", 1) != 1:
        raise NotReplayable(f"miles' call ran under context parallelism (size {settings['cp_size']})")
    held = inputs["data_iterator"]
    iterator = types.SimpleNamespace(
        micro_batch_size=held["micro_batch_size"],
        offset=held["offset"],
        rollout_data=dict(held["rollout_data"]),
    )
    if held["micro_batch_indices"] is not None:
        iterator.micro_batch_indices = held["micro_batch_indices"]
    args = types.SimpleNamespace(
        use_dynamic_batch_size=settings["use_dynamic_batch_size"], qkv_format=settings["qkv_format"] or "thd"
    )
    store = [dict(out) for out in inputs["forward_data_store"]]
    prefix = str(inputs.get("store_prefix", ""))
    return lambda: aggregate_forward_results(store, iterator, args, prefix)


#: The miles releases `install` supports (checked against miles itself: tests/test_miles.py).
VERSIONS = ("0.0.2",)
#: miles' integration (`_integration.Integration`): its public functions are this object's.
INTEGRATION = Integration(
    "miles",
    Versions("miles-rl", dict.fromkeys(VERSIONS), fallback=VERSIONS[-1]),
    lambda row: [
        Replaced(
            LOG_UTILS,
            "aggregate_forward_results",
            aggregate_forward_results,
            check_aggregate_forward_results,
            _dumped,
            _keys,
            _rows,
        )
    ],
    label="miles",
    carry=CARRY,
    replay=_replay,
    carrier=_carrying,
    records={(DATA, "get_data_iterator"): _recording},
)
install, uninstall, stats = INTEGRATION.install, INTEGRATION.uninstall, INTEGRATION.stats
mode, installed, replacements = INTEGRATION.mode, INTEGRATION.installed, INTEGRATION.replacements
