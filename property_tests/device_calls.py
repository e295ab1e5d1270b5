"""Every drop-in and public call of ``torch_impl``, with its inputs where each trainer keeps them.

`CALLS` maps a name to a builder: ``builder(move, b)`` makes the call's inputs for ``b`` rows (rows of
length 2 to 9, three micro-batches, rows in reverse order) on the host, moves what the trainer keeps on
its device with ``move`` (the identity, ``.to("meta")``, or `property_tests.fakecuda.fake_like`) and
returns ``(the call, the devices its tensor results must be on)``. What the trainer keeps on the host
stays there: verl's ``data`` (its ``input_ids``: the alignment witness) and its ``indices`` (lists of
ints), AReaL's ``output_seqlens`` and ``forward_indices``, SkyRL's partitions.

- verl: ``postprocess_batch_func`` (jagged and dense keys; with the witness and without),
  ``prepare_micro_batches`` (``data`` on the host: no device work), ``restore_dynamic_batch`` (a device
  tensor, as verl's Megatron engine restores ``layers_topk_idx``);
- AReaL: ``reorder_and_pad_outputs`` (each micro-batch's packed outputs on the device, their own
  ``cu_seqlens`` in ``mb_list.mbs`` on the device: the witness);
- SkyRL: ``reorder_and_combine_batches`` (each micro-batch's ``[b, S]`` tensors on the device);
- ``torch_impl``: ``postprocess_batch``, ``concat``, ``restore``, ``take``, ``split``, ``to_padded``,
  ``from_padded``, ``to_packed``, ``from_packed``.
"""

from __future__ import annotations

import itertools
import types
from collections.abc import Callable
from typing import Any

import torch
from tensordict import NonTensorData, TensorDict
from torch.utils._pytree import tree_leaves

import torch_impl
from torch_impl.integrations import areal, skyrl

from .data import jagged, offsets_of

__all__ = ["CALLS", "Move", "host_batch", "tensors_of"]

#: A tree of host tensors -> the same on the device under test.
Move = Callable[[Any], Any]
#: (move, rows) -> (the call, the device type of each tensor result: "in" for the inputs' device)
Builder = Callable[[Move, int], tuple[Callable[[], Any], str]]

_MICRO_BATCHES = 3


def host_batch(b: int, keys: int = 1) -> tuple[list[list[int]], list[int], list[torch.Tensor]]:
    """``(indices, each row's length in original order, each micro-batch's jagged float32 output)``:
    ``b`` rows of lengths 2 to 9 in three micro-batches, rows in reverse order."""
    lengths = [2 + (i * 5) % 8 for i in range(b)]
    order = list(range(b))[::-1]
    cuts = [round(b * m / _MICRO_BATCHES) for m in range(_MICRO_BATCHES + 1)]
    indices = [order[cuts[m] : cuts[m + 1]] for m in range(_MICRO_BATCHES)]
    g = torch.Generator(device="cpu").manual_seed(b)
    outs = [
        jagged(torch.randn(sum(lengths[i] for i in p), generator=g, device="cpu"), [lengths[i] for i in p])
        for p in indices
    ]
    return indices, lengths, outs


def tensors_of(result: Any) -> list[torch.Tensor]:
    """The tensors of a call's result (in dicts, lists, tuples; a nested tensor as its values and offsets)."""
    if isinstance(result, dict):
        result = dict(result)  # SkyRL's batch type: a dict subclass
    tensors = [t for t in tree_leaves(result) if isinstance(t, torch.Tensor)]
    return [u for t in tensors for u in ((t.values(), offsets_of(t)) if t.is_nested else (t,))]


def _randn(*shape: int) -> torch.Tensor:
    """Normal float32 values on the host, the same for the same shape (each call's inputs reproducible)."""
    return torch.randn(*shape, generator=torch.Generator(device="cpu").manual_seed(sum(shape)), device="cpu")


def _verl_data(lengths: list[int], witness: bool) -> Any:
    entries: dict[str, Any] = {"use_dynamic_bsz": NonTensorData(True)}
    if witness:
        offsets = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int64, device="cpu")
        ids = torch.zeros(int(offsets[-1]), dtype=torch.int64, device="cpu")
        entries["input_ids"] = torch.nested.nested_tensor_from_jagged(ids, offsets)
    return TensorDict(entries, batch_size=[])


