"""SkyRL 0.4.0 in the testing kit: its own ``TokenBasedBatchIterator.reorder_and_combine_batches(batches)``
called from the kit's cases (`PEER`) on an iterator holding the partitions: each micro-batch a
``TensorBatch`` of ``[b, S, *F]`` tensors (jagged keys right-padded to the call's longest row), the result
cut back into rows; with an alignment witness, the jagged keys as per-sample items through
``reorder_and_combine_items`` (its items path). Its native defects: stray indices SkyRL's iterator holds."""

from __future__ import annotations

import itertools
import types
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from ref import errors

from .. import peers, trainer_steps
from ..data import from_rows, rows_of
from ..device_inputs import Builder, Move, host_batch, randn
from ..trainer_import import import_trainer_module

MODULE = "skyrl.backends.skyrl_train.workers.worker_utils"
#: SkyRL's module holding its batches (``TensorBatch``, ``TrainingInputBatch``, ``TrainingOutputBatch``).
TRAINING_BATCH = "skyrl.backends.skyrl_train.training_batch"
METHODS = ("reorder_and_combine_batches", "reorder_and_combine_items")


def _theirs() -> dict[str, Callable[..., Any]]:
    cls = import_trainer_module(MODULE).TokenBasedBatchIterator
    return {name: vars(cls)[name] for name in METHODS}


def _ours() -> dict[str, Callable[..., Any]]:
    from torch_impl.integrations import skyrl

    return {name: getattr(skyrl, name) for name in METHODS}


def skyrl_iterator(
    partitions: list[list[Any]], rows: int, padding: int = 0, valid_lengths: Sequence[int] | None = None
) -> Any:
    """A ``TokenBasedBatchIterator`` holding ``partitions`` (its ``__init__``, which packs by token count
    and may all-reduce, skipped): the attributes its two methods read. With ``valid_lengths``, its batch
    is a ``TrainingInputBatch`` whose ``response_mask`` (left-padded, as SkyRL builds it) gives each row
    that many response tokens: the lengths SkyRL's workers keep in each per-sample item."""
    cls = import_trainer_module(MODULE).TokenBasedBatchIterator
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
        batch_cls = import_trainer_module(TRAINING_BATCH).TrainingInputBatch
        it.data = batch_cls({"response_mask": mask})
    return it


def tensor_batch(fields: dict[str, Any], metadata: dict[str, Any] | None = None) -> Any:
    """SkyRL's ``TensorBatch`` of ``fields``."""
    cls = import_trainer_module(TRAINING_BATCH).TensorBatch
    batch = cls(fields)
    batch.metadata = metadata
    return batch


