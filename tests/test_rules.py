"""Rules a reviewer found untested (issue 17): each test here fails on a realistic defect of that rule.

Metric folding (list extends; tuple and everything else appends; a Metric accumulator never mutates an
input), the split side's count rules, verl's partitioner order, gradients and dynamic batching on
every kernel path (with chunks small enough to cut rows).
"""

from __future__ import annotations

import copy
import functools
import math
from typing import Any

import pytest
import torch
from hypothesis import example, given, settings, strategies as st

import ref
import torch_impl
from property_tests.compare import assert_same
from property_tests.convert import ref_postprocess, torch_postprocess
from property_tests.data import jagged
from property_tests.kernels import ANYWHERE, KERNELS, forced
from property_tests.metric import FakeMetric
from property_tests.properties import gradients_match_vjp
from property_tests.strategies import MicrobatchOutputs, microbatch_outputs, tensordict_batches
from ref import errors
from ref.errors import TokenBudgetError
from ref.metrics import append_to_dict, fold_metrics, merge_metrics
from ref.partition import karmarkar_karp, pipeline_order, workload

#: Independent of torch's release and of the trainers: run once, in CI's main lane (the pins lane deselects
#: it, .ci/lanes.sh)
pytestmark = pytest.mark.main_lane_only

# -- metric folding ----------------------------------------------------------------------------------

_values = st.one_of(
    st.integers(-5, 5),
    st.lists(st.integers(-5, 5), max_size=3),
    st.tuples(st.integers(-5, 5), st.integers(-5, 5)),
    st.builds(FakeMetric, st.sampled_from(["mean", "max"]), st.integers(-5, 5)),
)
_metric_dicts = st.dictionaries(st.sampled_from(["a", "b", "c"]), _values, max_size=3)


def _model_fold(dicts: list[dict[str, Any]]) -> dict[str, Any]:
    """verl's rule, spelled out: a new key starts as [] (a Metric's init_list()); a list extends it;
    anything else (a tuple, a number, a Metric) is appended, and appending a Metric to a Metric extends it."""
    out: dict[str, Any] = {}
    for d in dicts:
        for k, v in d.items():
            if k not in out:
                out[k] = FakeMetric(v.aggregation) if isinstance(v, FakeMetric) else []
            acc = out[k]
            if isinstance(v, list):
                (acc.values if isinstance(acc, FakeMetric) else acc).extend(v)
            elif isinstance(acc, FakeMetric):
                acc.values.extend(v.values if isinstance(v, FakeMetric) else [v])
            else:
                acc.append(copy.deepcopy(v))
    return out


@given(st.lists(_metric_dicts, max_size=4))
@example([{"a": (1, 2)}, {"a": [3, 4]}, {"a": (5,)}])
@example([{"a": FakeMetric("mean", 1)}, {"a": FakeMetric("mean", 2)}, {"a": [3]}])
def test_metric_folding_rules(dicts: list[dict[str, Any]]) -> None:
    snapshot = copy.deepcopy(dicts)
    expected = _model_fold(dicts)
    assert fold_metrics(dicts) == expected
    assert functools.reduce(merge_metrics, dicts, {}) == expected
    in_place: dict[str, Any] = {}
    for d in dicts:
        assert append_to_dict(in_place, d) is None
    assert in_place == expected
    assert dicts == snapshot, "folding changed an input"


@given(_metric_dicts, _metric_dicts)
@example({"a": FakeMetric("mean", 1)}, {"a": FakeMetric("mean", 2)})
@example({"a": FakeMetric("mean", 1)}, {"a": 5})
def test_merge_metrics_never_mutates_its_arguments(acc_seed: dict[str, Any], new: dict[str, Any]) -> None:
    acc = fold_metrics([acc_seed])  # an accumulator as fold_metrics makes it (Metric entries included)
    acc_before, new_before = copy.deepcopy(acc), copy.deepcopy(new)
    out = merge_metrics(acc, new)
    assert acc == acc_before, "merge_metrics mutated its accumulator"
    assert new == new_before
    assert out == _model_fold([acc_seed, new])
    assert all(out[k] is not acc[k] for k in acc)


def test_tuples_and_tensors_are_appended_by_both_implementations() -> None:
    vec = torch.tensor([1.0, 2.0])
    outs = [{"metrics": {"t": (1, 2), "v": vec, "l": [1, 2]}}, {"metrics": {"t": (3,), "v": vec, "l": [3]}}]
    for impl in (torch_postprocess, ref_postprocess):
        m = impl(outs, [[], []])["metrics"]
        assert m["t"] == [(1, 2), (3,)], impl.__name__
        assert m["l"] == [1, 2, 3]
        assert len(m["v"]) == 2
        assert all(x is vec for x in m["v"])


