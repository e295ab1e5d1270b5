"""AReaL 1.0.4 in the testing kit: its own ``reorder_and_pad_outputs(outputs, output_seqlens, mb_list)``
called from the kit's cases (`PEER`), one call per key: each micro-batch's packed values, the original
rows' lengths, ``forward_indices`` (the partitions flattened) and ``backward_indices`` built as AReaL builds
them (``backward[forward] = arange``); a dense ``[b, *F]`` key as rows of length 1; the padded result cut
back into rows. Its native defects: ``backward_indices`` that disagree with ``forward_indices``."""

from __future__ import annotations

import os
import types
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from ref import errors

from .. import peers, trainer_steps
from ..data import offsets_of
from ..device_inputs import Builder, Move, host_batch
from ..trainer_import import import_trainer_module

MODULE = "areal.engine.core.train_engine"


def _theirs() -> dict[str, Callable[..., Any]]:
    module = import_trainer_module(MODULE)
    return {"reorder_and_pad_outputs": vars(module)["reorder_and_pad_outputs"]}


def _ours() -> dict[str, Callable[..., Any]]:
    from torch_impl.integrations import areal

    return {"reorder_and_pad_outputs": areal.reorder_and_pad_outputs}


def micro_batch_list(forward: Sequence[Any], cu_seqlens: Sequence[torch.Tensor] | None = None) -> Any:
    """What AReaL's splitter holds: ``forward_indices`` and ``backward_indices[forward] = arange`` (NumPy);
    with ``cu_seqlens``, ``mbs``: one dict per micro-batch holding its own (``mbs[m]["cu_seqlens"]``)."""
    backward = np.zeros(len(forward), dtype=np.int64)
    backward[np.asarray(forward, dtype=np.int64)] = np.arange(len(forward))
    mb_list = types.SimpleNamespace(forward_indices=list(forward), backward_indices=backward.tolist())
    if cu_seqlens is not None:
        mb_list.mbs = [{"cu_seqlens": c.to(torch.int32)} for c in cu_seqlens]
    return mb_list


