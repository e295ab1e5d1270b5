"""A drop-in to the last observable bit (issue 51, item 1): every jagged tensor rebatch returns carries
what the trainer's own result carries (its shortest and longest row cached, so ``to_padded_tensor()``
without an output size pads to the longest row), and ``ref`` and ``torch_impl`` take the same
partition forms wherever ``docs/spec.md`` says one is valid.

The trainer's own result is built as verl builds it, ``torch.nested.as_nested_tensor`` of the rows."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from hypothesis import given, strategies as st
from tensordict import TensorDict

import ref
import torch_impl
from property_tests.compare import assert_same, cached_sizes
from property_tests.convert import result_to_torch, to_ref
from property_tests.data import rows_of

LENGTHS = [3, 1, 2]  # verl pads these to [3, 3]; an uncached result pads to [3, 6]


def trainers_own(rows: list[torch.Tensor]) -> torch.Tensor:
    """The rows as verl's ``postprocess_batch_func`` builds its result."""
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


def engine_output(lengths: list[int], start: float = 0.0) -> torch.Tensor:
    """A micro-batch output as verl's engines build one: on offsets, nothing cached."""
    offsets = torch.tensor([0, *np.cumsum(lengths).tolist()], dtype=torch.int64)
    values = torch.arange(float(sum(lengths))) + start
    return torch_impl._jagged.njt(values, offsets)


CALLS: dict[str, Callable[[torch.Tensor], Any]] = {
    "restore": lambda x: torch_impl.restore(x, [[2], [0, 1]]),
    "concat": lambda x: torch_impl.concat([x, x]),
    "take": lambda x: torch_impl.take(x, [2, 0]),
    "split": lambda x: torch_impl.split(x, [[2], [0, 1]]),
    "from_packed": lambda x: torch_impl.from_packed(x.values(), LENGTHS),
    "from_packed_cu_seqlens": lambda x: torch_impl.from_packed(x.values(), cu_seqlens=[0, 3, 4, 6]),
    "from_padded": lambda x: torch_impl.from_padded(x.to_padded_tensor(0.0, output_size=(3, 5)), LENGTHS),
    "restore_dynamic_batch": lambda x: torch_impl.restore_dynamic_batch(x, [[2], [0, 1]]),
    "postprocess_batch_func": lambda x: torch_impl.postprocess_batch_func(
        [{"model_output": {"lp": x}}, {"model_output": {"lp": engine_output([2, 4], 10.0)}}],
        [[0, 1, 2], [3, 4]],
        None,
    )["model_output"]["lp"],
    "prepare_micro_batches": lambda x: [
        mb["input_ids"]
        for mb in torch_impl.prepare_micro_batches(
            TensorDict({"input_ids": x}, batch_size=[3]), max_token_len=4, use_dynamic_bsz_balance=False
        )[0]
    ],
}


@pytest.mark.parametrize("name", list(CALLS))
def test_every_jagged_result_pads_as_the_trainers_own(name: str) -> None:
    """Rows of 3, 1 and 2 tokens (from an engine output, nothing cached): each result, compared with the
    trainer's own tensor of the same rows, as a consumer sees it (padded shape and values, cached sizes,
    ``unbind``)."""
    got = CALLS[name](engine_output(LENGTHS))
    for result in got if isinstance(got, list) else [got]:
        want = trainers_own(rows_of(result))
        assert cached_sizes(result) == cached_sizes(want)
        assert result.to_padded_tensor(0.0).shape == want.to_padded_tensor(0.0).shape
        assert_same(result, want)


def test_verls_example_pads_to_the_longest_row() -> None:
    got = torch_impl.restore(engine_output(LENGTHS), [[0, 1, 2]])
    assert tuple(got.to_padded_tensor(0.0).shape) == (3, 3)


