"""An embedded, realistic RL step for ``rebatch check``: rollouts split into dynamic micro-batches under a
token budget (verl's partitioner), the testing kit's stand-in model run per micro-batch, and the answer
the reassembly must give.

256 prompts x 8 responses with long-tailed response lengths (log-normal, fixed seed), as RL rollouts
have. The stand-in model is element-wise in the token ids and positions, so running it on any
micro-batch gives exactly the rows it gives on the whole batch: the expected result is the model on
the original batch, computed without any reassembly.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch
from tensordict import NonTensorData, TensorDict

from property_tests.models import stand_in_model
from torch_impl import balanced_partitions
from torch_impl._jagged import njt

__all__ = ["RLStep", "make_step"]


class RLStep(NamedTuple):
    output_lst: list[dict[str, Any]]
    indices: list[list[int]]
    data: TensorDict
    expected: dict[str, torch.Tensor]
    rows: int
    tokens: int
    budget: int


def make_step(*, prompts: int = 256, responses: int = 8, max_tokens: int = 16384, seed: int = 0) -> RLStep:
    rng = np.random.default_rng(seed)
    b = prompts * responses
    lengths = np.clip(rng.lognormal(mean=5.6, sigma=0.9, size=b), 1, 8192).astype(np.int64).tolist()
    ids = torch.from_numpy(rng.integers(0, 151_936, size=sum(lengths), dtype=np.int64))
    offsets = torch.zeros(b + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.tensor(lengths), 0)
    batch = njt(ids, offsets)
    indices = balanced_partitions(lengths, max_tokens)
    rows = batch.unbind()
    output_lst = []
    for part in indices:
        micro = torch.nested.as_nested_tensor([rows[i] for i in part], layout=torch.jagged)
        out = stand_in_model(micro)
        output_lst.append(
            {"model_output": out, "loss": out["log_probs"].values().mean(), "metrics": {"tokens": [len(part)]}}
        )
    data = TensorDict({}, batch_size=[])
    data["use_dynamic_bsz"] = NonTensorData(True)
    data["pad_mode"] = NonTensorData("no_padding")
    return RLStep(output_lst, indices, data, stand_in_model(batch), b, sum(lengths), max_tokens)
