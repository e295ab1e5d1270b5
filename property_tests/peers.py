"""The trainers' own reorder steps beside rebatch's drop-ins, through one adapter each.

A `Peer` turns a ``postprocess_batch``-style call (``output_lst``, ``indices``, the settings; what the
strategies draw and the table of defects breaks) into the trainer's own call, runs a function on it
(the trainer's, or rebatch's drop-in with the same signature) and turns the result back:

- ``verl``: ``verl.workers.engine.utils.postprocess_batch_func(output_lst, indices, data)`` itself;
- ``areal``: AReaL 1.0.4's ``reorder_and_pad_outputs(outputs, output_seqlens, mb_list)``, one call per key:
  each micro-batch's packed values, the original rows' lengths, ``forward_indices`` (the partitions
  flattened) and ``backward_indices`` built as AReaL builds them (``backward[forward] = arange``); a dense
  ``[b, *F]`` key as rows of length 1; the padded result cut back into rows;
- ``skyrl``: SkyRL 0.4.0's ``TokenBasedBatchIterator.reorder_and_combine_batches(batches)`` on an iterator
  holding the partitions: each micro-batch a ``TensorBatch`` of ``[b, S, *F]`` tensors (jagged keys
  right-padded to the call's longest row), the result cut back into rows; with an alignment witness,
  the jagged keys as per-sample items through ``reorder_and_combine_items`` (its items path).

`differential` runs a trainer's function and rebatch's drop-in on the same drawn valid calls (and both
against the expected rows); `outcome` says what a function does with a bad input: raises a
`RebatchError`, crashes with another exception, or returns a result (silently misaligned). The
trainer-native defects (`Peer.native_defects`) are bad inputs only a trainer's own form can hold
(AReaL's ``backward_indices``, SkyRL's stray indices). `property_tests.conformance` runs all of it.
"""

from __future__ import annotations

import importlib
import itertools
import types
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from ref import errors

from .compare import first_difference
from .data import from_rows, jagged, offsets_of, random_tensor, rows_of

__all__ = [
    "PEERS",
    "NativeDefect",
    "NotExpressible",
    "Peer",
    "differential",
    "outcome",
    "sized_call",
]


class NotExpressible(Exception):
    """The call cannot be put in this trainer's own form (a setting or structure it has no place for)."""


class NativeDefect(NamedTuple):
    """A bad input in a trainer's own form: ``attempt(functions)`` calls the trainer-signature functions on
    it."""

    name: str
    what: str
    attempt: Callable[[dict[str, Callable[..., Any]]], Any]
    error: type[errors.RebatchError]


class Peer(NamedTuple):
    name: str
    label: str
    package: str
    #: the trainer's own functions, by name (imports the trainer)
    theirs: Callable[[], dict[str, Callable[..., Any]]]
    #: rebatch's drop-ins for them, by the same names
    ours: Callable[[], dict[str, Callable[..., Any]]]
    #: (functions, output_lst, indices, use_dynamic_bsz, pad_mode[, witness][, provenance=]) -> the result as
    #: ``postprocess_batch`` gives it (``provenance=`` only where `provenance` says the call can carry it)
    run: Callable[..., dict[str, Any]]
    #: bounds of `microbatch_outputs` for the calls the trainer handles correctly
    bounds: dict[str, Any]
    native_defects: Callable[[], tuple[NativeDefect, ...]]
    #: (output_lst, partitions) of one jagged key -> (function name, its arguments): for timing the call alone
    native: Callable[[Any, Any], tuple[str, tuple[Any, ...]]]
    # : whether the trainer's call can carry an alignment witness (the batch's row lengths, `run`'s
    # ``witness``)
    witnessed: bool = True
    #: whether the trainer's call can carry rebatch's split's provenance (`run`'s ``provenance``, as
    #: ``torch_impl.recorded(batch)``): verl's, whose ``data`` is the batch the split recorded; AReaL's and
    #: SkyRL's cannot (``docs/witness.md``, "Where provenance cannot reach")
    provenance: bool = False


# -- shared helpers ----------------------------------------------------------------------------------