def _verl_post(witness: bool, keys: int = 1) -> Builder:
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
        data = _verl_data(lengths, witness)
        return (lambda: torch_impl.postprocess_batch_func(output_lst, indices, data)), "in"

    return build


def _verl_prepare(move: Move, b: int) -> tuple[Callable[[], Any], str]:
    _, lengths, _ = host_batch(b)
    offsets = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int64, device="cpu")
    ids = torch.nested.nested_tensor_from_jagged(torch.zeros(int(offsets[-1]), dtype=torch.int64), offsets)
    data = TensorDict({"input_ids": ids}, batch_size=[b])
    return (lambda: torch_impl.prepare_micro_batches(data, max_token_len=24)), "cpu"


def _verl_restore(move: Move, b: int) -> tuple[Callable[[], Any], str]:
    indices, _, _ = host_batch(b)
    x = move(_randn(b, 4))
    return (lambda: torch_impl.restore_dynamic_batch(x, indices)), "in"


def _areal(move: Move, b: int) -> tuple[Callable[[], Any], str]:
    indices, lengths, outs = host_batch(b)
    forward = [i for p in indices for i in p]
    backward = [0] * b
    for k, i in enumerate(forward):
        backward[i] = k
    packed = move([x.values() for x in outs])
    mbs = move([{"cu_seqlens": offsets_of(x).to(torch.int32)} for x in outs])
    mb_list = types.SimpleNamespace(forward_indices=forward, backward_indices=backward, mbs=mbs)
    return (lambda: areal.reorder_and_pad_outputs(packed, lengths, mb_list)), "in"


class _Batch(dict):  # type: ignore[type-arg,unused-ignore]
    """What SkyRL's ``reorder_and_combine_batches`` reads of a batch: its items, its type, ``metadata``."""

    metadata: Any = None


def _skyrl(move: Move, b: int) -> tuple[Callable[[], Any], str]:
    indices, _, _ = host_batch(b)
    it = types.SimpleNamespace(
        _microbatches=indices,
        _token_counts=[1] * b,
        _num_padding_microbatches=0,
        data=types.SimpleNamespace(),
    )
    fields = move([{"log_probs": _randn(len(p), 7)} for p in indices])
    batches = [_Batch(f) for f in fields]
    return (lambda: skyrl.reorder_and_combine_batches(it, batches)), "in"


def _public(op: str) -> Builder:
    def build(move: Move, b: int) -> tuple[Callable[[], Any], str]:
        indices, lengths, outs = host_batch(b)
        parts = move(outs)
        whole = move(torch_impl.concat(outs))
        padded = move(torch_impl.to_padded(torch_impl.concat(outs)))
        packed = move(_randn(sum(lengths)))
        perm = [i for p in indices for i in p]
        calls: dict[str, Callable[[], Any]] = {
            "postprocess_batch": lambda: torch_impl.postprocess_batch(
                [{"model_output": {"x": x}} for x in parts], indices
            ),
            "concat": lambda: torch_impl.concat(parts),
            "restore": lambda: torch_impl.restore(whole, indices),
            "take": lambda: torch_impl.take(whole, perm),
            "split": lambda: torch_impl.split(whole, indices),
            "to_padded": lambda: torch_impl.to_padded(whole),
            "from_padded": lambda: torch_impl.from_padded(padded, lengths),
            "to_packed": lambda: torch_impl.to_packed(whole),
            "from_packed": lambda: torch_impl.from_packed(packed, lengths),
        }
        return calls[op], "in"

    return build


#: name -> builder (see the module's docstring)
CALLS: dict[str, Builder] = {
    "verl.postprocess_batch_func": _verl_post(witness=False),
    "verl.postprocess_batch_func+witness": _verl_post(witness=True),
    "verl.postprocess_batch_func+witness,5 keys": _verl_post(witness=True, keys=5),
    "verl.prepare_micro_batches": _verl_prepare,
    "verl.restore_dynamic_batch": _verl_restore,
    "areal.reorder_and_pad_outputs": _areal,
    "skyrl.reorder_and_combine_batches": _skyrl,
    **{
        f"torch_impl.{op}": _public(op)
        for op in (
            "postprocess_batch",
            "concat",
            "restore",
            "take",
            "split",
            "to_padded",
            "from_padded",
            "to_packed",
            "from_packed",
        )
    },
}
