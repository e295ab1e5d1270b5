"""Exact conversion between torch tensors and the reference's JAX data (the only module of `ref` that imports
torch).

``from_torch``: a jagged nested tensor ``[B, (j), *F]`` becomes a `Jagged`, a dense tensor a
``jax.Array``; ``to_torch`` goes back. Both share memory through DLPack (zero-copy where the layout
allows), keep the dtype bit for bit (bool, uint8, int8/16/32/64, float16, bfloat16, float32, float64)
and run under a scoped 64-bit context, so int64 and float64 survive whatever the caller's
``jax_enable_x64`` is, and that setting is left as it was.

Aliasing: by default both directions share memory (no copy) where DLPack allows. JAX treats arrays as
immutable, so after ``x = from_torch(t)`` an in-place change of ``t`` (``t.add_(1)``) changes ``x``,
and one of ``to_torch(x)`` changes ``x``. Pass ``copy=True`` when the tensor may change afterwards
(the result then owns its memory).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import torch

from ._jagged import Jagged

# torch's private parts, from the one room that holds them (`ref._torch_private`: imports torch only)
from ._torch_private import nested_view, ragged_idx
from ._x64 import exact
from .errors import InvalidJaggedError, where

__all__ = ["from_torch", "to_torch", "tree_from_torch", "tree_to_torch", "outputs_from_torch"]


#: ``torch.nested.nested_tensor_from_jagged`` without its ``is_fx_tracing()`` probe, which logs a warning on
#: the first call in the process (see ``torch_impl._jagged.njt``); None in a torch without it.
_nested_view = nested_view


def _to_jax(t: torch.Tensor, copy: bool = False) -> jax.Array:
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    elif copy:
        t = t.clone(memory_format=torch.contiguous_format)
    if not t.is_contiguous():
        t = t.contiguous()
    try:
        return jax.dlpack.from_dlpack(t)
    except BufferError:  # a dtype this torch's DLPack lacks (float8 before torch 2.10): through its bits
        bits = jax.dlpack.from_dlpack(t.view(_UNSIGNED[t.element_size()]))
        return jax.lax.bitcast_convert_type(bits, jnp.dtype(str(t.dtype).removeprefix("torch.")))


@exact
def from_torch(
    t: torch.Tensor, *, copy: bool = False, key: Any = None, micro_batch: int | None = None
) -> Jagged | jax.Array:
    """A jagged NJT ``[B, (j), *F]`` as `Jagged`; a dense tensor ``[B, *F]`` as ``jax.Array`` (same bits).

    Shares ``t``'s memory unless ``copy`` (see the module's note on aliasing). ``key`` and
    ``micro_batch`` only name the tensor in `InvalidJaggedError` messages.
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"from_torch takes a torch.Tensor, got {type(t).__name__}")
    if not t.is_nested:
        return _to_jax(t, copy)
    at = where(key, micro_batch)
    if t.layout != torch.jagged:
        raise InvalidJaggedError(f"{at}a nested tensor must use the jagged layout, got {t.layout}")
    nested: Any = t  # a jagged nested tensor: torch's stubs lack its methods
    if ragged_idx(nested) != 1:
        raise InvalidJaggedError(f"{at}the ragged dimension must be 1, got {ragged_idx(nested)}")
    if nested.lengths() is not None:
        rows = int(nested.offsets().shape[0]) - 1
        if rows == 0:  # torch cannot make an empty nested tensor contiguous
            values = nested.values()
            return Jagged(
                _to_jax(values[:0]),
                _to_jax(torch.zeros(1, dtype=torch.int64)),
                key=key,
                micro_batch=micro_batch,
            )
        _check_lengths(nested, at)
        nested = nested.contiguous()
    values, offsets = _to_jax(nested.values(), copy), _to_jax(nested.offsets(), copy)
    return Jagged(values, offsets, key=key, micro_batch=micro_batch)