# -- the split side honours the count rules ----------------------------------------------------------


@settings(max_examples=40)
@given(
    tensordict_batches(min_rows=1, max_rows=12, max_length=8),
    st.integers(8, 40),
    st.none() | st.integers(1, 12),
    st.none() | st.integers(1, 3),
    st.booleans(),
)
def test_prepare_micro_batches_honours_min_multiple_and_balance(
    batch, budget, minimum, multiple, balance
) -> None:
    kwargs = {"min_num_micro_batches": minimum, "multiple_of": multiple, "balance": balance}
    verl_kwargs = {
        "min_num_micro_batch": minimum,
        "num_batches_divided_by": multiple,
        "use_dynamic_bsz_balance": balance,
    }
    try:
        want = ref.balanced_partitions(batch.lengths, budget, **kwargs)
    except TokenBudgetError:
        with pytest.raises(TokenBudgetError):
            torch_impl.prepare_micro_batches(batch.data, max_token_len=budget, **verl_kwargs)
        return
    micro, indices = torch_impl.prepare_micro_batches(batch.data, max_token_len=budget, **verl_kwargs)
    assert indices == want
    assert len(micro) == len(indices) >= (minimum or 1)
    assert len(indices) % (multiple or 1) == 0
    for mb, part in zip(micro, indices, strict=True):
        assert_same(mb["input_ids"], torch_impl.take(batch.data["input_ids"], part))


def test_prepare_micro_batches_named_counts() -> None:
    data = tensordict_batches_fixed([4] * 6)
    _, idx = torch_impl.prepare_micro_batches(data, max_token_len=100, min_num_micro_batch=3)
    assert idx is not None
    assert len(idx) == 3
    _, idx = torch_impl.prepare_micro_batches(
        data, max_token_len=100, min_num_micro_batch=3, num_batches_divided_by=2
    )
    assert idx is not None
    assert len(idx) == 4
    _, unbalanced = torch_impl.prepare_micro_batches(
        data, max_token_len=100, min_num_micro_batch=3, use_dynamic_bsz_balance=False
    )
    assert unbalanced == ref.balanced_partitions([4] * 6, 100, min_num_micro_batches=3, balance=False)


def test_a_dense_batch_s_padded_width_must_fit_the_budget() -> None:
    """As verl: with a dense ``attention_mask`` ``[B, S]`` the padded width ``S`` must fit the budget, even
    when every row's tokens would (verl asserts ``max_token_len >= S``); a 1-D mask has width 1."""
    from tensordict import TensorDict

    mask = torch.zeros(4, 10, dtype=torch.int64)
    mask[:, :3] = 1  # 3 tokens a row, padded to 10
    data = TensorDict({"attention_mask": mask}, batch_size=[4])
    with pytest.raises(TokenBudgetError, match="10"):
        torch_impl.rearrange_micro_batches(data, max_token_len=6)
    _, parts = torch_impl.rearrange_micro_batches(data, max_token_len=10)
    assert sorted(i for p in parts for i in p) == [0, 1, 2, 3]
    deep = TensorDict({"attention_mask": mask.reshape(4, 1, 10).expand(4, 2, 10).clone()}, batch_size=[4])
    with pytest.raises(TokenBudgetError, match="10"):  # the last dimension is the width, as verl reads it
        torch_impl.rearrange_micro_batches(deep, max_token_len=8)
    flat = TensorDict({"attention_mask": torch.ones(4, dtype=torch.int64)}, batch_size=[4])
    _, parts = torch_impl.rearrange_micro_batches(flat, max_token_len=2)
    assert sorted(i for p in parts for i in p) == [0, 1, 2, 3]


@pytest.mark.parametrize("size", [0, -2])
def test_a_micro_batch_size_below_one_is_refused(size: int) -> None:
    """Fixed micro-batches of ``micro_batch_size_per_gpu`` rows: 0 or less is an `UnsupportedSettingError`
    (not a division by zero), whichever way the size is given."""
    from tensordict import NonTensorData

    from ref.errors import UnsupportedSettingError

    data = tensordict_batches_fixed([2, 3, 1, 4])
    data["use_dynamic_bsz"] = NonTensorData(False)
    data["micro_batch_size_per_gpu"] = NonTensorData(size)
    with pytest.raises(UnsupportedSettingError, match="micro_batch_size"):
        torch_impl.prepare_micro_batches(data)
    with pytest.raises(UnsupportedSettingError, match="micro_batch_size"):
        torch_impl.prepare_micro_batches(data, micro_batch_size=size)
    data["micro_batch_size_per_gpu"] = NonTensorData(3)  # 4 rows cannot be cut into micro-batches of 3
    with pytest.raises(UnsupportedSettingError, match="divisible"):
        torch_impl.prepare_micro_batches(data)
    data["micro_batch_size_per_gpu"] = NonTensorData(1)  # one row each is fine
    assert [len(m) for m in torch_impl.prepare_micro_batches(data)[0]] == [1, 1, 1, 1]
    assert [len(m) for m in torch_impl.prepare_micro_batches(data, micro_batch_size=1)[0]] == [1, 1, 1, 1]


