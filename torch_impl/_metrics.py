"""Metric folding as verl does it, accepting verl ``Metric`` objects by their methods (no verl import)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["append_to_dict", "fold_metrics"]


def _is_metric(value: Any) -> bool:
    return all(callable(getattr(value, name, None)) for name in ("init_list", "append", "extend"))


def _fold_into(acc: dict[str, Any], new: Mapping[str, Any]) -> None:
    for key, value in new.items():
        if key not in acc:
            acc[key] = value.init_list() if _is_metric(value) else []
        if isinstance(value, list):
            acc[key].extend(value)
        else:
            acc[key].append(value)


def fold_metrics(metrics: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """All ``metrics`` dicts folded, in order, into one fresh accumulator (linear time)."""
    acc: dict[str, Any] = {}
    for new in metrics:
        _fold_into(acc, new)
    return acc


def append_to_dict(acc: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """``acc`` with ``new`` folded in, as a new dict; neither argument is changed (same as ``ref``).

    A missing key starts as ``value.init_list()`` for a ``Metric`` and ``[]`` otherwise; a list value
    extends the entry, any other value is appended (a ``Metric`` appended to a ``Metric`` extends it).
    """
    out: dict[str, Any] = {}
    for key, value in acc.items():
        if _is_metric(value):
            out[key] = value.init_list()
            out[key].extend(value)
        else:
            out[key] = list(value)
    _fold_into(out, new)
    return out
