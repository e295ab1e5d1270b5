"""The device path measured here, today's code beside an older commit's, side by side in one run.

On a GPU a call is bound by its host work and its kernel launches (``docs/gpu.md``). Without a GPU,
both are measured on this machine for each trainer's call:

- **time**: the call with the device kernel forced on CPU tensors (``Settings.kernel =
  "element_indices"``, and where the code has it ``Settings.plan_on_device``: the accelerator's plan,
  `torch_impl._devplan`), so that every torch operation a GPU would launch runs here, each a few
  microseconds of issue cost on small data;
- **launches** and **reads**: the call traced on fake CUDA tensors (`property_tests.fakecuda`, that
  commit's own tracer), what stays on the host in a trainer left there.

Each commit's code runs in a worker process of its own (`rebatch.bench.workers.Worker`, its ``ref``,
``torch_impl`` and ``property_tests`` extracted from git); the harness alternates the two workers turn by
turn (the order shuffled each round), each turn timing a number of calls of one case, and reports the
medians and the median of the rounds' paired ratios. Both workers build the same inputs from one seed
(plain torch: lengths log-normal around 32, ``M = max(2, B // 64)`` micro-batches, every key of a
micro-batch on its one offsets tensor as verl's engines build them) and the results are checked equal
(a digest of every value and offset) before any timing.

Cases: verl's ``postprocess_batch_func`` at B = 8, 1024, 16384 with one and five keys, plain (``data``
holding only ``use_dynamic_bsz``) and checked (``data`` holding the batch's ``input_ids`` on the host and
recorded by rebatch's split: the alignment witness and exact provenance on); AReaL's
``reorder_and_pad_outputs`` (once a key) and SkyRL's ``reorder_and_combine_batches`` at B = 1024.

    python -m rebatch.bench.devicepath [--commit 2d635f6] [--rounds 9] [--out docs/devicepath.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from .workers import Worker, baseline_root, serve

__all__ = ["BEFORE", "CASES", "Case", "main", "measure"]

#: The commit before issue 56's work (its parent: keys on one offsets tensor each planned alone).
BEFORE = "2d635f6"
#: Every key of the cases is float32 log-probs, rows of mean length `MEAN_LENGTH`.
MEAN_LENGTH = 32
#: The workers' module (``__name__`` is ``__main__`` when run with ``-m``).
_MODULE = "rebatch.bench.devicepath"
#: Seconds of calls a worker makes a turn (at least `MIN_CALLS`).
TURN_SECONDS = 0.05
MIN_CALLS = 3


class Case(NamedTuple):
    """One call: ``trainer`` (``verl``, ``areal``, ``skyrl``), ``rows`` (B), ``keys``, ``checked`` (verl's
    ``data`` carrying the batch's ``input_ids``, recorded by rebatch's split)."""

    trainer: str
    rows: int
    keys: int
    checked: bool = False

    @property
    def name(self) -> str:
        checked = " checked" if self.checked else ""
        return f"{self.trainer} B={self.rows} keys={self.keys}{checked}"

    @property
    def micro_batches(self) -> int:
        return max(2, self.rows // 64)


#: The cases of the issue's item 4.
CASES: tuple[Case, ...] = (
    *(Case("verl", b, k, checked) for checked in (False, True) for b in (8, 1024, 16384) for k in (1, 5)),
    *(Case(trainer, 1024, k) for trainer in ("areal", "skyrl") for k in (1, 5)),
)


#: `main`'s ``--smoke`` cases: each trainer's call, plain and checked, at B = 8.
SMOKE: tuple[Case, ...] = (
    Case("verl", 8, 1),
    Case("verl", 8, 5, True),
    Case("areal", 8, 1),
    Case("skyrl", 8, 2),
)


def _batch(case: Case, seed: int = 0) -> tuple[list[int], list[list[int]], list[list[Any]]]:
    """The case's row lengths, its micro-batches' rows, and each micro-batch's keys ``[b_m, (j)]``, all on
    the micro-batch's one offsets tensor (plain torch)."""
    import numpy as np
    import torch

    rng = np.random.default_rng(seed)
    raw = rng.lognormal(0.0, 1.0, size=case.rows)
    lengths = np.maximum(1, np.round(raw / raw.mean() * MEAN_LENGTH)).astype(np.int64)
    order = rng.permutation(case.rows)
    bounds = np.linspace(0, case.rows, case.micro_batches + 1).astype(int)
    partitions = [order[a:b].tolist() for a, b in itertools.pairwise(bounds)]
    generator = torch.Generator(device="cpu").manual_seed(seed)
    keys = []
    for part in partitions:
        piece = lengths[part]
        offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(piece)]).astype(np.int64))
        values = [torch.randn(int(offsets[-1]), generator=generator, device="cpu") for _ in range(case.keys)]
        keys.append([torch.nested.nested_tensor_from_jagged(v, offsets) for v in values])
    return lengths.tolist(), partitions, keys


