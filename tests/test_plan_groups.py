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
    outs[1]["model_output"]["entropy"] = torch.nested.nested_tensor_from_jagged(longer.to(torch.float64), lp.offsets())
    with pytest.raises(InvalidJaggedError, match="key 'entropy', micro-batch 1: offsets\\[-1\\] must equal"):
        torch_impl.postprocess_batch(outs, indices)
