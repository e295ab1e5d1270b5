"""The trainers' drop-ins today against the same functions at an older commit, side by side in one run.

verl's drop-in has `rebatch.bench.versus`; this times the others, each on its own trainer's form of one
batch (built with plain torch from one seed, so both workers build the same bytes): miles'
``aggregate_forward_results`` (its split unrecorded, and recorded as ``get_data_iterator`` records it),
SkyRL's ``reorder_and_combine_items`` and AReaL's ``reorder_and_pad_outputs``, each witnessed. Each
implementation runs in a worker process of its own (`rebatch.bench.workers`), driven alternately round by
round (the order shuffled each round, a round's turns on one core, as `rebatch.bench.versus` does), and their
results are checked equal before any timing. None of the trainers is imported: the drop-ins take their
inputs by the attributes they read.

    python -m rebatch.bench.trainers [--commit 5035639] [--rounds 15] [--only NAME] [--out FILE]

Prints a table: trainer, case, baseline ms, today ms, baseline / today (the median of each round's
paired ratio; above 1: today is faster).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import statistics
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from property_tests.markdown import table

from .contention import cores
from .timing import timed_alone
from .workers import ROOT, Worker, baseline_root, describe, serve

__all__ = ["CASES", "TrainerCase", "main", "trainers_versus"]

#: The commit before issue 70's work (one checked core): the baseline of its speed check.
DEFAULT_COMMIT = "5035639"


class TrainerCase(NamedTuple):
    """One timed call: ``trainer`` (``miles``, ``miles_recorded``, ``skyrl_items``, ``areal``), ``rows``
    in ``micro_batches``, each row's tokens drawn from ``1..max_len``."""

    trainer: str
    rows: int
    micro_batches: int
    max_len: int = 64

    @property
    def name(self) -> str:
        return f"{self.trainer} B={self.rows} M={self.micro_batches}"


#: Every trainer at the small call, a middle one and B=1024 in 16 micro-batches.
CASES = [
    TrainerCase(trainer, rows, micro_batches)
    for trainer in ("miles", "miles_recorded", "skyrl_items", "areal")
    for rows, micro_batches in ((8, 2), (64, 4), (1024, 16))
]


