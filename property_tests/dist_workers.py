"""Worker processes for the multi-rank tests (importable, so ``torch.multiprocessing`` can spawn them).

Each rank takes its shard of one deterministic global batch, makes data-parallel micro-batches, runs a
stand-in model (`property_tests.models`: element-wise, so any batching gives the same rows), reassembles,
gathers, broadcasts,
and checks every result against the single-process answer; a mismatch raises in the worker.
"""

from __future__ import annotations

import datetime
import os
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.distributed as dist
from tensordict import TensorDict

from .compare import assert_same
from .data import jagged, random_tensor
from .models import stand_in_model
from .trainer_import import import_trainer_module

__all__ = [
    "check_budget_and_rank_order",
    "check_rank",
    "compare_with_verl",
    "global_batch",
    "init_group",
    "raise_on_one_rank",
    "run_in_threads",
    "shard_bounds",
]

MAX_TOKENS = 20


class Pair(NamedTuple):
    """A named-tuple metric value: it travels whole, as itself (not walked as a tuple of fields)."""

    rank: int
    next_rank: int


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


#: Set by `run_in_threads` while it runs: the ranks are threads of this process, joined by torch's
#: threaded process group (from torch's own test utilities) over this store.
_thread_store: Any = None


def init_group(rank: int, world: int, port: int, timeout_s: float) -> None:
    """Join rank ``rank`` of ``world`` to a gloo group on ``port`` (or the threaded group of
    `run_in_threads`)."""
    if _thread_store is not None:
        dist.init_process_group(
            "threaded",
            rank=rank,
            world_size=world,
            store=_thread_store,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        return
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

    init_group(rank, world, port, 60)
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
        for m in padded:  # a padding micro-batch is a copy of the rank's first row (no rows if it has none)
            assert_same(
                micro.batches[m]["input_ids"], torch_impl.take(shard, [0] if hi > lo else [])["input_ids"]
            )
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
        assert result["metrics"].get("padding", []) == [False] * len(kept), (
            "a padding micro-batch leaked into metrics"
        )
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
        if world >= 3:  # a subgroup of ranks 0 and 1: its own last stage, its own gather
            sub = dist.new_group([0, 1])
            if rank in (0, 1):
                first_two = [shard_bounds(data.batch_size[0], world)[r] for r in (0, 1)]
                got = torch_impl.broadcast_from_last_stage(result if rank == 1 else {}, group=sub)
                rows_1 = torch_impl.take(data, list(range(*first_two[1])))
                assert_same(got["model_output"], stand_in_model(rows_1["input_ids"]))
                both = torch_impl.gather_batch(result, group=sub)
                rows_01 = torch_impl.take(data, list(range(first_two[0][0], first_two[1][1])))
                assert_same(both["model_output"], stand_in_model(rows_01["input_ids"]))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def raise_on_one_rank(rank: int, world: int, port: int, timeout_s: float) -> None:
    """Rank 1 fails before the collective; the others must fail too, by the group's timeout, not hang."""
    import torch_impl

    init_group(rank, world, port, timeout_s)
    if rank == 1:
        raise RuntimeError("rank 1 failed on purpose")
    torch_impl.gather_batch({"model_output": {"x": torch.zeros(2)}, "loss": [], "metrics": {}})


def compare_with_verl(rank: int, world: int, port: int) -> None:
    """Each rank (different lengths per rank) plans with rebatch's and verl's ``rearrange_micro_batches``
    over the whole group, for several budgets and options: the same partitions on every rank, or both
    raise. Where verl raises on some ranks only (verl 0.8.0 and 0.9.0 check the count against a rank's
    groups locally; the other ranks would wait in the next collective), rebatch raises on every rank
    (docs/spec.md). verl builds its all-reduce tensors on ``get_device_name()`` ("cuda" even without a
    GPU): pointed at the CPU here, as verl's own CPU test does."""
    from torch_impl.integrations import verl as integration

    verl_sb: Any = import_trainer_module("verl.utils.seqlen_balancing")

    ours_fn = integration.replacements()[
        integration.SEQLEN_BALANCING, "rearrange_micro_batches"
    ]  # this release's
    verl_sb.get_device_name = lambda: "cpu"
    init_group(rank, world, port, 60.0)
    try:
        rng = np.random.default_rng(100 + rank)
        for trial in range(12):
            rows = int(rng.integers(2 + rank, 9 + 2 * rank))
            lengths = [int(n) for n in rng.choice([1, 2, 3, 5, 8], size=rows)]
            n = sum(lengths)
            data = TensorDict({"input_ids": jagged(torch.arange(n), lengths)}, batch_size=[rows])
            budget = int(rng.integers(8, 14))
            kwargs: dict[str, Any] = {
                "dp_group": dist.group.WORLD,
                "min_num_micro_batch": [None, 2, 3][trial % 3],
                "num_batches_divided_by": [None, 2][trial % 2],
                "use_dynamic_bsz_balance": bool(trial % 4),
            }
            outcomes = []
            for fn in (ours_fn, verl_sb.rearrange_micro_batches):
                try:
                    outcomes.append(("ok", fn(data, budget, **kwargs)[1]))
                except Exception as err:  # compared below: both raise, or the same partitions
                    outcomes.append(("raised", type(err).__name__))
            (ours_kind, ours), (theirs_kind, theirs) = outcomes
            kinds: list[Any] = [None] * world
            dist.all_gather_object(kinds, theirs_kind)
            if "raised" in kinds:  # verl raised on some rank: rebatch raises on every rank
                theirs_kind = "raised"
            assert ours_kind == theirs_kind, (rank, trial, outcomes, kinds)
            if ours_kind == "ok":
                assert ours == theirs, (rank, trial, lengths, budget, kwargs, ours, theirs)
            dist.barrier()
    finally:
        dist.destroy_process_group()


#: Per-rank row lengths for a budget of 12: rank 0's initial count (2, of 24 tokens) does not fit (7 + 7
#: cannot be apart in 2 sets with 7 as well), rank 1 fits in 1 and would keep 2; the count must be raised
#: to 3 on every rank after the first MAX.
BUDGET_LENGTHS = [[7, 7, 7, 1, 1, 1], [2, 3], [5, 5, 5, 5]]
BUDGET = 12


def check_budget_and_rank_order(rank: int, world: int, port: int) -> None:
    """The token budget holds on every rank after the count sync; gather_batch keeps rank order for every
    field (jagged and dense outputs, losses, list and tuple metrics)."""
    from tensordict import TensorDict

    import torch_impl

    init_group(rank, world, port, 60)
    try:
        lengths = BUDGET_LENGTHS[rank % len(BUDGET_LENGTHS)]
        data = TensorDict(
            {"input_ids": jagged(torch.arange(sum(lengths)), lengths)}, batch_size=[len(lengths)]
        )
        micro = torch_impl.prepare_micro_batches_dp(data, max_token_len=BUDGET)
        counts: list[Any] = [None] * world
        dist.all_gather_object(counts, len(micro.batches))
        assert len(set(counts)) == 1, f"micro-batch counts differ between ranks: {counts}"
        for p in micro.indices:
            if p is not torch_impl.PADDING:
                assert sum(lengths[i] for i in p) <= BUDGET, f"rank {rank}: {p} exceeds the budget {BUDGET}"
        # verl's engine signature: with a group, the count is agreed by default (same_micro_num_in_dp=True)
        _, engine = torch_impl.prepare_micro_batches(
            data, dist.group.WORLD, max_token_len=BUDGET, pad_micro_batches=True
        )
        assert engine == micro.indices, (rank, engine, micro.indices)
        # without a group, each rank plans alone (no collective), even with the process group initialised
        _, alone = torch_impl.rearrange_micro_batches(data, BUDGET)
        assert alone == torch_impl.balanced_partitions(lengths, BUDGET), (rank, alone)
        # a result whose every field names its rank
        result = {
            "model_output": {
                "dense": torch.full((rank + 1, 2), float(rank)),
                "jagged": jagged(torch.full((rank + 2,), rank), [rank + 2]),
                "empty": torch.zeros(0, 2),  # no bytes to send
            },
            "loss": [torch.tensor(float(rank)), float(rank) + 0.5],
            "metrics": {"r": [rank, rank], "t": (rank,), "pair": Pair(rank, rank + 1)},
        }
        whole = torch_impl.gather_batch(result)
        ranks = range(world)
        assert_same(
            whole["model_output"]["dense"], torch.cat([torch.full((r + 1, 2), float(r)) for r in ranks])
        )
        assert_same(
            whole["model_output"]["jagged"],
            jagged(torch.cat([torch.full((r + 2,), r) for r in ranks]), [r + 2 for r in ranks]),
        )
        assert_same(whole["model_output"]["empty"], torch.zeros(0, 2))
        assert_same(whole["loss"], [x for r in ranks for x in (torch.tensor(float(r)), float(r) + 0.5)])
        assert whole["metrics"] == {
            "r": [r for r in ranks for _ in range(2)],
            "t": [(r,) for r in ranks],
            "pair": [Pair(r, r + 1) for r in ranks],
        }
        assert all(type(p) is Pair for p in whole["metrics"]["pair"])
        # results without a single tensor (no bytes on any rank)
        bare = torch_impl.gather_batch({"loss": [float(rank)], "metrics": {"r": rank}})
        assert bare == {"model_output": {}, "loss": [float(r) for r in ranks], "metrics": {"r": list(ranks)}}
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _expect(
    name: str, fn: Any, error: type[BaseException], pattern: str, rank: int, budget_s: float = 15.0
) -> None:
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

    init_group(rank, world, port, 60)
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
                "trailing shape, the other way",
                result(x=x) if odd else result(x=jagged(torch.zeros(5, 2), [2, 3])),
                errors.ShapeMismatchError,
                r"key 'x', rank 1: trailing shape \(\) differs from rank 0's \(2,\)",
            ),
            (
                "layout",
                result(x=torch.zeros(2)) if odd else result(x=x),
                errors.ShapeMismatchError,
                r"key 'x', rank 1: layout dense differs from rank 0's jagged",
            ),
            (
                "layout, the other way",
                result(x=x) if odd else result(x=torch.zeros(2)),
                errors.ShapeMismatchError,
                r"key 'x', rank 1: layout jagged differs from rank 0's dense",
            ),
            (
                "scalar output",
                result(x=torch.tensor(1.0)) if odd else result(x=x),
                errors.ShapeMismatchError,
                r"rank 1: key 'x': a dense output needs a leading batch dimension, got a scalar",
            ),
            (
                "bad result",
                {"model_output": {"x": [1, 2]}} if odd else result(x=x),
                errors.UnsupportedSettingError,
                r"rank 1: key 'x': an output must be a tensor, got list",
            ),
        ]
        for name, mine, error, pattern in cases:
            _expect(
                f"gather_batch, {name}", lambda mine=mine: torch_impl.gather_batch(mine), error, pattern, rank
            )
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
        # a well-formed misalignment on one rank (two of its rows of other lengths swapped in its indices,
        # after the micro-batch count was agreed): the alignment witness raises there, before that call
        # returns; the others' calls return; no collective of rebatch's is left waiting (docs/spec.md)
        shard = global_batch(rows=12, seed=10 + rank)
        micro = torch_impl.prepare_micro_batches_dp(shard, max_token_len=MAX_TOKENS)
        outs = [{"model_output": stand_in_model(mb["input_ids"])} for mb in micro.batches]
        lengths = shard["input_ids"].offsets().diff().tolist()
        indices: list[Any] = [p if p is torch_impl.PADDING else list(p) for p in micro.indices]
        if odd:
            at = [(m, j) for m, p in enumerate(indices) if p is not torch_impl.PADDING for j in range(len(p))]
            a, b = next(
                (u, v) for u in at for v in at if lengths[indices[u[0]][u[1]]] != lengths[indices[v[0]][v[1]]]
            )
            indices[a[0]][a[1]], indices[b[0]][b[1]] = indices[b[0]][b[1]], indices[a[0]][a[1]]
            _expect(
                "postprocess_batch_func, misaligned",
                lambda: torch_impl.postprocess_batch_func(outs, indices, shard),
                errors.MisalignmentError,
                # the split's provenance sees the indices first; the witness where nothing was recorded
                r"micro-batch \d+(: this output holds micro-batch \d+'s rows of split \d+"
                r"|, position \d+: \d+ values restored as original row)",
                rank,
            )
        mine = torch_impl.postprocess_batch_func(outs, micro.indices, shard)  # aligned: every rank passes
        assert_same(mine["model_output"], stand_in_model(shard["input_ids"]))
        # the group still works
        whole = torch_impl.gather_batch(result(x=x))
        assert whole["model_output"]["x"].size(0) == 2 * world
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_in_threads(worker: Any, world: int, *, timeout_s: float = 60.0) -> None:
    """``worker(rank, world, 0)`` with each rank a thread of this process (torch's threaded process group
    from ``torch.testing._internal``): the workers above in seconds, without spawning processes (the
    first stage of the many-rank mutation session; `tests/test_distributed.py` runs them as processes
    over gloo). The first failure of any rank is raised here; the other ranks are released from their
    collectives at once."""
    import threading

    from torch_impl.testing import install_threaded_process_group, uninstall_threaded_process_group

    global _thread_store
    failures: list[BaseException] = []

    def run(rank: int) -> None:
        try:
            worker(rank, world, 0)
        except BaseException as err:  # handed to the caller below
            failures.append(err)
            threaded.ProcessLocalGroup.exception_handle(err)

    threaded = install_threaded_process_group()  # process group names per thread, as torch's own tests do
    _thread_store = dist.HashStore()
    try:
        threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout_s)
        if any(t.is_alive() for t in threads):
            raise TimeoutError(f"{worker.__name__}: ranks still running after {timeout_s} s")
        if failures:  # a SystemExit is a rank released by another's failure: the failure is what to raise
            raise next((f for f in failures if not isinstance(f, SystemExit)), failures[0])
    finally:
        _thread_store = None
        uninstall_threaded_process_group()
