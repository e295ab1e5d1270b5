"""Turn rebatch on in SkyRL 0.4.0 with one call: `install()` (and `uninstall()`).

SkyRL's token-budget micro-batching, ``skyrl.backends.skyrl_train.workers.worker_utils.TokenBasedBatchIterator``,
puts the micro-batches' outputs back in order with its methods ``reorder_and_combine_batches(batches)``
(per key, a Python loop copying row by row into a ``[B, *S]`` tensor) and ``reorder_and_combine_items(batches)``
(per-sample dicts). `install` replaces both methods on the class, so every iterator, made before or
after, uses rebatch's; `uninstall` puts SkyRL's back (the shared `torch_impl.integrations._patch.Patcher`).
SkyRL is imported only when `install` runs. Its workers are Ray actors: call `install()` in each worker
process (Ray's ``worker_process_setup_hook``, see the README).

Same result as SkyRL on every input it handles correctly (padding micro-batches left out from the end,
``None`` entries kept as ``None``, the first batch's type and ``metadata``); a `ref.errors.RebatchError`
where SkyRL silently accepts a duplicate (its rows still all covered), extra or negative index, or a
micro-batch output with more rows than its indices.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ref.errors import PartitionMismatchError

from .._entry import entry
from .._permutation import check_permutation, invert
from .._postprocess import postprocess_batch
from ._patch import Patcher, Versions

__all__ = [
    "ITERATOR",
    "VERSIONS",
    "WORKER_UTILS",
    "install",
    "installed",
    "reorder_and_combine_batches",
    "reorder_and_combine_items",
    "replacements",
    "uninstall",
]

#: The SkyRL module and class whose methods `install` replaces.
WORKER_UTILS = "skyrl.backends.skyrl_train.workers.worker_utils"
ITERATOR = "TokenBasedBatchIterator"


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
            f"{len(real)} micro-batch {what} (after {padding} padding ones) for {len(partitions)} micro-batches"
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
    b = len(self._token_counts)
    real = _real(batches, partitions, self._num_padding_microbatches, "outputs")
    check_permutation(partitions, b)
    first = real[0]
    empty = {k for k, v in first.items() if v is None}  # SkyRL keeps the first batch's None as None
    outs = [{"model_output": {k: v for k, v in batch.items() if k not in empty}} for batch in real]
    restored = postprocess_batch(outs, partitions)["model_output"]
    combined = type(first)({k: None if k in empty else restored[k] for k in first})
    combined.metadata = first.metadata
    return combined


@entry
def reorder_and_combine_items(self: Any, batches: Sequence[Sequence[Any]]) -> list[Any]:
    """Drop-in for SkyRL 0.4.0's ``TokenBasedBatchIterator.reorder_and_combine_items``: per-sample items
    in original order, ``[items[k] for k in inverse(perm)]``, with exactly one item per index of each
    partition (`PartitionMismatchError`) and the partitions a permutation of ``range(B)``."""
    partitions = self._microbatches
    perm = check_permutation(partitions, int(self.data.batch_size))
    padding = self._num_padding_microbatches
    if not isinstance(batches, Sequence) or not len(partitions) <= len(batches) <= len(partitions) + padding:
        got = len(batches) if isinstance(batches, Sequence) else type(batches).__name__
        raise PartitionMismatchError(
            f"{got} micro-batch item lists for {len(partitions)} micro-batches and {padding} padding ones"
        )
    real = list(batches[: len(partitions)])  # SkyRL pairs them with the partitions; padding ones come after
    for m, (part, items) in enumerate(zip(partitions, real, strict=True)):
        if len(items) != len(part):
            raise PartitionMismatchError(
                f"micro-batch {m}: {len(items)} items, but its partition has {len(part)} indices"
            )
    flat = [item for items in real for item in items]
    return [flat[k] for k in invert(perm).tolist()]


def replacements() -> dict[tuple[str, str], Any]:
    """``(SkyRL module, "Class.method") -> rebatch's function`` that `install` puts in SkyRL's place."""
    return {
        (WORKER_UTILS, f"{ITERATOR}.reorder_and_combine_batches"): reorder_and_combine_batches,
        (WORKER_UTILS, f"{ITERATOR}.reorder_and_combine_items"): reorder_and_combine_items,
    }


_patcher = Patcher("skyrl", replacements)
#: The SkyRL releases `install` supports (checked against SkyRL itself in CI: .ci/peers.sh).
VERSIONS = ("0.4.0",)
_versions: Versions[None] = Versions("skyrl", dict.fromkeys(VERSIONS), fallback=VERSIONS[-1])


def install(*, force: bool = False) -> list[str]:
    """Replace the iterator's two methods with rebatch's; returns the places replaced. Idempotent;
    `uninstall` undoes it.

    The installed SkyRL must be a release of `VERSIONS` (read from its metadata, SkyRL not imported):
    another raises `ref.errors.UnsupportedSettingError`, replacing nothing, unless ``force=True`` (then
    the same replacements, with a warning logged)."""
    _versions.pick(_versions.installed(), force=force)
    return _patcher.install()


def uninstall() -> None:
    """Put SkyRL's methods back. Idempotent."""
    _patcher.uninstall()


def installed() -> bool:
    """True between `install` and `uninstall`."""
    return _patcher.installed()
