"""Real steps of the trainers' own engines and micro-batch layers over a tiny random Qwen2 model, for
``tests/test_trainer_steps.py`` (in each trainer's environment, ``.ci/peers.sh``): one process per mode,
rebatch activated as a user does (``REBATCH=on``, ``REBATCH=shadow:1`` or off), its results saved for
the test to compare bit for bit.

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
import os
import sys
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["ROWS", "build_model", "main"]

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


def _batch(rank: int = 0) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
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


def _mode() -> dict[str, Any]:
    """Which restore functions are bound, and shadow mode's counters (rebatch's, where it is installed)."""
    from torch_impl.integrations import areal, skyrl

    out: dict[str, Any] = {"areal": areal.mode(), "skyrl": skyrl.mode()}
    for name, integration in (("areal", areal), ("skyrl", skyrl)):
        if integration.mode() == "shadow":
            stats = integration.stats()
            out[f"{name}_shadow"] = {
                k: stats[k] for k in ("calls", "sampled", "differences", "defects", "errors")
            }
            out[f"{name}_messages"] = list(stats["messages"])
    return out


def _attempt(fn: Callable[[], Any]) -> tuple[Any, str | None]:
    """``(result, None)`` or ``(None, "Class: message")``."""
    try:
        return fn(), None
    except Exception as err:
        return None, f"{type(err).__name__}: {err}"


# -- AReaL ---------------------------------------------------------------------------------------


def _areal(model: str, swap: tuple[int, int] | None, dtype: str = "float32") -> dict[str, Any]:
    from areal.api.cli_args import MicroBatchSpec, OptimizerConfig, TrainEngineConfig
    from areal.api.io_struct import FinetuneSpec
    from areal.engine import fsdp_engine

    config = TrainEngineConfig(
        experiment_name="rebatch",
        trial_name="engine",
        path=model,
        dtype=dtype,
        attn_impl="sdpa",
        optimizer=OptimizerConfig(lr=1e-2),
        backend=f"fsdp:d{int(os.environ['WORLD_SIZE'])}",
        mb_spec=MicroBatchSpec(max_tokens_per_mb=64),
    )
    engine = fsdp_engine.FSDPEngine(config)
    engine.create_process_group()
    engine.initialize(None, FinetuneSpec(total_train_epochs=1, dataset_size=ROWS, train_batch_size=ROWS))
    ids, mask, lengths = _batch(int(os.environ["RANK"]))
    batch = {"input_ids": ids, "attention_mask": mask}
    out: dict[str, Any] = {"bound": fsdp_engine.reorder_and_pad_outputs.__module__, "lengths": lengths}
    if swap is not None:
        _swap_areal_micro_batches(engine, *swap)
        out["forward"], out["error"] = _attempt(lambda: engine.forward_batch(dict(batch)))
        out["mode"] = _mode()
        return out
    out["logp_before"] = engine.forward_batch(dict(batch))

    def loss_fn(logprobs: torch.Tensor, entropy: torch.Tensor, mb: dict[str, Any], **_: Any) -> torch.Tensor:
        return -(logprobs * 1.0).sum() + 0.01 * entropy.sum()

    def loss_weight_fn(mb: dict[str, Any]) -> torch.Tensor:
        return torch.tensor(float(mb["input_ids"].numel()))

    out["train"] = [engine.train_batch(dict(batch), loss_fn, loss_weight_fn) for _ in range(2)]
    # the metrics but the wall-clock ones, as plain floats (the result is loaded with weights_only)
    out["train"] = [
        {k: float(v) for k, v in s.items() if "time" not in k and "seconds" not in k} for s in out["train"]
    ]
    out["params"] = {k: v.detach().clone() for k, v in engine.model.state_dict().items()}
    out["params"] = {
        k: (v.full_tensor() if hasattr(v, "full_tensor") else v) for k, v in out["params"].items()
    }
    out["logp_after"] = engine.forward_batch(dict(batch))
    out["mode"] = _mode()
    return out


def _swap_areal_micro_batches(engine: Any, m: int, n: int) -> None:
    """The engine's loop with the outputs of micro-batches ``m`` and ``n`` swapped (their results computed,
    then handed to the engine's collector in the other order)."""
    loop = engine.forward_backward_batch

    def forward_backward_batch(
        mb_list: Any, process_output_fn: Callable[..., Any], forward_only: bool = False
    ) -> None:
        held: list[tuple[torch.Tensor, dict[str, Any]]] = []
        loop(mb_list, lambda logits, ctx: held.append((logits, ctx)), forward_only)
        held[m], held[n] = held[n], held[m]
        for logits, ctx in held:
            process_output_fn(logits, ctx)

    engine.forward_backward_batch = forward_backward_batch


