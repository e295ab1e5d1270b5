"""Run the differential properties against any candidate ``postprocess_batch``: a conformance suite.

As array-api-tests runs against any array namespace, this runs the properties that compare
``postprocess_batch`` results with the oracles (the original rows, ``ref``, the plain-NumPy
implementation `property_tests.numpy_impl`, verl's algorithm where it applies, and the error classes of
the table of defects) against a candidate named ``module:function``::

    python -m property_tests.conformance --candidate torch_impl:postprocess_batch [--max-examples 100]
    REBATCH_CANDIDATE=my_pkg.ops:postprocess_batch_func python -m pytest property_tests/test_conformance.py

The candidate is called as ``postprocess_batch(output_lst, indices, *, use_dynamic_bsz, pad_mode)``, or,
when its signature has a ``data`` parameter, as verl's ``postprocess_batch_func(output_lst, indices,
data)`` with the settings in a TensorDict ``data`` (as ``NonTensorData``). Inputs and results are torch
tensors (jagged nested tensors and dense tensors). The default candidate is ``torch_impl.postprocess_batch``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any
from unittest import mock

from . import properties as properties_mod
from .properties import PROPERTIES, pass_or_fail

__all__ = ["CONFORMANCE", "DEFAULT_CANDIDATE", "ENV_VAR", "load_candidate", "use_candidate", "run_conformance", "main"]

#: The properties run against a candidate: each calls ``postprocess_batch`` only through the candidate.
CONFORMANCE = ("postprocess_agrees", "postprocess_agrees_with_numpy", "malformed_rejected_alike")
DEFAULT_CANDIDATE = "torch_impl:postprocess_batch"
ENV_VAR = "REBATCH_CANDIDATE"


def load_candidate(spec: str | Callable[..., Any]) -> Callable[..., Any]:
    """``module:function`` imported (a callable is returned as it is), adapted to ``postprocess_batch``'s
    call: a function with a ``data`` parameter is called as verl's ``postprocess_batch_func``."""
    fn: Any
    if callable(spec):
        fn = spec
    else:
        module_name, sep, attr = spec.partition(":")
        if not sep or not module_name or not attr:
            raise ValueError(f"a candidate is given as module:function, got {spec!r}")
        fn = importlib.import_module(module_name)
        for part in attr.split("."):
            fn = getattr(fn, part)
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}  # type: ignore[assignment]
    if "data" not in params:
        return fn

    def as_postprocess_batch(
        output_lst: Any, indices: Any, *, use_dynamic_bsz: Any = True, pad_mode: Any = "no_padding"
    ) -> Any:
        from tensordict import NonTensorData, TensorDict

        data = TensorDict(
            {"use_dynamic_bsz": NonTensorData(use_dynamic_bsz), "pad_mode": NonTensorData(pad_mode)}, batch_size=[]
        )
        return _dense_again(fn(output_lst, indices, data), output_lst)

    return as_postprocess_batch


def _dense_again(result: Any, output_lst: Any) -> Any:
    """verl's ``postprocess_batch_func`` returns a dense ``[B, S, *F]`` output as the jagged
    ``[B, (S), *F]``; ``postprocess_batch`` keeps it dense. Such results are made dense again (rows of
    ``S`` values each), so that a verl-signature candidate is held to ``postprocess_batch``'s meaning."""
    import torch

    first = next((o["model_output"] for o in output_lst if isinstance(o, dict) and "model_output" in o), None)
    if not isinstance(result, dict) or not isinstance(result.get("model_output"), dict) or first is None:
        return result
    model_output = dict(result["model_output"])
    for key, value in model_output.items():
        given = first.get(key) if hasattr(first, "get") else None
        if not isinstance(given, torch.Tensor) or given.is_nested or given.dim() < 2:
            continue
        if isinstance(value, torch.Tensor) and value.is_nested:
            model_output[key] = value.values().reshape(value.size(0), *given.shape[1:])
    return {**result, "model_output": model_output}


@contextlib.contextmanager
def use_candidate(spec: str | Callable[..., Any]) -> Iterator[Callable[..., Any]]:
    """Within the block, the properties call the candidate wherever they call ``torch_impl.postprocess_batch``."""
    candidate = load_candidate(spec)
    with mock.patch.object(properties_mod, "torch_postprocess", candidate):
        yield candidate


