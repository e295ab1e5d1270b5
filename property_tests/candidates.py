"""A candidate ``postprocess_batch`` loaded and run against the conformance properties.

`load_candidate` imports a candidate named ``module:function`` (adapting verl's ``postprocess_batch_func``
signature), `use_candidate` puts it where the properties call ``torch_impl.postprocess_batch``, and
`run_conformance` runs the properties of `CONFORMANCE` against it. Both `property_tests.conformance` (the
command line) and the trainers' reports (`property_tests.peers`, `property_tests.peer_report`) use these;
this module imports neither of them.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any
from unittest import mock

from . import properties as properties_mod
from .properties import PROPERTIES, pass_or_fail
from .trainer_import import import_trainer_module

__all__ = ["CONFORMANCE", "load_candidate", "use_candidate", "run_conformance"]

#: The properties run against a candidate: each calls ``postprocess_batch`` only through the candidate.
CONFORMANCE = ("postprocess_agrees", "postprocess_agrees_with_numpy", "malformed_rejected_alike")


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
        fn = import_trainer_module(module_name)  # a trainer's own function among them (verl's)
        for part in attr.split("."):
            fn = getattr(fn, part)
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}  # type: ignore[assignment]
    if "data" not in params:
        return fn

    def as_postprocess_batch(
        output_lst: Any,
        indices: Any,
        *,
        use_dynamic_bsz: Any = True,
        pad_mode: Any = "no_padding",
        witness: Any = None,
        provenance: Any = None,
    ) -> Any:
        from .data import verl_data

        data = verl_data(
            use_dynamic_bsz=use_dynamic_bsz, pad_mode=pad_mode, witness=witness, provenance=provenance
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
    """Within the block, the properties call the candidate wherever they call
    ``torch_impl.postprocess_batch``."""
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