def _run(
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
    outs = peers.model_outputs(output_lst, dynamic, pad_mode)
    keys = list(outs[0])
    counts = [int(peers.plain(mo[keys[0]]).shape[0]) for mo in outs]
    flat = peers.flat(indices, counts, dynamic)
    if dynamic:
        partitions = indices
    else:
        bounds = np.cumsum([0, *counts]).tolist()
        partitions = [list(range(a, b)) for a, b in itertools.pairwise(bounds)]
    lengths: dict[str, list[int]] = {}
    fields: list[dict[str, Any]] = [{} for _ in outs]
    per_row: dict[str, list[list[torch.Tensor]]] = {}
    for key in keys:
        parts = [peers.plain(mo[key]) for mo in outs]
        if any(p.is_nested != parts[0].is_nested for p in parts):
            raise peers.NotExpressible("layouts that differ between micro-batches")
        if parts[0].is_nested:
            in_order = [n for p in parts for n in peers.row_lengths(p)]
            lengths[key] = peers.original_lengths(flat, in_order)
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
            raise peers.NotExpressible(f"SkyRL's TensorBatch refuses it ({err})") from None
        it = skyrl_iterator(partitions, len(flat))
        combined = fns["reorder_and_combine_batches"](it, batches)
        for key in fields[0]:
            model_output[key] = (
                peers.cut(combined[key], lengths[key], outs[0][key]) if key in lengths else combined[key]
            )
    return peers.result({key: model_output[key] for key in keys})


def _native(output_lst: Any, partitions: Any) -> tuple[str, tuple[Any, ...]]:
    parts = [o["model_output"]["log_probs"] for o in output_lst]
    width = max((n for p in parts for n in peers.row_lengths(p)), default=0)
    batches = [tensor_batch({"log_probs": torch_padded(p, width)}, {}) for p in parts]
    rows = sum(len(p) for p in partitions)
    return "reorder_and_combine_batches", (skyrl_iterator(partitions, rows), batches)


def torch_padded(x: torch.Tensor, width: int) -> torch.Tensor:
    """A jagged ``[b, (j)]`` tensor right-padded with zeros to ``[b, width]`` (torch's own conversion)."""
    return torch.nested.to_padded_tensor(x, 0.0, output_size=(int(x.size(0)), width))


def _defects() -> tuple[peers.NativeDefect, ...]:
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
        peers.NativeDefect(
            "duplicate_still_covering",
            "partitions [[0, 1], [2, 1]] for 3 rows",
            combine([[0, 1], [2, 1]], 3),
            errors.NotAPermutationError,
        ),
        peers.NativeDefect(
            "extra_index",
            "partitions [[0, 1], [2, 5]] for 3 rows",
            combine([[0, 1], [2, 5]], 3),
            errors.NotAPermutationError,
        ),
        peers.NativeDefect(
            "negative_index",
            "partitions [[0, 1], [2, -1]] for 3 rows",
            combine([[0, 1], [2, -1]], 3),
            errors.NotAPermutationError,
        ),
        peers.NativeDefect(
            "extra_rows",
            "micro-batch 0's output has one row more than its indices",
            combine([[1, 0], [2]], 3, extra_rows=1),
            errors.PartitionMismatchError,
        ),
        peers.NativeDefect(
            "items_duplicate_still_covering",
            "reorder_and_combine_items, partitions [[0, 1], [2, 1]]",
            items([[0, 1], [2, 1]], 3),
            errors.NotAPermutationError,
        ),
        peers.NativeDefect(
            "items_extra_item",
            "reorder_and_combine_items, one item more than indices",
            items([[1, 0], [2]], 3, extra=1),
            errors.PartitionMismatchError,
        ),
    )


#: The trainer's own class of the side-by-side (`property_tests.sidebyside`): module and name.
THEIRS = (MODULE, "TokenBasedBatchIterator")


class Batch(dict):  # type: ignore[type-arg,unused-ignore]
    """What ``reorder_and_combine_batches`` reads of SkyRL's batch: its items, its type, ``metadata``."""

    metadata: Any = None


def side_by_side(
    parts: list[Any], partitions: list[list[int]], keys: int, move: Callable[[Any], Any], fn: Any
) -> tuple[Callable[[], Any], Callable[[], Any] | None, int]:
    """rebatch's call and SkyRL's (``fn``, its iterator class; None: not installed) of one side-by-side
    case, and the output's bytes: ``reorder_and_combine_batches(batches)``, each micro-batch a batch of
    ``[b, W]`` right-padded tensors moved with ``move``."""
    from torch_impl.integrations import skyrl

    b = sum(len(p) for p in partitions)
    width = max(n for p in parts for n in p.offsets().diff().tolist())
    fields = move([{f"k{k}": torch_padded(p, width) for k in range(keys)} for p in parts])
    nbytes = keys * b * width * 4
    if fn is None:
        it = types.SimpleNamespace(
            _microbatches=partitions, _token_counts=[1] * b, _num_padding_microbatches=0, data=None
        )
        batches = [Batch(f) for f in fields]
        return (lambda: skyrl.reorder_and_combine_batches(it, batches)), None, nbytes
    native_it = skyrl_iterator(partitions, b)
    native = [tensor_batch(dict(f), {}) for f in fields]
    return (
        lambda: skyrl.reorder_and_combine_batches(native_it, native),
        lambda: fn.reorder_and_combine_batches(native_it, native),
        nbytes,
    )


def _device_call(move: Move, b: int) -> tuple[Callable[[], Any], str]:
    from torch_impl.integrations.skyrl import reorder_and_combine_batches as ours

    indices, _, _ = host_batch(b)
    it = types.SimpleNamespace(
        _microbatches=indices,
        _token_counts=[1] * b,
        _num_padding_microbatches=0,
        data=types.SimpleNamespace(),
    )
    fields = move([{"log_probs": randn(len(p), 7)} for p in indices])
    batches = [Batch(f) for f in fields]
    return (lambda: ours(it, batches)), "in"


#: SkyRL's device call (`property_tests.device_calls`): each micro-batch's ``[b, S]`` tensors on the device.
DEVICE_CALLS: dict[str, Builder] = {"skyrl.reorder_and_combine_batches": _device_call}


