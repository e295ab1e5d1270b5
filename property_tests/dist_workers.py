"""Worker processes for the multi-rank tests (importable, so ``torch.multiprocessing`` can spawn them).

Each rank takes its shard of one deterministic global batch, makes data-parallel micro-batches, runs a
stand-in model (`property_tests.models`: element-wise, so any batching gives the same rows), reassembles, gathers, broadcasts,
and checks every result against the single-process answer; a mismatch raises in the worker.
"""

from __future__ import annotations

import datetime
import os
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from tensordict import TensorDict

from .compare import assert_same
from .data import jagged, random_tensor
from .models import stand_in_model

__all__ = ["global_batch", "shard_bounds", "check_rank", "raise_on_one_rank"]

MAX_TOKENS = 20


def global_batch(rows: int = 37, seed: int = 0) -> TensorDict:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 13, size=rows).tolist()
    n = sum(lengths)
    return TensorDict(
        {
            "input_ids": jagged(random_tensor(rng, (n,), "int64"), lengths),
            "top_k": jagged(random_tensor(rng, (n, 3), "float32"), lengths),
        },
        batch_size=[rows],
    )


def shard_bounds(rows: int, world: int) -> list[tuple[int, int]]:
    """Uneven shards; the last rank gets a single row (fewer than the synchronised micro-batch count)."""
    if world == 1:
        return [(0, rows)]
    rest = rows - 1
    cuts = [round(rest * i / (world - 1)) for i in range(world)]
    return [(cuts[i], cuts[i + 1]) for i in range(world - 1)] + [(rest, rows)]


def _init(rank: int, world: int, port: int, timeout_s: float) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


def check_rank(rank: int, world: int, port: int) -> None:
    import torch_impl

    _init(rank, world, port, 60)
    try:
        data = global_batch()
        lo, hi = shard_bounds(data.batch_size[0], world)[rank]
        shard = torch_impl.take(data, list(range(lo, hi)))
        micro = torch_impl.prepare_micro_batches_dp(shard, max_token_len=MAX_TOKENS)
        counts: list[Any] = [None] * world
        dist.all_gather_object(counts, len(micro.batches))
        assert len(set(counts)) == 1, f"micro-batch counts differ between ranks: {counts}"
        padded = [m for m, p in enumerate(micro.indices) if p is torch_impl.PADDING]
        if hi - lo < counts[0]:
            assert padded, f"rank {rank}: {hi - lo} rows for {counts[0]} micro-batches but no padding"
        output_lst = [
            {
                "model_output": stand_in_model(mb["input_ids"]),
                "loss": torch.tensor(float(100 * rank + m)),
                "metrics": {"padding": [p is torch_impl.PADDING], "rank": rank},
            }
            for m, (mb, p) in enumerate(zip(micro.batches, micro.indices, strict=True))
        ]
        result = torch_impl.postprocess_batch_func(output_lst, micro.indices, None)
        # the rank's own shard, exactly as one process computes it
        assert_same(result["model_output"], stand_in_model(shard["input_ids"]))
        kept = [m for m in range(len(micro.indices)) if m not in padded]
        assert_same(result["loss"], [torch.tensor(float(100 * rank + m)) for m in kept])
        assert result["metrics"].get("padding", []) == [False] * len(kept), "a padding micro-batch leaked into metrics"
        # the whole global batch, in global order, on every rank
        whole = torch_impl.gather_batch(result)
        assert_same(whole["model_output"], stand_in_model(data["input_ids"]))
        assert len(whole["loss"]) == sum(1 for _ in whole["metrics"].get("rank", []))
        # pipeline parallelism: only the last stage has a result; broadcast gives it to all
        last = world - 1
        mine = result if rank == last else {}
        got = torch_impl.broadcast_from_last_stage(mine)
        expected_last = torch_impl.take(data, list(range(*shard_bounds(data.batch_size[0], world)[last])))
        assert_same(got["model_output"], stand_in_model(expected_last["input_ids"]))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def raise_on_one_rank(rank: int, world: int, port: int, timeout_s: float) -> None:
    """Rank 1 fails before the collective; the others must fail too, by the group's timeout, not hang."""
    import torch_impl

    _init(rank, world, port, timeout_s)
    if rank == 1:
        raise RuntimeError("rank 1 failed on purpose")
    torch_impl.gather_batch({"model_output": {"x": torch.zeros(2)}, "loss": [], "metrics": {}})


