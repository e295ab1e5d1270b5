"""AReaL 1.0.4's table for the trainer contract (`_integration.Integration`): `install()` turns rebatch on.

AReaL's engines (FSDP, Megatron, Archon) restore order with ``areal.engine.core.train_engine.
reorder_and_pad_outputs(outputs, output_seqlens, mb_list, aggregate_fn=torch.cat)``, bound at import
(``from areal.engine.core import reorder_and_pad_outputs``). `install` replaces it there and in every
loaded ``areal`` module bound to it; call it in every training process (e.g. at the top of the script
every rank runs), or set ``REBATCH``: a lazy install also wraps AReaL's ``get_env_vars`` to pass rebatch's
variables on to the RPC workers its schedulers start.

rebatch's `reorder_and_pad_outputs` gives AReaL's result on every input AReaL handles correctly, and
raises a `ref.errors.RebatchError` where AReaL silently misaligns: ``backward_indices`` that is not the
inverse of ``forward_indices``, a negative, duplicate or out-of-range index in either, seqlens that do
not match the outputs (``docs/spec.md``, "The peers' reorder steps").
"""

from __future__ import annotations

import bisect
import itertools
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ref.errors import (
    MisalignmentError,
    NotAPermutationError,
    PartitionMismatchError,
    ShapeMismatchError,
    UnsupportedSettingError,
)
from ref.structure import check_lengths

from .._alignment import RowWitness, locate, witness_config
from .._devplan import upload
from .._entry import entry
from .._layouts import scatter_padded
from .._parts import DensePart, check_parts, numpy_bridge
from .._permutation import check_permutation, invert
from .._tally import skipped
from ._integration import Installed, Integration, NotReplayable, Replaced
from ._patch import Versions

__all__ = [
    "INTEGRATION",
    "LAUNCHER",
    "TRAIN_ENGINE",
    "VERSIONS",
    "Installed",
    "check_reorder_and_pad_outputs",
    "install",
    "installed",
    "mode",
    "reorder_and_pad_outputs",
    "replacements",
    "stats",
    "uninstall",
]

#: The key the alignment witness's errors name: AReaL's one output, by its parameter's name.
OUTPUTS = "outputs"
#: The AReaL module that defines the function `install` replaces.
TRAIN_ENGINE = "areal.engine.core.train_engine"
#: The AReaL module whose ``get_env_vars`` gives each RPC worker its environment (local and Ray schedulers).
LAUNCHER = "areal.infra.utils.launcher"


def _named(name: str) -> Callable[[int, int], str]:
    return lambda m, pos: f"{name}[{pos}]"


def _boundaries(sizes: Sequence[int], row_lengths: Sequence[int], perm: Sequence[int]) -> list[int]:
    """How many rows (in ``perm`` order, lengths ``row_lengths``) micro-batches ``0..m`` hold, from their
    packed sizes ``sizes`` (`PartitionMismatchError` where a micro-batch ends inside a row or the sizes
    do not add up to the rows)."""
    ends = list(itertools.accumulate(row_lengths, initial=0))
    total = ends[-1]
    counts: list[int] = []
    done = 0
    for m, size in enumerate(sizes):
        done += size
        k = bisect.bisect_left(ends, done)  # the first row boundary at or after ``done``
        if k >= len(ends) or ends[k] != done:
            if done > total:
                raise PartitionMismatchError(
                    f"micro-batch {m}: the outputs hold {done} values up to here, but output_seqlens add up "
                    f"to {total}"
                )
            raise PartitionMismatchError(
                f"micro-batch {m}: its output ends at value {done}, inside row {perm[k - 1]} "
                f"(forward_indices[{k - 1}], values {ends[k - 1]} to {ends[k]}): a micro-batch must hold "
                "whole rows"
            )
        counts.append(max(k, counts[-1] if counts else 0))
    if done != total:
        raise PartitionMismatchError(f"the outputs hold {done} values, but output_seqlens add up to {total}")
    return counts


