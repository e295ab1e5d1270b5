"""torch_impl's records of a batch's splits in ``ref``'s form (``docs/spec.md``, "Exact provenance"): the
oracle's view of the same splits, for the defects table, the state machine and the tests."""

from __future__ import annotations

from typing import Any

__all__ = ["ref_splits"]


def ref_splits(data: Any) -> tuple[Any, ...]:
    """Every live split torch recorded for ``data`` (``torch_impl.recorded(data)``), oldest first, as
    ``ref.Provenance`` values of the same names, the batch's too (padding micro-batches as
    ``ref.PADDING``)."""
    import torch_impl
    from ref import PADDING, Provenance

    kept = torch_impl.recorded(data)
    out = []
    for split in getattr(kept, "splits", ()):
        real = iter(split.rows())
        rows = tuple(PADDING if slot is PADDING else tuple(next(real)) for slot in split.slots)
        out.append(Provenance(rows, split.name, getattr(kept, "name", 0)))
    return tuple(out)