def _expect(name: str, fn: Any, error: type[BaseException], pattern: str, rank: int, budget_s: float = 15.0) -> None:
    """``fn()`` must raise ``error`` whose message matches ``pattern``, within ``budget_s`` seconds."""
    import re
    import time

    start = time.monotonic()
    try:
        fn()
    except error as err:
        took = time.monotonic() - start
        assert re.search(pattern, str(err)), f"rank {rank}, {name}: {type(err).__name__}: {err}"
        assert took < budget_s, f"rank {rank}, {name}: the error took {took:.1f} s to arrive"
        return
    raise AssertionError(f"rank {rank}, {name}: no {error.__name__} raised")


def ranks_agree_on_errors(rank: int, world: int, port: int) -> None:
    """One rank (rank 1, or the last stage) is wrong; every rank raises the same error at once, naming
    that rank, in every helper; afterwards the group still works. The group's timeout (60 s) is far
    above the budget of each error (15 s): an error that arrived by timeout fails the test."""
    import torch_impl
    from ref import errors

    _init(rank, world, port, 60)
    try:
        odd = rank == 1

        def result(**model_output: Any) -> dict[str, Any]:
            return {"model_output": model_output, "loss": [torch.tensor(1.0)], "metrics": {"r": rank}}

        x = jagged(torch.arange(5.0), [2, 3])
        cases = [
            (
                "extra key",
                result(x=x, y=torch.zeros(2)) if odd else result(x=x),
                errors.KeyMismatchError,
                r"key 'y', rank 1: present, while rank 0 lacks it",
            ),
            (
                "missing key",
                result(x=x) if odd else result(x=x, y=torch.zeros(2)),
                errors.KeyMismatchError,
                r"key 'y', rank 1: missing, while rank 0 has it",
            ),
            (
                "dtype",
                result(x=jagged(torch.arange(5.0, dtype=torch.float64), [2, 3])) if odd else result(x=x),
                errors.DtypeMismatchError,
                r"key 'x', rank 1: dtype torch.float64 differs from rank 0's torch.float32",
            ),
            (
                "trailing shape",
                result(x=jagged(torch.zeros(5, 2), [2, 3])) if odd else result(x=x),
                errors.ShapeMismatchError,
                r"key 'x', rank 1: trailing shape \(2,\) differs from rank 0's \(\)",
            ),
            (
                "layout",
                result(x=torch.zeros(2)) if odd else result(x=x),
                errors.ShapeMismatchError,
                r"key 'x', rank 1: layout dense differs from rank 0's jagged",
            ),
            (
                "bad result",
                {"model_output": {"x": [1, 2]}} if odd else result(x=x),
                errors.UnsupportedSettingError,
                r"rank 1: key 'x': an output must be a tensor, got list",
            ),
        ]
        for name, mine, error, pattern in cases:
            _expect(f"gather_batch, {name}", lambda mine=mine: torch_impl.gather_batch(mine), error, pattern, rank)
        # not a rebatch error on rank 1 (its tensor has no data to send): RankFailedError elsewhere
        if odd:
            _expect(
                "gather_batch, meta tensor",
                lambda: torch_impl.gather_batch(result(x=torch.zeros(2, device="meta"))),
                NotImplementedError,
                r"meta",
                rank,
            )
        else:
            _expect(
                "gather_batch, meta tensor",
                lambda: torch_impl.gather_batch(result(x=torch.zeros(2))),
                errors.RankFailedError,
                r"rank 1 failed: NotImplementedError",
                rank,
            )
        # the last stage's result is bad: every rank raises, naming it
        last = world - 1
        bad = {"model_output": {"x": x}, "metrics": None}
        _expect(
            "broadcast_from_last_stage",
            lambda: torch_impl.broadcast_from_last_stage(bad if rank == last else {}),
            errors.UnsupportedSettingError,
            rf"rank {last}: metrics must be a dict, got NoneType",
            rank,
        )
        # a row over the token budget on one rank, before the count is synchronised
        data = global_batch(rows=6, seed=rank)
        if odd:
            data = torch_impl.take(global_batch(rows=6, seed=rank), list(range(6)))
            data["input_ids"] = jagged(
                torch.zeros(6 * MAX_TOKENS, dtype=torch.int64), [MAX_TOKENS * 2] + [0] * 4 + [MAX_TOKENS * 4]
            )
        _expect(
            "prepare_micro_batches_dp",
            lambda: torch_impl.prepare_micro_batches_dp(data, max_token_len=MAX_TOKENS),
            errors.TokenBudgetError,
            rf"rank 1: row 0: length {MAX_TOKENS * 2} exceeds the token budget of {MAX_TOKENS}",
            rank,
        )
        # the group still works
        whole = torch_impl.gather_batch(result(x=x))
        assert whole["model_output"]["x"].size(0) == 2 * world
        dist.barrier()
    finally:
        dist.destroy_process_group()