def run_conformance(
    spec: str | Callable[..., Any],
    *,
    max_examples: int = 100,
    names: tuple[str, ...] = CONFORMANCE,
    properties: Mapping[str, Any] | None = None,
) -> dict[str, str | None]:
    """Each conformance property run against the candidate: ``{name: None if it held, else the first
    failure}`` (derandomized, no shrinking: pass or fail is what a conformance run reports).
    ``properties``: the `Property` objects by name (default `PROPERTIES`; a trainer's report narrows
    their strategies to the calls the trainer can hold)."""
    report: dict[str, str | None] = {}
    table = PROPERTIES if properties is None else properties
    with use_candidate(spec):
        for name in names:
            prop = table[name]
            test = pass_or_fail(prop, max_examples=max_examples)
            try:
                test()
            except Exception as err:
                first = str(err).splitlines()[0][:200] if str(err) else ""
                report[name] = f"{type(err).__name__}: {first}"
            else:
                report[name] = None
    return report


def candidate_from_env() -> str:
    """The candidate named by ``REBATCH_CANDIDATE``, or the default (``torch_impl:postprocess_batch``)."""
    return os.environ.get(ENV_VAR) or DEFAULT_CANDIDATE


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m property_tests.conformance", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument(
        "--candidate",
        default=candidate_from_env(),
        help="module:function, or a trainer's name (verl, areal, skyrl: its own function through its adapter) "
        "(default: %(default)s)",
    )
    parser.add_argument("--max-examples", type=int, default=100)
    parser.add_argument("--cases", type=int, default=500, help="a trainer's differential: valid calls drawn")
    parser.add_argument("--json", metavar="PATH", help="a trainer's report, saved as JSON")
    parser.add_argument(
        "--report", metavar="MARKDOWN", help="write docs/peers.md from the JSON reports given as arguments"
    )
    parser.add_argument("--check", action="store_true", help="with --report: fail if the table of outcomes differs")
    parser.add_argument("reports", nargs="*", help="JSON reports (with --report)")
    args = parser.parse_args(argv)
    if args.report:
        return _write_report(args.report, args.reports, check=args.check)
    from .peers import PEERS

    if args.candidate in PEERS:
        return _peer(args.candidate, args)
    failed = 0
    for name in CONFORMANCE:
        start = time.perf_counter()
        why = run_conformance(args.candidate, max_examples=args.max_examples, names=(name,))[name]
        print(f"{'ok  ' if why is None else 'FAIL'} {name:<32} {time.perf_counter() - start:5.1f}s  {why or ''}")
        failed += why is not None
    print(f"{args.candidate}: {len(CONFORMANCE) - failed} of {len(CONFORMANCE)} conformance properties hold")
    return 1 if failed else 0


def _peer(name: str, args: argparse.Namespace) -> int:
    """A trainer's report: differential, properties, defects, speed; exit 1 on a difference or a failed property."""
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
        f"{report['label']}: {diff['cases']} valid calls, {len(diff['differences'])} differences from rebatch's drop-in"
    )
    for line in diff["differences"][:5]:
        print(f"  {line}")
    for prop, why in report["properties"].items():
        print(f"{'ok  ' if why is None else 'FAIL'} {prop:<32} {why or ''}")
    for d in report["defects"]:
        print(f"  {d['name']:<40} {d['source']:<6} {report['label']}: {d['theirs']:<32} rebatch: {d['ours']}")
    for sp in report["speed"]:
        print(
            f"  B={sp['B']} L={sp['mean_length']} M={sp['M']}: {report['label']} {sp['theirs_ms']:.2f} ms, "
            f"rebatch {sp['ours_ms']:.2f} ms ({sp['speedup']:.1f}x)"
        )
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    wrong = [d for d in report["defects"] if d["ours"] != f"raises {d['expected']}" and d["ours"] != "n/a"]
    for d in wrong:
        print(f"FAIL rebatch's drop-in on {d['name']}: {d['ours']}, expected raises {d['expected']}")
    failed = bool(diff["differences"]) or any(v is not None for v in report["properties"].values()) or bool(wrong)
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
