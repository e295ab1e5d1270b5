"""`torch_impl._fewrows.few_rows_call`: a plain call of a few rows taken as a whole. Where it takes a call,
its result is the general pipeline's bit for bit (and its error, for bad offsets, the same); each of its
conditions, broken alone, sends the call to the general pipeline (None), which then gives its own result
or error."""

from __future__ import annotations

import itertools
import types
import warnings
from collections.abc import Callable
from typing import Any
from unittest import mock

import numpy as np
import pytest
import torch
from tensordict import NonTensorData, TensorDict

import torch_impl
import torch_impl._postprocess
from property_tests.compare import assert_same
from property_tests.data import jagged, random_tensor
from ref import errors
from torch_impl._fewrows import few_rows_call
from torch_impl._parts import _NJT as NestedTensor


def _general(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` with the whole-call path switched off: the general pipeline's result."""
    with mock.patch.object(torch_impl._postprocess, "few_rows_call", return_value=None):
        return fn(*args, **kwargs)


def _call(
    seed: int, *, sizes: tuple[int, ...] = (2, 3, 0, 3), keys: int = 2, dtype: str = "float32", trailing: tuple = ()
) -> tuple[list[dict[str, Any]], list[list[int]]]:
    """Micro-batches of ``sizes`` rows (random lengths 0-5, zero-length rows included), ``keys`` jagged
    keys of random bits, losses and metrics, and a random permutation as partitions."""
    rng = np.random.default_rng(seed)
    perm = rng.permutation(sum(sizes)).tolist()
    parts = [perm[a:b] for a, b in itertools.pairwise(itertools.accumulate(sizes, initial=0))]
    outs = []
    for m, size in enumerate(sizes):
        model_output = {}
        for k in range(keys):
            lengths = rng.integers(0, 6, size).tolist()
            model_output[f"k{k}"] = jagged(random_tensor(rng, (sum(lengths), *trailing), dtype), lengths)
        outs.append({"model_output": model_output, "loss": torch.tensor(float(m)), "metrics": {"a": [m], "b": m}})
    return outs, parts


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64", "int8", "bool", "complex64", "float8_e4m3fn"])
@pytest.mark.parametrize("trailing", [(), (3,), (2, 2)])
def test_the_whole_call_is_the_general_pipelines_result_bit_for_bit(dtype: str, trailing: tuple) -> None:
    for seed in range(3):
        outs, parts = _call(seed, dtype=dtype, trailing=trailing)
        got = few_rows_call(outs, parts)
        assert got is not None
        want = _general(torch_impl.postprocess_batch, outs, parts)
        assert_same(got, want["model_output"])
        assert list(got) == list(want["model_output"]) == ["k0", "k1"]
        assert_same(torch_impl.postprocess_batch(outs, parts), want)
        assert_same(
            torch_impl.postprocess_batch_func(outs, parts, None),
            _general(torch_impl.postprocess_batch_func, outs, parts, None),
        )


@pytest.mark.parametrize("sizes", [(1,), (4,), (1, 1, 1, 1), (0, 5), (3, 0, 0, 2)])
def test_the_whole_call_takes_one_or_many_micro_batches_and_the_identity(sizes: tuple[int, ...]) -> None:
    outs, parts = _call(7, sizes=sizes, keys=1)
    in_order = [list(range(a, b)) for a, b in itertools.pairwise(itertools.accumulate(sizes, initial=0))]
    for partition in (parts, in_order):
        got = few_rows_call(outs, partition)
        assert got is not None
        assert_same(got, _general(torch_impl.postprocess_batch, outs, partition)["model_output"])


def test_the_whole_call_takes_a_call_as_verl_makes_it() -> None:
    """verl's call: ``data`` a TensorDict of settings, losses and metrics in every micro-batch."""
    outs, parts = _call(3)
    data = TensorDict({}, batch_size=[])
    data["use_dynamic_bsz"] = NonTensorData(True)  # verl's bool, or a bool-like: a tensor, a NumPy bool
    data["pad_mode"] = NonTensorData("no_padding")
    taken: list[Any] = []
    with mock.patch.object(
        torch_impl._postprocess, "few_rows_call", lambda *a: taken.append(few_rows_call(*a)) or taken[-1]
    ):
        got = torch_impl.postprocess_batch_func(outs, parts, data)
        data["use_dynamic_bsz"] = torch.tensor(True)
        assert_same(torch_impl.postprocess_batch_func(outs, parts, data), got)
    assert len(taken) == 2
    assert None not in taken
    assert_same(got, _general(torch_impl.postprocess_batch_func, outs, parts, data))


class _Tagged(torch.Tensor):
    """A tensor subclass (torch's default ``__torch_function__``): its values go through torch's ops."""


def _broken(what: str) -> tuple[Any, Any]:
    """A call that breaks one condition of the whole-call path (and only that one, where it can)."""
    outs, parts = _call(11)
    first = outs[0]["model_output"]
    if what == "output_lst_a_tuple":
        return tuple(outs), parts
    if what == "indices_a_tuple":
        return outs, tuple(parts)
    if what == "no_outputs":
        return [], []
    if what == "one_partition_too_many":
        return outs, [*parts, []]
    if what == "an_output_not_a_dict":
        return [*outs[:-1], types.MappingProxyType(outs[-1])], parts
    if what == "model_output_not_a_dict":
        outs[1]["model_output"] = types.MappingProxyType(outs[1]["model_output"])
    elif what == "no_model_output":
        del outs[2]["model_output"]
    elif what == "metrics_not_a_dict":
        outs[1]["metrics"] = [1]
    elif what == "keys_in_another_order":
        outs[3]["model_output"] = dict(reversed(outs[3]["model_output"].items()))
    elif what == "a_key_missing":
        del outs[3]["model_output"]["k1"]
    elif what == "no_keys":
        for o in outs:
            o["model_output"] = {}
    elif what == "a_padding_micro_batch":
        parts = [*parts[:2], torch_impl.PADDING, parts[3]]
    elif what == "a_partition_a_tuple":
        parts[1] = tuple(parts[1])
    elif what == "a_numpy_index":
        parts[0] = [np.int64(parts[0][0]), *parts[0][1:]]
    elif what == "a_bool_index":
        outs, parts = _call(11, sizes=(1, 1), keys=1)
        parts = [[True], [0]]
    elif what == "a_duplicate_index":
        parts[0] = [parts[1][0], *parts[0][1:]]
    elif what == "an_index_missing":
        parts[3] = parts[3][:-1]
    elif what == "no_rows":
        outs, parts = _call(11, sizes=(0, 0), keys=1)
    elif what == "over_the_rows_knob":
        outs, parts = _call(11, sizes=(129,), keys=1)
    elif what == "a_dense_output":
        first["k0"] = torch.zeros(2, 3)
    elif what == "a_strided_nested_tensor":
        with warnings.catch_warnings():  # torch's note that the strided layout is a prototype
            warnings.simplefilter("ignore")
            first["k0"] = torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)])
    elif what == "ragged_dimension_2":
        outs, parts = _call(11, keys=1)
        for o in outs:  # [b, 3, (j)]: 3 values a row, each of a ragged number of features, 6 in all
            y = o["model_output"]["k0"]
            rows = y.offsets().numel() - 1
            offsets = torch.tensor([0] * rows + [6])
            o["model_output"]["k0"] = torch.nested.nested_tensor_from_jagged(torch.zeros(3, 6), offsets, jagged_dim=2)
    elif what == "meta_tensors":
        for o in outs:
            y = o["model_output"]["k0"]
            o["model_output"]["k0"] = torch_impl._jagged.njt(y.values().to("meta"), y.offsets().to("meta"))
    elif what == "holes":
        x = first["k0"]
        first["k0"] = torch.nested.nested_tensor_from_jagged(x.values(), x.offsets(), lengths=x.offsets().diff())
    elif what == "requires_grad":  # a nested tensor that requires grad, over values that do not
        first["k0"] = first["k0"].clone().requires_grad_()
    elif what == "values_require_grad":  # values that require grad, in a nested tensor that does not
        x = first["k0"]
        first["k0"] = NestedTensor(x.values().clone().requires_grad_(), x.offsets())
    elif what == "values_of_a_subclass":
        x = first["k0"]
        first["k0"] = NestedTensor(x.values().as_subclass(_Tagged), x.offsets())
    elif what == "int32_offsets":
        x = first["k0"]
        first["k0"] = torch_impl._jagged.njt(x.values(), x.offsets().to(torch.int32))
    elif what == "non_contiguous_values":
        x = first["k0"]
        v = torch.stack([x.values(), x.values()], 1)[:, 0]
        first["k0"] = torch_impl._jagged.njt(v, x.offsets())
    elif what == "a_negative_view":
        x = first["k0"]
        first["k0"] = torch_impl._jagged.njt(x.values().neg().clone()._neg_view(), x.offsets())
    elif what == "a_conjugate_view":
        outs, parts = _call(11, keys=1, dtype="complex64")
        x = outs[0]["model_output"]["k0"]
        outs[0]["model_output"]["k0"] = torch_impl._jagged.njt(x.values().conj(), x.offsets())
    elif what == "a_row_too_many":
        x = first["k0"]
        first["k0"] = jagged(torch.cat([x.values(), x.values()[:1]]), [*x.offsets().diff().tolist(), 1])
    elif what == "another_dtype":
        x = first["k0"]
        first["k0"] = torch_impl._jagged.njt(x.values().double(), x.offsets())
    elif what == "another_trailing_shape":
        outs, parts = _call(11, keys=1, trailing=(3,))
        x = outs[0]["model_output"]["k0"]
        outs[0]["model_output"]["k0"] = torch_impl._jagged.njt(x.values()[:, :2].contiguous(), x.offsets())
    elif what == "another_number_of_dimensions":
        x = first["k0"]
        first["k0"] = torch_impl._jagged.njt(x.values()[:, None].contiguous(), x.offsets())
    elif what == "an_unsupported_dtype":
        with warnings.catch_warnings():  # torch's note that complex32 is experimental
            warnings.simplefilter("ignore")
            for o in outs:
                y = o["model_output"]["k0"]
                o["model_output"]["k0"] = torch_impl._jagged.njt(
                    torch.zeros(y.values().shape, dtype=torch.complex32), y.offsets()
                )
    elif what == "over_the_prefault_floor":
        outs, parts = _call(11, keys=1, trailing=(70000,))
    else:  # pragma: no cover
        raise AssertionError(what)
    return outs, parts


BROKEN = [
    "output_lst_a_tuple", "indices_a_tuple", "no_outputs", "one_partition_too_many", "an_output_not_a_dict",
    "model_output_not_a_dict", "no_model_output", "metrics_not_a_dict", "keys_in_another_order",
    "a_key_missing", "no_keys", "a_padding_micro_batch", "a_partition_a_tuple", "a_numpy_index",
    "a_bool_index", "a_duplicate_index", "an_index_missing", "no_rows", "over_the_rows_knob", "a_dense_output",
    "a_strided_nested_tensor", "ragged_dimension_2", "meta_tensors", "holes", "requires_grad", "values_require_grad", "values_of_a_subclass", "int32_offsets",
    "non_contiguous_values", "a_negative_view", "a_conjugate_view", "a_row_too_many", "another_dtype",
    "another_trailing_shape", "another_number_of_dimensions", "an_unsupported_dtype", "over_the_prefault_floor",
]  # fmt: skip


@pytest.mark.parametrize("what", BROKEN)
def test_each_condition_broken_alone_sends_the_call_to_the_general_pipeline(what: str) -> None:
    outs, parts = _broken(what)
    assert few_rows_call(outs, parts) is None
    try:
        want: Any = _general(torch_impl.postprocess_batch, outs, parts)
    except errors.RebatchError as e:
        want = e
    if isinstance(want, errors.RebatchError):
        with pytest.raises(type(want)) as got:
            torch_impl.postprocess_batch(outs, parts)
        assert str(got.value) == str(want)
    elif what == "meta_tensors":  # no data to compare: the same shapes on the same device
        got = torch_impl.postprocess_batch(outs, parts)["model_output"]["k0"]
        assert (got.device.type, got.values().shape) == ("meta", want["model_output"]["k0"].values().shape)
    else:
        assert_same(torch_impl.postprocess_batch(outs, parts), want)


def test_the_plain_case_itself_is_taken() -> None:
    """The control of the table above: the call `_broken` starts from is taken whole."""
    outs, parts = _call(11)
    assert few_rows_call(outs, parts) is not None


def test_a_torch_without_numpy_takes_the_general_pipeline() -> None:
    outs, parts = _call(11)
    with mock.patch.object(torch_impl._fewrows, "numpy_bridge", return_value=False):
        assert few_rows_call(outs, parts) is None


def test_settings_other_than_dynamic_batching_without_padding_take_the_general_pipeline() -> None:
    outs, parts = _call(5)
    with mock.patch.object(torch_impl._postprocess, "few_rows_call", wraps=few_rows_call) as spy:
        torch_impl.postprocess_batch(outs, None, use_dynamic_bsz=False)
        with pytest.raises(errors.UnsupportedSettingError):
            torch_impl.postprocess_batch(outs, parts, pad_mode="left_right")
        with pytest.raises(errors.UnsupportedSettingError, match="use_dynamic_bsz must be a bool"):
            torch_impl.postprocess_batch(outs, parts, use_dynamic_bsz="yes")
        with pytest.raises(errors.UnsupportedSettingError, match="indices is None"):
            torch_impl.postprocess_batch(outs, None)
        assert spy.call_count == 0
        torch_impl.postprocess_batch(outs, parts)
        torch_impl.postprocess_batch(outs, parts, use_dynamic_bsz=1)
        assert spy.call_count == 2


@pytest.mark.parametrize(("bad_key", "offsets"), [(0, [1, 2, 3]), (1, [0, 1, 4]), (0, [0, 2, 1])])
def test_bad_offsets_raise_as_the_general_pipeline_raises_them_in_key_order(bad_key: int, offsets: list[int]) -> None:
    """Bad offsets in one key, or in both (the first key's error comes first); a call with bad offsets
    in one key and another defect the checks find first (a dtype) raises that defect."""
    outs, parts = _call(2, sizes=(2, 2), keys=2)
    bad = torch_impl._jagged.njt(torch.arange(3.0), torch.tensor(offsets))
    outs[1]["model_output"][f"k{bad_key}"] = bad
    want = _error(lambda: _general(torch_impl.postprocess_batch, outs, parts))
    assert isinstance(want, errors.InvalidJaggedError)
    assert f"key 'k{bad_key}'" in str(want)
    assert str(_error(lambda: torch_impl.postprocess_batch(outs, parts))) == str(want)
    outs[1]["model_output"][f"k{1 - bad_key}"] = bad  # both bad: the first key is named
    assert "key 'k0'" in str(_error(lambda: torch_impl.postprocess_batch(outs, parts)))
    outs[1]["model_output"][f"k{1 - bad_key}"] = torch_impl._jagged.njt(
        torch.zeros(3, dtype=torch.float64), bad.offsets()
    )
    got = _error(lambda: torch_impl.postprocess_batch(outs, parts))
    assert isinstance(got, errors.DtypeMismatchError)
    assert str(got) == str(_error(lambda: _general(torch_impl.postprocess_batch, outs, parts)))


def _error(fn: Callable[[], Any]) -> errors.RebatchError:
    with pytest.raises(errors.RebatchError) as e:
        fn()
    return e.value


def test_the_whole_call_makes_every_copy_after_every_key_is_planned(monkeypatch) -> None:
    """A bad second key raises before any output of the first is written: no copy is made."""
    from torch_impl import _fewrows

    made = []
    real = _fewrows._copy_spans
    monkeypatch.setattr(_fewrows, "_copy_spans", lambda *a: made.append(1) or real(*a))
    outs, parts = _call(4, sizes=(2, 2), keys=2)
    outs[1]["model_output"]["k1"] = torch_impl._jagged.njt(torch.arange(3.0), torch.tensor([0, 1, 4]))
    with pytest.raises(errors.InvalidJaggedError):
        torch_impl.postprocess_batch(outs, parts)
    assert made == []
    outs, parts = _call(4, sizes=(2, 2), keys=2)
    torch_impl.postprocess_batch(outs, parts)
    assert made == [1, 1]
