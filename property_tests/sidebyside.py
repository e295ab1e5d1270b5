"""rebatch's drop-in and a trainer's own function on the same inputs, each in the trainer's own form, for
the side-by-side traces (``rebatch.bench.gpu_model``) and timings (``rebatch.bench.cuda_check``).

`pair(trainer, b, keys, move)` builds one case: ``b`` rows of float32 log-probs (`peers.sized_call`,
mean length `MEAN_LENGTH`, `micro_batches(b)` micro-batches), the key repeated ``keys`` times under
distinct names; what the trainer keeps on its device is moved with ``move``, the rest stays on the host:

- verl: ``postprocess_batch_func(output_lst, indices, data)``, jagged outputs, ``data`` an empty
  TensorDict (``use_dynamic_bsz`` defaulting to True; no witness: verl's has none);
- AReaL: ``reorder_and_pad_outputs(outputs, output_seqlens, mb_list)`` once per key, the packed values
  on the device, ``output_seqlens`` and ``mb_list``'s indices on the host;
- SkyRL: ``TokenBasedBatchIterator.reorder_and_combine_batches(batches)``, each micro-batch a batch of
  ``[b, W]`` right-padded tensors on the device.

The trainer's own function is imported from the trainer (`theirs`); where the trainer is not installed,
verl's has a stand-in (`property_tests.baseline`, verl 0.9.1's algorithm) and the others none.
"""

from __future__ import annotations

import importlib
import types
from collections.abc import Callable
from typing import Any, NamedTuple

from tensordict import TensorDict

import torch_impl

from .peers import sized_call, torch_padded

__all__ = ["KEYS", "MEAN_LENGTH", "SIZES", "TRAINERS", "Batch", "Pair", "micro_batches", "pair", "theirs"]

SIZES = (8, 1024, 16384)
KEYS = (1, 5)
MEAN_LENGTH = 32
TRAINERS = ("verl", "areal", "skyrl")

_THEIRS = {
    "verl": ("verl.workers.engine.utils", "postprocess_batch_func"),
    "areal": ("areal.engine.core.train_engine", "reorder_and_pad_outputs"),
    "skyrl": ("skyrl.backends.skyrl_train.workers.worker_utils", "TokenBasedBatchIterator"),
}


def micro_batches(b: int) -> int:
    """The number of micro-batches of a case: ``max(2, b // 256)``."""
    return max(2, b // 256)


class Batch(dict):  # type: ignore[type-arg,unused-ignore]
    """What ``reorder_and_combine_batches`` reads of SkyRL's batch: its items, its type, ``metadata``."""

    metadata: Any = None


class Pair(NamedTuple):
    """One case: rebatch's call and the trainer's (None: not installed), and the output's bytes."""

    ours: Callable[[], Any]
    theirs: Callable[[], Any] | None
    output_bytes: int


def theirs(trainer: str, *, stand_in: bool = False) -> tuple[Any, str]:
    """The trainer's own function (SkyRL's: its iterator class) and its label; with ``stand_in``, verl's
    algorithm (`property_tests.baseline`) where verl is not installed. Raises ImportError otherwise."""
    module, name = _THEIRS[trainer]
    try:
        found = getattr(importlib.import_module(module), name)
    except ImportError:
        if not (stand_in and trainer == "verl"):
            raise
        from .baseline import verl_postprocess_batch_func

        return (
            verl_postprocess_batch_func,
            "verl 0.9.1's algorithm (property_tests.baseline, verl not installed)",
        )
    version = importlib.import_module(trainer).__dict__.get("__version__", "?")
    return found, f"{trainer} {version}"


def pair(trainer: str, b: int, keys: int, move: Callable[[Any], Any], fn: Any = None) -> Pair:
    """rebatch's and the trainer's calls of one case (``fn``: the trainer's own, from `theirs`)."""
    outs, partitions = sized_call(b, MEAN_LENGTH, micro_batches(b))
    parts = [o["model_output"]["log_probs"] for o in outs]
    nbytes = keys * sum(int(p.values().numel()) * 4 for p in parts)
    if trainer == "verl":
        output_lst = move([{"model_output": {f"k{k}": p for k in range(keys)}} for p in parts])
        data = TensorDict({}, batch_size=[])
        ours: Callable[[], Any] = lambda: torch_impl.postprocess_batch_func(output_lst, partitions, data)  # noqa: E731
        return Pair(ours, None if fn is None else (lambda: fn(output_lst, partitions, data)), nbytes)
    if trainer == "areal":
        from torch_impl.integrations import areal

        forward = [i for p in partitions for i in p]
        backward = [0] * b
        for k, i in enumerate(forward):
            backward[i] = k
        lengths = [0] * b
        for p, x in zip(partitions, parts, strict=True):
            for i, n in zip(p, x.offsets().diff().tolist(), strict=True):
                lengths[i] = n
        mb_list = types.SimpleNamespace(forward_indices=forward, backward_indices=backward)
        packed = move([[p.values() for p in parts] for _ in range(keys)])

        def per_key(f: Any) -> Callable[[], Any]:
            return lambda: [f(key, lengths, mb_list) for key in packed]

        return Pair(per_key(areal.reorder_and_pad_outputs), None if fn is None else per_key(fn), nbytes)
    if trainer == "skyrl":
        from torch_impl.integrations import skyrl

        width = max(n for p in parts for n in p.offsets().diff().tolist())
        fields = move([{f"k{k}": torch_padded(p, width) for k in range(keys)} for p in parts])
        it = types.SimpleNamespace(
            _microbatches=partitions, _token_counts=[1] * b, _num_padding_microbatches=0, data=None
        )
        batches = [Batch(f) for f in fields]
        nbytes = keys * b * width * 4
        if fn is None:
            return Pair(lambda: skyrl.reorder_and_combine_batches(it, batches), None, nbytes)
        from .peers import skyrl_iterator, tensor_batch

        native_it = skyrl_iterator(partitions, b)
        native = [tensor_batch(dict(f), {}) for f in fields]
        return Pair(
            lambda: skyrl.reorder_and_combine_batches(native_it, native),
            lambda: fn.reorder_and_combine_batches(native_it, native),
            nbytes,
        )
    raise ValueError(f"unknown trainer {trainer!r} (known: {TRAINERS})")