def test_a_gradient_path_result_caches_its_sizes_too() -> None:
    x = engine_output(LENGTHS)
    x = torch_impl._jagged.njt(x.values().clone().requires_grad_(), torch.tensor([0, 3, 4, 6]))
    got = torch_impl.restore(x, [[2, 0, 1]])
    assert got.requires_grad
    assert cached_sizes(got) == (1, 3, False)


def test_on_meta_a_permutation_keeps_the_sizes_the_input_caches() -> None:
    """Off the CPU nothing is read for the sizes: a permutation carries what its input caches."""
    x = trainers_own([torch.zeros(n, device="meta") for n in LENGTHS])
    assert cached_sizes(torch_impl.restore(x, [[2], [0, 1]])) == (1, 3, False)
    assert cached_sizes(torch_impl.concat([x, x])) == (1, 3, False)
    bare = engine_output(LENGTHS).to("meta")
    assert cached_sizes(torch_impl.restore(bare, [[2], [0, 1]])) == (None, None, False)


def test_the_comparison_sees_a_missing_cache() -> None:
    """The tests' comparison tells a result without cached sizes from the trainer's own."""
    x = engine_output(LENGTHS)
    with pytest.raises(AssertionError, match="min_seqlen"):
        assert_same(x, trainers_own(rows_of(x)))


FLAT_FORMS: dict[str, Callable[[list[int]], tuple[Any, Any]]] = {
    # (torch_impl's argument, ref's argument): the permutation itself, one 1-D integer array
    "numpy": lambda p: (np.array(p, dtype=np.int64), np.array(p, dtype=np.int64)),
    "numpy_int32": lambda p: (np.array(p, dtype=np.int32), np.array(p, dtype=np.int32)),
    "tensor_and_jax": lambda p: (
        torch.tensor(p, dtype=torch.int64),
        jnp.asarray(np.array(p, dtype=np.int32)),
    ),
}

PARTITION_FORMS: dict[str, Callable[[list[list[int]]], Any]] = {
    "lists": lambda parts: [list(p) for p in parts],
    "numpy_scalars": lambda parts: [[np.int64(i) for i in p] for p in parts],
    "zero_dim_arrays": lambda parts: [[np.array(i) for i in p] for p in parts],
    "numpy_arrays": lambda parts: [np.array(p, dtype=np.int64) for p in parts],
    "tuples": lambda parts: [tuple(p) for p in parts],
}


@st.composite
def _permuted(draw: st.DrawFn) -> tuple[list[int], list[list[int]]]:
    lengths = draw(st.lists(st.integers(0, 4), min_size=1, max_size=7))
    perm = draw(st.permutations(range(len(lengths))))
    cut = draw(st.integers(0, len(perm)))
    return lengths, [list(perm[:cut]), list(perm[cut:])]


@given(_permuted(), st.sampled_from(sorted(FLAT_FORMS)), st.sampled_from(sorted(PARTITION_FORMS)))
def test_both_implementations_take_every_documented_form(drawn: Any, flat: str, form: str) -> None:
    """``restore(x, P)`` for each documented form of ``P`` (partitions as lists, NumPy scalars, 0-d
    arrays, 1-D arrays, tuples; or ``perm`` itself as one 1-D array) in both implementations, same
    result, and the flat form the same as the partitions; ``restore_dynamic_batch`` too."""
    lengths, parts = drawn
    x = torch_impl.from_packed(torch.arange(float(sum(lengths))), lengths)
    perm = [i for p in parts for i in p]
    want = torch_impl.restore(x, parts)
    as_torch, as_ref = FLAT_FORMS[flat](perm)
    assert_same(torch_impl.restore(x, as_torch), want)
    assert_same(torch_impl.restore_dynamic_batch(x, as_torch), want)
    assert_same(result_to_torch(ref.restore(to_ref(x), as_ref)), want)
    partitions = PARTITION_FORMS[form](parts)
    assert_same(torch_impl.restore(x, partitions), want)
    assert_same(result_to_torch(ref.restore(to_ref(x), partitions)), want)