def _model_outputs(output_lst: Any, dynamic: Any, pad_mode: Any) -> list[dict[str, torch.Tensor]]:
    """The micro-batches' ``model_output`` dicts of a call a trainer without settings can hold."""
    if dynamic is not True and dynamic is not False:
        raise NotExpressible("a use_dynamic_bsz that is not a bool")
    if pad_mode != "no_padding":
        raise NotExpressible("a pad_mode")
    if not isinstance(output_lst, list) or not all(isinstance(o, dict) for o in output_lst):
        raise NotExpressible("output_lst is not a list of dicts")
    if any("metrics" in o for o in output_lst):
        raise NotExpressible("metrics are folded elsewhere in this trainer")
    if not output_lst or any("model_output" not in o for o in output_lst):
        raise NotExpressible("a micro-batch without a model_output")
    outs = [o["model_output"] for o in output_lst]
    if any(set(mo) != set(outs[0]) for mo in outs):
        raise NotExpressible("micro-batches with different keys")
    return outs


def _flat(indices: Any, counts: Sequence[int], dynamic: bool) -> list[Any]:
    """The partitions flattened (the identity without dynamic batching)."""
    if not dynamic:
        return list(range(sum(counts)))
    if not isinstance(indices, list) or not all(isinstance(p, list) for p in indices):
        raise NotExpressible("indices that are not lists of lists")
    return [i for p in indices for i in p]


def _plain(x: Any) -> torch.Tensor:
    """``x`` if a trainer's packed or padded form can hold it: a tensor with data (not ``meta``) and, if
    nested, a jagged one without holes whose offsets are valid (`NotExpressible` otherwise)."""
    if not isinstance(x, torch.Tensor) or x.dim() == 0:
        raise NotExpressible("an output that is not a batched tensor")
    if x.device.type == "meta":
        raise NotExpressible("a tensor without data")
    if x.is_nested:
        if x.layout != torch.jagged or x._lengths is not None:  # type: ignore[attr-defined]
            raise NotExpressible("a nested tensor that is not a packed jagged one")
        o = offsets_of(x)
        if int(o[0]) != 0 or bool((o.diff() < 0).any()) or int(o[-1]) != int(x.values().shape[0]):
            raise NotExpressible("offsets that describe no packed rows")
    return x


def _row_lengths(x: torch.Tensor) -> list[int]:
    if x.is_nested:
        return [int(n) for n in offsets_of(x).diff().tolist()]
    return [1] * int(x.shape[0])


def _check_partition_sizes(indices: Any, counts: Sequence[int], dynamic: bool) -> None:
    """A trainer that holds only the flattened order (AReaL) cannot hold partitions that disagree with
    the micro-batches' row counts: such a call has no form there."""
    if dynamic and (
        len(indices) != len(counts) or any(len(p) != c for p, c in zip(indices, counts, strict=True))
    ):
        raise NotExpressible("partitions that differ from the micro-batches' rows (only their order is held)")


def _original_lengths(flat: Sequence[Any], lengths_in_order: Sequence[int]) -> list[int]:
    """Each original row's length, placed as a trainer's splitter knows them (``L[perm[k]]``)."""
    if len(flat) != len(lengths_in_order):
        raise NotExpressible("as many indices as rows are needed to place the row lengths")
    out = [0] * len(flat)
    for k, i in enumerate(flat):
        if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < len(flat):
            raise NotExpressible(f"index {i!r} cannot place a row length")
        out[i] = lengths_in_order[k]
    return out


def _cut(padded: Any, lengths: Sequence[int], like: torch.Tensor) -> torch.Tensor:
    """Rows ``padded[i, :lengths[i]]`` (per row, independently of rebatch) in ``like``'s layout."""
    if not isinstance(padded, torch.Tensor):
        return padded
    rows = [padded[i, : lengths[i]] for i in range(len(lengths))]
    if like.is_nested:
        return from_rows(rows, like)
    return torch.stack([r[0] for r in rows]) if rows else like.new_empty((0, *like.shape[1:]))


def _result(model_output: dict[str, Any]) -> dict[str, Any]:
    return {"model_output": model_output, "loss": [], "metrics": {}}


# -- AReaL -----------------------------------------------------------------------------------------

AREAL_MODULE = "areal.engine.core.train_engine"


