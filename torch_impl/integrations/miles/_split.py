"""miles' split as rebatch sees it: each iterator ``get_data_iterator`` makes, recorded in the core.

The split is miles' own, unchanged; `recording` wraps it so that each iterator's indices, the rollout's
micro-batch count and the rows the iterator holds are kept in the alignment core's one registry
(`torch_impl._alignment.record_handout`), which the restore's judge reads. `carrying` passes rebatch's
variables on to the training actors.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ref.errors import UnsupportedSettingError

from ..._alignment import Record, Split, record_handout, recorded

__all__ = ["carrying", "index_lists", "recorded_split", "recording", "rows_held"]


def index_lists(indices: Any) -> list[list[Any]]:
    """The iterator's ``micro_batch_indices`` as lists (each entry checked by the restore's permutation
    check); `UnsupportedSettingError` for anything but a list of index lists."""
    if type(indices) is list and all(type(p) is list for p in indices):  # miles' own, without the ABC
        return [list(p) for p in indices]
    if not isinstance(indices, Sequence) or not all(isinstance(p, Sequence) for p in indices):
        raise UnsupportedSettingError(
            f"data_iterator.micro_batch_indices must be a list of index lists, got {type(indices).__name__}"
        )
    return [list(p) for p in indices]


def rows_held(data_iterator: Any, default: int) -> int:
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


def _record(result: Any) -> None:
    """Record the split ``get_data_iterator`` returned (``(iterators, num_microbatches)``): each
    iterator's indices, the rollout's micro-batch count and the rows it holds. Anything else,
    unrecorded. Never raises."""
    try:
        iterators, counts = result
        total = sum(int(n) for n in counts)
        for it in iterators:
            indices = it.micro_batch_indices
            rows = None if indices is None else index_lists(indices)  # None: fixed-size micro-batches
            record_handout(it, rows, total, rows_held(it, sum(map(len, rows or ()))))
    except (TypeError, AttributeError, ValueError):  # not miles' shape: unproven
        return


def recorded_split(data_iterator: Any) -> Split | None:
    """The split recorded for ``data_iterator`` (made by ``get_data_iterator`` while installed), or None."""
    kept = recorded(data_iterator)
    return kept.splits[-1] if isinstance(kept, Record) else None


def recording(get_data_iterator: Callable[..., Any]) -> Callable[..., Any]:
    """miles' own ``get_data_iterator``, its result recorded (`_record`): the split is miles', unchanged."""

    @functools.wraps(get_data_iterator)
    def recording(*args: Any, **kwargs: Any) -> Any:
        result = get_data_iterator(*args, **kwargs)
        _record(result)
        return result

    return recording


def carrying(allocate: Callable[..., Any]) -> Callable[..., Any]:
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
