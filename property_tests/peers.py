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
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from rebatch_startup.trainers import TRAINERS, by_name
from ref import errors
from torch_impl.testing import raw_lengths

from .compare import first_difference
from .data import from_rows, jagged, offsets_of, random_tensor, rows_of

__all__ = [
    "PEERS",
    "declared",
    "check_partition_sizes",
    "cut",
    "flat",
    "model_outputs",
    "original_lengths",
    "plain",
    "result",
    "row_lengths",
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
    #: what `native`'s call hands both functions, in a phrase (docs/peers.md's speed table names it)
    timed: str = ""
    # : whether the trainer's call can carry an alignment witness (the batch's row lengths, `run`'s
    # ``witness``)
    witnessed: bool = True
    #: whether the trainer's call can carry rebatch's split's provenance (`run`'s ``provenance``, as
    #: ``torch_impl.recorded(batch)``): verl's, whose ``data`` is the batch the split recorded; AReaL's and
    #: SkyRL's cannot (``docs/witness.md``, "Where provenance cannot reach")
    provenance: bool = False


def declared(
    name: str,
    theirs: Callable[[], dict[str, Callable[..., Any]]],
    ours: Callable[[], dict[str, Callable[..., Any]]],
    run: Callable[..., dict[str, Any]],
    bounds: dict[str, Any],
    native_defects: Callable[[], tuple[NativeDefect, ...]],
    native: Callable[[Any, Any], tuple[str, tuple[Any, ...]]],
    timed: str,
    **options: bool,
) -> Peer:
    """Trainer ``name``'s `Peer`, its name, label and package those of its declaration
    (`rebatch_startup.trainers`: the label its ``release``)."""
    trainer = by_name(name)
    return Peer(
        trainer.name,
        trainer.release,
        trainer.package,
        theirs,
        ours,
        run,
        bounds,
        native_defects,
        native,
        timed,
        **options,
    )


# -- shared helpers ----------------------------------------------------------------------------------


def model_outputs(output_lst: Any, dynamic: Any, pad_mode: Any) -> list[dict[str, torch.Tensor]]:
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


def flat(indices: Any, counts: Sequence[int], dynamic: bool) -> list[Any]:
    """The partitions flattened (the identity without dynamic batching)."""
    if not dynamic:
        return list(range(sum(counts)))
    if not isinstance(indices, list) or not all(isinstance(p, list) for p in indices):
        raise NotExpressible("indices that are not lists of lists")
    return [i for p in indices for i in p]


def plain(x: Any) -> torch.Tensor:
    """``x`` if a trainer's packed or padded form can hold it: a tensor with data (not ``meta``) and, if
    nested, a jagged one without holes whose offsets are valid (`NotExpressible` otherwise)."""
    if not isinstance(x, torch.Tensor) or x.dim() == 0:
        raise NotExpressible("an output that is not a batched tensor")
    if x.device.type == "meta":
        raise NotExpressible("a tensor without data")
    if x.is_nested:
        if x.layout != torch.jagged or raw_lengths(x) is not None:
            raise NotExpressible("a nested tensor that is not a packed jagged one")
        o = offsets_of(x)
        if int(o[0]) != 0 or bool((o.diff() < 0).any()) or int(o[-1]) != int(x.values().shape[0]):
            raise NotExpressible("offsets that describe no packed rows")
    return x


def row_lengths(x: torch.Tensor) -> list[int]:
    if x.is_nested:
        return [int(n) for n in offsets_of(x).diff().tolist()]
    return [1] * int(x.shape[0])


def check_partition_sizes(indices: Any, counts: Sequence[int], dynamic: bool) -> None:
    """A trainer that holds only the flattened order (AReaL) cannot hold partitions that disagree with
    the micro-batches' row counts: such a call has no form there."""
    if dynamic and (
        len(indices) != len(counts) or any(len(p) != c for p, c in zip(indices, counts, strict=True))
    ):
        raise NotExpressible("partitions that differ from the micro-batches' rows (only their order is held)")


def original_lengths(flat: Sequence[Any], lengths_in_order: Sequence[int]) -> list[int]:
    """Each original row's length, placed as a trainer's splitter knows them (``L[perm[k]]``)."""
    if len(flat) != len(lengths_in_order):
        raise NotExpressible("as many indices as rows are needed to place the row lengths")
    out = [0] * len(flat)
    for k, i in enumerate(flat):
        if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < len(flat):
            raise NotExpressible(f"index {i!r} cannot place a row length")
        out[i] = lengths_in_order[k]
    return out


def cut(padded: Any, lengths: Sequence[int], like: torch.Tensor) -> torch.Tensor:
    """Rows ``padded[i, :lengths[i]]`` (per row, independently of rebatch) in ``like``'s layout."""
    if not isinstance(padded, torch.Tensor):
        return padded
    rows = [padded[i, : lengths[i]] for i in range(len(lengths))]
    if like.is_nested:
        return from_rows(rows, like)
    return torch.stack([r[0] for r in rows]) if rows else like.new_empty((0, *like.shape[1:]))


def result(model_output: dict[str, Any]) -> dict[str, Any]:
    return {"model_output": model_output, "loss": [], "metrics": {}}


class _Peers(Mapping[str, Peer]):
    """Each declared trainer's `Peer` by name (`rebatch_startup.trainers`: those with a kit module), in the
    registry's order: its kit module's ``PEER``, imported when first asked for (it imports no trainer)."""

    def __getitem__(self, name: str) -> Peer:
        trainer = by_name(name)
        if trainer.kit_module is None:
            raise KeyError(f"trainer {name!r} has no kit module")
        peer: Peer = importlib.import_module(trainer.kit_module).PEER
        return peer

    def __iter__(self) -> Iterator[str]:
        return (trainer.name for trainer in TRAINERS if trainer.kit_module is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)


#: The trainers' peers, by name.
PEERS: Mapping[str, Peer] = _Peers()


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
