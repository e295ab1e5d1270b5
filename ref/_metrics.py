"""`append_to_dict`: verl's metric folding, as a pure function."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["append_to_dict", "is_metric"]


def is_metric(value: Any) -> bool:
    """True for a verl ``Metric``-like object: it has ``init_list``, ``append`` and ``extend``."""
    return all(callable(getattr(value, name, None)) for name in ("init_list", "append", "extend"))


def _fresh_copy(acc_value: Any) -> Any:
    """A copy of one accumulated entry (a list, or a ``Metric``) that can be grown without touching it."""
    if is_metric(acc_value):
        copy = acc_value.init_list()
        copy.extend(acc_value)
        return copy
    return list(acc_value)


def append_to_dict(acc: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """``acc`` with ``new`` folded in; neither argument is changed.

    For each ``key, value`` of ``new``: a missing key starts as ``value.init_list()`` for a ``Metric``
    and ``[]`` otherwise; then a list ``value`` extends the entry and any other ``value`` is appended
    (appending a ``Metric`` to a ``Metric`` extends it). For plain values:
    ``out[k] == acc.get(k, []) + (new[k] if isinstance(new[k], list) else [new[k]])``.
    """
    out = {k: _fresh_copy(v) for k, v in acc.items()}
    for key, value in new.items():
        if key not in out:
            out[key] = value.init_list() if is_metric(value) else []
        if isinstance(value, list):
            out[key].extend(value)
        else:
            out[key].append(value)
    return out
