"""The error table: every bad input raises the same `RebatchError` subclass from both implementations,
never a result, with a message naming the place and the value."""

from __future__ import annotations

import re

import pytest

import ref
import torch_impl
from property_tests.convert import outputs_to_ref, provenance_for, to_ref
from property_tests.data import verl_data
from property_tests.error_cases import ErrorCase, error_cases
from ref import errors

CASES = error_cases()


def _call_torch(case: ErrorCase):
    args, kwargs = case.build()
    return getattr(torch_impl, case.op)(*args, **provenance_for("torch_impl", kwargs))


def _call_ref(case: ErrorCase):
    args, kwargs = case.build()
    args = (outputs_to_ref(args[0]), *args[1:]) if case.op == "postprocess_batch" else to_ref(args)
    return getattr(ref, case.op)(*args, **provenance_for("ref", kwargs))


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
@pytest.mark.parametrize("call", [_call_torch, _call_ref], ids=["torch_impl", "ref"])
def test_error_case(call, case: ErrorCase) -> None:
    with pytest.raises(errors.RebatchError) as info:
        call(case)
    assert type(info.value) is case.error, f"{type(info.value).__name__}: {info.value}"
    assert isinstance(info.value, ValueError)
    assert re.search(case.pattern, str(info.value)), str(info.value)


PP_CASES = [c for c in CASES if c.op == "postprocess_batch"]


@pytest.mark.parametrize("case", PP_CASES, ids=[c.name for c in PP_CASES])
def test_torch_impl_drop_in_raises_what_postprocess_batch_raises(case: ErrorCase) -> None:
    """verl's call, ``postprocess_batch_func(output_lst, indices, data)`` with the settings in a
    TensorDict, refuses every bad input of ``postprocess_batch`` with the same class and message."""
    args, kwargs = case.build()
    # the settings as NonTensorData, the witness as the batch's input_ids (with a provenance: the split's
    # batch)
    data = verl_data(**provenance_for("torch_impl", kwargs))
    with pytest.raises(errors.RebatchError) as info:
        torch_impl.postprocess_batch_func(*args, data)
    assert type(info.value) is case.error, f"{type(info.value).__name__}: {info.value}"
    assert re.search(case.pattern, str(info.value)), str(info.value)


def test_every_error_class_has_a_case() -> None:
    concrete = {
        c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.RebatchError)
    }
    abstract = {errors.RebatchError, errors.OutputMismatchError}
    many_ranks = {errors.RankFailedError}  # raised across processes: tests/test_distributed.py
    assert concrete - abstract - many_ranks <= {c.error for c in CASES}


def test_duplicate_index_never_gives_a_result() -> None:
    """The bug verl has: a duplicate index leaves a stale entry, and misaligned rows come back."""
    from property_tests.baseline import verl_postprocess_batch_func

    case = next(c for c in CASES if c.name == "duplicate_index")
    (outs, indices), _ = case.build()
    outs = [{"model_output": {"lp": o["model_output"]["lp"]}} for o in outs]  # verl's jagged outputs only
    verl_postprocess_batch_func(outs, indices, None)  # verl returns silently...
    with pytest.raises(errors.NotAPermutationError):  # ...rebatch refuses
        torch_impl.postprocess_batch(outs, indices)


def test_errors_name_the_key_and_micro_batch() -> None:
    for case in CASES:
        if case.op == "postprocess_batch" and "key '" in case.pattern:
            assert re.search(r"key '\w+', micro-batch \d", case.pattern), case.name
