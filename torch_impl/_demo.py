"""An embedded, realistic RL step for ``rebatch check``: rollouts split into dynamic micro-batches under a
token budget, a stand-in model run per micro-batch, and the answer the reassembly must give.

256 prompts x 8 responses with long-tailed response lengths (log-normal, fixed seed), as RL rollouts
have. The stand-in model is element-wise in the token ids and positions, so running it on any
micro-batch gives exactly the rows it gives on the whole batch: the expected result is the model on
the original batch, computed without any reassembly.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
import torch
from tensordict import NonTensorData, TensorDict

__all__ = ["RLStep", "make_step", "stand_in_model", "budget_partitions"]


class RLStep(NamedTuple):
    output_lst: list[dict[str, Any]]
    indices: list[list[int]]
    data: TensorDict
    expected: dict[str, torch.Tensor]
    rows: int
    tokens: int
    budget: int


def budget_partitions(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Rows packed into as few micro-batches as fit ``max_tokens`` each (longest first, each into the
    least-loaded micro-batch, more micro-batches until all fit); indices ascending in each, as verl has them."""
    if any(n > max_tokens for n in lengths):
        raise ValueError(f"a row of {max(lengths)} tokens exceeds the budget of {max_tokens}")
    count = max(1, math.ceil(sum(lengths) / max_tokens)) if lengths else 0
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    while True:
        loads = [0] * count
        parts: list[list[int]] = [[] for _ in range(count)]
        for i in order:
            m = min(range(count), key=lambda j: (loads[j], j))
            loads[m] += lengths[i]
            parts[m].append(i)
        if all(load <= max_tokens for load in loads):
            return [sorted(p) for p in parts]
        count += 1


def stand_in_model(ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-token outputs of a jagged ``ids`` ``[b, (j)]`` and a per-sample value: element-wise, so exact
    whatever the batching. Returns log-probs float32 ``[b, (j)]``, entropy bfloat16 ``[b, (j)]``,
    top-k log-probs float32 ``[b, (j), 5]`` and values float32 ``[b]``."""
    tok = ids.values()
    offsets = ids.offsets()
    lengths = offsets.diff()
    pos = torch.arange(tok.numel()) - torch.repeat_interleave(offsets[:-1], lengths)
    logp = -((tok % 1009).to(torch.float32) / 97.0) - pos.to(torch.float32) * 1e-4
    entropy = ((tok % 613).to(torch.float32) / 101.0).to(torch.bfloat16)
    topk = logp[:, None] - torch.arange(5, dtype=torch.float32)[None, :] * 0.5
    value = lengths.to(torch.float32) * 0.25

    def nt(v: torch.Tensor) -> torch.Tensor:
        return torch.nested.nested_tensor_from_jagged(v, offsets)

    return {"log_probs": nt(logp), "entropy": nt(entropy), "top_k_log_probs": nt(topk), "values": value}


def make_step(*, prompts: int = 256, responses: int = 8, max_tokens: int = 16384, seed: int = 0) -> RLStep:
    rng = np.random.default_rng(seed)
    b = prompts * responses
    lengths = np.clip(rng.lognormal(mean=5.6, sigma=0.9, size=b), 1, 8192).astype(np.int64).tolist()
    ids = torch.from_numpy(rng.integers(0, 151_936, size=sum(lengths), dtype=np.int64))
    offsets = torch.zeros(b + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.tensor(lengths), 0)
    batch = torch.nested.nested_tensor_from_jagged(ids, offsets)
    indices = budget_partitions(lengths, max_tokens)
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
