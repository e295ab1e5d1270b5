"""verl 0.9.1 in the testing kit: its own ``verl.workers.engine.utils.postprocess_batch_func(output_lst,
indices, data)`` called from the kit's cases (`PEER`); a witness travels as the batch's ``input_ids`` in
``data``, and a provenance as the batch rebatch's split recorded."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import torch
from tensordict import NonTensorData, TensorDict

import torch_impl

from .. import peers
from ..device_inputs import Builder, Move, host_batch, randn
from ..trainer_import import import_trainer_module


def _theirs() -> dict[str, Callable[..., Any]]:
    module = import_trainer_module("verl.workers.engine.utils")
    return {"postprocess_batch_func": vars(module)["postprocess_batch_func"]}


def _ours() -> dict[str, Callable[..., Any]]:
    import torch_impl

    return {"postprocess_batch_func": torch_impl.postprocess_batch_func}


def _run(
    fns: dict[str, Callable[..., Any]],
    output_lst: Any,
    indices: Any,
    dynamic: Any,
    pad_mode: Any = "no_padding",
    witness: Any = None,
    provenance: Any = None,
) -> dict[str, Any]:
    """verl's call; a ``witness`` travels as the batch's ``input_ids`` in ``data``, where verl's engines
    leave it (and where rebatch's drop-in reads it); with a ``provenance`` (``torch_impl.recorded(batch)``),
    ``data`` is that ``batch``, the one rebatch's split made the micro-batches of (where the drop-in finds
    the split's record)."""
    from ..candidates import load_candidate

    run = load_candidate(fns["postprocess_batch_func"])
    # verl nests every output and cannot nest a dense [b] one: it travels as [b, 1] and comes back as [B]
    flat_keys: set[str] = set()
    if isinstance(output_lst, list):
        staged = []
        for o in output_lst:
            mo = o.get("model_output") if isinstance(o, dict) else None
            if isinstance(mo, dict):
                wide = {k: v[:, None] if _is_dense_1d(v) else v for k, v in mo.items()}
                flat_keys |= {k for k, v in mo.items() if _is_dense_1d(v)}
                o = {**o, "model_output": wide}
            staged.append(o)
        output_lst = staged
    result: dict[str, Any] = run(
        output_lst,
        indices,
        use_dynamic_bsz=dynamic,
        pad_mode=pad_mode,
        witness=witness,
        provenance=provenance,
    )
    if flat_keys and isinstance(result.get("model_output"), dict):
        mo = dict(result["model_output"])
        for k in flat_keys & set(mo):
            if isinstance(mo[k], torch.Tensor) and mo[k].dim() == 2:
                mo[k] = mo[k][:, 0]
        result = {**result, "model_output": mo}
    return result


def _is_dense_1d(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and not x.is_nested and x.dim() == 1


def _defects() -> tuple[peers.NativeDefect, ...]:
    return ()


def _native(output_lst: Any, partitions: Any) -> tuple[str, tuple[Any, ...]]:
    from tensordict import TensorDict

    return "postprocess_batch_func", (output_lst, partitions, TensorDict({}, batch_size=[]))


#: The trainer's own function of the side-by-side (`property_tests.sidebyside`): module and name.
THEIRS = ("verl.workers.engine.utils", "postprocess_batch_func")


def stand_in() -> tuple[Any, str]:
    """verl's algorithm (`property_tests.baseline`) and its label, where verl is not installed."""
    from ..baseline import verl_postprocess_batch_func

    return verl_postprocess_batch_func, "verl 0.9.1's algorithm (property_tests.baseline, verl not installed)"


def side_by_side(
    parts: list[Any], partitions: list[list[int]], keys: int, move: Callable[[Any], Any], fn: Any
) -> tuple[Callable[[], Any], Callable[[], Any] | None, int]:
    """rebatch's call and verl's (``fn``; None: not installed) of one side-by-side case, and the output's
    bytes: ``postprocess_batch_func(output_lst, indices, data)``, jagged outputs moved with ``move``,
    ``data`` an empty TensorDict (``use_dynamic_bsz`` defaulting to True; no witness: verl's has none)."""
    from tensordict import TensorDict

    import torch_impl

    nbytes = keys * sum(int(p.values().numel()) * 4 for p in parts)
    output_lst = move([{"model_output": {f"k{k}": p for k in range(keys)}} for p in parts])
    data = TensorDict({}, batch_size=[])

    def ours() -> Any:
        return torch_impl.postprocess_batch_func(output_lst, partitions, data)

    if fn is None:
        return ours, None, nbytes
    return ours, (lambda: fn(output_lst, partitions, data)), nbytes


def _device_data(lengths: list[int], witness: bool) -> Any:
    entries: dict[str, Any] = {"use_dynamic_bsz": NonTensorData(True)}
    if witness:
        offsets = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int64, device="cpu")
        ids = torch.zeros(int(offsets[-1]), dtype=torch.int64, device="cpu")
        entries["input_ids"] = torch.nested.nested_tensor_from_jagged(ids, offsets)
    return TensorDict(entries, batch_size=[])


def _device_post(witness: bool, keys: int = 1) -> Builder:
    def build(move: Move, b: int) -> tuple[Callable[[], Any], str]:
        indices, lengths, outs = host_batch(b)
        g = torch.Generator(device="cpu").manual_seed(1)
        dense = [torch.randn(len(p), 3, generator=g, device="cpu") for p in indices]
        output_lst = move(
            [
                {"model_output": {**{f"k{k}": x for k in range(keys)}, "dense": d}, "loss": 1.0}
                for x, d in zip(outs, dense, strict=True)
            ]
        )
        data = _device_data(lengths, witness)
        return (lambda: torch_impl.postprocess_batch_func(output_lst, indices, data)), "in"

    return build


def _device_prepare(move: Move, b: int) -> tuple[Callable[[], Any], str]:
    _, lengths, _ = host_batch(b)
    offsets = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int64, device="cpu")
    ids = torch.nested.nested_tensor_from_jagged(torch.zeros(int(offsets[-1]), dtype=torch.int64), offsets)
    data = TensorDict({"input_ids": ids}, batch_size=[b])
    return (lambda: torch_impl.prepare_micro_batches(data, max_token_len=24)), "cpu"


def _device_restore(move: Move, b: int) -> tuple[Callable[[], Any], str]:
    indices, _, _ = host_batch(b)
    x = move(randn(b, 4))
    return (lambda: torch_impl.restore_dynamic_batch(x, indices)), "in"


#: verl's device calls (`property_tests.device_calls`): ``postprocess_batch_func`` (jagged and dense keys;
#: with the witness and without), ``prepare_micro_batches`` (``data`` on the host: no device work),
#: ``restore_dynamic_batch`` (a device tensor, as verl's Megatron engine restores ``layers_topk_idx``).
DEVICE_CALLS: dict[str, Builder] = {
    "verl.postprocess_batch_func": _device_post(witness=False),
    "verl.postprocess_batch_func+witness": _device_post(witness=True),
    "verl.postprocess_batch_func+witness,5 keys": _device_post(witness=True, keys=5),
    "verl.prepare_micro_batches": _device_prepare,
    "verl.restore_dynamic_batch": _device_restore,
}

#: verl 0.9.1 beside rebatch's drop-in (`property_tests.peers.Peer`).
PEER = peers.declared(
    "verl",
    _theirs,
    _ours,
    _run,
    {"min_rows": 1, "metrics": False},
    _defects,
    _native,
    "jagged nested tensors",
    provenance=True,
)
