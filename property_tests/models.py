"""`stand_in_model`: a model for tests and demos whose outputs do not depend on how rows are batched.

It is element-wise in the token ids and their positions, so running it on any micro-batch gives exactly
the rows it gives on the whole batch: the expected reassembled result is the model on the original
batch, computed without any reassembly. Used by ``rebatch check``'s embedded step and the many-rank tests.
"""

from __future__ import annotations

import torch

from torch_impl.testing import njt, seqlens_of

from .data import offsets_of

__all__ = ["stand_in_model"]


def stand_in_model(ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-token outputs of a jagged ``ids`` ``[b, (j)]`` and a per-sample value: element-wise, so exact
    whatever the batching. Returns log-probs float32 ``[b, (j)]``, entropy bfloat16 ``[b, (j)]``,
    top-k log-probs float32 ``[b, (j), 5]`` and values float32 ``[b]``."""
    tok = ids.values()
    offsets = offsets_of(ids)
    lengths = offsets.diff()
    pos = torch.arange(tok.numel()) - torch.repeat_interleave(offsets[:-1], lengths)
    logp = -((tok % 1009).to(torch.float32) / 97.0) - pos.to(torch.float32) * 1e-4
    entropy = ((tok % 613).to(torch.float32) / 101.0).to(torch.bfloat16)
    topk = logp[:, None] - torch.arange(5, dtype=torch.float32)[None, :] * 0.5
    value = lengths.to(torch.float32) * 0.25

    def nt(v: torch.Tensor) -> torch.Tensor:  # its sizes cached, as a batch's own tensors cache theirs
        return njt(v, offsets, None, seqlens_of(lengths))

    return {"log_probs": nt(logp), "entropy": nt(entropy), "top_k_log_probs": nt(topk), "values": value}