def _check_lengths(nested: Any, at: str) -> None:
    """A nested tensor with ``lengths``: every row inside the values (`InvalidJaggedError`), before torch
    reads them (torch would raise its own error, or read past the values)."""
    lengths, offsets, n = nested.lengths().cpu(), nested.offsets().cpu(), int(nested.values().shape[0])
    integers = not (
        lengths.dtype.is_floating_point or lengths.dtype.is_complex or lengths.dtype == torch.bool
    )
    if lengths.dim() != 1 or lengths.shape[0] != offsets.shape[0] - 1 or not integers:
        raise InvalidJaggedError(
            f"{at}lengths must be 1-D integers, one per row, got {lengths.dtype}{list(lengths.shape)}"
        )
    for i, (o, n_i) in enumerate(zip(offsets[:-1].tolist(), lengths.tolist(), strict=True)):
        if n_i < 0:
            raise InvalidJaggedError(f"{at}lengths[{i}] = {n_i} is negative")
        if o < 0:
            raise InvalidJaggedError(f"{at}offsets[{i}] = {o} is negative")
        if o + n_i > n:
            raise InvalidJaggedError(
                f"{at}row {i} runs past the values: offsets[{i}] + lengths[{i}] = {o} + {n_i} > len(values) "
                f"= {n}"
            )


#: The unsigned integer dtype of each element size: a tensor's bits, for DLPack (`_to_jax`, `_to_tensor`).
_UNSIGNED = {1: torch.uint8, 2: torch.uint16, 4: torch.uint32, 8: torch.uint64}


def _to_tensor(x: jax.Array, copy: bool = False) -> torch.Tensor:
    try:
        t = torch.from_dlpack(x)
    except BufferError:  # a dtype this torch's DLPack lacks (float8 before torch 2.10): through its bits
        size = x.dtype.itemsize
        bits = torch.from_dlpack(jax.lax.bitcast_convert_type(x, jnp.dtype(f"uint{8 * size}")))
        t = bits.view(getattr(torch, x.dtype.name))
    return t.clone() if copy else t


@exact
def to_torch(x: Jagged | jax.Array, *, copy: bool = False) -> torch.Tensor:
    """A `Jagged` as a jagged NJT (int64 offsets), a ``jax.Array`` as a tensor (same bits).

    Shares ``x``'s memory unless ``copy`` (see the module's note on aliasing).
    """
    if isinstance(x, Jagged):
        offsets = _to_tensor(jnp.asarray(x.offsets, jnp.int64), copy)
        values = _to_tensor(x.values, copy)
        # the shortest and longest row cached where the host holds the offsets, as torch_impl's results
        lengths = offsets.diff() if offsets.device.type == "cpu" and offsets.numel() > 1 else None
        lo, hi = (None, None) if lengths is None else (int(lengths.min()), int(lengths.max()))
        if _nested_view is None:  # pragma: no cover
            return torch.nested.nested_tensor_from_jagged(values, offsets, min_seqlen=lo, max_seqlen=hi)
        return _nested_view(values, offsets, None, min_seqlen=lo, max_seqlen=hi)
    return _to_tensor(jnp.asarray(x), copy)


def tree_from_torch(tree: Any) -> Any:
    """``tree`` with every tensor converted by `from_torch` (dicts, lists and tuples are walked)."""
    if isinstance(tree, torch.Tensor):
        return from_torch(tree)
    if isinstance(tree, Mapping):
        return {k: tree_from_torch(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(tree_from_torch(v) for v in tree)
    return tree


def tree_to_torch(tree: Any) -> Any:
    """``tree`` with every `Jagged` and ``jax.Array`` converted by `to_torch`."""
    if isinstance(tree, (Jagged, jax.Array)):
        return to_torch(tree)
    if isinstance(tree, Mapping):
        return {k: tree_to_torch(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(tree_to_torch(v) for v in tree)
    return tree


def outputs_from_torch(output_lst: Any) -> Any:
    """A whole ``output_lst`` converted for ``ref.postprocess_batch``: each ``model_output`` tensor by
    `from_torch`, named by key and micro-batch in errors; losses and metrics are left as they are."""
    if not isinstance(output_lst, (list, tuple)):
        return output_lst
    out = []
    for m, o in enumerate(output_lst):
        if isinstance(o, Mapping) and isinstance(o.get("model_output"), Mapping):
            converted = {
                k: from_torch(v, key=k, micro_batch=m) if isinstance(v, torch.Tensor) else v
                for k, v in o["model_output"].items()
            }
            o = {**o, "model_output": converted}
        out.append(o)
    return out
