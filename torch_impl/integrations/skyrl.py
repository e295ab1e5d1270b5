"""SkyRL 0.4.0's table for the trainer contract (`_integration.Integration`): `install()` turns rebatch on.

SkyRL's token-budget micro-batching (``TokenBasedBatchIterator`` of ``skyrl.backends.skyrl_train.workers.
worker_utils``) restores order with its methods ``reorder_and_combine_batches(batches)`` (per key, a
Python loop copying row by row into ``[B, *S]``) and ``reorder_and_combine_items(batches)`` (per-sample
dicts). `install` replaces both on the class (every iterator, made before or after, uses rebatch's); a
lazy install (``REBATCH``) also wraps ``prepare_runtime_environment`` so that a driver passes rebatch's
variables on to its Ray actors (else call `install()` in each worker: Ray's ``worker_process_setup_hook``).

Same result as SkyRL on every input it handles correctly (padding micro-batches left out from the end,
``None`` entries kept, the first batch's type and ``metadata``); a `ref.errors.RebatchError` where SkyRL
silently accepts a duplicate (its rows still all covered), extra or negative index, or a micro-batch
output with more rows than its indices. ``reorder_and_combine_items`` checks each item's valid length
against the batch's own (`item_witness`, ``docs/witness.md``): items restored as the wrong rows raise
`ref.errors.MisalignmentError` (the padded outputs of ``reorder_and_combine_batches`` keep no lengths).
"""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ref.errors import PartitionMismatchError

from .._alignment import RowWitness, witness_config
from .._entry import entry
from .._permutation import check_permutation, invert
from .._postprocess import check_batch_func, postprocess_batch
from .._tally import skipped
from ._counts import rows_of_partitions
from ._integration import Installed, Integration, NotReplayable, Replaced
from ._patch import Versions

__all__ = [
    "INTEGRATION",
    "ITERATOR",
    "TRAIN_UTILS",
    "VERSIONS",
    "WORKER_UTILS",
    "Installed",
    "check_reorder_and_combine_batches",
    "check_reorder_and_combine_items",
    "install",
    "installed",
    "item_witness",
    "mode",
    "reorder_and_combine_batches",
    "reorder_and_combine_items",
    "replacements",
    "stats",
    "uninstall",
]

#: The SkyRL module and class whose methods `install` replaces.
WORKER_UTILS = "skyrl.backends.skyrl_train.workers.worker_utils"
ITERATOR = "TokenBasedBatchIterator"
#: The SkyRL module whose ``prepare_runtime_environment`` gives the Ray actors their environment variables.
TRAIN_UTILS = "skyrl.train.utils.utils"


def _real(batches: Sequence[Any], partitions: Sequence[Any], padding: int, what: str) -> list[Any]:
    """The batches of real micro-batches: the last ``padding`` are SkyRL's padding micro-batches. One
    per partition (`PartitionMismatchError`)."""
    if not isinstance(batches, Sequence):
        raise PartitionMismatchError(f"{what} must be a list, got {type(batches).__name__}")
    real = list(batches[: len(batches) - padding])
    if not real:
        raise PartitionMismatchError("Cannot reorder an empty list of microbatches.")
    if len(real) != len(partitions):
        raise PartitionMismatchError(
            f"{len(real)} micro-batch {what} (after {padding} padding ones) for {len(partitions)} "
            "micro-batches"
        )
    return real


@entry
def reorder_and_combine_batches(self: Any, batches: Sequence[Any]) -> Any:
    """Drop-in for SkyRL 0.4.0's ``TokenBasedBatchIterator.reorder_and_combine_batches``: each key of the
    first batch restored to original order, ``[B, *S]``, in a batch of the first one's type and metadata.

    ``self._microbatches`` are the partitions, ``len(self._token_counts)`` the batch size ``B``; the last
    ``self._num_padding_microbatches`` batches are padding. Every index, key, row count, dtype, device
    and shape is checked before any data moves (``postprocess_batch``'s checks).
    """
    partitions = self._microbatches
    first, empty, outs = _batches_checked(self, batches)
    restored = postprocess_batch(outs, partitions)["model_output"]
    combined = type(first)({k: None if k in empty else restored[k] for k in first})
    combined.metadata = first.metadata
    return combined


def check_reorder_and_combine_batches(self: Any, batches: Sequence[Any]) -> None:
    """Every check `reorder_and_combine_batches` makes of this call, without moving data (shadow mode
    runs it on unsampled calls): returns None or raises the same `ref.errors.RebatchError`."""
    _, _, outs = _batches_checked(self, batches)
    check_batch_func(outs, self._microbatches, None)