def step(model: str, swap: tuple[int, int] | None, dtype: str = "float32") -> dict[str, Any]:
    training_batch = import_trainer_module(TRAINING_BATCH)
    logprobs_from_logits = import_trainer_module(
        "skyrl.backends.skyrl_train.utils.torch_utils"
    ).logprobs_from_logits
    worker_utils = import_trainer_module(MODULE)
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    net = AutoModelForCausalLM.from_pretrained(model, attn_implementation="sdpa", dtype=getattr(torch, dtype))
    ids, _, lengths = trainer_steps.batch()
    # SkyRL's layout: sequences left-padded, the last `a` columns the response; response_mask marks each
    # row's response tokens (a prompt of 4 tokens, the rest response)
    s = ids.shape[1]
    a = s - 4
    left = torch.zeros_like(ids)
    attention = torch.zeros(trainer_steps.ROWS, s, dtype=torch.int64)
    response = torch.zeros(trainer_steps.ROWS, a, dtype=torch.int64)
    for i, n in enumerate(lengths):
        left[i, s - n :] = ids[i, :n]
        attention[i, s - n :] = 1
        response[i, a - (n - 4) :] = 1
    data = training_batch.TrainingInputBatch(
        {"sequences": left, "attention_mask": attention, "response_mask": response}
    )
    data.metadata = {"response_length": a}
    it = worker_utils.TokenBasedBatchIterator(data, max_tokens_per_microbatch=64)
    out: dict[str, Any] = {
        "bound": type(it).__dict__["reorder_and_combine_batches"].__module__,
        "microbatches": [list(p) for p in it._microbatches],
        "valid": [n - 4 for n in lengths],
    }

    def micro(mb: Any) -> tuple[torch.Tensor, list[dict[str, Any]]]:
        # SkyRL's HFModelWrapper.forward without padding removal (its module imports flash_attn: not on a
        # CPU machine), with SkyRL's own logprobs_from_logits
        seq, att = mb["sequences"], mb["attention_mask"]
        pos = att.long().cumsum(-1) - 1
        pos.masked_fill_(att == 0, 1)
        logits = net(seq, attention_mask=att, position_ids=pos)["logits"]
        logp = logprobs_from_logits(logits, torch.roll(seq, shifts=-1, dims=1), inplace_backward=True)
        action = logp[:, -a - 1 : -1]
        valid = mb["response_mask"].sum(dim=1).int().tolist()
        cpu = action.detach().cpu()
        items = [{"logprobs": cpu[i, -n:].tolist() if n > 0 else []} for i, n in enumerate(valid)]
        return action, items

    batches, item_lists, losses = [], [], []
    for mb in it:
        action, items = micro(mb)
        batches.append(training_batch.TrainingOutputBatch({"output": action.detach()}))
        item_lists.append(items)
        losses.append(-(action * mb["response_mask"]).sum())
    if swap is not None:
        m, n = swap
        batches[m], batches[n] = batches[n], batches[m]
        item_lists[m], item_lists[n] = item_lists[n], item_lists[m]
        out["swapped"] = (m, n)
        out["batches"], out["batches_error"] = trainer_steps.attempt(
            lambda: dict(it.reorder_and_combine_batches(batches))
        )
        out["items"], out["items_error"] = trainer_steps.attempt(
            lambda: it.reorder_and_combine_items(item_lists)
        )
        out["mode"] = trainer_steps.mode()
        return out
    out["batches"] = dict(it.reorder_and_combine_batches(batches))
    out["items"] = it.reorder_and_combine_items(item_lists)
    torch.stack(losses).sum().backward()
    out["grads"] = {k: p.grad.clone() for k, p in net.named_parameters() if p.grad is not None}
    out["mode"] = trainer_steps.mode()
    return out


#: What SkyRL's own function does with each native defect (the reason rebatch exists).
OUTCOMES = {
    "duplicate_still_covering": "silent",
    "extra_index": "silent",
    "negative_index": "silent",
    "extra_rows": "silent",
    "items_duplicate_still_covering": "silent",
    "items_extra_item": "silent",
}

#: SkyRL 0.4.0 beside rebatch's drop-in (`property_tests.peers.Peer`).
PEER = peers.declared(
    "skyrl",
    _theirs,
    _ours,
    _run,
    {"min_rows": 1, "losses": False, "metrics": False},
    _defects,
    _native,
    "padded `[b, S]`",
)
