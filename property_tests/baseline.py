"""verl's algorithm, row by row, written here as the baseline to compare against (semantics of verl 0.9's
``postprocess_batch_func`` and ``restore_dynamic_batch``; not verl's code).

It unbinds every micro-batch's nested tensor into rows, rebuilds one nested tensor, then builds the
inverse permutation with a Python loop and rebuilds again in that order. It checks only that the row
count matches: on a duplicate or negative index it silently returns misaligned data. Used by the
tests (as the ground truth on valid input), the benchmarks and ``rebatch check``.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import torch

__all__ = ["verl_postprocess_batch_func", "verl_restore_dynamic_batch", "verl_append_to_dict"]


def _setting(data: Any, key: str, default: Any) -> Any:
    if data is None:
        return default
    value = data.get(key, default)
    return getattr(value, "data", value) if type(value).__name__ == "NonTensorData" else value


def verl_append_to_dict(acc: dict[str, Any], new: Mapping[str, Any]) -> None:
    """In-place fold: a list extends, anything else is appended; a Metric key starts from ``init_list()``."""
    for key, value in new.items():
        if key not in acc:
            acc[key] = value.init_list() if hasattr(value, "init_list") else []
        if isinstance(value, list):
            acc[key].extend(value)
        else:
            acc[key].append(value)


def verl_restore_dynamic_batch(data: torch.Tensor, batch_idx_list: Sequence[Sequence[int]]) -> torch.Tensor:
    flat = list(itertools.chain.from_iterable(batch_idx_list))
    if len(flat) != data.shape[0]:
        raise AssertionError(f"{len(flat)} vs. {data.shape[0]}")
    reverse = list(flat)  # a copy, then overwritten where perm points: duplicates leave stale entries
    for i, idx in enumerate(flat):
        reverse[idx] = i
    reverse_t = torch.tensor(reverse, dtype=torch.long)
    if data.is_nested:
        rows = data.unbind()
        return torch.nested.as_nested_tensor([rows[i] for i in reverse_t], layout=torch.jagged)
    return data[reverse_t]


def verl_postprocess_batch_func(
    output_lst: Sequence[Mapping[str, Any]], indices: Any, data: Any
) -> dict[str, Any]:
    use_dynamic_bsz = _setting(data, "use_dynamic_bsz", True)
    pad_mode = _setting(data, "pad_mode", "no_padding")
    if pad_mode != "no_padding":
        raise AssertionError("postprocess_batch_func only support NO_PADDING pad_mode")
    model_output: dict[str, Any] = {}
    for o in output_lst:
        for key, value in o.get("model_output", {}).items():
            model_output.setdefault(key, []).append(value)
    for key, values in model_output.items():
        rows = [row for nt in values for row in nt.unbind()]
        joined = torch.nested.as_nested_tensor(rows, layout=torch.jagged)
        model_output[key] = verl_restore_dynamic_batch(joined, indices) if use_dynamic_bsz else joined
    losses = [o["loss"] for o in output_lst if "loss" in o]
    metrics: dict[str, Any] = {}
    for o in output_lst:
        if "metrics" in o:
            verl_append_to_dict(metrics, o["metrics"])
    return {"model_output": model_output, "loss": losses, "metrics": metrics}
