"""What verl's shadow mode costs: verl's ``postprocess_batch_func`` alone against the same call through
``install(mode="shadow")`` on unsampled calls (rebatch's checks only) and on sampled ones (rebatch's
function too, and the bit-exact comparison). Needs verl (the pins environment).

    python -m rebatch.bench.shadow [--rows 256] [--micro-batches 8] [--max-len 512] [--device cpu] [--threads
    1] [--min-time 0.5]

Prints one line per variant: the median seconds per call (`torch.utils.benchmark`) and the ratio to verl
alone.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch

from property_tests.trainer_import import import_trainer_module

from .timing import median_seconds

#: Each variant is timed (`timing.median_seconds`) for at least this many seconds.
MIN_RUN_TIME = 0.5


def _step(rows: int, micro_batches: int, max_len: int, device: str) -> tuple[list[dict[str, Any]], Any, Any]:
    """An engine-style step: jagged float32 log-probs and bfloat16 entropy, a dense value head, a loss
    and metrics per micro-batch, the rows shuffled into ``micro_batches`` partitions."""
    from tensordict import NonTensorData, TensorDict

    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, max_len + 1, (rows,), generator=g)
    perm = torch.randperm(rows, generator=g).tolist()
    parts = [perm[m::micro_batches] for m in range(micro_batches)]
    outs = []
    for part in parts:
        lens = [int(lengths[i]) for i in part]
        n = sum(lens)
        offsets = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device=device)
        lp = torch.nested.nested_tensor_from_jagged(torch.randn(n, generator=g).to(device), offsets)
        ent = torch.nested.nested_tensor_from_jagged(
            torch.randn(n, generator=g).to(device, torch.bfloat16), offsets
        )
        values = torch.randn(len(part), 4, generator=g).to(device)
        outs.append(
            {
                "model_output": {"log_probs": lp, "entropy": ent, "values": values},
                "loss": torch.tensor(1.0),
                "metrics": {"lr": 1e-6, "kl": [0.1, 0.2]},
            }
        )
    data = TensorDict({}, batch_size=[])
    data["use_dynamic_bsz"] = NonTensorData(True)
    return outs, parts, data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--micro-batches", type=int, default=8)
    parser.add_argument("--max-len", type=int, default=512)
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--min-time", type=float, default=MIN_RUN_TIME, help="seconds to time each variant for, at least"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch's CPU threads (1: steadier timings)")
    args = parser.parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        return _measure(args)
    finally:
        torch.set_num_threads(threads)


def _measure(args: argparse.Namespace) -> int:
    from torch_impl.integrations import verl as integration

    engine = import_trainer_module("verl.workers.engine.fsdp.transformer_impl")
    outs, parts, data = _step(args.rows, args.micro_batches, args.max_len, args.device)
    call = lambda: engine.postprocess_batch_func(outs, parts, data)  # noqa: E731
    call()  # warm both paths
    alone = median_seconds(call, min_run_time=args.min_time)
    rows = [("verl alone", alone)]
    for label, sample in (
        ("shadow, unsampled calls (checks only)", 0.0),
        ("shadow, every call sampled", 1.0),
    ):
        integration.install(mode="shadow", sample=sample)
        try:
            call()  # the first call is always sampled
            rows.append((label, median_seconds(call, min_run_time=args.min_time)))
        finally:
            integration.uninstall()
    where = f"{args.device}, {args.threads} thread(s), torch {torch.__version__}"
    print(f"{args.rows} rows, {args.micro_batches} micro-batches, lengths 1..{args.max_len}, {where}:")
    for label, seconds in rows:
        print(f"  {label:40s} {seconds * 1e3:8.3f} ms  x{seconds / alone:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
