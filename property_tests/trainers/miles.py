"""miles 0.0.2 in the testing kit: its own ``aggregate_forward_results(forward_data_store, data_iterator,
args)`` (``miles.backends.training_utils.log_utils``) called from the kit's cases (`PEER`): each
micro-batch's outputs as miles stores them (a dict of per-sample lists: a jagged key's rows, a dense key's
row tensors), the partitions as the iterator's ``micro_batch_indices``, ``args.use_dynamic_batch_size``
the call's; with an alignment witness, the rows' lengths as the iterator's ``rollout_data``
(``response_lengths``, ``total_lengths``). The restored lists are put back into the call's layout. Its
native defects: miles' indices and outputs that its own function restores silently."""

from __future__ import annotations

import types
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ref import errors

from .. import peers
from ..data import from_rows, rows_of
from ..trainer_import import import_trainer_module

#: miles' module holding the function the kit calls.
MODULE = "miles.backends.training_utils.log_utils"
#: The function's name.
FUNCTION = "aggregate_forward_results"


def _theirs() -> dict[str, Callable[..., Any]]:
    module = import_trainer_module(MODULE)
    return {FUNCTION: vars(module)[FUNCTION]}


def _ours() -> dict[str, Callable[..., Any]]:
    from torch_impl.integrations import miles

    return {FUNCTION: miles.aggregate_forward_results}


class Iterator:
    """A stand-in of miles' ``DataIterator``: its attributes as given; like miles' own, an object of its
    own identity (rebatch's record of a split refers to its iterator weakly, by identity)."""

    def __init__(self, **attributes: Any) -> None:
        vars(self).update(attributes)

    def __repr__(self) -> str:
        return f"Iterator({', '.join(f'{k}={v!r}' for k, v in vars(self).items())})"


def iterator(partitions: Sequence[Sequence[int]] | None, lengths: Sequence[int] | None, rows: int) -> Any:
    """What miles' ``DataIterator`` holds that ``aggregate_forward_results`` (and rebatch's) reads: its
    ``micro_batch_indices`` (None: fixed-size micro-batches), and its rows' ``response_lengths`` and
    ``total_lengths`` (``lengths``; None: no lengths, ``total_lengths`` holding only the row count)."""
    if lengths is None:  # the row count only: no lengths to witness
        data: dict[str, list[int]] = {"total_lengths": [1] * rows}
    else:
        data = {"response_lengths": list(lengths), "total_lengths": list(lengths)}
    it: Any = Iterator(micro_batch_size=None, offset=0, rollout_data=data)
    if partitions is not None:
        it.micro_batch_indices = [list(p) for p in partitions]
    return it


def split_by_miles(it: Any, micro_batches: int) -> Any:
    """``it`` as miles' ``get_data_iterator`` hands it out under ``install()``: its split recorded by the
    integration's own record of that function, and every micro-batch handed out (a pass's end)."""
    from torch_impl.integrations import miles

    recording = miles.INTEGRATION.records[(miles.DATA, "get_data_iterator")]
    recording(lambda: ([it], [micro_batches]))()
    it.offset = micro_batches
    return it


def _per_sample(x: torch.Tensor) -> list[torch.Tensor]:
    """A key's per-sample values as miles stores them: a jagged key's rows, a dense key's row tensors."""
    if x.is_nested:
        return rows_of(x)
    return list(x.unbind(0))


def _back(values: list[Any], like: torch.Tensor) -> torch.Tensor:
    """Restored per-sample values in ``like``'s layout (a jagged tensor of the rows, or a stack)."""
    if like.is_nested:
        return from_rows(values, like)
    if not values:
        return like.new_empty((0, *like.shape[1:]))
    return torch.stack(values)


def _same_form(parts: list[dict[str, torch.Tensor]]) -> None:
    """Each key's micro-batches of one layout, dtype and trailing shape: miles stores per-sample values
    and concatenates none, so a call whose parts differ there has no form in miles (`NotExpressible`)."""
    for key, first in parts[0].items():
        for part in parts[1:]:
            x = part.get(key)
            if x is None:
                continue
            if x.is_nested != first.is_nested or x.dtype != first.dtype or x.shape[2:] != first.shape[2:]:
                raise peers.NotExpressible(
                    f"key {key!r}: micro-batches of different forms (miles joins lists)"
                )
            if not x.is_nested and x.shape[1:] != first.shape[1:]:
                raise peers.NotExpressible(
                    f"key {key!r}: micro-batches of different forms (miles joins lists)"
                )


def _run(
    fns: dict[str, Callable[..., Any]],
    output_lst: Any,
    indices: Any,
    dynamic: Any,
    pad_mode: Any = "no_padding",
    witness: Any = None,
) -> dict[str, Any]:
    """miles' call: the micro-batches' keys as per-sample lists, the partitions as the iterator's indices;
    a ``witness`` (the batch's row lengths) as the iterator's ``response_lengths``, where miles keeps them."""
    outs = peers.model_outputs(output_lst, dynamic, pad_mode)
    parts = [{k: peers.plain(v) for k, v in mo.items()} for mo in outs]
    counts = [int(next(iter(p.values())).shape[0]) if p else 0 for p in parts]
    flat = peers.flat(indices, counts, dynamic)
    peers.check_partition_sizes(indices, counts, dynamic)
    if any(not isinstance(i, int) or isinstance(i, bool) for i in flat):
        raise peers.NotExpressible("indices that are not ints (miles' iterator holds lists of ints)")
    _same_form(parts)
    store = [{k: _per_sample(v) for k, v in p.items()} for p in parts]
    rows = len(flat)
    lengths = None if witness is None else [int(n) for n in witness]
    it = iterator(indices if dynamic else None, lengths, rows)
    if not dynamic and len(set(counts)) == 1:  # fixed-size micro-batches: miles' DataIterator's form
        it.micro_batch_size = counts[0]
    args = types.SimpleNamespace(use_dynamic_batch_size=bool(dynamic), qkv_format="thd")
    got = fns[FUNCTION](store, it, args)
    like = parts[0]
    return peers.result({k: _back(got[k], like[k]) for k in got})