def _areal_theirs() -> dict[str, Callable[..., Any]]:
    module = importlib.import_module(AREAL_MODULE)
    return {"reorder_and_pad_outputs": vars(module)["reorder_and_pad_outputs"]}


def _areal_ours() -> dict[str, Callable[..., Any]]:
    from torch_impl.integrations import areal

    return {"reorder_and_pad_outputs": areal.reorder_and_pad_outputs}


def areal_mb_list(forward: Sequence[Any], cu_seqlens: Sequence[torch.Tensor] | None = None) -> Any:
    """What AReaL's splitter holds: ``forward_indices`` and ``backward_indices[forward] = arange`` (NumPy);
    with ``cu_seqlens``, ``mbs``: one dict per micro-batch holding its own (``mbs[m]["cu_seqlens"]``)."""
    backward = np.zeros(len(forward), dtype=np.int64)
    backward[np.asarray(forward, dtype=np.int64)] = np.arange(len(forward))
    mb_list = types.SimpleNamespace(forward_indices=list(forward), backward_indices=backward.tolist())
    if cu_seqlens is not None:
        mb_list.mbs = [{"cu_seqlens": c.to(torch.int32)} for c in cu_seqlens]
    return mb_list


def _areal_run(
    fns: dict[str, Callable[..., Any]],
    output_lst: Any,
    indices: Any,
    dynamic: Any,
    pad_mode: Any = "no_padding",
    witness: Any = None,
) -> dict[str, Any]:
    """AReaL's call, once per key. With a ``witness`` (the batch's row lengths), a key it binds travels as
    AReaL has it: ``output_seqlens`` the batch's lengths (AReaL splits the packed outputs by them) and
    each micro-batch's own ``cu_seqlens`` in ``mb_list.mbs`` (its rows' lengths as the model saw them:
    the outputs' offsets), which rebatch's drop-in compares."""
    outs = _model_outputs(output_lst, dynamic, pad_mode)
    if any(p is not None and not isinstance(p, list) for p in (indices or [])):
        raise NotExpressible("a partition that is not a list")
    keys = list(outs[0])
    first = keys[0]
    counts = [int(_plain(mo[first]).shape[0]) for mo in outs]
    flat = _flat(indices, counts, dynamic)
    _check_partition_sizes(indices, counts, dynamic)
    try:
        mb_list = areal_mb_list(flat)
    except (IndexError, ValueError, TypeError, OverflowError) as err:  # AReaL's own backward_indices fails
        raise NotExpressible(f"AReaL's splitter cannot hold these indices ({type(err).__name__})") from None
    result: dict[str, Any] = {}
    for key in keys:
        parts = [_plain(mo[key]) for mo in outs]
        if any(p.is_nested != parts[0].is_nested for p in parts):
            raise NotExpressible("layouts that differ between micro-batches")
        lengths_in_order = [n for p in parts for n in _row_lengths(p)]
        seqlens = _original_lengths(flat, lengths_in_order)
        call_list = mb_list
        if witness is not None and parts[0].is_nested and sum(lengths_in_order) == sum(witness):
            seqlens = list(witness)
            call_list = areal_mb_list(flat, cu_seqlens=[offsets_of(p) for p in parts])
        packed = [p.values() if p.is_nested else p for p in parts]
        padded = fns["reorder_and_pad_outputs"](packed, seqlens, call_list)
        result[key] = _cut(padded, seqlens, parts[0])
    return _result(result)


def _areal_native(output_lst: Any, partitions: Any) -> tuple[str, tuple[Any, ...]]:
    parts = [o["model_output"]["log_probs"] for o in output_lst]
    flat = [i for p in partitions for i in p]
    seqlens = _original_lengths(flat, [n for p in parts for n in _row_lengths(p)])
    return "reorder_and_pad_outputs", ([p.values() for p in parts], seqlens, areal_mb_list(flat))


