"""Well-formed misalignments: inputs that pass every structural check but whose restored rows do not match the
batch's alignment witness (docs/spec.md, 'The alignment witness'). Filled by issue 38."""

from __future__ import annotations

from ._core import Defect

__all__ = ["ALIGNMENT"]

ALIGNMENT: tuple[Defect, ...] = ()
