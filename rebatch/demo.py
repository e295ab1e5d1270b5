"""An embedded, realistic RL step for ``rebatch check``: rollouts split into dynamic micro-batches under a
token budget (verl's partitioner), the testing kit's stand-in model run per micro-batch, and the answer
the reassembly must give.

256 prompts x 8 responses, GRPO-like (`grpo_lengths`, fixed seed): the responses of a prompt share
its prompt length, responses are long-tailed and a share is truncated at the length cap, so rows of
equal length occur as in real runs; ``data["input_ids"]`` holds the batch, as a verl step's does. The stand-in
model is element-wise in the token ids and positions, so running it on any
micro-batch gives exactly the rows it gives on the whole batch: the expected result is the model on
the original batch, computed without any reassembly.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch
from tensordict import NonTensorData, TensorDict

from property_tests.models import stand_in_model
from torch_impl import balanced_partitions, prepare_micro_batches
from torch_impl.testing import njt

__all__ = ["RLStep", "grpo_lengths", "make_step"]


class RLStep(NamedTuple):
    output_lst: list[dict[str, Any]]
    indices: list[list[int]]
    data: TensorDict
    expected: dict[str, torch.Tensor]
    rows: int
    tokens: int
    budget: int
    #: responses per prompt: rows ``g * responses`` to ``g * responses + responses - 1`` share prompt ``g``
    responses: int = 8


def grpo_lengths(
    rng: np.random.Generator, prompts: int, responses: int, *, max_response: int = 1024
) -> tuple[list[int], list[int]]:
    """``(prompt lengths, row lengths)`` of a GRPO-like batch: each prompt's ``responses`` rows share its
    prompt length (log-normal, 16 to 1024 tokens); each response is long-tailed (log-normal) and
    truncated at ``max_response``, so the responses of a group that reach the cap have equal lengths,
    as in real runs; a row is its prompt and its response."""
    prompt = np.clip(rng.lognormal(mean=4.8, sigma=0.7, size=prompts), 16, 1024).astype(np.int64)
    response = np.clip(rng.lognormal(mean=5.6, sigma=0.9, size=prompts * responses), 1, max_response).astype(
        np.int64
    )
    rows = np.repeat(prompt, responses) + response
    return prompt.tolist(), rows.tolist()


def make_step(
    *,
    prompts: int = 256,
    responses: int = 8,
    max_tokens: int = 16384,
    seed: int = 0,
    fixed_length: int | None = None,
    split: bool = False,
) -> RLStep:
    """The step: ``prompts x responses`` rows of `grpo_lengths` (``fixed_length``: every row that long),
    their token ids in ``data["input_ids"]`` (as a verl step carries them: the alignment witness), split
    by verl's partitioner under ``max_tokens``; with ``split``, by rebatch's ``prepare_micro_batches``
    (the same partitions), which records the split's provenance for ``data``."""
    rng = np.random.default_rng(seed)
    b = prompts * responses
    _, lengths = grpo_lengths(rng, prompts, responses)
    if fixed_length is not None:
        lengths = [fixed_length] * b
    ids = torch.from_numpy(rng.integers(0, 151_936, size=sum(lengths), dtype=np.int64))
    offsets = torch.zeros(b + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.tensor(lengths), 0)
    batch = njt(ids, offsets)
    indices = balanced_partitions(lengths, max_tokens)
    rows = batch.unbind()
    data = TensorDict({}, batch_size=[b] if split else [])
    micro_batches: Any = None
    if split:
        data["input_ids"] = batch
        micro_batches, split_indices = prepare_micro_batches(data, max_token_len=max_tokens)
        indices = list(split_indices or [])
    output_lst = []
    for m, part in enumerate(indices):
        if micro_batches is not None:
            micro = micro_batches[m]["input_ids"]
        else:
            micro = torch.nested.as_nested_tensor([rows[i] for i in part], layout=torch.jagged)
        out = stand_in_model(micro)
        output_lst.append(
            {
                "model_output": out,
                "loss": out["log_probs"].values().mean(),
                "metrics": {"tokens": [len(part)]},
            }
        )
    data["use_dynamic_bsz"] = NonTensorData(True)
    data["pad_mode"] = NonTensorData("no_padding")
    data["input_ids"] = batch
    return RLStep(output_lst, indices, data, stand_in_model(batch), b, sum(lengths), max_tokens, responses)