def _areal_defects() -> tuple[NativeDefect, ...]:
    seqlens = [2, 1, 0, 3, 2]
    forward = [4, 0, 3, 2, 1]  # micro-batches [4, 0] and [3, 2, 1]

    def outputs() -> list[torch.Tensor]:
        return [torch.arange(4.0), torch.arange(4.0) + 10]

    def call(backward: list[int], lens: list[int] = seqlens, outs: Callable[[], Any] = outputs) -> Any:
        mb = types.SimpleNamespace(forward_indices=forward, backward_indices=backward)
        return lambda fns: fns["reorder_and_pad_outputs"](outs(), lens, mb)

    return (
        NativeDefect(
            "negative_alias_in_backward",
            "backward_indices [1, -4, 3, 2, 0]: -4 aliases 1",
            call([1, -4, 3, 2, 0]),
            errors.NotAPermutationError,
        ),
        NativeDefect(
            "backward_not_the_inverse",
            "a permutation, not the inverse of forward_indices",
            call([1, 4, 3, 0, 2]),
            errors.NotAPermutationError,
        ),
        NativeDefect(
            "duplicate_in_backward",
            "backward_indices [1, 4, 3, 3, 0]",
            call([1, 4, 3, 3, 0]),
            errors.NotAPermutationError,
        ),
        NativeDefect(
            "out_of_range_in_backward",
            "backward_indices [1, 4, 3, 2, 5] for 5 rows",
            call([1, 4, 3, 2, 5]),
            errors.NotAPermutationError,
        ),
        NativeDefect(
            "outputs_ending_inside_a_row",
            "micro-batch outputs of 3 and 5 values, rows of 2+2 and 3+0+1",
            call([1, 4, 3, 2, 0], outs=lambda: [torch.arange(3.0), torch.arange(5.0)]),
            errors.PartitionMismatchError,
        ),
        NativeDefect(
            "seqlens_short_of_the_outputs",
            "output_seqlens adding up to 8 for 9 values",
            call([1, 4, 3, 2, 0], outs=lambda: [torch.arange(4.0), torch.arange(5.0)]),
            errors.PartitionMismatchError,
        ),
    )


# -- SkyRL -----------------------------------------------------------------------------------------

SKYRL_MODULE = "skyrl.backends.skyrl_train.workers.worker_utils"
SKYRL_METHODS = ("reorder_and_combine_batches", "reorder_and_combine_items")


def _skyrl_theirs() -> dict[str, Callable[..., Any]]:
    cls = importlib.import_module(SKYRL_MODULE).TokenBasedBatchIterator
    return {name: vars(cls)[name] for name in SKYRL_METHODS}


def _skyrl_ours() -> dict[str, Callable[..., Any]]:
    from torch_impl.integrations import skyrl

    return {name: getattr(skyrl, name) for name in SKYRL_METHODS}


def skyrl_iterator(
    partitions: list[list[Any]], rows: int, padding: int = 0, valid_lengths: Sequence[int] | None = None
) -> Any:
    """A ``TokenBasedBatchIterator`` holding ``partitions`` (its ``__init__``, which packs by token count
    and may all-reduce, skipped): the attributes its two methods read. With ``valid_lengths``, its batch
    is a ``TrainingInputBatch`` whose ``response_mask`` (left-padded, as SkyRL builds it) gives each row
    that many response tokens: the lengths SkyRL's workers keep in each per-sample item."""
    cls = importlib.import_module(SKYRL_MODULE).TokenBasedBatchIterator
    it = object.__new__(cls)
    it._microbatches = partitions
    it._token_counts = [1] * rows
    it._num_padding_microbatches = padding
    it.data = types.SimpleNamespace(batch_size=rows)
    if valid_lengths is not None:
        width = max(valid_lengths, default=0)
        mask = torch.zeros(len(valid_lengths), width, dtype=torch.int64)
        for i, n in enumerate(valid_lengths):
            mask[i, width - n :] = 1
        batch_cls = importlib.import_module("skyrl.backends.skyrl_train.training_batch").TrainingInputBatch
        it.data = batch_cls({"response_mask": mask})
    return it


def tensor_batch(fields: dict[str, Any], metadata: dict[str, Any] | None = None) -> Any:
    """SkyRL's ``TensorBatch`` of ``fields``."""
    cls = importlib.import_module("skyrl.backends.skyrl_train.training_batch").TensorBatch
    batch = cls(fields)
    batch.metadata = metadata
    return batch


