"""Metric folding as verl does it (pure Python: no JAX, no torch; shared by `ref` and `torch_impl`).

A verl ``Metric`` is recognised by its methods (``init_list``, ``append``, ``extend``): no verl import.
The rule, for each ``key, value`` folded into an accumulator: a missing key starts as
``value.init_list()`` for a ``Metric`` and ``[]`` otherwise; then a ``list`` value extends the entry
and any other value (a tuple, a tensor, a number, a ``Metric``) is appended to it (appending a
``Metric`` to a ``Metric`` extends it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["append_to_dict", "fold_metrics", "is_metric", "merge_metrics"]


def is_metric(value: Any) -> bool:
    """True for a verl ``Metric``-like object: it has ``init_list``, ``append`` and ``extend``."""
    return all(callable(getattr(value, name, None)) for name in ("init_list", "append", "extend"))


def _fresh_copy(entry: Any) -> Any:
    """A copy of one accumulated entry (a list, or a ``Metric``) that can be grown without touching it."""
    if is_metric(entry):
        copy = entry.init_list()
        copy.extend(entry)
        return copy
    return list(entry)


def append_to_dict(data: dict[str, Any], new_data: Mapping[str, Any], prefix: str = "") -> None:
    """verl's ``append_to_dict``: ``new_data`` folded into ``data`` in place (the rule above); returns None.

    Each key is written as ``prefix + key`` unless it already starts with ``prefix``. For plain values:
    ``data[k'] = data.get(k', []) + (v if isinstance(v, list) else [v])`` for each ``k, v`` of ``new_data``.
    """
    for key, value in new_data.items():
        name = key if key.startswith(prefix) else f"{prefix}{key}"
        if name not in data:
            data[name] = value.init_list() if is_metric(value) else []
        if isinstance(value, list):
            data[name].extend(value)
        else:
            data[name].append(value)


def merge_metrics(acc: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """``acc`` with ``new`` folded in, as a new dict; neither argument is changed.

    For plain values: ``out[k] == list(acc.get(k, [])) + (new[k] if isinstance(new[k], list) else [new[k]])``.
    """
    out = {k: _fresh_copy(v) for k, v in acc.items()}
    append_to_dict(out, new)
    return out


def fold_metrics(metrics: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """All ``metrics`` dicts folded, in order, into one fresh accumulator (linear time).

    ``fold_metrics(ms) == functools.reduce(merge_metrics, ms, {})``.
    """
    acc: dict[str, Any] = {}
    for new in metrics:
        append_to_dict(acc, new)
    return acc