def test_an_empty_batch_has_no_micro_batches() -> None:
    data = tensordict_batches_fixed([])
    assert torch_impl.rearrange_micro_batches(data, 10) == ([], [])
    assert torch_impl.prepare_micro_batches(data, max_token_len=10) == ([], [])


def test_balanced_partitions_settings_are_keyword_only() -> None:
    """``torch_impl.balanced_partitions(lengths, max_tokens, *, ...)``: the rows and the budget by position or
    by name, every setting by name only (a setting given by position is a `TypeError`, not a silent
    misreading)."""
    assert torch_impl.balanced_partitions(lengths=[3, 1, 2], max_tokens=4) == torch_impl.balanced_partitions(
        [3, 1, 2], 4
    )
    with pytest.raises(TypeError):
        torch_impl.balanced_partitions([3, 1, 2], 4, 2)  # type: ignore[misc]


def test_the_engine_budget_is_per_gpu_times_sp_size_which_defaults_to_one() -> None:
    from tensordict import NonTensorData

    data = tensordict_batches_fixed([4, 6, 3, 5, 2])
    data["max_token_len_per_gpu"] = NonTensorData(10)
    _, parts = torch_impl.prepare_micro_batches(data)  # no sp_size: a budget of 10
    assert parts is not None
    assert all(sum([4, 6, 3, 5, 2][i] for i in p) <= 10 for p in parts)
    assert parts == torch_impl.balanced_partitions([4, 6, 3, 5, 2], 10)
    data["sp_size"] = NonTensorData(2)
    assert torch_impl.prepare_micro_batches(data)[1] == torch_impl.balanced_partitions([4, 6, 3, 5, 2], 20)


def test_prepare_micro_batches_dp_settings_are_keyword_only() -> None:
    data = tensordict_batches_fixed([2, 3])
    assert torch_impl.prepare_micro_batches_dp(data=data, max_token_len=5).indices == [[0, 1]]
    with pytest.raises(TypeError):
        torch_impl.prepare_micro_batches_dp(data, 5)  # type: ignore[misc]


def tensordict_batches_fixed(lengths: list[int]) -> Any:
    from tensordict import TensorDict

    return TensorDict({"input_ids": jagged(torch.arange(sum(lengths)), lengths)}, batch_size=[len(lengths)])


# -- verl's partitioner, hand-checked ------------------------------------------------------------------


def test_pipeline_order_interleaves_heaviest_first() -> None:
    """Heaviest first [p0, p1, p2, p3(, p4)], then p[::2][::-1] + p[1::2]."""
    parts = [[0], [1], [2], [3]]  # workloads ascend with the lengths
    assert pipeline_order([1, 2, 3, 4], parts) == [[1], [3], [2], [0]]
    assert pipeline_order([1, 2, 3, 4, 5], [[0], [1], [2], [3], [4]]) == [[0], [2], [4], [3], [1]]
    assert ref.balanced_partitions([1, 2, 3, 4], 100, min_num_micro_batches=4) == [[1], [3], [2], [0]]


def test_karmarkar_karp_breaks_ties_by_the_larger_top_set() -> None:
    """Four equal rows into two sets, by hand: the states of rows 3 and 2 (larger items first on a tie)
    merge into ({3}, {2}), rows 1 and 0 into ({1}, {0}); then ({3}, {2}) pops first and joins set for
    set the other way round: {3, 0} and {2, 1}."""
    w = workload(1)
    assert karmarkar_karp([w] * 4, 2) == [[3, 0], [2, 1]]
    assert karmarkar_karp([w] * 6, 3) == [[5, 0], [4, 1], [3, 2]]
    assert ref.balanced_partitions([1, 1, 1, 1], 100, min_num_micro_batches=2, balance=False) == [
        [0, 3],
        [1, 2],
    ]


def test_verl_orders_equal_micro_batches_by_their_first_index() -> None:
    """verl sorts by (workload, partition[0]) heaviest first: [[1, 2], [0, 3]] for four equal rows."""
    assert ref.balanced_partitions([1, 1, 1, 1], 2) == [[1, 2], [0, 3]]


# -- every kernel path: dynamic batching, chunks that cut rows, gradients ------------------------------


