"""Today's ``torch_impl.postprocess_batch_func`` against the same function at an older commit, side by
side in one run, quiet and with one busy process per core; plus today's code against a same-bytes clone.

Both implementations have the same package names (``ref``, ``torch_impl``), so each runs in a worker
process of its own: the baseline's with ``PYTHONPATH`` at an extract of the commit's ``ref``,
``torch_impl`` and ``property_tests`` (``git archive``, cached under ``.cache/``), today's with this
checkout's. The harness drives the workers alternately, round by round (order shuffled each round, as
`rebatch.bench.run.median_times`): a worker times its own calls while the other waits on its pipe,
so both meet the same state of the machine, and within a round both calling threads run on the same
core (the rounds take the cores in turn, `_medians`). Each worker builds identical inputs from the same seed
(plain torch, no code of either implementation), and the results are checked bit-equal (a digest of
every output's bytes and offsets) before any timing.

    python -m rebatch.bench.versus [--commit 3c468db6] [--grid targets|acceptance|smoke|quick|standard]
                                   [--contended] [--out docs/versus.json] [--docs docs/benchmarks.md]

Prints a table: case, baseline ms, today ms, baseline / today (quiet and contended), today / clone
(the ms columns medians of all calls, the ratios medians of each round's paired ratio); then the issue's
targets (item 2: fixed cost and speed-ups against the commit; item 3: large outputs
against a same-bytes clone). ``--out`` writes the run's JSON; ``--docs`` then fills that page's regions
from it (`rebatch.figures`: the tables and figures; the prose around them is the page's own).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .tables import markdown, row_line
from .timing import timed_alone
from .workers import IMPL_ENV, ROOT, Worker, baseline_root, describe, serve

__all__ = ["TARGETS", "main", "refresh_docs", "targets_grid", "versus"]

DEFAULT_COMMIT = "3c468db6"


# ---------------------------------------------------------------------------------------------------
# The worker: one process per implementation, JSON lines on stdin/stdout.


def _inputs(case: Any, seed: int = 0) -> tuple[list[dict[str, Any]], list[list[int]], list[Any]]:
    """``output_lst``, ``indices`` and each key's whole values for ``case`` (as
    `rebatch.bench.cases.make_inputs`, built with plain torch so both workers build the same bytes)."""
    import numpy as np
    import torch

    from .cases import lengths_for, micro_batch_indices

    lengths = lengths_for(case, seed)
    indices = micro_batch_indices(case, seed)
    offsets = np.zeros(case.rows + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(lengths)
    feature = (5,) if case.ndim == 3 else ()
    dtype = getattr(torch, case.dtype)
    outs: list[dict[str, Any]] = [{"model_output": {}, "loss": torch.tensor(0.0)} for _ in indices]
    wholes = []
    for k in range(case.keys):
        values = torch.randn(
            (int(offsets[-1]), *feature), generator=torch.Generator().manual_seed(seed + k)
        ).to(dtype)
        wholes.append(values)
        for o, part in zip(outs, indices, strict=True):
            rows = np.asarray(part, dtype=np.int64)
            starts, ends = offsets[rows], offsets[rows + 1]
            take = np.concatenate([np.arange(s, e) for s, e in zip(starts, ends, strict=True)])
            piece_offsets = np.zeros(len(part) + 1, dtype=np.int64)
            piece_offsets[1:] = np.cumsum(ends - starts)
            piece = torch.nested.nested_tensor_from_jagged(
                values[torch.from_numpy(take)], torch.from_numpy(piece_offsets)
            )
            o["model_output"][f"key{k}"] = piece
    return outs, indices, wholes


def _digest(result: dict[str, Any]) -> str:
    """A digest of every output's bytes (and a jagged one's offsets), key by key."""
    import torch

    h = hashlib.sha256()
    for key, t in result["model_output"].items():
        h.update(repr((key, str(t.dtype), t.is_nested)).encode())
        parts = [t.values(), t.offsets()] if t.is_nested else [t]
        for p in parts:
            p = p.detach().contiguous()
            h.update(repr(tuple(p.shape)).encode())
            h.update(p.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _witness_data(case: Any, seed: int = 0, *, witness: bool = True) -> Any:
    """verl's ``data`` for ``case``: a TensorDict holding ``use_dynamic_bsz`` and the batch's ``input_ids``
    (zeros, the case's row lengths, original order), from which the drop-in reads the alignment witness;
    without ``witness``, the same ``data`` with ``input_ids`` under another name (read by nobody)."""
    import numpy as np
    import torch
    from tensordict import TensorDict

    from .cases import lengths_for

    lengths = lengths_for(case, seed)
    offsets = np.zeros(case.rows + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(lengths)
    ids = torch.nested.nested_tensor_from_jagged(
        torch.zeros(int(offsets[-1]), dtype=torch.int64), torch.from_numpy(offsets)
    )
    from tensordict import NonTensorData

    return TensorDict(
        {"input_ids" if witness else "ids": ids, "use_dynamic_bsz": NonTensorData(True)}, batch_size=[]
    )


def _provenanced_data(case: Any, outs: list[Any], indices: Any) -> Any:
    """`_witness_data` recorded as rebatch's split records what it hands out (`torch_impl._alignment`):
    micro-batch ``m`` holding output ``m``'s jagged keys as its fields, as verl's engines build each
    output on its micro-batch's offsets, so every output is proven by its nested ints."""
    from tensordict import TensorDict

    from torch_impl.testing import record

    data = _witness_data(case)
    micro_batches = []
    for o, p in zip(outs, indices, strict=True):
        fields = {str(k): v for k, v in o["model_output"].items() if v.is_nested}
        micro_batches.append(TensorDict(fields, batch_size=[len(p)]))
    record(data, micro_batches, indices)
    return data


def _clones(wholes: list[Any]) -> list[Any]:
    """One clone of each key's whole values: a buffer of the output's bytes."""
    return [w.clone() for w in wholes]


# Complex by design: one branch for each command of the worker protocol.
def _worker() -> int:  # noqa: C901
    """Serve the harness: ``setup`` (a case: inputs built, a warm-up call, the result's digest),
    ``time`` (``n`` calls of ``impl`` or ``clone``, each timed alone after returning the C heap's free
    pages; with ``core``, the calling thread on that core alone meanwhile), ``pair`` (``n`` pairs of
    calls of two functions ``fns``, alternated, timed as ``time`` times: `rebatch.bench.checkcost`),
    ``quit``."""
    import torch

    import torch_impl

    from .cases import Case
    from .contention import on_core

    torch.zeros(2**20).fill_(1)  # torch's thread pool started now, on every core, before any turn pins
    call: Callable[..., Any] = torch_impl.postprocess_batch_func
    data_of: Callable[[Any], Any] = lambda case: None  # noqa: E731
    if os.environ.get(IMPL_ENV) == "verl":  # verl's own function (importable in verl's pins environment)
        from tensordict import TensorDict

        from property_tests.trainer_import import import_trainer_module

        call = import_trainer_module("verl.workers.engine.utils").postprocess_batch_func
        data_of = lambda case: TensorDict({}, batch_size=[])  # noqa: E731  (verl's defaults, as ours)

    fns: dict[str, Callable[[], Any]] = {}

    def handle(msg: dict[str, Any]) -> dict[str, Any] | None:
        reply: dict[str, Any]
        if msg["cmd"] == "setup":
            fns.clear()
            case = Case(*msg["case"])
            outs, indices, wholes = _inputs(case)
            data = data_of(case)
            if msg.get(
                "checked"
            ):  # the same data to both: rebatch's recorded by a split, which verl's ignores
                data = (
                    _witness_data(case)
                    if os.environ.get(IMPL_ENV) == VERL
                    else _provenanced_data(case, outs, indices)
                )
            fns["impl"] = functools.partial(call, outs, indices, data)
            fns["witnessed"] = functools.partial(
                torch_impl.postprocess_batch_func, outs, indices, _witness_data(case)
            )
            fns["unwitnessed"] = functools.partial(
                torch_impl.postprocess_batch_func, outs, indices, _witness_data(case, witness=False)
            )
            if msg.get("provenance"):
                fns["provenanced"] = functools.partial(
                    torch_impl.postprocess_batch_func, outs, indices, _provenanced_data(case, outs, indices)
                )
            fns["clone"] = functools.partial(_clones, wholes)
            result = fns["impl"]()
            reply = {"digest": _digest(result), "torch": torch.__version__, "torch_impl": torch_impl.__file__}
            if msg.get("witness"):
                reply["witnessed_digest"] = _digest(fns["witnessed"]())
            if msg.get("provenance"):
                reply["witnessed_digest"] = _digest(fns["provenanced"]())
            del result
            warm = []
            for _ in range(3):  # the warm cost of a call, which sets the calls per turn
                start = time.perf_counter()
                fns["impl"]()
                warm.append(time.perf_counter() - start)
            reply["first"] = min(warm)
        elif msg["cmd"] == "time":
            fn = fns[msg["fn"]]
            with on_core(msg.get("core")):
                times = [timed_alone(fn) for _ in range(msg["n"])]
            reply = {"times": times}
        elif msg["cmd"] == "pair":  # two functions call by call, each pair in a shuffled order
            pair = [fns[name] for name in msg["fns"]]
            rng = random.Random(msg["seed"])
            paired: tuple[list[float], list[float]] = ([], [])
            with on_core(msg.get("core")):
                for _ in range(msg["n"]):
                    for k in rng.sample((0, 1), 2):
                        paired[k].append(timed_alone(pair[k]))
            reply = {"times": paired}
        else:
            return None
        return reply

    return serve(handle)


# ---------------------------------------------------------------------------------------------------
# The harness.


def _medians(
    workers: dict[str, tuple[Worker, str]],
    first: dict[str, float],
    *,
    min_time: float,
    rounds: int,
    seed: int,
    cores: list[int] | None = None,
) -> dict[str, float]:
    """Median seconds per call of each (worker, function), in rounds of shuffled order; each turn is
    ``n`` calls of that function, ``n`` set from its own warm cost (``first[name]``, or the warm-up
    turn's call where lower or not given) so that every function's turn lasts about 20 ms, at most 50 calls:
    a turn's first calls run in caches the other worker's turn has just used, and a cheap function
    given the turn length of a dear one would be timed mostly cold. Also ``speedup`` and ``vs_clone``:
    the medians over rounds of each round's ``baseline / today`` and ``today / clone`` (the turns'
    medians), a paired estimate that a slower or faster phase of a shared machine, lasting longer than
    a round, cancels out of; and ``<name>_first``: the median over turns of each turn's first call.
    ``cores``: in round ``r`` every turn's calling thread runs on ``cores[r % len(cores)]`` alone (torch's
    own threads stay free), so that a core slower than the others for a while (measured on this 2-core
    machine, a Python loop pinned to each: 282-309 ms on core 0, 177-270 ms on core 1, alternating)
    weighs on both implementations alike, not on whichever worker the scheduler left there."""
    calls: dict[str, int] = {}
    for name, (w, fn) in workers.items():  # a warm-up turn each
        cost = min(w.ask(cmd="time", fn=fn, n=1)["times"][0], first.get(name, math.inf))
        calls[name] = max(1, min(50, int(0.02 / max(cost, 1e-6))))
    times: dict[str, list[float]] = {name: [] for name in workers}
    firsts: dict[str, list[float]] = {name: [] for name in workers}
    paired: dict[str, list[float]] = {"speedup": [], "vs_clone": []}
    order = list(workers)
    rng = random.Random(seed)
    spent = 0.0
    done = 0
    while done < rounds or (spent < min_time and done < 3 * rounds):
        rng.shuffle(order)
        turn: dict[str, float] = {}
        pin = {"core": cores[done % len(cores)]} if cores else {}
        for name in order:
            w, fn = workers[name]
            t = w.ask(cmd="time", fn=fn, n=calls[name], **pin)["times"]
            times[name] += t
            firsts[name].append(t[0])
            turn[name] = statistics.median(t)
            spent += sum(t)
        if {"baseline", "today", "clone"} <= turn.keys():
            paired["speedup"].append(turn["baseline"] / turn["today"])
            paired["vs_clone"].append(turn["today"] / turn["clone"])
        done += 1
    result = {name: statistics.median(t) for name, t in times.items()}
    result.update({f"{name}_first": statistics.median(t) for name, t in firsts.items()})
    result.update({name: statistics.median(r) for name, r in paired.items() if r})
    return result


def targets_grid() -> list[Any]:
    """The cases of issue 25's items 2 and 3."""
    from .cases import Case

    return [
        Case(8, 16, 4, 1, "float32", 2),  # the fixed cost: at most 0.2 ms
        Case(1024, 512, 64, 5, "float32", 2),  # at least 2x the commit
        Case(1024, 512, 16, 1, "float32", 2),  # at least 1.5x the commit
        Case(16384, 4096, 16, 1, "float32", 2),  # >= 64M elements: within 1.5x of a clone
    ]


TARGETS = "targets"
ACCEPTANCE = "acceptance"
#: ``--commit verl``: verl's own function as the baseline.
VERL = "verl"


def versus(
    cases: list[Any],
    commit: str,
    *,
    contended: bool,
    rounds: int = 7,
    min_time: float = 0.5,
    log: Any = None,
    checked: bool = False,
) -> dict[str, Any]:
    """``commit``: a commit of this repository, or ``verl`` (verl's own function, in this environment).
    ``checked``: today's drop-in given ``data`` with the batch's ``input_ids``, recorded by a split (the
    alignment witness and exact provenance both checking every call; `_provenanced_data`), and the
    commit's drop-in the same (a commit with `torch_impl.testing`, issue 58's), or verl's own function the
    same ``data`` (`_witness_data`: the settings it reads are read from it as from ours)."""
    from .contention import busy_processes, core_count, cores

    base = Worker(ROOT, verl=True) if commit == VERL else Worker(baseline_root(commit))
    today = Worker(ROOT)
    rows = []
    try:
        fns = {"baseline": (base, "impl"), "today": (today, "impl"), "clone": (today, "clone")}
        start = time.perf_counter()
        for i, case in enumerate(cases):
            a = base.ask(cmd="setup", case=list(case), checked=checked)
            b = today.ask(cmd="setup", case=list(case), checked=checked)
            for w, reply in ((base, a), (today, b)):
                if not Path(reply["torch_impl"]).resolve().is_relative_to(w.root.resolve()):
                    raise AssertionError(f"a worker for {w.root} imported {reply['torch_impl']}")
            if a["digest"] != b["digest"]:
                raise AssertionError(f"{case.name}: the baseline's result and today's differ")
            first = {"baseline": a["first"], "today": b["first"]}
            row: dict[str, Any] = {"case": case._asdict(), "name": case.name, "elements": case.elements}
            timing = functools.partial(
                _medians, fns, first, min_time=min_time, rounds=rounds, seed=i, cores=cores()
            )
            row["quiet"] = timing()
            if contended:
                with busy_processes():
                    row["contended"] = timing()
            rows.append(row)
            if log is not None:
                print(f"[{time.perf_counter() - start:6.0f}s] {row_line(row)}", file=log, flush=True)
    finally:
        base.close()
        today.close()
    if commit == VERL:
        import importlib.metadata

        commit = f"verl {importlib.metadata.version('verl')}"
    return {
        "commit": commit,
        "today": describe(),
        "torch": a["torch"] if cases else None,
        "checked": checked,
        "busy_processes": core_count() if contended else 0,
        "pinned": cores(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "rows": rows,
    }


def refresh_docs(page: str) -> list[str]:
    """Fill the regions of ``page`` (``docs/benchmarks.md``, ``docs/witness.md``) from the JSON files they
    name, the one ``--out`` just wrote among them, with `rebatch.figures` (as its ``--write``); the pages
    changed. The page's prose is its own: this writes none of it."""
    from .. import figures

    name = Path(page).resolve().relative_to(figures.ROOT).as_posix()
    return figures.write(figures.ROOT, pages=(name,))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rebatch.bench.versus",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--commit", default=DEFAULT_COMMIT, help="a commit, or verl: verl's own function (pins env)"
    )
    parser.add_argument(
        "--grid",
        default=TARGETS,
        help="targets (issue 25's cases), acceptance (the standard grid and the targets), or a grid of "
        "rebatch.bench.cases",
    )
    parser.add_argument(
        "--contended", action="store_true", help="also time every case with one busy process per core"
    )
    parser.add_argument(
        "--checked",
        action="store_true",
        help="today's drop-in with the witness and exact provenance checking every call",
    )
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument(
        "--docs",
        help="with --out: fill this page's regions from their JSON (rebatch.figures --write, this page only)",
    )
    parser.add_argument(
        "--witness",
        action="store_true",
        help="the alignment witness's cost instead: with it against without, paired",
    )
    parser.add_argument(
        "--provenance",
        action="store_true",
        help="with --witness: exact provenance's cost instead (the witnessed call with data a split "
        "recorded, paired)",
    )
    args = parser.parse_args(argv)
    if args.docs and not args.out:
        parser.error("--docs fills the page from the JSON files it names: give --out too")
    if args.worker:
        return _worker()
    if args.witness:
        from .checkcost import checks_cost, checks_markdown, witness_grid

        results = checks_cost(witness_grid(), rounds=args.rounds, log=sys.stderr, provenance=args.provenance)
        results["command"] = "python -m rebatch.bench.versus " + " ".join(
            argv if argv is not None else sys.argv[1:]
        )
        print("\n".join(checks_markdown(results)))
        if args.out:
            Path(args.out).write_text(json.dumps(results, indent=1))
        if args.docs:
            refresh_docs(args.docs)
        return 0
    from .cases import grid

    if args.grid == TARGETS and args.commit == VERL:
        from .cases import TARGET_CASES

        cases = list(TARGET_CASES)
    elif args.grid == TARGETS:
        cases = targets_grid()
    elif args.grid == ACCEPTANCE:  # the standard grid and the targets it lacks
        cases = grid("standard")
        cases += [c for c in targets_grid() if c not in cases]
    else:
        cases = grid(args.grid)
    results = versus(
        cases, args.commit, contended=args.contended, rounds=args.rounds, log=sys.stderr, checked=args.checked
    )
    results["command"] = "python -m rebatch.bench.versus " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    print("\n".join(markdown(results)))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    if args.docs:
        refresh_docs(args.docs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