def _run(
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
    outs = peers.model_outputs(output_lst, dynamic, pad_mode)
    if any(p is not None and not isinstance(p, list) for p in (indices or [])):
        raise peers.NotExpressible("a partition that is not a list")
    keys = list(outs[0])
    first = keys[0]
    counts = [int(peers.plain(mo[first]).shape[0]) for mo in outs]
    flat = peers.flat(indices, counts, dynamic)
    peers.check_partition_sizes(indices, counts, dynamic)
    try:
        mb_list = micro_batch_list(flat)
    except (IndexError, ValueError, TypeError, OverflowError) as err:  # AReaL's own backward_indices fails
        raise peers.NotExpressible(
            f"AReaL's splitter cannot hold these indices ({type(err).__name__})"
        ) from None
    result: dict[str, Any] = {}
    for key in keys:
        parts = [peers.plain(mo[key]) for mo in outs]
        if any(p.is_nested != parts[0].is_nested for p in parts):
            raise peers.NotExpressible("layouts that differ between micro-batches")
        lengths_in_order = [n for p in parts for n in peers.row_lengths(p)]
        seqlens = peers.original_lengths(flat, lengths_in_order)
        call_list = mb_list
        if witness is not None and parts[0].is_nested and sum(lengths_in_order) == sum(witness):
            seqlens = list(witness)
            call_list = micro_batch_list(flat, cu_seqlens=[offsets_of(p) for p in parts])
        packed = [p.values() if p.is_nested else p for p in parts]
        padded = fns["reorder_and_pad_outputs"](packed, seqlens, call_list)
        result[key] = peers.cut(padded, seqlens, parts[0])
    return peers.result(result)


def _native(output_lst: Any, partitions: Any) -> tuple[str, tuple[Any, ...]]:
    parts = [o["model_output"]["log_probs"] for o in output_lst]
    flat = [i for p in partitions for i in p]
    seqlens = peers.original_lengths(flat, [n for p in parts for n in peers.row_lengths(p)])
    return "reorder_and_pad_outputs", ([p.values() for p in parts], seqlens, micro_batch_list(flat))


def _defects() -> tuple[peers.NativeDefect, ...]:
    seqlens = [2, 1, 0, 3, 2]
    forward = [4, 0, 3, 2, 1]  # micro-batches [4, 0] and [3, 2, 1]

    def outputs() -> list[torch.Tensor]:
        return [torch.arange(4.0), torch.arange(4.0) + 10]

    def call(backward: list[int], lens: list[int] = seqlens, outs: Callable[[], Any] = outputs) -> Any:
        mb = types.SimpleNamespace(forward_indices=forward, backward_indices=backward)
        return lambda fns: fns["reorder_and_pad_outputs"](outs(), lens, mb)

    return (
        peers.NativeDefect(
            "negative_alias_in_backward",
            "backward_indices [1, -4, 3, 2, 0]: -4 aliases 1",
            call([1, -4, 3, 2, 0]),
            errors.NotAPermutationError,
        ),
        peers.NativeDefect(
            "backward_not_the_inverse",
            "a permutation, not the inverse of forward_indices",
            call([1, 4, 3, 0, 2]),
            errors.NotAPermutationError,
        ),
        peers.NativeDefect(
            "duplicate_in_backward",
            "backward_indices [1, 4, 3, 3, 0]",
            call([1, 4, 3, 3, 0]),
            errors.NotAPermutationError,
        ),
        peers.NativeDefect(
            "out_of_range_in_backward",
            "backward_indices [1, 4, 3, 2, 5] for 5 rows",
            call([1, 4, 3, 2, 5]),
            errors.NotAPermutationError,
        ),
        peers.NativeDefect(
            "outputs_ending_inside_a_row",
            "micro-batch outputs of 3 and 5 values, rows of 2+2 and 3+0+1",
            call([1, 4, 3, 2, 0], outs=lambda: [torch.arange(3.0), torch.arange(5.0)]),
            errors.PartitionMismatchError,
        ),
        peers.NativeDefect(
            "seqlens_short_of_the_outputs",
            "output_seqlens adding up to 8 for 9 values",
            call([1, 4, 3, 2, 0], outs=lambda: [torch.arange(4.0), torch.arange(5.0)]),
            errors.PartitionMismatchError,
        ),
    )


#: The trainer's own function of the side-by-side (`property_tests.sidebyside`): module and name.
THEIRS = (MODULE, "reorder_and_pad_outputs")


def side_by_side(
    parts: list[Any], partitions: list[list[int]], keys: int, move: Callable[[Any], Any], fn: Any
) -> tuple[Callable[[], Any], Callable[[], Any] | None, int]:
    """rebatch's call and AReaL's (``fn``; None: not installed) of one side-by-side case, and the output's
    bytes: ``reorder_and_pad_outputs(outputs, output_seqlens, mb_list)`` once per key, the packed values
    moved with ``move``, ``output_seqlens`` and ``mb_list``'s indices on the host."""
    from torch_impl.integrations import areal

    b = sum(len(p) for p in partitions)
    nbytes = keys * sum(int(p.values().numel()) * 4 for p in parts)
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

    return per_key(areal.reorder_and_pad_outputs), None if fn is None else per_key(fn), nbytes


def _device_call(move: Move, b: int) -> tuple[Callable[[], Any], str]:
    from torch_impl.integrations.areal import reorder_and_pad_outputs as ours

    indices, lengths, outs = host_batch(b)
    forward = [i for p in indices for i in p]
    backward = [0] * b
    for k, i in enumerate(forward):
        backward[i] = k
    packed = move([x.values() for x in outs])
    mbs = move([{"cu_seqlens": offsets_of(x).to(torch.int32)} for x in outs])
    mb_list = types.SimpleNamespace(forward_indices=forward, backward_indices=backward, mbs=mbs)
    return (lambda: ours(packed, lengths, mb_list)), "in"


#: AReaL's device call (`property_tests.device_calls`): each micro-batch's packed outputs on the device,
#: their own ``cu_seqlens`` in ``mb_list.mbs`` on the device (the witness).
DEVICE_CALLS: dict[str, Builder] = {"areal.reorder_and_pad_outputs": _device_call}


def step(model: str, swap: tuple[int, int] | None, dtype: str = "float32") -> dict[str, Any]:
    cli_args = import_trainer_module("areal.api.cli_args")
    io_struct = import_trainer_module("areal.api.io_struct")
    fsdp_engine = import_trainer_module("areal.engine.fsdp_engine")

    config = cli_args.TrainEngineConfig(
        experiment_name="rebatch",
        trial_name="engine",
        path=model,
        dtype=dtype,
        attn_impl="sdpa",
        optimizer=cli_args.OptimizerConfig(lr=1e-2),
        backend=f"fsdp:d{int(os.environ['WORLD_SIZE'])}",
        mb_spec=cli_args.MicroBatchSpec(max_tokens_per_mb=64),
    )
    engine = fsdp_engine.FSDPEngine(config)
    engine.create_process_group()
    engine.initialize(
        None,
        io_struct.FinetuneSpec(
            total_train_epochs=1, dataset_size=trainer_steps.ROWS, train_batch_size=trainer_steps.ROWS
        ),
    )
    ids, mask, lengths = trainer_steps.batch(int(os.environ["RANK"]))
    batch = {"input_ids": ids, "attention_mask": mask}
    out: dict[str, Any] = {"bound": fsdp_engine.reorder_and_pad_outputs.__module__, "lengths": lengths}
    if swap is not None:
        _swap_areal_micro_batches(engine, *swap)
        out["forward"], out["error"] = trainer_steps.attempt(lambda: engine.forward_batch(dict(batch)))
        out["mode"] = trainer_steps.mode()
        return out
    out["logp_before"] = engine.forward_batch(dict(batch))

    def loss_fn(logprobs: torch.Tensor, entropy: torch.Tensor, mb: dict[str, Any], **_: Any) -> torch.Tensor:
        return -(logprobs * 1.0).sum() + 0.01 * entropy.sum()

    def loss_weight_fn(mb: dict[str, Any]) -> torch.Tensor:
        return torch.tensor(float(mb["input_ids"].numel()))

    out["train"] = [engine.train_batch(dict(batch), loss_fn, loss_weight_fn) for _ in range(2)]
    # the metrics but the wall-clock ones, as plain floats (the result is loaded with weights_only)
    out["train"] = [
        {k: float(v) for k, v in s.items() if "time" not in k and "seconds" not in k} for s in out["train"]
    ]
    out["params"] = {k: v.detach().clone() for k, v in engine.model.state_dict().items()}
    out["params"] = {
        k: (v.full_tensor() if hasattr(v, "full_tensor") else v) for k, v in out["params"].items()
    }
    out["logp_after"] = engine.forward_batch(dict(batch))
    out["mode"] = trainer_steps.mode()
    return out


def _swap_areal_micro_batches(engine: Any, m: int, n: int) -> None:
    """The engine's loop with the outputs of micro-batches ``m`` and ``n`` swapped (their results computed,
    then handed to the engine's collector in the other order)."""
    loop = engine.forward_backward_batch

    def forward_backward_batch(
        mb_list: Any, process_output_fn: Callable[..., Any], forward_only: bool = False
    ) -> None:
        held: list[tuple[torch.Tensor, dict[str, Any]]] = []
        loop(mb_list, lambda logits, ctx: held.append((logits, ctx)), forward_only)
        held[m], held[n] = held[n], held[m]
        for logits, ctx in held:
            process_output_fn(logits, ctx)

    engine.forward_backward_batch = forward_backward_batch


#: What AReaL's own function does with each native defect (the reason rebatch exists).
OUTCOMES = {
    "negative_alias_in_backward": "silent",
    "backward_not_the_inverse": "silent",
    "duplicate_in_backward": "crashes: AssertionError",
    "out_of_range_in_backward": "crashes: IndexError",
    "outputs_ending_inside_a_row": "silent",
    "seqlens_short_of_the_outputs": "crashes: RuntimeError",
}

#: AReaL 1.0.4 beside rebatch's drop-in (`property_tests.peers.Peer`).
PEER = peers.declared(
    "areal",
    _theirs,
    _ours,
    _run,
    {"min_rows": 1, "losses": False, "metrics": False},
    _defects,
    _native,
    "packed outputs",
)