def _skyrl_run(
    fns: dict[str, Callable[..., Any]],
    output_lst: Any,
    indices: Any,
    dynamic: Any,
    pad_mode: Any = "no_padding",
    witness: Any = None,
) -> dict[str, Any]:
    """SkyRL's call. Its padded ``[b, *S]`` micro-batch outputs keep no row lengths; its per-sample items
    do. With a ``witness`` (the batch's row lengths) that a jagged key's total matches, the jagged keys
    travel as SkyRL's workers return per-token outputs: one item per row (``{key: the row}``) through
    ``reorder_and_combine_items``, on an iterator whose batch's ``response_mask`` gives the witness (each
    row's valid length, which rebatch's drop-in compares); dense keys through
    ``reorder_and_combine_batches``."""
    outs = _model_outputs(output_lst, dynamic, pad_mode)
    keys = list(outs[0])
    counts = [int(_plain(mo[keys[0]]).shape[0]) for mo in outs]
    flat = _flat(indices, counts, dynamic)
    if dynamic:
        partitions = indices
    else:
        bounds = np.cumsum([0, *counts]).tolist()
        partitions = [list(range(a, b)) for a, b in itertools.pairwise(bounds)]
    lengths: dict[str, list[int]] = {}
    fields: list[dict[str, Any]] = [{} for _ in outs]
    per_row: dict[str, list[list[torch.Tensor]]] = {}
    for key in keys:
        parts = [_plain(mo[key]) for mo in outs]
        if any(p.is_nested != parts[0].is_nested for p in parts):
            raise NotExpressible("layouts that differ between micro-batches")
        if parts[0].is_nested:
            in_order = [n for p in parts for n in _row_lengths(p)]
            lengths[key] = _original_lengths(flat, in_order)
            per_row[key] = [rows_of(p) for p in parts]
            width = max(in_order, default=0)
            for m, p in enumerate(parts):
                rows = per_row[key][m]
                feature = tuple(p.shape[2:])
                padded = [torch.cat([r, r.new_zeros((width - r.shape[0], *feature))]) for r in rows]
                fields[m][key] = torch.stack(padded) if padded else p.values().new_zeros((0, width, *feature))
        else:
            for m, p in enumerate(parts):
                fields[m][key] = p
    as_items = witness is not None and any(sum(n) == sum(witness) for n in lengths.values())
    model_output: dict[str, Any] = {}
    if as_items:
        it = skyrl_iterator(partitions, len(flat), valid_lengths=list(witness))
        items = [[{k: per_row[k][m][j] for k in per_row} for j in range(c)] for m, c in enumerate(counts)]
        ordered = fns["reorder_and_combine_items"](it, items)
        model_output = {k: from_rows([x[k] for x in ordered], outs[0][k]) for k in per_row}
        fields = [{k: v for k, v in f.items() if k not in per_row} for f in fields]
    if any(fields):
        try:
            batches = [tensor_batch(f, {"micro_batch": m}) for m, f in enumerate(fields)]
        except (
            ValueError
        ) as err:  # keys of different row counts: SkyRL's TensorBatch holds no such micro-batch
            raise NotExpressible(f"SkyRL's TensorBatch refuses it ({err})") from None
        it = skyrl_iterator(partitions, len(flat))
        combined = fns["reorder_and_combine_batches"](it, batches)
        for key in fields[0]:
            model_output[key] = (
                _cut(combined[key], lengths[key], outs[0][key]) if key in lengths else combined[key]
            )
    return _result({key: model_output[key] for key in keys})


def _skyrl_native(output_lst: Any, partitions: Any) -> tuple[str, tuple[Any, ...]]:
    parts = [o["model_output"]["log_probs"] for o in output_lst]
    width = max((n for p in parts for n in _row_lengths(p)), default=0)
    batches = [tensor_batch({"log_probs": torch_padded(p, width)}, {}) for p in parts]
    rows = sum(len(p) for p in partitions)
    return "reorder_and_combine_batches", (skyrl_iterator(partitions, rows), batches)


def torch_padded(x: torch.Tensor, width: int) -> torch.Tensor:
    """A jagged ``[b, (j)]`` tensor right-padded with zeros to ``[b, width]`` (torch's own conversion)."""
    return torch.nested.to_padded_tensor(x, 0.0, output_size=(int(x.size(0)), width))


