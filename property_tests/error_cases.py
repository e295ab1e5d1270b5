"""Bad inputs as data (OpInfo's ``error_inputs_func``): each named case, the operation it calls, the
`RebatchError` subclass both implementations must raise, and a pattern its message must match.

The cases are `property_tests.defects.TABLE` applied to named valid calls: each defect's breaker,
with its scripted choices, on the valid call it names (the same breakers `malformed_inputs` applies to
drawn calls). Inputs are built in torch; the reference gets them through ``ref.interop`` inside the
call (so a conversion that rejects bad data counts as the reference rejecting it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from ref import errors

from .defects import TABLE, Defect, named_call

__all__ = ["ErrorCase", "error_cases"]


class ErrorCase(NamedTuple):
    name: str
    op: str
    build: Callable[[], tuple[tuple[Any, ...], dict[str, Any]]]
    error: type[errors.RebatchError]
    pattern: str


def _builder(defect: Defect) -> Callable[[], tuple[tuple[Any, ...], dict[str, Any]]]:
    def build() -> tuple[tuple[Any, ...], dict[str, Any]]:
        call = named_call(defect)
        return call.args, call.kwargs

    return build


def error_cases() -> list[ErrorCase]:
    """One named case per defect of the table, in the table's order."""
    return [ErrorCase(d.name, d.op, _builder(d), d.error, d.pattern) for d in TABLE]
