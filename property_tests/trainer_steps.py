"""Real steps of the trainers' own engines and micro-batch layers over a tiny random Qwen2 model, for
``tests/test_trainer_steps.py`` (in each trainer's environment, ``.ci/peers.sh``): one process per mode,
rebatch activated as a user does (``REBATCH=on``, ``REBATCH=shadow:1`` or off), its results saved for
the test to compare bit for bit.

Each trainer's steps are its kit module's ``step(model, swap, dtype)`` (`property_tests.trainers`):

- ``areal``: AReaL 1.0.4's own ``FSDPEngine`` (``areal.engine.fsdp_engine``) on the CPU over gloo (world
  size 1, or each rank of ``torch.distributed.run`` with its own rows, its result in ``OUT.rankR``):
  ``forward_batch`` (log-probs: its micro-batch split, the model, ``reorder_and_pad_outputs``),
  two ``train_batch`` steps (its loss path, optimizer step), ``forward_batch`` again.
- ``skyrl``: SkyRL 0.4.0's ``TokenBasedBatchIterator`` over a ``TrainingInputBatch`` built as its trainer
  builds one, each micro-batch through the model's forward as its worker's ``_forward_backward_micro``
  computes log-probs (response tokens) and the per-sample items it returns, restored with the iterator's
  ``reorder_and_combine_batches`` and ``reorder_and_combine_items``; then a gradient step (SkyRL's
  worker does not run on the CPU: ``docs/peers.md``).

``--dtype bfloat16``: the model computes in bf16 (AReaL: its engine's ``dtype``, fp32 master weights).
``--swap M,N``: the outputs of micro-batches ``M`` and ``N`` swapped inside the loop (a well-formed
misalignment); the result records what the restore step did with it. Run as ``python -m
property_tests.trainer_steps TRAINER MODEL OUT [--swap M,N]``; ``build_model(path)`` writes the model. Nothing
here is imported by rebatch itself.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

import torch

from rebatch_startup.trainers import TRAINERS, by_name

__all__ = ["ROWS", "attempt", "batch", "build_model", "main", "mode", "stepped"]

#: the batch: 24 sequences of 6-29 tokens
ROWS = 24


def build_model(path: str) -> None:
    """The tiny random ``Qwen2ForCausalLM`` (hidden 64, 2 layers, vocab 512) saved with
    ``save_pretrained``."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=512,
        max_position_embeddings=128,
    )
    Qwen2ForCausalLM(config).save_pretrained(path)


def batch(rank: int = 0) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """``(input_ids [B, S], attention_mask [B, S] bool, lengths)``, right-padded, seeded (each data-parallel
    rank its own rows)."""
    g = torch.Generator().manual_seed(1 + rank)
    lengths = torch.randint(6, 30, (ROWS,), generator=g).tolist()
    s = max(lengths)
    ids = torch.randint(1, 512, (ROWS, s), generator=g)
    mask = torch.zeros(ROWS, s, dtype=torch.bool)
    for i, n in enumerate(lengths):
        mask[i, :n] = True
    return ids * mask, mask, lengths


def stepped() -> tuple[str, ...]:
    """The trainers whose kit module has steps in their own code (``step``), in the registry's order."""
    return tuple(
        trainer.name
        for trainer in TRAINERS
        if trainer.kit_module is not None and hasattr(importlib.import_module(trainer.kit_module), "step")
    )


def mode() -> dict[str, Any]:
    """Which restore functions are bound, and shadow mode's counters (rebatch's, where it is installed)."""
    out: dict[str, Any] = {}
    for name in stepped():
        integration = importlib.import_module(by_name(name).integration)
        out[name] = integration.mode()
        if integration.mode() == "shadow":
            stats = integration.stats()
            out[f"{name}_shadow"] = {
                k: stats[k] for k in ("calls", "sampled", "differences", "defects", "errors")
            }
            out[f"{name}_messages"] = list(stats["messages"])
    return out


def attempt(fn: Callable[[], Any]) -> tuple[Any, str | None]:
    """``(result, None)`` or ``(None, "Class: message")``."""
    try:
        return fn(), None
    except Exception as err:
        return None, f"{type(err).__name__}: {err}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trainer", choices=stepped())
    parser.add_argument("model")
    parser.add_argument("out")
    parser.add_argument("--swap", type=lambda v: tuple(int(x) for x in v.split(",")), default=None)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    args = parser.parse_args(argv)
    for k, v in {"MASTER_ADDR": "127.0.0.1", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        os.environ.setdefault(k, v)
    torch.use_deterministic_algorithms(True)
    kit = importlib.import_module(str(by_name(args.trainer).kit_module))
    result = kit.step(args.model, args.swap, args.dtype)
    out = args.out if os.environ["WORLD_SIZE"] == "1" else f"{args.out}.rank{os.environ['RANK']}"
    tmp = f"{out}.{os.getpid()}.tmp"
    torch.save(result, tmp)
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
