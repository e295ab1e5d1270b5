"""Building test data: random-bit tensors of every dtype, jagged tensors from rows, and the list model.

The list model is the third, independent oracle: a jagged batch is a plain Python list of NumPy rows;
concatenation is list concatenation and restoring is list indexing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from torch_impl.testing import njt, seqlens_of

__all__ = ["DTYPES", "ListModel", "jagged", "offsets_of", "random_tensor", "rows_of"]

#: Every dtype both torch and JAX have, by torch name.
DTYPES = ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64")


def random_tensor(rng: np.random.Generator, shape: Sequence[int], dtype: str) -> torch.Tensor:
    """A tensor of random bits (so floats include infinities and NaNs with payloads), bools 0 or 1."""
    tdtype = getattr(torch, dtype)
    count = int(np.prod(shape, dtype=np.int64))
    if count == 0:
        return torch.empty(tuple(shape), dtype=tdtype)
    if dtype == "bool":
        return (
            torch.from_numpy(rng.integers(0, 2, size=count, dtype=np.uint8))
            .to(torch.bool)
            .reshape(tuple(shape))
        )
    size = torch.empty((), dtype=tdtype).element_size()
    raw = rng.integers(0, 256, size=count * size, dtype=np.uint8)
    return torch.from_numpy(raw).view(tdtype).reshape(tuple(shape)).clone()


def jagged(values: torch.Tensor, lengths: Sequence[int]) -> torch.Tensor:
    """A jagged nested tensor ``[B, (j), *F]`` over ``values`` ``[N, *F]`` with the given row lengths,
    its shortest and longest row cached, as a trainer's own tensor built from its rows caches them."""
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    if len(lengths):
        offsets[1:] = torch.cumsum(torch.tensor(list(lengths), dtype=torch.int64), 0)
    return njt(values, offsets, None, seqlens_of(list(lengths)))


def offsets_of(x: torch.Tensor) -> torch.Tensor:
    """A jagged nested tensor's offsets ``[B + 1]`` (``x.offsets()``, which torch's type stubs lack)."""
    nested: Any = x
    return nested.offsets()


def rows_of(x: torch.Tensor) -> list[torch.Tensor]:
    """The rows of a jagged or dense tensor, as a list (per-row: for tests only)."""
    if x.is_nested:
        x = x.contiguous()
        o = offsets_of(x).tolist()
        v = x.values()
        return [v[o[i] : o[i + 1]] for i in range(len(o) - 1)]
    return list(x.unbind(0))


def from_rows(rows: Sequence[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """A tensor of ``like``'s layout, dtype and trailing shape holding ``rows`` (per-row: tests only)."""
    if like.is_nested:
        feature = tuple(like.shape[2:])
        values = torch.cat(list(rows)) if rows else like.values().new_empty((0, *feature))
        return jagged(values, [r.shape[0] for r in rows])
    return torch.stack(list(rows)) if rows else like.new_empty((0, *like.shape[1:]))


class ListModel:
    """The plain-Python model: rows are NumPy arrays of raw bits in a list; everything is list work."""

    @staticmethod
    def rows(x: torch.Tensor) -> list[np.ndarray]:
        from .compare import bits

        return [bits(r).numpy().copy() for r in rows_of(x)]

    @staticmethod
    def concat(parts: Sequence[list[np.ndarray]]) -> list[np.ndarray]:
        return [row for part in parts for row in part]

    @staticmethod
    def restore(rows: list[np.ndarray], partitions: Sequence[Sequence[int]]) -> list[np.ndarray]:
        perm = [i for p in partitions for i in p]
        out: list[Any] = [None] * len(perm)
        for k, i in enumerate(perm):
            out[i] = rows[k]
        return out

    @staticmethod
    def take(rows: list[np.ndarray], idx: Sequence[int]) -> list[np.ndarray]:
        return [rows[i] for i in idx]

    @staticmethod
    def equal(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
        return len(a) == len(b) and all(
            x.shape == y.shape and np.array_equal(x, y) for x, y in zip(a, b, strict=True)
        )


def verl_data(*, witness: Sequence[int] | None = None, provenance: Any = None, **settings: Any) -> Any:
    """verl's ``data`` for a call: each setting (``use_dynamic_bsz``, ``pad_mode``) as ``NonTensorData``
    and, with a ``witness``, the batch's ``input_ids`` (zeros) whose row lengths it is: where verl's
    drop-in reads the alignment witness. With a ``provenance`` (``torch_impl.recorded(batch)``: what
    rebatch's split of ``batch`` handed out), ``batch`` itself, the settings set on it: where verl's
    drop-in finds the split's record (its ``input_ids`` are the witness's rows)."""
    from tensordict import NonTensorData, TensorDict

    entries: dict[str, Any] = {k: NonTensorData(v) for k, v in settings.items()}
    batch = getattr(provenance, "batch", lambda: None)()
    if batch is not None:
        for k, v in entries.items():
            batch[k] = v
        return batch
    if witness is not None:
        entries["input_ids"] = jagged(torch.zeros(sum(witness), dtype=torch.int64), list(witness))
    return TensorDict(entries, batch_size=[])