@entry
def reorder_and_pad_outputs(
    outputs: list[torch.Tensor],
    output_seqlens: list[int],
    mb_list: Any,
    aggregate_fn: Callable[[list[Any]], Any] = torch.cat,
) -> torch.Tensor:
    """Drop-in for AReaL 1.0.4's ``reorder_and_pad_outputs``: ``[B, max_len, *F]``, zero-padded.

    ``outputs[m]``: micro-batch ``m``'s packed output ``[n_m, *F]``; ``output_seqlens`` ``[B]``: each
    original row's length; ``mb_list.forward_indices`` (the rows in micro-batch order) and
    ``mb_list.backward_indices`` (its inverse). The result is
    ``to_padded(restore(from_packed(cat(outputs), [output_seqlens[i] for i in forward]), [forward]))``.
    Every index, length and output is checked before any data moves.
    """
    seqlens, perm, in_order, parts = _checked(outputs, output_seqlens, mb_list, aggregate_fn)
    b = len(seqlens)
    if parts is not None:
        values = parts[0].values if len(parts) == 1 else torch.cat([p.values for p in parts])
    else:
        values = _aggregated(aggregate_fn(list(outputs)), sum(seqlens))
    lengths = np.asarray(in_order, dtype=np.int64)  # the host knows them: planned there, uploaded once
    return scatter_padded(values, lengths, perm.numpy(), b, max(seqlens, default=0), 0)


def check_reorder_and_pad_outputs(
    outputs: list[torch.Tensor],
    output_seqlens: list[int],
    mb_list: Any,
    aggregate_fn: Callable[[list[Any]], Any] = torch.cat,
) -> None:
    """Every check `reorder_and_pad_outputs` makes of this call, without moving data (shadow mode runs it
    on unsampled calls): returns None or raises the same `ref.errors.RebatchError`. With another
    ``aggregate_fn`` than ``torch.cat`` its result is not checked (that would call it)."""
    _checked(outputs, output_seqlens, mb_list, aggregate_fn)


def _checked(
    outputs: list[torch.Tensor],
    output_seqlens: list[int],
    mb_list: Any,
    aggregate_fn: Callable[[list[Any]], Any],
) -> tuple[list[int], torch.Tensor, list[int], list[DensePart] | None]:
    """The checks of a call: ``(seqlens, the permutation, the lengths in its order, each micro-batch's
    part)`` (no parts for another ``aggregate_fn``)."""
    seqlens = check_lengths(output_seqlens, name="output_seqlens")
    b = len(seqlens)
    forward = getattr(mb_list, "forward_indices", None)
    backward = getattr(mb_list, "backward_indices", None)
    if forward is None or backward is None:
        raise UnsupportedSettingError("mb_list needs forward_indices and backward_indices, got None")
    perm = check_permutation([forward], b, at=_named("forward_indices"))
    back = check_permutation([backward], b, at=_named("backward_indices"))
    if not isinstance(outputs, list | tuple) or not outputs:
        raise UnsupportedSettingError(f"outputs must be a non-empty list, got {type(outputs).__name__}")
    order = perm.tolist()
    in_order = [seqlens[i] for i in order]
    parts = (
        _packed_parts(outputs) if aggregate_fn is torch.cat else None
    )  # another aggregate_fn: its own inputs
    _check_micro_batches(
        mb_list, seqlens, in_order, order, None if parts is None else [p.rows for p in parts]
    )
    counts = _boundaries([p.rows for p in parts], in_order, order) if parts is not None else [b]
    inv = invert(perm)
    wrong = (back != inv).nonzero()
    if wrong.numel():
        i = int(wrong[0, 0])
        rows = [end - start for start, end in itertools.pairwise([0, *counts])]
        m, position = locate(int(inv[i]), rows)
        raise NotAPermutationError(
            f"backward_indices[{i}] = {int(back[i])}, but row {i} is at micro-batch {m}, position {position} "
            f"(forward_indices[{int(inv[i])}]): backward_indices is not the inverse of forward_indices"
        )
    return list(seqlens), perm, in_order, parts


