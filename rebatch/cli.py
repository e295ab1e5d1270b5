"""The ``rebatch`` command (also ``python -m rebatch``): check, bench, fuzz, report."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys

from .bench import BENCHMARKS

__all__ = ["main"]

DUMP_HELP = """\
To capture a real step in verl, add two lines at the top of postprocess_batch_func
(verl/workers/engine/utils.py):
    import torch
    torch.save((output_lst, indices, data), "/tmp/rebatch_dump.pt")
then run: rebatch check --dump /tmp/rebatch_dump.pt \
[--candidate verl.workers.engine.utils:postprocess_batch_func]
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rebatch", description="Reassemble micro-batch outputs exactly; verify, benchmark, fuzz."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser(
        "check",
        help="verify reassembly bit for bit on an embedded RL step or a dump",
        description="With no arguments: build a realistic RL step (256 prompts x 8 responses, long-tailed "
        "lengths), split it under a token budget, run a stand-in model, reassemble with torch_impl and "
        "verify it against the original rows, the JAX reference and a per-row baseline. Exit 0 when all "
        "agree, 1 on a mismatch, 2 for an unusable dump.",
        epilog=DUMP_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    check.add_argument(
        "--dump", metavar="FILE", help="a torch.save'd (output_lst, indices, data) from a real step"
    )
    check.add_argument(
        "--candidate", metavar="MODULE:FUNCTION", help="also verify this function (e.g. verl's) on the dump"
    )
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    bench = sub.add_parser(
        "bench",
        help="run a benchmark (rebatch bench NAME [ARGS...]); alone, the grid: JSON, a Markdown table and "
        "a plot",
        usage="%(prog)s NAME [ARGS...]\n"
        "       %(prog)s [--quick] [--grid GRID] [--device DEVICE] [--out OUT] [--json] [--contended]",
        description="NAME: run that benchmark with its own ARGS (also python -m rebatch.bench.MODULE "
        "ARGS...).\nNo NAME: the benchmark grid (the options below).",
        epilog=_benchmarks_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    bench.add_argument("--quick", action="store_true", help="a small grid (about a minute)")
    bench.add_argument(
        "--grid",
        choices=["quick", "standard", "large", "full"],
        help="the grid (default standard; --quick = quick; large: outputs of at least 64M elements)",
    )
    bench.add_argument("--device", default="cpu", help="cpu or cuda")
    bench.add_argument(
        "--out", default="docs", help="folder for benchmarks.json, benchmarks.md and benchmarks.png"
    )
    bench.add_argument("--json", action="store_true", help="print the results as JSON")
    bench.add_argument(
        "--contended", action="store_true", help="also time every case with one busy process per core"
    )
    fuzz = sub.add_parser("fuzz", help="run the property suite under the fuzz profile")
    fuzz.add_argument("--minutes", type=float, default=10.0, help="time budget (default 10)")
    report = sub.add_parser(
        "report",
        help="the reports of many processes (shadow and on mode) in one table; exit 1 on a difference or a "
        "defect",
        description="Read reports (REBATCH_REPORT_DIR: one JSON a process) and print, per trainer, function "
        "and mode, the processes, calls, sampled calls, differences, defects, errors, both functions' "
        "seconds and the rows. Exit 0 when clean, 1 on a difference or a defect, 2 for anything that is "
        "not a report.",
    )
    report.add_argument(
        "paths", nargs="+", metavar="PATH", help="report files, or directories of them (rebatch-*-*-*-*.json)"
    )
    return parser


def _benchmarks_help() -> str:
    """The benchmarks' names, each with its line, for ``rebatch bench --help``."""
    width = max(map(len, BENCHMARKS))
    lines = [f"  {name:<{width}}  {b.help}" for name, b in BENCHMARKS.items()]
    return "benchmarks (rebatch bench NAME --help: its arguments):\n" + "\n".join(lines)


def _bench(name: str, argv: list[str]) -> int:
    """``rebatch bench NAME ARGS...``: the benchmark's ``main`` given ``ARGS``
    (`rebatch.bench.BENCHMARKS`)."""
    bench = BENCHMARKS.get(name)
    if bench is None:
        print(
            f"rebatch bench: unknown benchmark {name!r} (choose from {', '.join(BENCHMARKS)})",
            file=sys.stderr,
        )
        return 2
    if missing := _missing(*bench.needs):
        print(f"rebatch bench {name} needs {missing}: pip install 'rebatch[test]'", file=sys.stderr)
        return 2
    module = importlib.import_module(f"{__package__}.bench.{bench.module}")
    code: int = module.main([*bench.args, *argv])
    return code


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"] and len(argv) > 1 and not argv[1].startswith("-"):
        return _bench(argv[1], argv[2:])
    args = _parser().parse_args(argv)
    if args.command == "check":
        from .check import run_check

        return run_check(args.dump, args.candidate, args.json)
    if args.command == "bench":
        if missing := _missing("matplotlib"):
            print(f"rebatch bench needs {missing}: pip install 'rebatch[test]'", file=sys.stderr)
            return 2
        from .bench.run import run_bench

        return run_bench(
            quick=args.quick,
            device=args.device,
            out=args.out,
            as_json=args.json,
            grid_name=args.grid,
            contended=args.contended,
        )
    if args.command == "report":
        from .report import main as report_main

        return report_main(args.paths)
    if missing := _missing("hypothesis"):
        print(f"rebatch fuzz needs {missing}: pip install 'rebatch[test]'", file=sys.stderr)
        return 2
    from property_tests.fuzz import main as fuzz_main

    return fuzz_main(["--minutes", str(args.minutes)])


def _missing(*modules: str) -> str:
    """The first of ``modules`` that cannot be imported ("" if all can)."""
    return next((m for m in modules if importlib.util.find_spec(m) is None), "")


if __name__ == "__main__":
    sys.exit(main())
