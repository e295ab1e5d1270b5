"""The table of defects, exercised on every run: each defect, drawn several times with its choices
explored, at a few rows and at thousands of rows, is rejected alike by both implementations.

(`malformed_rejected_alike` draws one defect per example from the whole table, so under the ci
profile's 60 examples some defects may never come up; here each has its own test.)
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import ref
import torch_impl
from property_tests.convert import outputs_to_ref, provenance_for, to_ref
from property_tests.defects import TABLE, VALID, Call, Defect, Scripted, apply, named_call
from property_tests.properties import malformed_rejected_alike
from property_tests.strategies import DEFECTS, Drawing, malformed_inputs
from ref import errors

OTHER = [d for d in TABLE if d.op != "postprocess_batch"]


def _call(impl: Any, call: Call) -> Any:
    args = call.args
    if impl is ref:
        args = (outputs_to_ref(args[0]), *args[1:]) if call.op == "postprocess_batch" else to_ref(args)
    return getattr(impl, call.op)(*args, **provenance_for(impl.__name__, call.kwargs))


def _rejected_alike(defect: Defect, call: Call) -> None:
    for impl in (torch_impl, ref):
        with pytest.raises(errors.RebatchError) as info:
            _call(impl, call)
        assert type(info.value) is defect.error, f"{impl.__name__} on {defect.name}: {info.value!r}"


def test_names_are_unique_and_every_defect_has_a_named_case() -> None:
    names = [d.name for d in TABLE]
    assert len(names) == len(set(names))
    assert set(DEFECTS) == {d.name for d in TABLE if d.op == "postprocess_batch"}
    for d in TABLE:
        assert (d.base or d.op) in VALID, d.name


def test_the_named_valid_calls_are_valid() -> None:
    for name, make in VALID.items():
        call = make()
        for impl in (torch_impl, ref):
            _call(impl, call)  # raises nothing
        assert name


def test_breakers_leave_the_valid_call_unchanged() -> None:
    for d in TABLE:
        valid = VALID[d.base or d.op]()
        before = repr(valid)
        apply(d, valid, Scripted(d.script))
        assert repr(valid) == before, d.name


def test_scripted_chooser() -> None:
    choose = Scripted((2, 1))
    assert choose.choice("abc") == "c"
    assert choose.integer(5, 9) == 6
    assert choose.choice("abc") == "a"  # past the script: the first option
    assert choose.integer(3, 3) == 3


@pytest.mark.parametrize("name", list(DEFECTS))
@settings(max_examples=6, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_each_defect_is_rejected_alike(name: str, data: st.DataObject) -> None:
    case = data.draw(malformed_inputs(defects=(name,), max_rows=12))
    malformed_rejected_alike(case)


@pytest.mark.parametrize("name", list(DEFECTS))
@settings(max_examples=20, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_each_defect_breaks_the_smallest_calls_or_passes_them_by(name: str, data: st.DataObject) -> None:
    """At the fewest rows and micro-batches `malformed_inputs` allows (2 and 2: the cut between the two
    micro-batches falls at 0, 1 or 2 rows, so some calls hold every row in micro-batch 0), every defect
    either breaks the drawn call or the example is rejected (a breaker with nothing to choose from):
    drawing never fails."""
    case = data.draw(malformed_inputs(defects=(name,), max_rows=2, max_micro_batches=2))
    assert case.name == name


@pytest.mark.parametrize("name", list(DEFECTS))
@settings(max_examples=2, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_each_defect_is_rejected_alike_at_thousands_of_rows(name: str, data: st.DataObject) -> None:
    """Every validation at B in the thousands (a check that only runs on small batches fails here)."""
    case = data.draw(malformed_inputs(defects=(name,), min_rows=1000, max_rows=4000, max_micro_batches=6))
    malformed_rejected_alike(case)


@pytest.mark.parametrize("defect", OTHER, ids=[d.name for d in OTHER])
@settings(max_examples=6)
@given(data=st.data())
def test_each_defect_of_the_other_operations_is_rejected_alike(defect: Defect, data: st.DataObject) -> None:
    call = apply(defect, VALID[defect.base or defect.op](), Drawing(data.draw))
    _rejected_alike(defect, call)


def test_named_cases_match_their_patterns() -> None:
    """(tests/test_errors.py runs the same cases; this one checks the table's own entry point.)"""
    for d in TABLE:
        call = named_call(d)
        with pytest.raises(d.error) as info:
            _call(torch_impl, call)
        assert re.search(d.pattern, str(info.value)), (d.name, str(info.value))


SPLIT = [d for d in TABLE if d.base == "postprocess_split"]


@pytest.mark.parametrize("defect", SPLIT, ids=[d.name for d in SPLIT])
def test_only_the_splits_provenance_sees_a_fixed_length_misalignment(defect: Defect) -> None:
    """The provenance family: with the split's provenance both implementations raise its
    `MisalignmentError`; without it both return a result (the witness, given, is blind: every row one
    length, or a dense key only)."""
    call = named_call(defect)
    _rejected_alike(defect, call)
    blind = call._replace(kwargs={k: v for k, v in call.kwargs.items() if k != "provenance"})
    assert "witness" in blind.kwargs
    for impl in (torch_impl, ref):
        _call(impl, blind)  # raises nothing
