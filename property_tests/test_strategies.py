"""The strategies validate their arguments, draw NamedTuples, and respect their bounds."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis.errors import InvalidArgument

from property_tests.strategies import (
    DEFECTS,
    JaggedBatch,
    MicrobatchOutputs,
    Partitions,
    jagged_batches,
    malformed_inputs,
    microbatch_outputs,
    partitions,
)


@pytest.mark.parametrize(
    "strategy",
    [
        lambda: jagged_batches(min_rows=3, max_rows=2),
        lambda: jagged_batches(min_length=-1),
        lambda: jagged_batches(dtypes=("complex64",)),
        lambda: jagged_batches(feature_shape=(-1,)),
        lambda: partitions(num_rows=-1),
        lambda: partitions(num_rows=2, min_micro_batches=3, allow_empty=False),
        lambda: microbatch_outputs(min_keys=2, max_keys=1),
        lambda: malformed_inputs(min_rows=1),
        lambda: malformed_inputs(defects=("no_such_defect",)),
        lambda: malformed_inputs(defects=()),
        lambda: malformed_inputs(defects="duplicate_index"),
        lambda: malformed_inputs(min_micro_batches=1),
    ],
)
def test_bad_arguments_are_rejected(strategy) -> None:
    with pytest.raises(InvalidArgument):
        _draw_one(strategy())


def _draw_one(strategy):
    """One example drawn under @given (``.example()`` is for interactive use only)."""
    drawn = []

    @settings(max_examples=1, database=None, derandomize=True)
    @given(strategy)
    def inner(x) -> None:
        drawn.append(x)

    inner()
    return drawn[0]


@given(jagged_batches(min_rows=2, max_rows=5, max_length=3, min_feature_dims=1, max_feature_dims=1))
def test_jagged_batches_respect_bounds(x: JaggedBatch) -> None:
    assert isinstance(x, JaggedBatch)
    assert 2 <= len(x.lengths) <= 5
    assert all(0 <= n <= 3 for n in x.lengths)
    assert x.values.dim() == 2
    assert x.njt().size(0) == len(x.lengths)


@given(partitions(num_rows=7, min_micro_batches=2, max_micro_batches=3, allow_empty=False))
def test_partitions_form_a_permutation(p: Partitions) -> None:
    assert isinstance(p, Partitions)
    assert 2 <= len(p.parts) <= 3
    assert all(p.parts)
    assert sorted(i for q in p.parts for i in q) == list(range(7))


@given(microbatch_outputs(min_rows=1, max_rows=4, min_micro_batches=2, max_micro_batches=2))
def test_microbatch_outputs_are_consistent(case: MicrobatchOutputs) -> None:
    assert isinstance(case, MicrobatchOutputs)
    assert len(case.output_lst) == 2
    assert case.indices is not None
    assert sum(len(p) for p in case.indices) == next(iter(case.expected.values())).size(0)


def test_every_defect_is_reachable() -> None:
    for name in DEFECTS:
        case = _draw_one(malformed_inputs(defects=(name,)))
        assert case.name == name
        assert case.error is DEFECTS[name].error


def test_former_defect_names_are_refused() -> None:
    """The never-released aliases (``extra_partition``, ``moved_index``, ``missing_index``) are dropped."""
    for old in ("extra_partition", "moved_index", "missing_index"):
        with pytest.raises(InvalidArgument, match=f"got \\('{old}',\\)"):
            _draw_one(malformed_inputs(defects=(old,)))


@given(malformed_inputs(min_rows=1000, max_rows=3000, defects=("duplicate_index",)))
@settings(max_examples=2)
def test_malformed_inputs_reach_thousands_of_rows(case) -> None:
    assert sum(len(p) for p in case.indices) >= 1000