def _case(
    lengths_per_mb: list[list[int]], parts: list[list[int]], feature: tuple[int, ...] = ()
) -> MicrobatchOutputs:
    """A named dynamic-batch case with one jagged key; rows of ``lengths_per_mb[m]`` in micro-batch ``m``."""
    outs, rows = [], {}
    start = 0
    for lengths, part in zip(lengths_per_mb, parts, strict=True):
        n = sum(lengths)
        values = torch.arange(start, start + n * math.prod(feature), dtype=torch.float32).reshape(n, *feature)
        start += values.numel()
        x = jagged(values, lengths)
        outs.append({"model_output": {"lp": x}})
        for i, r in zip(part, x.unbind(), strict=True):
            rows[i] = r
    expected = torch.nested.as_nested_tensor([rows[i] for i in range(len(rows))], layout=torch.jagged)
    return MicrobatchOutputs(outs, parts, True, "no_padding", {"lp": expected})


#: rows of 5 and 7 values cut by chunks of 3; an empty row; a row starting inside a chunk
NAMED_CASES = [
    _case([[5, 7], [0, 4, 2]], [[3, 0], [4, 2, 1]]),
    _case([[1, 3, 8], [6]], [[1, 3, 0], [2]], feature=(2,)),
]


@pytest.mark.parametrize("path", sorted(KERNELS))
@settings(max_examples=8)
@given(microbatch_outputs(use_dynamic_bsz=True, min_rows=2, max_length=9, losses=False, metrics=False))
def test_every_kernel_path_with_dynamic_batching(path: str, case: MicrobatchOutputs) -> None:
    """Each path, forced on, puts the rows back (dynamic batching on every example; rows of up to 9
    values, so the three-values-per-chunk path cuts rows and leaves partial last chunks)."""
    for c in [case, *NAMED_CASES]:
        with forced(path):
            got = torch_postprocess(c.output_lst, c.indices, use_dynamic_bsz=True, pad_mode=c.pad_mode)
        assert_same(got["model_output"], c.expected)


@pytest.mark.parametrize("path", sorted(KERNELS))
@settings(max_examples=2)
@given(
    microbatch_outputs(
        dtypes=("float32", "float64"), min_rows=2, max_length=9, dense=False, losses=False, metrics=False
    )
)
def test_gradients_on_every_kernel_path(path: str, case: MicrobatchOutputs) -> None:
    """Backward through each forced path equals jax.vjp of the reference, bit for bit; a host kernel,
    which cannot carry a gradient, forced on a key that requires one raises (never another kernel)."""
    if (
        path not in ANYWHERE and "jagged" in torch_impl.KERNELS[KERNELS[path]["kernel"]].layouts
    ):  # jagged cases
        with forced(path), pytest.raises(errors.UnsupportedSettingError, match="cannot move this key"):
            gradients_match_vjp(NAMED_CASES[0])
        return
    with forced(path):
        gradients_match_vjp(case)
        gradients_match_vjp(NAMED_CASES[0])


def test_fuzz_keeps_its_time_budget(tmp_path, monkeypatch) -> None:
    """A round of 25 slow examples would take far longer than the 3 s share: it is cut short."""
    import io
    import time

    from property_tests.fuzz import fuzz

    monkeypatch.setenv("REBATCH_FUZZ_DB", str(tmp_path))
    out = io.StringIO()
    start = time.perf_counter()
    assert fuzz(0.05, only=["gradients_match_vjp"], out=out) == 0
    assert time.perf_counter() - start < 20, out.getvalue()
    assert "ok   gradients_match_vjp" in out.getvalue()


def test_append_to_dict_prefixes_keys_that_lack_the_prefix() -> None:
    data: dict[str, Any] = {}
    append_to_dict(data, {"loss": 1, "actor/kl": (2,)}, prefix="actor/")
    assert data == {"actor/loss": [1], "actor/kl": [(2,)]}


def test_indices_without_item_access_are_rejected() -> None:
    """A sized but unindexable ``indices`` (dict keys) is no list of partitions, in both implementations."""
    from ref.errors import PartitionMismatchError

    outs = [{"model_output": {"x": torch.zeros(2)}}, {"model_output": {"x": torch.zeros(1)}}]
    for impl in (torch_postprocess, ref_postprocess):
        with pytest.raises(PartitionMismatchError):
            impl(outs, {(1, 2): None, (0,): None}.keys())


def test_padding_is_recognised_beside_numpy_partitions() -> None:
    """A padding micro-batch is found by identity: NumPy partitions beside it must not be compared to it."""
    import numpy as np

    from ref import PADDING

    outs = [{"model_output": {"x": torch.tensor([1.0, 0.0])}}, {"model_output": {"x": torch.zeros(1)}}]
    got = torch_impl.postprocess_batch(outs, [np.array([1, 0]), PADDING])
    assert_same(got["model_output"]["x"], torch.tensor([0.0, 1.0]))