def _check_micro_batches(
    mb_list: Any, seqlens: Sequence[int], in_order: list[int], order: list[int], sizes: list[int] | None
) -> None:
    """The alignment witness AReaL's call holds (``docs/witness.md``): each micro-batch's own ``cu_seqlens``
    (``mb_list.mbs[m]["cu_seqlens"]``: its rows' lengths as the model saw them, in ``forward_indices``
    order) against ``output_seqlens`` in that order, and each output's size (``sizes``, packed values)
    against its micro-batch's tokens: `MisalignmentError` where ``forward_indices`` or the outputs'
    order is not the one the micro-batches were built with. One read, where they live on an accelerator
    (AReaL moves ``mb_list`` to the device). Not checked where ``mb_list`` has no ``mbs`` holding 1-D
    integer ``cu_seqlens`` for exactly the batch's rows (``output_seqlens`` alone cannot witness: the
    split is made from it; counted: `torch_impl._tally.SKIPS`), or with the witness switched off
    (``REBATCH_WITNESS=off``)."""
    if not witness_config()[0]:
        return
    mbs = getattr(mb_list, "mbs", None)
    mbs = mbs if isinstance(mbs, list | tuple) else ()
    found = [mb.get("cu_seqlens") if isinstance(mb, Mapping) else None for mb in mbs]
    cus = [c for c in found if isinstance(c, torch.Tensor) and c.dim() == 1 and c.numel() > 0]
    if not found or len(cus) != len(found) or any(c.is_floating_point() or c.is_complex() for c in cus):
        return skipped("calls_without_witness")
    if sum(int(c.numel()) - 1 for c in cus) != len(in_order) or cus[0].device.type == "meta":
        return skipped("calls_without_witness")
    rows = [int(c.numel()) - 1 for c in cus]
    witness = RowWitness(seqlens, order, rows, witness_config()[1], expected=in_order)
    lengths, on_device = _row_lengths(cus, rows, in_order)
    witness.compare(OUTPUTS, lengths, declared=True, on_device=on_device)
    if sizes is None or len(sizes) != len(cus):
        return
    # the witness held: each micro-batch's tokens are its rows' lengths, which the host knows
    bounds = itertools.pairwise(itertools.accumulate(rows, initial=0))
    tokens = [sum(in_order[a:b]) for a, b in bounds]
    for m, (n, held) in enumerate(zip(sizes, tokens, strict=True)):
        if n != held:
            raise MisalignmentError(
                f"micro-batch {m}: its output holds {n} values, but mb_list.mbs[{m}]['cu_seqlens'] gives "
                f"{held} tokens (the outputs are not in the order of the micro-batches; switch the check "
                "off: REBATCH_WITNESS=off)"
            )


def _row_lengths(cus: list[torch.Tensor], rows: Sequence[int], in_order: list[int]) -> tuple[Any, Any]:
    """Each micro-batch's row lengths from its ``cu_seqlens``, laid end to end, and the witness to compare
    them with where it is uploaded: a list where they are on the host (read as NumPy; nothing uploaded),
    else an int64 tensor on the first one's device (their offsets' differences, less those across the
    micro-batches' boundaries, whose positions the host knows) and ``in_order`` there: one upload."""
    device = cus[0].device
    if device.type == "cpu" and numpy_bridge() and all(c.device == device for c in cus):
        return np.concatenate([np.diff(c.numpy()) for c in cus]).tolist(), None
    if all(c.device == device and c.dtype == cus[0].dtype for c in cus):  # as AReaL makes them: one cat
        flat = torch.cat(cus)
    else:
        flat = torch.cat([c.to(device, torch.int64, non_blocking=c.is_cpu) for c in cus])
    starts = np.cumsum([0, *(n + 1 for n in rows[:-1])], dtype=np.int64)
    inside = np.concatenate([np.arange(n, dtype=np.int64) + a for a, n in zip(starts, rows, strict=True)])
    both = upload(np.concatenate([inside, np.asarray(in_order, dtype=np.int64)]), device)
    count = inside.shape[0]
    return flat.diff().index_select(0, both[:count]), both[count:]


