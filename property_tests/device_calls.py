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
- ``torch_impl``: ``postprocess_batch``, ``concat``, ``restore``, ``take``, ``split`` (of a tensor, and of
  a TensorDict whose jagged fields share one offsets tensor, one an equal copy), ``to_padded``,
  ``from_padded``, ``to_packed``, ``from_packed``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDict

import torch_impl
from rebatch_startup.trainers import TRAINERS
from torch_impl.testing import tree_leaves

from .data import offsets_of
from .device_inputs import Builder, Move, host_batch, randn

__all__ = ["CALLS", "Move", "host_batch", "tensors_of"]


def tensors_of(result: Any) -> list[torch.Tensor]:
    """The tensors of a call's result (in dicts, lists, tuples; a nested tensor as its values and offsets)."""
    if isinstance(result, dict):
        result = dict(result)  # SkyRL's batch type: a dict subclass
    tensors = [t for t in tree_leaves(result) if isinstance(t, torch.Tensor)]
    return [u for t in tensors for u in ((t.values(), offsets_of(t)) if t.is_nested else (t,))]


def _public(op: str) -> Builder:
    def build(move: Move, b: int) -> tuple[Callable[[], Any], str]:
        indices, lengths, outs = host_batch(b)
        parts = move(outs)
        whole = move(torch_impl.concat(outs))
        padded = move(torch_impl.to_padded(torch_impl.concat(outs)))
        packed = move(randn(sum(lengths)))
        perm = [i for p in indices for i in p]
        fields = move(_fields(torch_impl.concat(outs)))
        calls: dict[str, Callable[[], Any]] = {
            "postprocess_batch": lambda: torch_impl.postprocess_batch(
                [{"model_output": {"x": x}} for x in parts], indices
            ),
            "concat": lambda: torch_impl.concat(parts),
            "restore": lambda: torch_impl.restore(whole, indices),
            "take": lambda: torch_impl.take(whole, perm),
            "split": lambda: torch_impl.split(whole, indices),
            "take+TensorDict": lambda: dict(
                torch_impl.take(TensorDict(fields, batch_size=[b]), perm).items()
            ),
            "split+TensorDict": lambda: [
                dict(mb.items()) for mb in torch_impl.split(TensorDict(fields, batch_size=[b]), indices)
            ],
            "to_padded": lambda: torch_impl.to_padded(whole),
            "from_padded": lambda: torch_impl.from_padded(padded, lengths),
            "to_packed": lambda: torch_impl.to_packed(whole),
            "from_packed": lambda: torch_impl.from_packed(packed, lengths),
        }
        return calls[op], "in"

    return build


def _fields(x: torch.Tensor) -> dict[str, torch.Tensor]:
    """A TensorDict's fields around the jagged ``x``: three jagged fields on its one offsets tensor (as
    verl's ``input_ids`` and the fields built on its ``cu_seqlens``), one on an equal copy of it, and a
    dense one."""
    values, offsets = x.values(), offsets_of(x)
    fields = {f"j{k}": torch.nested.nested_tensor_from_jagged(values * (k + 1), offsets) for k in range(3)}
    fields["copy"] = torch.nested.nested_tensor_from_jagged(-values, offsets.clone())
    fields["dense"] = randn(int(offsets.shape[0]) - 1)
    return fields


#: name -> builder (see the module's docstring)
CALLS: dict[str, Builder] = {
    **{
        name: builder
        for trainer in TRAINERS
        if trainer.kit_module is not None
        for name, builder in getattr(importlib.import_module(trainer.kit_module), "DEVICE_CALLS", {}).items()
    },
    **{
        f"torch_impl.{op}": _public(op)
        for op in (
            "postprocess_batch",
            "concat",
            "restore",
            "take",
            "split",
            "take+TensorDict",
            "split+TensorDict",
            "to_padded",
            "from_padded",
            "to_packed",
            "from_packed",
        )
    },
}