def _native(output_lst: Any, partitions: Any) -> tuple[str, tuple[Any, ...]]:
    """The timed call as a miles user runs it with rebatch installed (`split_by_miles`): miles' own
    function reads the same iterator; rebatch's takes the rows its record checked when the split was
    made."""
    parts = [o["model_output"]["log_probs"] for o in output_lst]
    store = [{"log_probs": rows_of(p)} for p in parts]
    rows = sum(len(p) for p in partitions)
    args = types.SimpleNamespace(use_dynamic_batch_size=True, qkv_format="thd")
    it = split_by_miles(iterator(partitions, None, rows), len(partitions))
    return FUNCTION, (store, it, args)


#: The issue's batch: 4 rows in two micro-batches, ``[[2, 1], [0, 3]]``, response lengths 3, 2, 4, 1.
_PARTITIONS = [[2, 1], [0, 3]]
_LENGTHS = [3, 2, 4, 1]


def _store(partitions: Sequence[Sequence[int]]) -> list[dict[str, list[torch.Tensor]]]:
    """Each micro-batch's ``log_probs`` as miles stores them, row ``i`` of length ``_LENGTHS[i]``."""
    return [
        {"log_probs": [torch.full((_LENGTHS[i],), float(i), device="cpu") for i in p]} for p in partitions
    ]


def _attempt(store: list[Any], partitions: Sequence[Sequence[int]]) -> Callable[[Any], Any]:
    def attempt(fns: dict[str, Callable[..., Any]]) -> Any:
        args = types.SimpleNamespace(use_dynamic_batch_size=True, qkv_format="thd")
        return fns[FUNCTION](store, iterator(partitions, _LENGTHS, len(_LENGTHS)), args)

    return attempt


def _defects() -> tuple[peers.NativeDefect, ...]:
    swapped = _store(_PARTITIONS)[::-1]
    short = _store(_PARTITIONS)
    short[1]["log_probs"] = short[1]["log_probs"][:1]
    duplicate = [[2, 1], [0, 2]]
    return (
        peers.NativeDefect(
            "micro_batch_outputs_swapped",
            "the two micro-batches' outputs in each other's place (miles: rows of lengths 4, 1, 3, 2 for a "
            "batch of 3, 2, 4, 1)",
            _attempt(swapped, _PARTITIONS),
            errors.MisalignmentError,
        ),
        peers.NativeDefect(
            "output_one_row_short",
            "micro-batch 1's output one row short (miles: 3 rows for a batch of 4)",
            _attempt(short, _PARTITIONS),
            errors.PartitionMismatchError,
        ),
        peers.NativeDefect(
            "duplicate_index",
            "row 2 twice in the iterator's indices, row 3 in none (miles: a row overwritten, a None left)",
            _attempt(_store(duplicate), duplicate),
            errors.NotAPermutationError,
        ),
    )


#: What miles' own function does with each native defect (the reason rebatch exists).
OUTCOMES = {
    "micro_batch_outputs_swapped": "silent",
    "output_one_row_short": "silent",
    "duplicate_index": "silent",
}

#: The trainer's own function of the side-by-side (`property_tests.sidebyside`): module and name.
THEIRS = (MODULE, FUNCTION)


def side_by_side(
    parts: list[Any], partitions: list[list[int]], keys: int, move: Callable[[Any], Any], fn: Any
) -> tuple[Callable[[], Any], Callable[[], Any] | None, int]:
    """rebatch's call and miles' (``fn``; None: not installed) of one side-by-side case, and the output's
    bytes: ``aggregate_forward_results(store, iterator, args)``, each micro-batch's rows moved with
    ``move``, the iterator's indices and the rows' lengths on the host."""
    from torch_impl.integrations import miles

    b = sum(len(p) for p in partitions)
    nbytes = keys * sum(int(p.values().numel()) * 4 for p in parts)
    lengths = [0] * b
    for p, x in zip(partitions, parts, strict=True):
        for i, n in zip(p, x.offsets().diff().tolist(), strict=True):
            lengths[i] = n
    store = move([{f"k{k}": rows_of(p) for k in range(keys)} for p in parts])
    it = iterator(partitions, lengths, b)
    args = types.SimpleNamespace(use_dynamic_batch_size=True, qkv_format="thd")

    def ours() -> Any:
        return miles.aggregate_forward_results(store, it, args)

    if fn is None:
        return ours, None, nbytes
    return ours, (lambda: fn(store, it, args)), nbytes


#: miles 0.0.2 beside rebatch's drop-in (`property_tests.peers.Peer`).
PEER = peers.declared(
    "miles",
    _theirs,
    _ours,
    _run,
    {"min_rows": 1, "losses": False, "metrics": False},
    _defects,
    _native,
    "per-sample lists; the iterator's split recorded, as under `install()`",
)