def _has(package: Any, *path: str) -> bool:
    """Whether the worker's own ``package`` (this checkout's, or an older commit's extract) has the module
    ``path``: its file is there. (An import would not tell: the project's editable install finds a module
    the extract lacks in this checkout instead.)"""
    return Path(package.__file__).parent.joinpath(*path).with_suffix(".py").is_file()


def _verl_data(
    case: Case, lengths: list[int], outs: list[dict[str, Any]], partitions: list[list[int]]
) -> Any:
    """verl's ``data``: ``use_dynamic_bsz``, and where checked the batch's ``input_ids`` on the host,
    recorded as rebatch's split records the micro-batches it hands out (each output's keys their fields)."""
    import torch
    from tensordict import NonTensorData, TensorDict

    import torch_impl

    entries: dict[str, Any] = {"use_dynamic_bsz": NonTensorData(True)}
    if not case.checked:
        return TensorDict(entries, batch_size=[])
    ids = torch.zeros(sum(lengths), dtype=torch.int64, device="cpu")
    entries["input_ids"] = torch_impl.from_packed(ids, lengths)
    data = TensorDict(entries, batch_size=[])
    if _has(torch_impl, "testing"):
        from torch_impl.testing import record
    else:  # an older commit's code (before issue 58's public testing namespace): its own (no module here)
        from torch_impl._provenance import record  # type: ignore[no-redef]

    fields = [dict(o["model_output"]) for o in outs]
    micro_batches = [TensorDict(f, batch_size=[len(p)]) for f, p in zip(fields, partitions, strict=True)]
    record(data, micro_batches, partitions)
    return data


def _call(case: Case, move: Callable[[Any], Any]) -> Callable[[], Any]:
    """The case's call of today's or the older commit's drop-in, its device data moved with ``move``."""
    import torch_impl

    lengths, partitions, keys = _batch(case)
    if case.trainer == "verl":
        outs = [{"model_output": {f"k{k}": x for k, x in enumerate(ks)}} for ks in keys]
        data = _verl_data(case, lengths, outs, partitions)
        moved = move(outs)
        return lambda: torch_impl.postprocess_batch_func(moved, partitions, data)
    if case.trainer == "areal":
        from torch_impl.integrations import areal

        forward = [i for p in partitions for i in p]
        backward = [0] * case.rows
        for k, i in enumerate(forward):
            backward[i] = k
        mb_list = types.SimpleNamespace(forward_indices=forward, backward_indices=backward)
        packed = move([[ks[k].values() for ks in keys] for k in range(case.keys)])
        return lambda: [areal.reorder_and_pad_outputs(p, lengths, mb_list) for p in packed]
    if case.trainer == "skyrl":
        import property_tests

        if _has(property_tests, "trainers", "skyrl"):
            from property_tests.trainers.skyrl import Batch
        else:  # an older commit's kit (before issue 58's one module a trainer)
            from property_tests.sidebyside import Batch  # type: ignore[no-redef,attr-defined]
        from torch_impl.integrations import skyrl

        width = max(lengths)
        batches = []
        for ks in keys:
            padded = {f"k{k}": x.to_padded_tensor(0.0, (x.size(0), width)) for k, x in enumerate(ks)}
            batches.append(Batch(padded))
        it = types.SimpleNamespace(
            _microbatches=partitions, _token_counts=[1] * case.rows, _num_padding_microbatches=0, data=None
        )
        moved_batches = move([dict(b) for b in batches])  # plain dicts: a tree's nodes
        return lambda: skyrl.reorder_and_combine_batches(it, [Batch(b) for b in moved_batches])
    raise ValueError(f"unknown trainer {case.trainer!r}")


def _forced(call: Callable[[], Any]) -> Callable[[], Any]:
    """``call`` with the device path forced on CPU tensors, as far as this commit's code has it: the
    device kernel, and the accelerator's plan (an older commit: its device kernel after its host plan)."""
    import dataclasses

    import torch_impl

    settings: dict[str, Any] = {"kernel": "element_indices", "plan_on_device": True}
    if "plan_on_device" not in {f.name for f in dataclasses.fields(torch_impl.Settings)}:
        del settings["plan_on_device"]

    def forced() -> Any:
        with torch_impl.use_settings(**settings):
            return call()

    return forced


def _digest(result: Any) -> str:
    """A digest of every tensor of a result (a nested tensor's values and offsets)."""
    import hashlib

    import torch

    h = hashlib.sha256()
    for t in _tensors(result):
        for p in (t.values(), t.offsets()) if t.is_nested else (t,):
            p = p.detach().contiguous()
            h.update(repr((tuple(p.shape), str(p.dtype))).encode())
            h.update(p.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _tensors(tree: Any) -> list[Any]:
    """Every tensor of a result (mappings, lists and tuples walked in order), by plain Python: the workers
    run older commits' code too, which may lack today's helpers."""
    import torch

    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, dict):
        return [t for v in tree.values() for t in _tensors(v)]
    if isinstance(tree, list | tuple):
        return [t for v in tree for t in _tensors(v)]
    return []


