"""Hostile inputs found in issue 42 (item 5): each raised an exception that was not a `RebatchError`, or cost
time and memory sized by a claim before it was checked. Each is now a `RebatchError` subclass naming the
place,
the same class in both implementations where the input applies to both. (The dtypes: `tests/test_dtypes.py`;
the strategies of hostile types: `property_tests.strategies.hostile_indices`, `hostile_data`.)"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest
import torch

import rebatch_startup
import ref
import torch_impl
from property_tests.convert import ref_postprocess, torch_postprocess
from property_tests.data import jagged
from property_tests.defects import LyingPartition
from ref import errors
from torch_impl.integrations._shadow import Shadow


def _outs() -> list[dict[str, Any]]:
    return [
        {"model_output": {"lp": jagged(torch.arange(3.0), [1, 2]), "v": torch.zeros(2)}},
        {"model_output": {"lp": jagged(torch.arange(2.0), [2]), "v": torch.zeros(1)}},
    ]


def _both_raise(indices: Any, error: type[errors.RebatchError], pattern: str) -> None:
    for impl in (torch_postprocess, ref_postprocess):
        with pytest.raises(error, match=pattern):
            impl(_outs(), indices)


def test_indices_on_the_meta_device_are_refused_typed_in_both() -> None:
    meta = torch.tensor([0, 2], device="meta")
    _both_raise(
        [meta, [1]], errors.UnsupportedSettingError, r"micro-batch 0: the indices are on the meta device"
    )
    _both_raise(
        [[0, 2], meta[:1]], errors.UnsupportedSettingError, r"micro-batch 1: the indices are on the meta"
    )
    for impl in (torch_impl, ref):
        with pytest.raises(errors.UnsupportedSettingError, match=r"the indices are on the meta device"):
            impl.inverse_permutation(torch.tensor([1, 0], device="meta"))
        with pytest.raises(
            errors.UnsupportedSettingError, match=r"micro-batch 0: the indices are on the meta"
        ):
            impl.flatten_partitions([torch.tensor([0], device="meta")], 1)


def _objects(*entries: Any) -> np.ndarray:
    array = np.empty(len(entries), dtype=object)
    for j, e in enumerate(entries):
        array[j] = e
    return array


@pytest.mark.parametrize(
    ("partition", "shown"),
    [
        (_objects(0, "2"), "position 1: index '2'"),
        (_objects(0, None), "position 1: index None"),
        (_objects(0, 2.0), r"position 1: index 2\.0"),
        (_objects(0, (2,)), r"position 1: index \(2,\)"),
        (np.array(["0", "2"]), "position 0: index '0'"),
        (np.array([0, 2], dtype=np.longdouble), r"position 0: index np\.longdouble\('0\.0'\)"),
        (
            np.array(["2026-01-01", "2026-01-02"], dtype="datetime64[D]"),
            r"position 0: index datetime\.date\(2026, 1, 1\)",
        ),
    ],
)
def test_numpy_arrays_of_other_dtypes_are_checked_entry_by_entry_in_both(
    partition: np.ndarray, shown: str
) -> None:
    _both_raise([partition, [1]], errors.NotAPermutationError, rf"micro-batch 0, {shown} is not an integer")


def test_an_object_array_of_integers_is_a_partition_in_both() -> None:
    """As a list of the same integers (the reference took it so already)."""
    want = torch_postprocess(_outs(), [[0, 2], [1]])
    for impl in (torch_postprocess, ref_postprocess):
        got = impl(_outs(), [_objects(0, np.int64(2)), _objects(1)])
        assert torch.equal(got["model_output"]["v"], want["model_output"]["v"])
        assert torch.equal(got["model_output"]["lp"].offsets(), want["model_output"]["lp"].offsets())


@pytest.mark.parametrize("data", [3, 2.5, "abc", b"x", [1], (1,), {1}, object()])
def test_a_data_that_is_not_a_tensordict_or_a_mapping_is_refused_typed(data: Any) -> None:
    from torch_impl._postprocess import check_batch_func

    name = type(data).__name__
    for fn in (torch_impl.postprocess_batch_func, check_batch_func):
        with pytest.raises(errors.UnsupportedSettingError, match=rf"data must be a TensorDict .*got {name}$"):
            fn(_outs(), [[0, 2], [1]], data)


def test_data_may_still_be_none_a_dict_or_a_tensordict() -> None:
    from tensordict import TensorDict

    for data in (None, {}, {"use_dynamic_bsz": True}, TensorDict({}, batch_size=[])):
        torch_impl.postprocess_batch_func(_outs(), [[0, 2], [1]], data)


@pytest.mark.parametrize("claimed", [0, 3, 10**9, 2**62])
def test_a_partition_whose_len_lies_is_refused_before_anything_is_sized_by_it(claimed: int) -> None:
    idx = [LyingPartition([0, 2], claimed), [1]]
    more = "more than " if claimed < 2 else ""
    _both_raise(
        idx,
        errors.PartitionMismatchError,
        rf"micro-batch 0: a partition's len\(\) is {claimed}, but iterating it gives {more}",
    )
    for impl in (torch_impl, ref):
        with pytest.raises(errors.PartitionMismatchError, match=r"micro-batch 0: a partition's len\(\)"):
            impl.flatten_partitions(idx, 3)


class _BadLen(LyingPartition):
    def __len__(self) -> int:
        return -1


def test_a_partition_whose_len_fails_is_refused_typed_in_both() -> None:
    _both_raise(
        [_BadLen([0, 2], 0), [1]],
        errors.PartitionMismatchError,
        r"micro-batch 0: a partition's len\(\) fails",
    )


def test_a_claim_of_a_billion_rows_costs_no_memory() -> None:
    """Before: 34 s and 9.8 GB (torch_impl: a bincount of 10**9 counters; ref: a list sized by the claim)
    before the NotAPermutationError. Here in a fresh process whose peak resident memory may grow by at most
    256 MiB over the calls (an address-space cap is not used: torch's CUDA build and JAX reserve more
    address space than they use, and crash under one)."""
    script = textwrap.dedent(
        """
        import resource, sys
        import torch, jax.numpy as jnp
        import torch_impl, ref
        from property_tests.defects import LyingPartition
        outs = [{"model_output": {"d": torch.arange(2.0)}}, {"model_output": {"d": torch.arange(1.0)}}]
        routs = [{"model_output": {"d": jnp.arange(2.0)}}, {"model_output": {"d": jnp.arange(1.0)}}]
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
        for impl, o in ((torch_impl, outs), (ref, routs)):
            try:
                impl.postprocess_batch(o, [LyingPartition([0, 2], 10**9), [1]])
            except ref.PartitionMismatchError as err:
                print(type(err).__name__, err)
            else:
                sys.exit("accepted")
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak
        if grown > 256 * 1024:
            sys.exit(f"peak memory grew by {grown} KiB")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert done.stdout.count("PartitionMismatchError") == 2


