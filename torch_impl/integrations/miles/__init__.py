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
outputs not one per micro-batch it handed out (`check_provenance`). Its checks are the alignment core's
(`torch_impl._alignment`): this package reads miles' call into the core's form, a module a part: the
split recorded (`_split`), the witness read (`_witness`), the restore (`_restore`), and here the
declaration and its adapters (a call's keys, rows, dump and replay).
"""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .._integration import Installed, Integration, NotReplayable, Replaced
from .._patch import Versions
from ._restore import aggregate_forward_results, check_aggregate_forward_results, check_provenance
from ._split import carrying, recorded_split, recording
from ._witness import PARALLEL, cp_size, length_witness

__all__ = [
    "ACTOR_GROUP",
    "CARRY",
    "DATA",
    "INTEGRATION",
    "LOG_UTILS",
    "PARALLEL",
    "VERSIONS",
    "Installed",
    "aggregate_forward_results",
    "carrying",
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
            "cp_size": cp_size(),
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
    carrier=carrying,
    records={(DATA, "get_data_iterator"): recording},
)
install, uninstall, stats = INTEGRATION.install, INTEGRATION.uninstall, INTEGRATION.stats
mode, installed, replacements = INTEGRATION.mode, INTEGRATION.installed, INTEGRATION.replacements