def _skyrl_defects() -> tuple[NativeDefect, ...]:
    def batches_of(partitions: list[list[int]], extra_rows: int = 0) -> list[Any]:
        return [
            tensor_batch({"output": torch.arange(float(len(p) + (extra_rows if m == 0 else 0)))}, {"m": m})
            for m, p in enumerate(partitions)
        ]

    def combine(partitions: list[list[int]], rows: int, extra_rows: int = 0) -> Callable[..., Any]:
        return lambda fns: fns["reorder_and_combine_batches"](
            skyrl_iterator(partitions, rows), batches_of(partitions, extra_rows)
        )

    def items(partitions: list[list[int]], rows: int, extra: int = 0) -> Callable[..., Any]:
        lists = [
            [{"i": i} for i in p] + [{"extra": 1}] * (extra if m == 0 else 0)
            for m, p in enumerate(partitions)
        ]
        return lambda fns: fns["reorder_and_combine_items"](skyrl_iterator(partitions, rows), lists)

    return (
        NativeDefect(
            "duplicate_still_covering",
            "partitions [[0, 1], [2, 1]] for 3 rows",
            combine([[0, 1], [2, 1]], 3),
            errors.NotAPermutationError,
        ),
        NativeDefect(
            "extra_index",
            "partitions [[0, 1], [2, 5]] for 3 rows",
            combine([[0, 1], [2, 5]], 3),
            errors.NotAPermutationError,
        ),
        NativeDefect(
            "negative_index",
            "partitions [[0, 1], [2, -1]] for 3 rows",
            combine([[0, 1], [2, -1]], 3),
            errors.NotAPermutationError,
        ),
        NativeDefect(
            "extra_rows",
            "micro-batch 0's output has one row more than its indices",
            combine([[1, 0], [2]], 3, extra_rows=1),
            errors.PartitionMismatchError,
        ),
        NativeDefect(
            "items_duplicate_still_covering",
            "reorder_and_combine_items, partitions [[0, 1], [2, 1]]",
            items([[0, 1], [2, 1]], 3),
            errors.NotAPermutationError,
        ),
        NativeDefect(
            "items_extra_item",
            "reorder_and_combine_items, one item more than indices",
            items([[1, 0], [2]], 3, extra=1),
            errors.PartitionMismatchError,
        ),
    )


# -- verl ------------------------------------------------------------------------------------------


def _verl_theirs() -> dict[str, Callable[..., Any]]:
    module = importlib.import_module("verl.workers.engine.utils")
    return {"postprocess_batch_func": vars(module)["postprocess_batch_func"]}


def _verl_ours() -> dict[str, Callable[..., Any]]:
    import torch_impl

    return {"postprocess_batch_func": torch_impl.postprocess_batch_func}


def _verl_run(
    fns: dict[str, Callable[..., Any]],
    output_lst: Any,
    indices: Any,
    dynamic: Any,
    pad_mode: Any = "no_padding",
    witness: Any = None,
    provenance: Any = None,
) -> dict[str, Any]:
    """verl's call; a ``witness`` travels as the batch's ``input_ids`` in ``data``, where verl's engines
    leave it (and where rebatch's drop-in reads it); with a ``provenance`` (``torch_impl.recorded(batch)``),
    ``data`` is that ``batch``, the one rebatch's split made the micro-batches of (where the drop-in finds
    the split's record)."""
    from .candidates import load_candidate

    run = load_candidate(fns["postprocess_batch_func"])
    # verl nests every output and cannot nest a dense [b] one: it travels as [b, 1] and comes back as [B]
    flat_keys: set[str] = set()
    if isinstance(output_lst, list):
        staged = []
        for o in output_lst:
            mo = o.get("model_output") if isinstance(o, dict) else None
            if isinstance(mo, dict):
                wide = {k: v[:, None] if _is_dense_1d(v) else v for k, v in mo.items()}
                flat_keys |= {k for k, v in mo.items() if _is_dense_1d(v)}
                o = {**o, "model_output": wide}
            staged.append(o)
        output_lst = staged
    result: dict[str, Any] = run(
        output_lst,
        indices,
        use_dynamic_bsz=dynamic,
        pad_mode=pad_mode,
        witness=witness,
        provenance=provenance,
    )
    if flat_keys and isinstance(result.get("model_output"), dict):
        mo = dict(result["model_output"])
        for k in flat_keys & set(mo):
            if isinstance(mo[k], torch.Tensor) and mo[k].dim() == 2:
                mo[k] = mo[k][:, 0]
        result = {**result, "model_output": mo}
    return result


