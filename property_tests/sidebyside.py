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

Each trainer's case is its kit module's ``side_by_side`` (`property_tests.trainers`). The trainer's own
function is imported from the trainer (`theirs`, the kit module's ``THEIRS``); where the trainer is not
installed, verl's has a stand-in (`property_tests.baseline`, verl 0.9.1's algorithm) and the others none.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, NamedTuple

from rebatch_startup.trainers import TRAINERS as REGISTRY, by_name

from .peers import sized_call
from .trainer_import import import_trainer_module

__all__ = ["KEYS", "MEAN_LENGTH", "SIZES", "TRAINERS", "Pair", "micro_batches", "pair", "theirs"]

SIZES = (8, 1024, 16384)
KEYS = (1, 5)
MEAN_LENGTH = 32
#: The trainers whose kit module has a side-by-side call (``side_by_side``, ``THEIRS``), in the
#: registry's order.
TRAINERS = tuple(
    trainer.name
    for trainer in REGISTRY
    if trainer.kit_module is not None and hasattr(importlib.import_module(trainer.kit_module), "side_by_side")
)


def _kit(trainer: str) -> Any:
    """Trainer ``trainer``'s kit module."""
    if trainer not in TRAINERS:
        raise ValueError(f"unknown trainer {trainer!r} (known: {TRAINERS})")
    return importlib.import_module(str(by_name(trainer).kit_module))


def micro_batches(b: int) -> int:
    """The number of micro-batches of a case: ``max(2, b // 256)``."""
    return max(2, b // 256)


class Pair(NamedTuple):
    """One case: rebatch's call and the trainer's (None: not installed), and the output's bytes."""

    ours: Callable[[], Any]
    theirs: Callable[[], Any] | None
    output_bytes: int


def theirs(trainer: str, *, stand_in: bool = False) -> tuple[Any, str]:
    """The trainer's own function (SkyRL's: its iterator class) and its label; with ``stand_in``, its kit
    module's stand-in where the trainer is not installed (verl's: its algorithm, `property_tests.baseline`).
    Raises ImportError otherwise."""
    kit = _kit(trainer)
    module, name = kit.THEIRS
    try:
        found = getattr(import_trainer_module(module), name)
    except ImportError:
        if not stand_in or not hasattr(kit, "stand_in"):
            raise
        stand: tuple[Any, str] = kit.stand_in()
        return stand
    versions = importlib.import_module(by_name(trainer).integration).INTEGRATION.versions
    return found, f"{trainer} {versions.installed() or '?'}"


def pair(trainer: str, b: int, keys: int, move: Callable[[Any], Any], fn: Any = None) -> Pair:
    """rebatch's and the trainer's calls of one case (``fn``: the trainer's own, from `theirs`)."""
    outs, partitions = sized_call(b, MEAN_LENGTH, micro_batches(b))
    parts = [o["model_output"]["log_probs"] for o in outs]
    ours, mine, nbytes = _kit(trainer).side_by_side(parts, partitions, keys, move, fn)
    return Pair(ours, mine, nbytes)
