"""Keys on one offsets tensor share one plan (`torch_impl._plan.KeyPlan.group`): their results are the
results of keys planned one by one, bit for bit, on every kernel that moves a jagged key; a key whose
values do not fill the shared offsets is planned on its own (and its defect raised as ever)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import torch_impl
from property_tests.compare import first_difference
from property_tests.kernels import forced
from ref.errors import InvalidJaggedError

JAGGED_KERNELS = ["host_rows_copy", "host_scatter", "element_indices"]


def _outputs(*, shared: bool) -> tuple[list[dict[str, Any]], list[list[int]]]:
    """Three micro-batches, three jagged keys each (of other dtypes and trailing shapes), on one offsets
    tensor a micro-batch (``shared``) or each key on its own copy of it."""
    lengths = [[3, 0, 2], [1, 4], [2, 2, 1]]
    outs = []
    for m, rows in enumerate(lengths):
        offsets = torch.tensor([0, *torch.tensor(rows).cumsum(0).tolist()])
        n = sum(rows)
        values = {
            "log_probs": torch.arange(n, dtype=torch.float32) + 10 * m,
            "entropy": torch.arange(n, dtype=torch.float64) * -1.5 + m,
            "hidden": torch.arange(n * 2, dtype=torch.bfloat16).reshape(n, 2),
        }
        outs.append(
            {
                "model_output": {
                    k: torch.nested.nested_tensor_from_jagged(v, offsets if shared else offsets.clone())
                    for k, v in values.items()
                }
            }
        )
    return outs, [[4, 0, 7], [2, 5], [1, 6, 3]]


@pytest.mark.parametrize("kernel", JAGGED_KERNELS)
@pytest.mark.parametrize("dynamic", [True, False])
def test_a_group_moves_as_keys_planned_one_by_one(kernel: str, dynamic: bool) -> None:
    shared, indices = _outputs(shared=True)
    alone, _ = _outputs(shared=False)
    given = indices if dynamic else None
    with forced(kernel):
        ours = torch_impl.postprocess_batch(shared, given, use_dynamic_bsz=dynamic)
        theirs = torch_impl.postprocess_batch(alone, given, use_dynamic_bsz=dynamic)
    assert first_difference(ours, theirs) is None
    results = list(ours["model_output"].values())
    assert all(r.offsets() is results[0].offsets() for r in results)  # one result offsets a group


def test_a_key_whose_values_do_not_fill_the_shared_offsets_is_planned_alone() -> None:
    """The second key's values are one row too long for the offsets it shares: its own defect, as when
    planned alone."""
    outs, indices = _outputs(shared=True)
    lp = outs[1]["model_output"]["log_probs"]
    longer = torch.cat([lp.values(), lp.values()[:1]])
    outs[1]["model_output"]["entropy"] = torch.nested.nested_tensor_from_jagged(
        longer.to(torch.float64), lp.offsets()
    )
    with pytest.raises(InvalidJaggedError, match="key 'entropy', micro-batch 1: offsets\\[-1\\] must equal"):
        torch_impl.postprocess_batch(outs, indices)


def test_values_filling_the_shared_offsets_otherwise_in_each_micro_batch_raise() -> None:
    """A review's case: a key whose values add up to the group's in total but not micro-batch by
    micro-batch (values attached to another micro-batch's offsets) is planned alone: its defect raises."""
    first = torch.tensor([0, 2, 5])
    second = torch.tensor([0, 3, 7])
    outs = []
    for offsets, mine in ((first, 6), (second, 6)):  # 6 + 6 values where the offsets hold 5 + 7
        a = torch.nested.nested_tensor_from_jagged(torch.arange(float(offsets[-1])), offsets)
        b = torch.nested.nested_tensor_from_jagged(torch.arange(float(mine)), offsets)
        outs.append({"model_output": {"a": a, "b": b}})
    with pytest.raises(InvalidJaggedError, match="key 'b', micro-batch 0: offsets\\[-1\\] must equal"):
        torch_impl.postprocess_batch(outs, [[0, 3], [1, 2]])


def _meta_outputs(*, shared: bool) -> list[dict[str, Any]]:
    """Keys on ``meta`` caching other sizes: ``a`` (4, 4), ``b`` none, ``c`` (1, 9)."""
    nested = torch.nested.nested_tensor_from_jagged
    outs = []
    for b in (2, 3):
        offsets = torch.arange(0, (b + 1) * 4, 4, device="meta")
        other = offsets if shared else offsets.clone()
        values = torch.zeros(b * 4, device="meta")
        keys = {
            "a": nested(values, offsets, min_seqlen=4, max_seqlen=4),
            "b": nested(values, other),
            "c": nested(values, other, min_seqlen=1, max_seqlen=9),
        }
        outs.append({"model_output": keys})
    return outs


def test_off_the_cpu_each_key_keeps_its_own_cached_sizes_and_is_counted() -> None:
    """A review's cases: off the CPU a key of a group caches the sizes its own parts cache (as planned
    alone), and each key's trusted offsets are counted (``skipped_device_offsets``), not each group's."""
    from property_tests.compare import cached_sizes

    indices = [[4, 3], [2, 1, 0]]
    before = torch_impl.witness_stats()["skipped_device_offsets"]
    shared = torch_impl.postprocess_batch(_meta_outputs(shared=True), indices)["model_output"]
    counted = torch_impl.witness_stats()["skipped_device_offsets"] - before
    alone = torch_impl.postprocess_batch(_meta_outputs(shared=False), indices)["model_output"]
    assert counted == torch_impl.witness_stats()["skipped_device_offsets"] - before - counted
    for key in "abc":
        assert cached_sizes(shared[key]) == cached_sizes(alone[key]), key