def test_a_meta_witness_against_host_lengths_is_refused_typed_not_asserted() -> None:
    """Before: a bare ``assert`` in `torch_impl._alignment` (AssertionError, gone under ``python -O``)."""
    w = torch.tensor([1, 2, 2], device="meta")
    with pytest.raises(
        errors.UnsupportedSettingError, match=r"key 'lp': the witness lengths are on the meta"
    ):
        torch_impl.postprocess_batch(_outs(), [[0, 1], [2]], witness=w)


@pytest.mark.parametrize("sample", [5e-324, 1e-300, 2.0**-63])
def test_a_tiny_shadow_fraction_is_refused_typed(sample: float) -> None:
    """Before: ``OverflowError`` from ``round(1 / sample)`` (5e-324), and `rebatch_startup.parse` took it."""
    with pytest.raises(
        errors.UnsupportedSettingError, match=r"sample must be 0 or a fraction in \[2\*\*-62, 1\]"
    ):
        Shadow(sample, "log", None)
    with pytest.raises(
        errors.UnsupportedSettingError, match=r"REBATCH='shadow:.*': expected off, on, shadow"
    ):
        rebatch_startup.parse(f"shadow:{sample!r}")


def test_small_shadow_fractions_still_work() -> None:
    assert Shadow(2.0**-62, "log", None).every == 2**62
    assert Shadow(0, "log", None).every == 0
    for value, sample in (("shadow:0", 0.0), ("shadow:1e-9", 1e-9)):
        setting = rebatch_startup.parse(value)
        assert setting is not None
        assert setting.sample == sample


def test_jax_and_read_only_numpy_partitions_are_taken_alike_without_a_warning() -> None:
    """Found beside issue 42: torch_impl refused a JAX integer array (each entry "not an integer") where ref
    took it, and a read-only NumPy partition made torch warn (an error under pytest's ``-W error``)."""
    import warnings

    import jax.numpy as jnp

    frozen = np.array([0, 2])
    frozen.flags.writeable = False
    want = torch_postprocess(_outs(), [[0, 2], [1]])["model_output"]["v"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for indices in ([jnp.array([0, 2]), [1]], [[jnp.array(0), 2], [jnp.int32(1)]], [frozen, [1]]):
            for impl in (torch_postprocess, ref_postprocess):
                assert torch.equal(impl(_outs(), indices)["model_output"]["v"], want)
    _both_raise([jnp.array([0.0, 2.0]), [1]], errors.NotAPermutationError, r"micro-batch 0")
    _both_raise(
        [jnp.array([0, 2], dtype=jnp.bfloat16), [1]],
        errors.NotAPermutationError,
        r"micro-batch 0, position 0",
    )