def _trace(case: Case) -> dict[str, int]:
    """The case's call traced on fake CUDA by this commit's own tracer: launches and host reads."""
    from property_tests.fakecuda import FakeCuda, fake_like

    fc = FakeCuda()
    call = _call(case, lambda x: fake_like(x, fc))
    with fc:
        call()
    trace = fc.trace()
    return {"launches": len(trace.launches), "reads": trace.syncs}


def _worker() -> int:
    """Serve the harness on stdin/stdout: ``setup`` (a case: its forced call built, a warm-up, the
    result's digest, the warm time of one call, the fake-CUDA trace), ``time`` (``n`` calls, each timed),
    ``quit``."""
    made: dict[str, Callable[[], Any]] = {}  # the case's forced call, once set up

    def handle(msg: dict[str, Any]) -> dict[str, Any] | None:
        reply: dict[str, Any]
        if msg["cmd"] == "setup":
            case = Case(*msg["case"])
            fn = made["call"] = _forced(_call(case, lambda x: x))
            reply = {"digest": _digest(fn()), **_trace(case)}
            warm = []
            for _ in range(3):
                start = time.perf_counter()
                fn()
                warm.append(time.perf_counter() - start)
            reply["first"] = min(warm)
        elif msg["cmd"] == "time":
            fn = made["call"]
            times = []
            for _ in range(msg["n"]):
                start = time.perf_counter()
                fn()
                times.append(time.perf_counter() - start)
            reply = {"times": times}
        else:
            return None
        return reply

    return serve(handle)


def measure(cases: tuple[Case, ...], commit: str, *, rounds: int, log: Any = None) -> dict[str, Any]:
    """Each case, today's code against ``commit``'s, alternated turn by turn: medians, paired ratio,
    launches and reads of each."""
    root = Path(__file__).resolve().parents[2]
    before = Worker(baseline_root(commit), module=_MODULE)
    today = Worker(root, module=_MODULE)
    rows = []
    try:
        for case in cases:
            a = before.ask(cmd="setup", case=list(case))
            b = today.ask(cmd="setup", case=list(case))
            if a["digest"] != b["digest"]:
                raise RuntimeError(f"{case.name}: the two commits' results differ")
            n = max(MIN_CALLS, round(TURN_SECONDS / max(a["first"], b["first"], 1e-6)))
            times: dict[str, list[float]] = {"before": [], "today": []}
            ratios = []
            rng = random.Random(0)
            for _ in range(rounds):
                turn: dict[str, float] = {}
                for name in rng.sample(["before", "today"], 2):
                    worker = before if name == "before" else today
                    got = worker.ask(cmd="time", n=n)["times"]
                    times[name] += got
                    turn[name] = statistics.median(got)
                ratios.append(turn["before"] / turn["today"])
            row = {
                "case": case.name,
                "trainer": case.trainer,
                "rows": case.rows,
                "keys": case.keys,
                "checked": case.checked,
                "micro_batches": case.micro_batches,
                "before_ms": statistics.median(times["before"]) * 1e3,
                "today_ms": statistics.median(times["today"]) * 1e3,
                "before_over_today": statistics.median(ratios),
                "launches_before": a["launches"],
                "launches_today": b["launches"],
                "reads_before": a["reads"],
                "reads_today": b["reads"],
            }
            rows.append(row)
            if log is not None:
                print(_line(row), file=log, flush=True)
    finally:
        before.close()
        today.close()
    import torch

    return {
        "commit": commit,
        "rounds": rounds,
        "torch": torch.__version__,
        "machine": _machine(),
        "command": "python -m rebatch.bench.devicepath",
        "rows": rows,
    }


def _machine() -> str:
    import os
    import platform

    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"


def _line(row: dict[str, Any]) -> str:
    return (
        f"{row['case']}: {row['before_ms']:.3f} ms -> {row['today_ms']:.3f} ms "
        f"({row['before_over_today']:.2f}x), launches {row['launches_before']} -> {row['launches_today']}, "
        f"reads {row['reads_before']} -> {row['reads_today']}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rebatch.bench.devicepath", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--commit", default=BEFORE, help=f"the older commit (default {BEFORE})")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument(
        "--smoke", action="store_true", help="one small case a trainer, two rounds (the tests' run)"
    )
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args(argv)
    if args.worker:
        return _worker()
    cases = CASES
    rounds = args.rounds
    if args.smoke:
        cases = SMOKE
        rounds = 2
    results = measure(cases, args.commit, rounds=rounds, log=sys.stderr)
    if args.out is not None:
        from .gpu_model import _write_atomically

        _write_atomically(args.out, json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