def _packed_parts(outputs: Sequence[Any]) -> list[DensePart]:
    """Each micro-batch's output, a dense tensor ``[n_m, *F]``, all of one dtype, device and trailing
    shape."""
    parts = check_parts(list(outputs))
    dense = [p for p in parts if isinstance(p, DensePart)]
    if len(dense) != len(parts):
        m = next(m for m, p in enumerate(parts) if not isinstance(p, DensePart))
        raise ShapeMismatchError(
            f"micro-batch {m}: AReaL's outputs are packed [n, *F] tensors, got a nested tensor"
        )
    return dense


def _aggregated(res: Any, total: int) -> torch.Tensor:
    """What another ``aggregate_fn`` returned: one packed tensor ``[total, *F]``."""
    if not isinstance(res, torch.Tensor) or res.is_nested or res.dim() < 1:
        raise UnsupportedSettingError(
            "aggregate_fn must return one packed tensor [N, *F] for rebatch to reorder, got "
            f"{type(res).__name__}"
        )
    if int(res.shape[0]) != total:
        raise PartitionMismatchError(
            f"aggregate_fn returned {int(res.shape[0])} values, but output_seqlens add up to {total}"
        )
    return res


def _keys(outputs: Any, output_seqlens: Any, mb_list: Any, aggregate_fn: Any = None) -> list[str]:
    """What a misaligned call misaligns: AReaL's function reorders one output (its caller's key)."""
    return ["outputs"]


def _dumped(outputs: Any, output_seqlens: Any, mb_list: Any, aggregate_fn: Any = None) -> dict[str, Any]:
    """A call's inputs as rebatch's dump holds them (`_files.save_dump`):
    ``outputs``, ``output_seqlens``, ``mb_list`` (``forward_indices``, ``backward_indices`` and each
    micro-batch's ``cu_seqlens``, a plain dict) and ``aggregate_fn`` (None: ``torch.cat``; else its name)."""
    mbs = getattr(mb_list, "mbs", None) or []
    return {
        "outputs": list(outputs),
        "output_seqlens": list(output_seqlens),
        "mb_list": {
            "forward_indices": list(getattr(mb_list, "forward_indices", None) or []),
            "backward_indices": list(getattr(mb_list, "backward_indices", None) or []),
            "mbs": [{"cu_seqlens": mb.get("cu_seqlens")} if isinstance(mb, Mapping) else {} for mb in mbs],
        },
        "aggregate_fn": None
        if aggregate_fn in (None, torch.cat)
        else getattr(aggregate_fn, "__qualname__", "?"),
    }


def _replay(function: str, inputs: Mapping[str, Any]) -> Callable[[], Any]:
    """A call of rebatch's drop-in on a dump's inputs (`_dumped`'s form; ``rebatch check``)."""
    if inputs.get("aggregate_fn") is not None:
        raise NotReplayable(f"AReaL's call used aggregate_fn {inputs['aggregate_fn']}, not torch.cat")
    mb_list = types.SimpleNamespace(**inputs["mb_list"])
    outputs = list(inputs["outputs"])
    output_seqlens = list(inputs["output_seqlens"])
    return lambda: reorder_and_pad_outputs(outputs, output_seqlens, mb_list)


#: The AReaL releases `install` supports (checked against AReaL itself in CI: .ci/peers.sh).
VERSIONS = ("1.0.4",)
#: AReaL's integration (`_integration.Integration`): its public functions are this object's.
INTEGRATION = Integration(
    "areal",
    Versions("areal", dict.fromkeys(VERSIONS), fallback=VERSIONS[-1]),
    lambda row: [
        Replaced(
            TRAIN_ENGINE,
            "reorder_and_pad_outputs",
            reorder_and_pad_outputs,
            check_reorder_and_pad_outputs,
            _dumped,
            _keys,
            lambda outputs, output_seqlens, *args, **kwargs: len(output_seqlens),
        )
    ],
    label="AReaL",
    carry=(LAUNCHER, "get_env_vars"),
    replay=_replay,
)
install, uninstall, stats = INTEGRATION.install, INTEGRATION.uninstall, INTEGRATION.stats
mode, installed, replacements = INTEGRATION.mode, INTEGRATION.installed, INTEGRATION.replacements