def _batch(case: TrainerCase, seed: int) -> tuple[list[int], list[list[int]]]:
    """Each row's length and the micro-batches' rows (shuffled, then cut in equal parts)."""
    import torch

    gen = torch.Generator(device="cpu").manual_seed(seed)
    lengths = torch.randint(1, case.max_len + 1, (case.rows,), generator=gen, device="cpu").tolist()
    order = torch.randperm(case.rows, generator=gen, device="cpu").tolist()
    step = -(-case.rows // case.micro_batches)
    parts = [sorted(order[a : a + step]) for a in range(0, case.rows, step)]
    return lengths, parts


def _miles_call(case: TrainerCase, lengths: list[int], parts: list[list[int]]) -> Callable[[], Any]:
    import torch

    from torch_impl.integrations import miles

    it = types.SimpleNamespace(
        rollout_data={"response_lengths": list(lengths), "total_lengths": [n + 4 for n in lengths]},
        micro_batch_size=None,
        micro_batch_indices=[list(p) for p in parts],
        offset=0,
    )
    if case.trainer == "miles_recorded":
        miles.INTEGRATION.records[(miles.DATA, "get_data_iterator")](lambda: ([it], [len(parts)]))()
    store = [
        {
            "log_probs": [torch.full((lengths[i],), float(i), device="cpu") for i in p],
            "entropy": [torch.full((lengths[i],), -float(i), device="cpu") for i in p],
        }
        for p in parts
    ]
    args = types.SimpleNamespace(use_dynamic_batch_size=True, qkv_format="thd")
    return lambda: miles.aggregate_forward_results(store, it, args)


def _skyrl_call(lengths: list[int], parts: list[list[int]]) -> Callable[[], Any]:
    import torch

    from torch_impl.integrations import skyrl

    width = max(lengths)
    mask = torch.zeros(len(lengths), width, dtype=torch.int64, device="cpu")
    for i, n in enumerate(lengths):
        mask[i, width - n :] = 1
    iterator = types.SimpleNamespace(
        _microbatches=[list(p) for p in parts],
        _num_padding_microbatches=0,
        data={"response_mask": mask},
    )
    iterator.data = _Data(iterator.data, len(lengths))
    batches = [[{"logprobs": [float(i)] * lengths[i], "loss": float(i)} for i in p] for p in parts]
    return lambda: skyrl.reorder_and_combine_items(iterator, batches)


class _Data(dict[str, Any]):
    """SkyRL's ``TrainingInputBatch`` as its iterator's restore reads it: its fields and ``batch_size``."""

    def __init__(self, fields: dict[str, Any], rows: int) -> None:
        super().__init__(fields)
        self.batch_size = rows


def _areal_call(lengths: list[int], parts: list[list[int]]) -> Callable[[], Any]:
    import torch

    from torch_impl.integrations import areal

    forward = [i for p in parts for i in p]
    backward = [0] * len(forward)
    for position, row in enumerate(forward):
        backward[row] = position
    mbs = []
    outputs = []
    for p in parts:
        cu = torch.tensor([0, *(sum(lengths[i] for i in p[: k + 1]) for k in range(len(p)))], device="cpu")
        mbs.append({"cu_seqlens": cu.to(torch.int32)})
        outputs.append(torch.arange(int(cu[-1]), dtype=torch.float32, device="cpu"))
    mb_list = types.SimpleNamespace(forward_indices=forward, backward_indices=backward, mbs=mbs)
    return lambda: areal.reorder_and_pad_outputs(outputs, list(lengths), mb_list)


def make_call(case: TrainerCase, seed: int = 0) -> Callable[[], Any]:
    """The drop-in call of ``case`` on its batch (``seed``'s)."""
    lengths, parts = _batch(case, seed)
    if case.trainer.startswith("miles"):
        return _miles_call(case, lengths, parts)
    if case.trainer == "skyrl_items":
        return _skyrl_call(lengths, parts)
    return _areal_call(lengths, parts)


def _digest(result: Any) -> str:
    """A digest of a result's values (tensors by their bytes, in order), to check both workers agree."""
    import torch

    h = hashlib.sha256()

    def walk(x: Any) -> None:
        if isinstance(x, torch.Tensor):
            h.update(str((x.dtype, tuple(x.shape))).encode())
            h.update(x.detach().contiguous().view(torch.uint8).numpy().tobytes())
        elif isinstance(x, dict):
            for k in x:
                h.update(repr(k).encode())
                walk(x[k])
        elif isinstance(x, list | tuple):
            for v in x:
                walk(v)
        else:
            h.update(repr(x).encode())

    walk(result)
    return h.hexdigest()


def _worker() -> int:
    """A worker: ``setup`` (a case: its call built, made once, its digest), ``time`` (``n`` calls)."""
    from .contention import on_core

    state: dict[str, Callable[[], Any]] = {}

    def handle(msg: dict[str, Any]) -> dict[str, Any] | None:
        if msg["cmd"] == "setup":
            call = make_call(TrainerCase(*msg["case"]))
            state["call"] = call
            first = timed_alone(call)
            return {"digest": _digest(call()), "first": first}
        if msg["cmd"] == "time":
            with on_core(msg.get("core")):
                return {"times": [timed_alone(state["call"]) for _ in range(msg["n"])]}
        return None

    return serve(handle)


def trainers_versus(
    cases: list[TrainerCase], commit: str, *, rounds: int = 15, log: Any = None
) -> dict[str, Any]:
    """Each case timed in both workers, paired round by round: ``baseline``, ``today`` (ms) and
    ``speedup`` (the median of each round's ``baseline / today``)."""
    module = "rebatch.bench.trainers"
    workers = {
        "baseline": Worker(baseline_root(commit), module=module),
        "today": Worker(ROOT, module=module),
    }
    rows = []
    try:
        pinned = cores()
        for i, case in enumerate(cases):
            replies = {name: w.ask(cmd="setup", case=list(case)) for name, w in workers.items()}
            if replies["baseline"]["digest"] != replies["today"]["digest"]:
                raise AssertionError(f"{case.name}: today's result differs from the commit's")
            calls = max(1, min(50, int(0.02 / max(min(r["first"] for r in replies.values()), 1e-6))))
            timed = _paired(workers, calls=calls, rounds=rounds, seed=i, cores=pinned)
            row = {
                "case": case._asdict(),
                "name": case.name,
                "baseline_ms": 1e3 * timed["baseline"],
                "today_ms": 1e3 * timed["today"],
                "speedup": timed["speedup"],
            }
            rows.append(row)
            if log is not None:
                print(f"{case.name}: {_line(row)}", file=log, flush=True)
    finally:
        for w in workers.values():
            w.close()
    return {
        "commit": commit,
        "today": describe(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "rounds": rounds,
        "rows": rows,
    }


def _paired(
    workers: dict[str, Worker], *, calls: int, rounds: int, seed: int, cores: list[int]
) -> dict[str, float]:
    """Each worker's median seconds a call over ``rounds`` rounds of ``calls`` calls (the order shuffled
    each round, every turn of a round on one core), and ``speedup``, the median of each round's
    ``baseline / today`` (a slower phase of a shared machine longer than a round cancels out)."""
    rng = random.Random(seed)
    order = list(workers)
    for name in order:  # a warm-up turn each
        workers[name].ask(cmd="time", n=1)
    times: dict[str, list[float]] = {name: [] for name in order}
    ratios = []
    for r in range(rounds):
        rng.shuffle(order)
        pin = {"core": cores[r % len(cores)]} if cores else {}
        turn = {}
        for name in order:
            got = workers[name].ask(cmd="time", n=calls, **pin)["times"]
            times[name] += got
            turn[name] = statistics.median(got)
        ratios.append(turn["baseline"] / turn["today"])
    result = {name: statistics.median(t) for name, t in times.items()}
    result["speedup"] = statistics.median(ratios)
    return result


def _line(row: dict[str, Any]) -> str:
    return f"{row['baseline_ms']:.3f} ms -> {row['today_ms']:.3f} ms, {row['speedup']:.3f}x"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rebatch.bench.trainers",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--commit", default=DEFAULT_COMMIT, help="the baseline commit")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--only", default="", help="the cases whose name holds this (default: every case)")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args(argv)
    if args.worker:
        return _worker()
    cases = [case for case in CASES if args.only in case.name]
    results = trainers_versus(cases, args.commit, rounds=args.rounds, log=sys.stderr)
    results["command"] = "python -m rebatch.bench.trainers " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    header = ["case", "baseline ms", "today ms", "baseline / today"]
    body = [
        [r["name"], f"{r['baseline_ms']:.3f}", f"{r['today_ms']:.3f}", f"{r['speedup']:.3f}x"]
        for r in results["rows"]
    ]
    print("\n".join(table(header, body)))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