def _batches_checked(self: Any, batches: Sequence[Any]) -> tuple[Any, set[Any], list[dict[str, Any]]]:
    """``(the first real batch, its None keys, each real batch as a postprocess_batch output)``, the
    batches counted and the partitions a permutation of ``range(B)``."""
    partitions = self._microbatches
    b = len(self._token_counts)
    real = _real(batches, partitions, self._num_padding_microbatches, "outputs")
    check_permutation(partitions, b)
    first = real[0]
    empty = {k for k, v in first.items() if v is None}  # SkyRL keeps the first batch's None as None
    outs = [{"model_output": {k: v for k, v in batch.items() if k not in empty}} for batch in real]
    return first, empty, outs


@entry
def reorder_and_combine_items(self: Any, batches: Sequence[Sequence[Any]]) -> list[Any]:
    """Drop-in for SkyRL 0.4.0's ``TokenBasedBatchIterator.reorder_and_combine_items``: per-sample items
    in original order, ``[items[k] for k in inverse(perm)]``, with one item per index of each partition
    (`PartitionMismatchError`; SkyRL's Megatron worker's padding rows, trailing, are left out as SkyRL
    leaves them) and the partitions a permutation of ``range(B)``; then the alignment witness: each
    per-token list of every item against its row's valid length in the iterator's batch
    (`MisalignmentError`, ``docs/witness.md``)."""
    return _items_restored(self, batches)


def check_reorder_and_combine_items(self: Any, batches: Sequence[Sequence[Any]]) -> None:
    """Every check `reorder_and_combine_items` makes of this call, the witness included: None or the
    same `ref.errors.RebatchError` (the restored list is one of references, so nothing is copied)."""
    _items_restored(self, batches)


def _items_restored(self: Any, batches: Sequence[Sequence[Any]]) -> list[Any]:
    partitions = self._microbatches
    perm = check_permutation(partitions, int(self.data.batch_size))
    padding = self._num_padding_microbatches
    if not isinstance(batches, Sequence) or not len(partitions) <= len(batches) <= len(partitions) + padding:
        got = len(batches) if isinstance(batches, Sequence) else type(batches).__name__
        raise PartitionMismatchError(
            f"{got} micro-batch item lists for {len(partitions)} micro-batches and {padding} padding ones"
        )
    # SkyRL's Megatron worker pads every micro-batch to the widest one's rows (its padding micro-batches
    # have one) and returns an item for each padding row too: no per-token values (their response and loss
    # masks are zero), after the real ones, which SkyRL's zip leaves out.
    widest = max([len(p) for p in partitions] + [1 if padding else 0])
    flat: list[Any] = []
    for m, (part, items) in enumerate(zip(partitions, batches, strict=False)):
        if len(items) != len(part) and not (
            len(items) == widest and all(_empty(x) for x in items[len(part) :])
        ):
            raise PartitionMismatchError(
                f"micro-batch {m}: {len(items)} items, but its partition has {len(part)} indices"
            )
        flat.extend(items[: len(part)])
    ordered = [flat[k] for k in invert(perm).tolist()]
    _witness_items(self.data, ordered, perm, [len(p) for p in partitions])
    return ordered


def _empty(item: Any) -> bool:
    """A Megatron padding row's item: a dict whose per-token values are all empty (``{}`` included)."""
    return isinstance(item, Mapping) and all(_sized(v) and len(v) == 0 for v in item.values())


def _sized(value: Any) -> bool:
    """A per-token value of an item: a list or tuple (SkyRL's ``.tolist()``), or a tensor or array with a
    row dimension; its length is its tokens."""
    if isinstance(value, list | tuple):
        return True
    return isinstance(value, torch.Tensor | np.ndarray) and value.ndim >= 1


def item_witness(data: Any) -> list[int] | None:
    """The alignment witness of SkyRL's per-sample items: each row's valid length as SkyRL's workers
    compute it when they build the items (``_forward_backward_micro``: ``response_mask.sum(dim=1)``, else
    ``(loss_mask > 0).sum(dim=1)``) from the iterator's batch ``data`` (its ``TrainingInputBatch``), where
    each item keeps the last that many of its row's log-probs. On the host: SkyRL keeps the batch there
    (each micro-batch goes to the device in the worker); on an accelerator, one small read. None without
    such a mask of ``[B, S]`` (counted by reason: `torch_impl._tally.SKIPS`), or with the witness switched
    off (``REBATCH_WITNESS=off``)."""
    if not witness_config()[0]:
        return None
    try:
        mask = data.get("response_mask")
        if mask is None:
            mask = data.get("loss_mask")
            mask = mask > 0 if isinstance(mask, torch.Tensor) else None
    except (AttributeError, TypeError, KeyError):  # not a mapping: unwitnessed, counted
        skipped("skipped_unreadable_witness")
        return None
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2 or mask.is_nested or mask.device.type == "meta":
        skipped("calls_without_witness")
        return None
    # SkyRL slices ``log_probs[i, -valid_len:]`` (``[]`` where not positive): the lengths it keeps
    return [int(n) for n in mask.sum(dim=1).long().clamp(0, mask.shape[1]).tolist()]


