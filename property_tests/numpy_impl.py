"""A third implementation of ``postprocess_batch``, in plain NumPy: one more oracle for the property suite.

It shares no data-movement code with ``ref`` (JAX) or ``torch_impl`` (PyTorch): jagged outputs are
`NumpyJagged` ``(values, offsets)`` pairs, data moves by NumPy fancy indexing (a byte copy, so every bit
and NaN payload is kept), and the inverse permutation, the concatenated offsets and the value indices
are computed with ``np.argsort``, ``np.cumsum`` and ``np.repeat``. It implements the meaning of
``docs/spec.md`` for valid inputs (padding micro-batches, losses and metrics included: the metrics fold
is ``ref.metrics``, pure Python); it is an oracle, not a validator: invalid inputs are not its job.

`postprocess_agrees_with_numpy` (a property in `PROPERTIES`) compares a candidate implementation,
``torch_impl`` by default, with it bit for bit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from ref.metrics import fold_metrics
from ref.structure import PADDING

__all__ = ["NumpyJagged", "postprocess_batch", "from_torch", "to_numpy_tree"]


class NumpyJagged(NamedTuple):
    """Jagged rows ``[B, (j), *F]``: row ``i`` is ``values[offsets[i]:offsets[i + 1]]``."""

    values: np.ndarray
    offsets: np.ndarray


Output = NumpyJagged | np.ndarray


def _concat(parts: Sequence[Output]) -> Output:
    if not isinstance(parts[0], NumpyJagged):
        return np.concatenate(list(parts), axis=0)
    jagged = [p for p in parts if isinstance(p, NumpyJagged)]
    lengths = np.concatenate([np.diff(p.offsets.astype(np.int64)) for p in jagged])
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return NumpyJagged(np.concatenate([p.values for p in jagged], axis=0), offsets)


def _restore(x: Output, perm: np.ndarray) -> Output:
    inv = np.argsort(perm, kind="stable")  # inv[i] = the position k with perm[k] == i
    if not isinstance(x, NumpyJagged):
        return x[inv]
    starts = x.offsets[:-1].astype(np.int64)
    lengths: np.ndarray = np.diff(x.offsets.astype(np.int64))[inv]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    # value t of output row r is value (t - offsets[r]) of source row inv[r]
    index = np.arange(int(offsets[-1]), dtype=np.int64) + np.repeat(
        starts[inv] - offsets[:-1], lengths.astype(np.int64)
    )
    return NumpyJagged(x.values[index], offsets)


def postprocess_batch(
    output_lst: Sequence[Mapping[str, Any]],
    indices: Sequence[Sequence[int]] | None,
    *,
    use_dynamic_bsz: bool = True,
    pad_mode: str = "no_padding",
) -> dict[str, Any]:
    """``ref.postprocess_batch``'s result on NumPy data (`NumpyJagged` or dense ``np.ndarray`` outputs)."""
    del pad_mode  # only decides which inputs are valid
    if indices is not None and any(p is PADDING for p in indices):
        keep = [m for m, p in enumerate(indices) if p is not PADDING]
        output_lst = [output_lst[m] for m in keep]
        indices = [indices[m] for m in keep]
    outs = [o["model_output"] for o in output_lst if "model_output" in o]
    model_output: dict[str, Any] = {}
    for key in outs[0] if outs else ():
        joined = _concat([mo[key] for mo in outs])
        if use_dynamic_bsz:
            assert indices is not None
            perm = np.asarray([int(i) for p in indices for i in p], dtype=np.int64)
            joined = _restore(joined, perm)
        model_output[key] = joined
    return {
        "model_output": model_output,
        "loss": [o["loss"] for o in output_lst if "loss" in o],
        "metrics": fold_metrics(o["metrics"] for o in output_lst if "metrics" in o),
    }


def from_torch(t: Any) -> Output:
    """A torch tensor as NumPy data of its raw bits (bfloat16 and float8 have no NumPy dtype): a jagged
    nested tensor as `NumpyJagged`, a dense tensor as an array."""
    from .compare import bits
    from .data import offsets_of

    if t.is_nested:
        t = t.contiguous()
        return NumpyJagged(bits(t.values()).numpy().copy(), offsets_of(t).numpy().astype(np.int64))
    return bits(t).numpy().copy()


def to_numpy_tree(output_lst: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``output_lst`` with each ``model_output`` tensor converted by `from_torch`."""
    out = []
    for o in output_lst:
        o = dict(o)
        if "model_output" in o:
            o["model_output"] = {k: from_torch(v) for k, v in o["model_output"].items()}
        out.append(o)
    return out
