"""The one table of defects: each a way to break a valid call, the error it must raise, and its message.

Both the named error cases (`property_tests.error_cases`) and the malformed-input strategy
(`property_tests.strategies.malformed_inputs`) are drawn from `TABLE`:

- a `Defect` names the operation it breaks (``op``), the `RebatchError` subclass both implementations
  must raise, the pattern its message matches on the named valid call, what it needs of a valid call,
  and a ``breaker(call, choose) -> call`` that applies it to a copy of a valid call, asking ``choose``
  (a `Chooser`) for every choice it makes;
- ``error_cases()`` applies each breaker to a named valid call (`VALID`, by the defect's ``base``) with
  a `Scripted` chooser (the defect's ``script`` of option numbers), so each named case is deterministic
  and its message is known;
- ``malformed_inputs()`` applies the breakers of ``postprocess_batch`` to drawn valid calls, with a
  chooser that draws (so Hypothesis explores, and shrinks, every choice).

Inputs are built in torch (the reference gets them through ``ref.interop``). No Hypothesis here.

One module per family of defect, each a tuple, joined here in that order: `_core` (the calls, choosers,
`Defect`, `VALID`, `apply`, the shared helpers), `_settings`, `_structure`, `_permutation`, `_parts` (per
key and micro-batch, the jagged invariants, metrics), `_operations` (the other operations), `_layouts`
(packed and padded), `_alignment` (well-formed misalignments the alignment witness sees), `_provenance`
(misalignments of a fixed-length batch only the split's provenance sees: such a defect's call carries a
`SplitProvenance`, which `property_tests.convert.provenance_for` gives each implementation in its form).
"""

from __future__ import annotations

from ._alignment import ALIGNMENT
from ._core import (
    VALID,
    Breaker,
    Call,
    Chooser,
    Defect,
    Scripted,
    SplitProvenance,
    apply,
    postprocess_call,
    split_call,
    strided_nested,
)
from ._layouts import LAYOUTS
from ._operations import OPERATIONS
from ._parts import PARTS
from ._permutation import PERMUTATION, LyingPartition
from ._provenance import PROVENANCE
from ._settings import SETTINGS
from ._structure import STRUCTURE

__all__ = [
    "Breaker",
    "Call",
    "Chooser",
    "Defect",
    "LyingPartition",
    "Scripted",
    "SplitProvenance",
    "TABLE",
    "VALID",
    "apply",
    "named_call",
    "postprocess_call",
    "postprocess_defects",
    "split_call",
    "strided_nested",
]

#: The table: every defect both implementations must reject, in the order of ``docs/spec.md``'s checks.
TABLE: tuple[Defect, ...] = (
    SETTINGS + STRUCTURE + PERMUTATION + PARTS + OPERATIONS + LAYOUTS + ALIGNMENT + PROVENANCE
)


def postprocess_defects() -> dict[str, Defect]:
    """The defects of ``postprocess_batch`` (those `malformed_inputs` draws), by name."""
    return {d.name: d for d in TABLE if d.op == "postprocess_batch"}


def named_call(defect: Defect) -> Call:
    """``defect`` applied to its named valid call with its script: the input of its named error case."""
    return apply(defect, VALID[defect.base or defect.op](), Scripted(defect.script))
