"""Run the differential properties against any candidate ``postprocess_batch``: a conformance suite.

As array-api-tests runs against any array namespace, this runs the properties that compare
``postprocess_batch`` results with the oracles (the original rows, ``ref``, the plain-NumPy
implementation `property_tests.numpy_impl`, verl's algorithm where it applies, and the error classes of
the table of defects) against a candidate named ``module:function``::

    python -m property_tests.conformance --candidate torch_impl:postprocess_batch [--max-examples 100]
    REBATCH_CANDIDATE=my_pkg.ops:postprocess_batch_func python -m pytest property_tests/test_conformance.py

The candidate is called as ``postprocess_batch(output_lst, indices, *, use_dynamic_bsz, pad_mode)`` (with
``witness=`` and ``provenance=``, as ``torch_impl.postprocess_batch`` takes them, where a bad input carries
them), or, when its signature has a ``data`` parameter, as verl's ``postprocess_batch_func(output_lst,
indices, data)`` with the settings in a TensorDict ``data`` (as ``NonTensorData``; with a provenance, the
batch rebatch's split recorded). Inputs and results are torch tensors (jagged nested tensors and dense
tensors). The default candidate is ``torch_impl.postprocess_batch``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from .candidates import CONFORMANCE, load_candidate, run_conformance, use_candidate

__all__ = [
    "CONFORMANCE",
    "DEFAULT_CANDIDATE",
    "ENV_VAR",
    "load_candidate",
    "use_candidate",
    "run_conformance",
    "main",
]

DEFAULT_CANDIDATE = "torch_impl:postprocess_batch"
ENV_VAR = "REBATCH_CANDIDATE"


def candidate_from_env() -> str:
    """The candidate named by ``REBATCH_CANDIDATE``, or the default (``torch_impl:postprocess_batch``)."""
    return os.environ.get(ENV_VAR) or DEFAULT_CANDIDATE


def main(argv: list[str] | None = None) -> int:
    from .peers import PEERS

    parser = argparse.ArgumentParser(
        prog="python -m property_tests.conformance",
        description=__doc__,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    parser.add_argument(
        "--candidate",
        default=candidate_from_env(),
        help=f"module:function, or a trainer's name ({', '.join(PEERS)}: its own function through its "
        "adapter) (default: %(default)s)",
    )
    parser.add_argument("--max-examples", type=int, default=100)
    parser.add_argument("--cases", type=int, default=500, help="a trainer's differential: valid calls drawn")
    parser.add_argument("--json", metavar="PATH", help="a trainer's report, saved as JSON")
    parser.add_argument(
        "--report", metavar="MARKDOWN", help="write docs/peers.md from the JSON reports given as arguments"
    )
    parser.add_argument(
        "--check", action="store_true", help="with --report: fail if the table of outcomes differs"
    )
    parser.add_argument("reports", nargs="*", help="JSON reports (with --report)")
    args = parser.parse_args(argv)
    if args.report:
        return _write_report(args.report, args.reports, check=args.check)
    if args.candidate in PEERS:
        return _peer(args.candidate, args)
    failed = 0
    for name in CONFORMANCE:
        start = time.perf_counter()
        why = run_conformance(args.candidate, max_examples=args.max_examples, names=(name,))[name]
        print(
            f"{'ok  ' if why is None else 'FAIL'} {name:<32} {time.perf_counter() - start:5.1f}s  {why or ''}"
        )
        failed += why is not None
    print(f"{args.candidate}: {len(CONFORMANCE) - failed} of {len(CONFORMANCE)} conformance properties hold")
    return 1 if failed else 0


def _peer(name: str, args: argparse.Namespace) -> int:
    """A trainer's report: differential, properties, defects, speed; exit 1 on a difference or a failed
    property."""
    import json

    from .peer_report import measure
    from .peers import PEERS

    try:
        PEERS[name].theirs()
    except ImportError as err:
        print(f"{PEERS[name].label} is not installed in this environment ({err}): see .ci/peers.sh")
        return 2
    report = measure(name, cases=args.cases, max_examples=args.max_examples)
    diff = report["differential"]
    print(
        f"{report['label']}: {diff['cases']} valid calls, {len(diff['differences'])} differences from "
        "rebatch's drop-in"
    )
    for line in diff["differences"][:5]:
        print(f"  {line}")
    for prop, why in report["properties"].items():
        print(f"{'ok  ' if why is None else 'FAIL'} {prop:<32} {why or ''}")
    for d in report["defects"]:
        limit = f" (known limit: {d['limit']})" if d.get("limit") else ""
        print(
            f"  {d['name']:<40} {d['source']:<6} {report['label']}: {d['theirs']:<32} rebatch: "
            f"{d['ours']}{limit}"
        )
    for sp in report["speed"]:
        print(
            f"  B={sp['B']} L={sp['mean_length']} M={sp['M']}: {report['label']} {sp['theirs_ms']:.2f} ms, "
            f"rebatch {sp['ours_ms']:.2f} ms ({sp['speedup']:.1f}x)"
        )
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    wrong = [
        d
        for d in report["defects"]
        if d["ours"] != f"raises {d['expected']}"
        and d["ours"] != "n/a"
        and not d.get("undetectable")
        and not (d.get("limit") and d["ours"] == "silent")  # measured, a known limit: not a failure
    ]
    for d in wrong:
        print(f"FAIL rebatch's drop-in on {d['name']}: {d['ours']}, expected raises {d['expected']}")
    failed = (
        bool(diff["differences"]) or any(v is not None for v in report["properties"].values()) or bool(wrong)
    )
    return 1 if failed else 0


def _write_report(path: str, sources: list[str], *, check: bool) -> int:
    from .peer_report import OUTCOMES_BEGIN, OUTCOMES_END, load, outcomes_section, render

    reports = load(sources)
    if check:
        with open(path) as f:
            text = f.read()
        committed = text[text.index(OUTCOMES_BEGIN) : text.index(OUTCOMES_END) + len(OUTCOMES_END)]
        if committed != "\n".join(outcomes_section(reports)):
            print(f"{path}: the table of outcomes differs from the trainers' reports; regenerate it")
            return 1
        print(f"{path}: the table of outcomes matches the trainers' reports")
        return 0
    with open(path, "w") as f:
        f.write(render(reports))
    print(f"wrote {path} from {len(reports)} reports")
    return 0


if __name__ == "__main__":
    sys.exit(main())