def _witness_items(data: Any, ordered: list[Any], perm: torch.Tensor, sizes: list[int]) -> None:
    """Step 6 for the items (``docs/spec.md``, "The alignment witness"), by the core's rule
    (`torch_impl._alignment.RowWitness`): every key of the first restored item, its values' lengths in
    original row order (``ordered``) against the witness, the error naming where ``perm`` took the row
    from; a value without a length (`_sized`) leaves the key unbound, and the lengths are read from lists
    (a key whose values all have one length where the rows' differ is unproven)."""
    first = ordered[0] if ordered else None
    if not isinstance(first, Mapping) or not first:
        return
    witness = item_witness(data)
    if witness is None:
        return
    judge = RowWitness(witness, perm, sizes, witness_config()[1], rows=len(ordered))
    for key in first:
        values: list[Any] = [x.get(key) if isinstance(x, Mapping) else None for x in ordered]
        if set(map(type, values)) <= {list} or all(map(_sized, values)):  # per-token values, SkyRL's lists
            judge.compare(key, list(map(len, values)), inferred=True, restored=True)


def _keys(self: Any, batches: Any) -> list[Any]:
    """The keys a misaligned call misaligns (the first batch's)."""
    first = batches[0] if isinstance(batches, Sequence) and batches else None
    return list(first.keys()) if first is not None and hasattr(first, "keys") else ["items"]


def _dumped(self: Any, batches: Any) -> dict[str, Any]:
    """A call's inputs as rebatch's dump holds them (`_files.save_dump`):
    ``self`` (the iterator's ``_microbatches``, ``_num_padding_microbatches``, ``batch_size``, a plain
    dict) and ``batches`` (each a dict of its keys and ``metadata``, or a list of items)."""
    return {
        "self": {
            "_microbatches": [list(p) for p in self._microbatches],
            "_num_padding_microbatches": self._num_padding_microbatches,
            "batch_size": len(self._token_counts),
        },
        "batches": [
            {"values": dict(b), "metadata": getattr(b, "metadata", None)} if hasattr(b, "keys") else list(b)
            for b in batches
        ],
    }


def _rows(self: Any, batches: Any) -> int:
    """The rows of a call (for ``on`` mode's counters): the partitions' indices."""
    return rows_of_partitions(self._microbatches)


class _Batch(dict[str, Any]):
    """A SkyRL batch as a dump holds it: its keys, and ``metadata``."""

    metadata: Any = None


#: The iterator's methods rebatch replaces, by name.
_METHODS = {
    "reorder_and_combine_batches": reorder_and_combine_batches,
    "reorder_and_combine_items": reorder_and_combine_items,
}


def _replay(function: str, inputs: Mapping[str, Any]) -> Callable[[], Any]:
    """A call of rebatch's drop-in on a dump's inputs (`_dumped`'s form; ``rebatch check``)."""
    method = function.rsplit(".", 1)[-1]
    if method not in _METHODS:
        raise NotReplayable(f"SkyRL's function {function} is not one rebatch replaces")
    me = inputs["self"]
    n = int(me["batch_size"])
    iterator = types.SimpleNamespace(
        _microbatches=me["_microbatches"],
        _num_padding_microbatches=int(me["_num_padding_microbatches"]),
        _token_counts=[0] * n,
        data=types.SimpleNamespace(batch_size=n),
    )
    batches: list[Any] = []
    for b in inputs["batches"]:
        if isinstance(b, dict):
            batch = _Batch(b["values"])
            batch.metadata = b.get("metadata")
            batches.append(batch)
        else:
            batches.append(list(b))
    ours = _METHODS[method]
    return lambda: ours(iterator, batches)


#: The SkyRL releases `install` supports (checked against SkyRL itself in CI: .ci/peers.sh).
VERSIONS = ("0.4.0",)
#: SkyRL's integration (`_integration.Integration`): its public functions are this object's.
INTEGRATION = Integration(
    "skyrl",
    Versions("skyrl", dict.fromkeys(VERSIONS), fallback=VERSIONS[-1]),
    lambda row: [
        Replaced(WORKER_UTILS, f"{ITERATOR}.{name}", fn, check, _dumped, _keys, _rows)
        for name, fn, check in (
            ("reorder_and_combine_batches", reorder_and_combine_batches, check_reorder_and_combine_batches),
            ("reorder_and_combine_items", reorder_and_combine_items, check_reorder_and_combine_items),
        )
    ],
    label="SkyRL",
    carry=(TRAIN_UTILS, "prepare_runtime_environment"),
    replay=_replay,
)
install, uninstall, stats = INTEGRATION.install, INTEGRATION.uninstall, INTEGRATION.stats
mode, installed, replacements = INTEGRATION.mode, INTEGRATION.installed, INTEGRATION.replacements