def _is_dense_1d(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and not x.is_nested and x.dim() == 1


def _verl_defects() -> tuple[NativeDefect, ...]:
    return ()


def _verl_native(output_lst: Any, partitions: Any) -> tuple[str, tuple[Any, ...]]:
    from tensordict import TensorDict

    return "postprocess_batch_func", (output_lst, partitions, TensorDict({}, batch_size=[]))


PEERS: dict[str, Peer] = {
    "verl": Peer(
        "verl",
        "verl 0.9.1",
        "verl",
        _verl_theirs,
        _verl_ours,
        _verl_run,
        {
            "min_rows": 1,
            "metrics": False,
        },  # verl folds its own Metric class (tests/test_verl_differential.py)
        _verl_defects,
        _verl_native,
        provenance=True,
    ),
    "areal": Peer(
        "areal",
        "AReaL 1.0.4",
        "areal",
        _areal_theirs,
        _areal_ours,
        _areal_run,
        {"min_rows": 1, "losses": False, "metrics": False},
        _areal_defects,
        _areal_native,
    ),
    "skyrl": Peer(
        "skyrl",
        "SkyRL 0.4.0",
        "skyrl",
        _skyrl_theirs,
        _skyrl_ours,
        _skyrl_run,
        {"min_rows": 1, "losses": False, "metrics": False},
        _skyrl_defects,
        _skyrl_native,
    ),
}


def outcome(attempt: Callable[[], Any]) -> str:
    """What a function does with a bad input: ``raises <Class>`` (a `RebatchError`), ``crashes: <Type>``
    (any other exception), ``silent`` (it returned a result), or ``n/a`` (the input has no form there)."""
    try:
        attempt()
    except NotExpressible:
        return "n/a"
    except errors.RebatchError as err:
        return f"raises {type(err).__name__}"
    except Exception as err:
        return f"crashes: {type(err).__name__}"
    return "silent"


def differential(peer: Peer, cases: Sequence[Any]) -> list[str]:
    """Each drawn valid call (`MicrobatchOutputs`) through the trainer's function and rebatch's drop-in:
    the differences found (an empty list when they agree bit for bit, with each other and with the
    expected rows)."""
    theirs, ours = peer.theirs(), peer.ours()
    found: list[str] = []
    for n, case in enumerate(cases):
        args = (case.output_lst, case.indices, case.use_dynamic_bsz, case.pad_mode)
        try:
            got_theirs = peer.run(theirs, *args)
        except Exception as err:
            found.append(f"case {n}: {peer.label} raised {type(err).__name__}: {err}")
            continue
        got_ours = peer.run(ours, *args)
        why = first_difference(got_ours, got_theirs)
        if why is None:
            why = first_difference(got_ours["model_output"], case.expected)
        if why is not None:
            found.append(f"case {n}: {why}")
    return found


def sized_call(
    b: int, mean_length: int, m: int, seed: int = 0
) -> tuple[list[dict[str, Any]], list[list[int]]]:
    """A timing-sized call: ``b`` rows of float32 log-probs, lengths uniform in ``[1, 2 * mean_length - 1]``,
    shuffled into ``m`` micro-batches (one jagged key)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 2 * mean_length, size=b).tolist()
    order = rng.permutation(b).tolist()
    cuts = np.linspace(0, b, m + 1).astype(int).tolist()
    partitions = [order[a:c] for a, c in itertools.pairwise(cuts)]
    values = random_tensor(rng, (sum(lengths),), "float32")
    rows = rows_of(jagged(values, lengths))
    output_lst = []
    for p in partitions:
        picked = [rows[i] for i in p]
        output_lst.append(
            {"model_output": {"log_probs": jagged(torch.cat(picked), [len(r) for r in picked])}}
        )
    return output_lst, partitions