# -- SkyRL ---------------------------------------------------------------------------------------


def _skyrl(model: str, swap: tuple[int, int] | None, dtype: str = "float32") -> dict[str, Any]:
    from skyrl.backends.skyrl_train.training_batch import TrainingInputBatch, TrainingOutputBatch
    from skyrl.backends.skyrl_train.utils.torch_utils import logprobs_from_logits
    from skyrl.backends.skyrl_train.workers import worker_utils
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    net = AutoModelForCausalLM.from_pretrained(model, attn_implementation="sdpa", dtype=getattr(torch, dtype))
    ids, _, lengths = _batch()
    # SkyRL's layout: sequences left-padded, the last `a` columns the response; response_mask marks each
    # row's response tokens (a prompt of 4 tokens, the rest response)
    s = ids.shape[1]
    a = s - 4
    left = torch.zeros_like(ids)
    attention = torch.zeros(ROWS, s, dtype=torch.int64)
    response = torch.zeros(ROWS, a, dtype=torch.int64)
    for i, n in enumerate(lengths):
        left[i, s - n :] = ids[i, :n]
        attention[i, s - n :] = 1
        response[i, a - (n - 4) :] = 1
    data = TrainingInputBatch({"sequences": left, "attention_mask": attention, "response_mask": response})
    data.metadata = {"response_length": a}
    it = worker_utils.TokenBasedBatchIterator(data, max_tokens_per_microbatch=64)
    out: dict[str, Any] = {
        "bound": type(it).__dict__["reorder_and_combine_batches"].__module__,
        "microbatches": [list(p) for p in it._microbatches],
        "valid": [n - 4 for n in lengths],
    }

    def micro(mb: Any) -> tuple[torch.Tensor, list[dict[str, Any]]]:
        # SkyRL's HFModelWrapper.forward without padding removal (its module imports flash_attn: not on a
        # CPU machine), with SkyRL's own logprobs_from_logits
        seq, att = mb["sequences"], mb["attention_mask"]
        pos = att.long().cumsum(-1) - 1
        pos.masked_fill_(att == 0, 1)
        logits = net(seq, attention_mask=att, position_ids=pos)["logits"]
        logp = logprobs_from_logits(logits, torch.roll(seq, shifts=-1, dims=1), inplace_backward=True)
        action = logp[:, -a - 1 : -1]
        valid = mb["response_mask"].sum(dim=1).int().tolist()
        cpu = action.detach().cpu()
        items = [{"logprobs": cpu[i, -n:].tolist() if n > 0 else []} for i, n in enumerate(valid)]
        return action, items

    batches, item_lists, losses = [], [], []
    for mb in it:
        action, items = micro(mb)
        batches.append(TrainingOutputBatch({"output": action.detach()}))
        item_lists.append(items)
        losses.append(-(action * mb["response_mask"]).sum())
    if swap is not None:
        m, n = swap
        batches[m], batches[n] = batches[n], batches[m]
        item_lists[m], item_lists[n] = item_lists[n], item_lists[m]
        out["swapped"] = (m, n)
        out["batches"], out["batches_error"] = _attempt(lambda: dict(it.reorder_and_combine_batches(batches)))
        out["items"], out["items_error"] = _attempt(lambda: it.reorder_and_combine_items(item_lists))
        out["mode"] = _mode()
        return out
    out["batches"] = dict(it.reorder_and_combine_batches(batches))
    out["items"] = it.reorder_and_combine_items(item_lists)
    torch.stack(losses).sum().backward()
    out["grads"] = {k: p.grad.clone() for k, p in net.named_parameters() if p.grad is not None}
    out["mode"] = _mode()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trainer", choices=("areal", "skyrl"))
    parser.add_argument("model")
    parser.add_argument("out")
    parser.add_argument("--swap", type=lambda v: tuple(int(x) for x in v.split(",")), default=None)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    args = parser.parse_args(argv)
    for k, v in {"MASTER_ADDR": "127.0.0.1", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        os.environ.setdefault(k, v)
    torch.use_deterministic_algorithms(True)
    step = _areal if args.trainer == "areal" else _skyrl
    result = step(args.model, args.swap, args.dtype)
    out = args.out if os.environ["WORLD_SIZE"] == "1" else f"{args.out}.rank{os.environ['RANK']}"
    tmp = f"{out}.{os.getpid()}.tmp"
    torch.save(result, tmp)
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
