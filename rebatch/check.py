"""``rebatch check``: reassemble a realistic RL step (or a dump of a real one) and verify it bit for bit."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import itertools
import json
import pickletools
import re
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import torch

from property_tests.compare import same_tensor
from property_tests.data import rows_of
from property_tests.trainer_import import import_trainer_module
from rebatch_startup.trainers import by_name, names as trainer_names
from ref.errors import MisalignmentError, RebatchError
from torch_impl import postprocess_batch_func, read_setting, witness_stats
from torch_impl.testing import DUMP_FORMAT, PICKLE_NAMES_TO_ALLOW, PICKLE_NAMES_TORCH_ADMITS, check_batch_func

__all__ = ["DUMP_GLOBALS", "DumpError", "UnsafeDumpError", "first_bad_row", "run_check"]


class DumpError(Exception):
    """A dump file that cannot be used (unreadable, unsafe, or not a dump of rebatch's format)."""


def first_bad_row(got: Any, want: torch.Tensor) -> tuple[int | None, str]:
    """The first original row where ``got`` differs from ``want`` (None if identical), and what differs."""
    if not isinstance(got, torch.Tensor):
        return 0, f"not a tensor: {type(got).__name__}"
    if got.is_nested != want.is_nested or got.dtype != want.dtype:
        return (
            0,
            f"layout or dtype differs: {got.dtype} nested={got.is_nested} vs {want.dtype} "
            f"nested={want.is_nested}",
        )
    g, w = rows_of(got.detach()), rows_of(want.detach())
    bad = [i for i, (a, b) in enumerate(zip(g, w, strict=False)) if same_tensor(a, b) is not None]
    if bad:
        a, b = g[bad[0]], w[bad[0]]
        rows = ", ".join(map(str, bad[:10])) + (f" and {len(bad) - 10} more" if len(bad) > 10 else "")
        return bad[0], (
            f"got {a.tolist()[:8]}{'...' if a.numel() > 8 else ''}, "
            f"expected {b.tolist()[:8]}{'...' if b.numel() > 8 else ''} (differing original rows: {rows})"
        )
    if len(g) != len(w):
        return min(len(g), len(w)), f"{len(g)} rows, expected {len(w)}"
    return None, ""


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    """``fn()``'s result (one call), then its median seconds per call (`rebatch.bench.timing`; a slow call
    timed once)."""
    from .bench.timing import SLOW_CALL_SECONDS, median_seconds

    result = fn()
    return result, median_seconds(fn, min_run_time=MIN_RUN_TIME, once_over=SLOW_CALL_SECONDS)


def _compare(result: dict[str, Any], truth: dict[str, torch.Tensor]) -> dict[str, dict[str, Any]]:
    out = {}
    for key, want in truth.items():
        row, why = first_bad_row(result.get(key), want) if key in result else (0, "missing")
        out[key] = {"agree": row is None, "first_bad_row": row, "detail": why}
    return out


def _ref_postprocess(output_lst: Any, indices: Any, data: Any) -> Callable[[], dict[str, Any]]:
    import ref
    from ref import interop

    converted = interop.outputs_from_torch(output_lst)
    dynamic = read_setting(data, "use_dynamic_bsz", True)
    pad_mode = read_setting(data, "pad_mode", "no_padding")
    pad_mode = getattr(pad_mode, "value", pad_mode)

    def run() -> dict[str, Any]:
        res = ref.postprocess_batch(converted, indices, use_dynamic_bsz=dynamic, pad_mode=pad_mode)
        return {k: interop.to_torch(v) for k, v in res["model_output"].items()}

    return run


#: The one-line note printed when the JAX reference cannot be compared.
#: Each implementation is timed (`rebatch.bench.timing.median_seconds`) for at least this many seconds.
MIN_RUN_TIME = 0.2
NO_JAX_NOTE = "JAX reference comparison skipped: jax is not installed (pip install 'rebatch[jax]')"


def _have_jax() -> bool:
    return importlib.util.find_spec("jax") is not None


def _default_check() -> dict[str, Any]:
    from property_tests.baseline import verl_postprocess_batch_func

    from .demo import make_step

    step = make_step()
    before = witness_stats()
    result = postprocess_batch_func(step.output_lst, step.indices, step.data)
    witnessed = {k: v - before[k] for k, v in witness_stats().items()}  # of that one call
    _, t_torch = _timed(lambda: postprocess_batch_func(step.output_lst, step.indices, step.data))
    mo = result["model_output"]
    ref_mo: dict[str, Any] = {}
    t_ref = None
    if _have_jax():
        ref_mo, t_ref = _timed(_ref_postprocess(step.output_lst, step.indices, step.data))
    jagged_keys = [k for k, v in step.expected.items() if v.is_nested]
    jagged_only = [
        {**o, "model_output": {k: o["model_output"][k] for k in jagged_keys}} for o in step.output_lst
    ]
    base, t_base = _timed(lambda: verl_postprocess_batch_func(jagged_only, step.indices, step.data))
    report: dict[str, Any] = {
        "source": "embedded RL step (256 prompts x 8 responses)",
        "rows": step.rows,
        "tokens": step.tokens,
        "micro_batches": len(step.indices),
        "token_budget": step.budget,
        "keys": {
            k: {
                "shape": f"[{step.rows}, (j){''.join(f', {d}' for d in v.shape[2:])}]"
                if v.is_nested
                else str(list(v.shape)),
                "dtype": str(v.dtype).removeprefix("torch."),
                "vs_original_rows": _compare(mo, {k: v})[k],
                "vs_ref": _compare(ref_mo, {k: v})[k] if k in ref_mo else None,
                "vs_per_row_baseline": _compare(base["model_output"], {k: mo[k]})[k]
                if k in jagged_keys
                else None,
            }
            for k, v in step.expected.items()
        },
        "seconds": {"torch_impl": t_torch, "ref": t_ref, "per_row_baseline": t_base},
        "witness": {"stats": witnessed, "caught": witness_rates(step)},
        "provenance": {
            "grpo": witness_rates(make_step(split=True), proven=True),
            "fixed_length": witness_rates(make_step(split=True, fixed_length=FIXED_LENGTH), proven=True),
        },
    }
    if t_ref is None:
        report["note"] = NO_JAX_NOTE
    report["agree"] = all(
        all(c is None or c["agree"] for c in (v["vs_original_rows"], v["vs_ref"], v["vs_per_row_baseline"]))
        for v in report["keys"].values()
    ) and all(
        r["unexplained"] == 0
        for rates in (report["witness"]["caught"], *report["provenance"].values())
        for r in rates.values()
    )
    return report


#: The misalignments `witness_rates` tries, and how many of each (seeded).
MISALIGNMENTS = (
    "random wrong permutation, same sizes",
    "two rows transposed",
    "two responses of one prompt transposed",
    "two micro-batches swapped",
)
TRIALS = 200
#: The fixed-length step's row length (every row: the witness is blind there, provenance is not).
FIXED_LENGTH = 512


def witness_rates(
    step: Any, *, trials: int = TRIALS, seed: int = 1, proven: bool = False
) -> dict[str, dict[str, int]]:
    """How often the alignment witness catches each kind of well-formed misalignment on ``step``, through
    verl's shadow-mode check (`torch_impl._postprocess.check_batch_func`: every check of the drop-in,
    no data moved): ``trials`` of each of `MISALIGNMENTS` (a random permutation cut into the step's
    micro-batch sizes; two positions of the flattened indices swapped; the same for two rows of one
    prompt's group, ``step.responses`` consecutive rows, the blind spot's worst case (responses truncated
    at the cap have equal lengths); two micro-batches of equal size swapped in ``output_lst``). A miss must be
    a misalignment that moves rows only among rows of equal
    length (``missed_equal_lengths``); a miss that is not, or a catch where every length agrees, is
    ``unexplained`` (a defect of rebatch). ``proven``: ``step`` was split by rebatch's split (its
    provenance recorded): every misalignment must be caught, whatever the lengths (a miss is
    ``unexplained``)."""
    rng = np.random.default_rng(seed)
    witness = [int(n) for n in step.data["input_ids"].offsets().diff().tolist()]
    flat = [i for p in step.indices for i in p]
    sizes = [len(p) for p in step.indices]
    starts = list(itertools.accumulate(sizes, initial=0))
    same_size = [m for m in range(len(sizes)) if sizes.count(sizes[m]) > 1]
    position = {i: k for k, i in enumerate(flat)}
    out: dict[str, dict[str, int]] = {}
    for kind in MISALIGNMENTS:
        counts = dict.fromkeys(("trials", "caught", "missed", "missed_equal_lengths", "unexplained"), 0)
        possible = {MISALIGNMENTS[1]: len(flat) >= 2, MISALIGNMENTS[2]: step.responses >= 2}
        for _ in range(trials if possible.get(kind, True) and (kind != MISALIGNMENTS[3] or same_size) else 0):
            # ``src[k]``: the original row concatenated row k was computed for; ``perm[k]``: the row the
            # indices restore it as
            outputs, src, perm = list(step.output_lst), flat, list(flat)
            if kind == MISALIGNMENTS[0]:
                perm = rng.permutation(len(flat)).tolist()
            elif kind in MISALIGNMENTS[1:3]:
                if kind == MISALIGNMENTS[1]:
                    a, b = rng.choice(len(flat), size=2, replace=False).tolist()
                else:
                    group = int(rng.integers(len(flat) // step.responses)) * step.responses
                    rows = (group + rng.choice(step.responses, size=2, replace=False)).tolist()
                    a, b = (position[r] for r in rows)
                perm[a], perm[b] = perm[b], perm[a]
            else:
                m = int(rng.choice(same_size))
                n = int(rng.choice([k for k in same_size if sizes[k] == sizes[m] and k != m]))
                outputs[m], outputs[n] = outputs[n], outputs[m]
                moved = {m: n, n: m}
                src = [flat[starts[moved.get(q, q)] + j] for q in range(len(sizes)) for j in range(sizes[q])]
            indices = [perm[starts[q] : starts[q + 1]] for q in range(len(sizes))]
            equal = all(witness[a] == witness[b] for a, b in zip(src, perm, strict=True))
            counts["trials"] += 1
            try:
                check_batch_func(outputs, indices, step.data)
            except MisalignmentError:
                counts["caught"] += 1
                counts["unexplained"] += int(equal and not proven)
                continue
            counts["missed"] += 1
            counts["missed_equal_lengths" if equal and not proven else "unexplained"] += 1
        out[kind] = counts
    return out


#: The globals a dump may name (``module.name``), beyond which nothing is unpickled: torch's tensors and
#: storages, nested (jagged) tensors, tensordict's TensorDict and non-tensor data, and the containers they
#: use, and the dynamic-dimension marks of a tensor. Found by saving real-shaped verl, AReaL and SkyRL
#: steps (torch 2.9.1 and 2.13, tensordict 0.10 and 0.15) and the dump verl's own FSDP engine leaves
# : (``tests/test_verl_engine.py``), and reading the globals their pickles name
# (``tests/test_trust_files.py``).
DUMP_GLOBALS = frozenset(
    {
        "collections.OrderedDict",
        "__builtin__.set",
        "builtins.set",
        "torch.Size",
        "torch.Tensor",
        "tensordict.tensorclass.NonTensorData",
        "tensordict.tensorclass.NonTensorStack",
        # torch's private rebuild functions, the jagged tensor's class, tensordict's TensorDict, and the
        # (dim, min, max) ranges a tensor marked dynamic keeps (as verl's engine marks them), as the pickle
        # spells them (`ref._torch_private`, the one room of private torch names)
        *PICKLE_NAMES_TORCH_ADMITS,
        *PICKLE_NAMES_TO_ALLOW,
    }
)
_STORAGE = re.compile(r"torch\.[A-Za-z0-9]+Storage")
#: The most bytes of pickle a dump may hold (its tensors' data are separate records, not counted).
_MAX_PICKLE = 256 << 20


class UnsafeDumpError(DumpError):
    """A dump that names a global outside `DUMP_GLOBALS` (code it would run, or a class it would build):
    refused before anything of it is unpickled."""


def _globals_named(path: str) -> list[str]:
    """Every global (``module.name``) the pickles of the torch.save archive ``path`` name, read with
    `pickletools` (nothing executed)."""
    try:
        with zipfile.ZipFile(path) as archive:
            found: list[str] = []
            for info in archive.infolist():
                if not info.filename.endswith(".pkl"):
                    continue
                if info.file_size > _MAX_PICKLE:
                    raise DumpError(
                        f"{path}: {info.filename} holds {info.file_size} bytes of pickle, over the cap"
                    )
                for op, arg, _ in pickletools.genops(archive.read(info)):
                    if op.name == "GLOBAL":
                        found.append(str(arg).replace(" ", "."))
                    elif op.name in ("STACK_GLOBAL", "INST", "OBJ"):
                        raise UnsafeDumpError(
                            f"{path}: refused: its pickle uses {op.name}, which torch.save never writes "
                            "(rebatch never runs code from a dump)"
                        )
            return found
    except DumpError:
        raise
    except (zipfile.BadZipFile, ValueError, EOFError, OSError) as err:
        raise DumpError(f"cannot read {path} with torch.load: not a torch.save archive ({err})") from None


def _safe_load(path: str) -> Any:
    """The object of dump ``path``, unpickled with ``weights_only=True`` and only `DUMP_GLOBALS` allowed
    (scoped to this load); a global outside them raises `UnsafeDumpError` naming it."""
    for name in _globals_named(path):
        if name not in DUMP_GLOBALS and not _STORAGE.fullmatch(name):
            raise UnsafeDumpError(
                f"{path}: refused: the dump names the global {name}, which is not one a dump holds "
                "(tensors, nested tensors, TensorDict, non-tensor data); rebatch never runs code from a dump"
            )
    allowed: list[Any] = []
    for name in sorted(DUMP_GLOBALS):  # those beyond torch's own allowlist, as this release spells them
        module, _, attr = name.rpartition(".")
        if module.startswith("tensordict") or name in PICKLE_NAMES_TO_ALLOW:
            with contextlib.suppress(ImportError, AttributeError):  # another release: its pickle names differ
                allowed.append(getattr(importlib.import_module(module), attr))
    try:
        with torch.serialization.safe_globals(allowed):
            return torch.load(path, weights_only=True, map_location="cpu")
    except Exception as err:
        raise DumpError(f"cannot read {path} with torch.load: {type(err).__name__}: {err}") from None


def _dump_call(path: str, obj: Any) -> tuple[str, Callable[[], Any]] | None:
    """For a dump its trainer's integration replays (AReaL's, SkyRL's: ``Integration.replay``):
    ``(its function, a call of rebatch's drop-in on its inputs)``; None for verl's format. `DumpError` for
    a dict that is not a dump of rebatch's format, of no declared trainer, or whose inputs its
    integration cannot replay (``NotReplayable``, a `ValueError`)."""
    if obj.get("format") != DUMP_FORMAT or not isinstance(obj.get("inputs"), dict):
        raise DumpError(
            f"{path}: not a rebatch dump (format {DUMP_FORMAT!r} with inputs), got keys {sorted(obj)[:8]}"
        )
    trainer, function, inputs = obj.get("trainer"), str(obj.get("function")), obj["inputs"]
    if trainer not in trainer_names():
        known = ", ".join(trainer_names())
        raise DumpError(f"{path}: a dump of trainer {trainer!r}: rebatch checks dumps of {known}")
    integration = importlib.import_module(by_name(trainer).integration).INTEGRATION
    if integration.replay is None:
        return None
    try:
        return function, integration.replay(function, inputs)
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        if isinstance(err, RebatchError):
            raise
        raise DumpError(
            f"{path}: the {trainer} dump's inputs are not usable: {type(err).__name__}: {err}"
        ) from None


def _load_dump(path: str) -> Any:
    """verl's ``(output_lst, indices, data)`` (a dump of rebatch's format, or the older tuple), or, for
    AReaL and SkyRL, ``(function, call)`` (`_dump_call`). A file that is not a regular file, not a
    torch.save archive, or that names a global outside `DUMP_GLOBALS` raises `DumpError`."""
    p = Path(path)
    if not p.is_file():
        raise DumpError(f"no such file: {path}")
    obj = _safe_load(path)
    if isinstance(obj, dict):
        call = _dump_call(path, obj)
        if call is not None:
            return call
        inputs = obj["inputs"]
        if not {"output_lst", "indices", "data"} <= set(inputs):
            raise DumpError(f"{path}: a verl dump's inputs must hold output_lst, indices and data")
        obj = (inputs["output_lst"], inputs["indices"], inputs["data"])
    if not isinstance(obj, (tuple, list)) or len(obj) != 3:
        what = f"a {type(obj).__name__}" + (
            f" of length {len(obj)}" if isinstance(obj, (tuple, list)) else ""
        )
        raise DumpError(f"{path} must hold (output_lst, indices, data), got {what}")
    output_lst, indices, data = obj
    if not isinstance(output_lst, (list, tuple)):
        raise DumpError(f"{path}: output_lst must be a list of dicts, got {type(output_lst).__name__}")
    return list(output_lst), indices, data


def _load_candidate(spec: str) -> Callable[..., Any]:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise DumpError(f"--candidate must look like module:function, got {spec!r}")
    try:
        fn = getattr(import_trainer_module(module_name), attr)  # a trainer's own function among them
    except (ImportError, AttributeError) as err:
        raise DumpError(f"cannot load candidate {spec}: {err}") from None
    if not callable(fn):
        raise DumpError(f"candidate {spec} is not callable")
    return fn


def _drop_in_check(
    path: str, function: str, call: Callable[[], Any], candidate: str | None
) -> dict[str, Any]:
    """An AReaL or SkyRL dump: rebatch's drop-in run on its inputs, agreeing (it accepts them) or not
    (the `RebatchError` it raises: the trainer's function would have misaligned that step)."""
    if candidate:
        raise DumpError(f"{path}: --candidate applies to verl dumps (postprocess_batch_func) only")
    report: dict[str, Any] = {"source": path, "function": function}
    try:
        call()
    except RebatchError as err:
        report.update(agree=False, rejected=f"{type(err).__name__}: {err}")
        return report
    report["agree"] = True
    return report


def _dump_check(path: str, candidate: str | None) -> dict[str, Any]:
    loaded = _load_dump(path)
    if len(loaded) == 2:
        function, call = loaded
        return _drop_in_check(path, function, call, candidate)
    output_lst, indices, data = loaded
    cand = _load_candidate(candidate) if candidate else None
    report: dict[str, Any] = {"source": path, "micro_batches": len(output_lst)}
    try:
        truth = postprocess_batch_func(output_lst, indices, data)["model_output"]
    except RebatchError as err:
        report.update(agree=False, rejected=f"{type(err).__name__}: {err}")
        return report
    report["rows"] = next((int(v.size(0)) for v in truth.values()), 0)
    report["keys"] = {k: {"dtype": str(v.dtype).removeprefix("torch.")} for k, v in truth.items()}
    if _have_jax():
        ref_mo = _ref_postprocess(output_lst, indices, data)()
        for k, c in _compare(ref_mo, truth).items():
            report["keys"][k]["vs_ref"] = c
    else:
        report["note"] = NO_JAX_NOTE
    if cand is not None:
        report["candidate"] = candidate
        try:
            got = cand(output_lst, indices, data)["model_output"]
            for k, c in _compare(got, truth).items():
                report["keys"][k]["vs_candidate"] = c
        except Exception as err:
            report["candidate_error"] = f"{type(err).__name__}: {err}"
    report["agree"] = "candidate_error" not in report and all(
        c["agree"] for v in report["keys"].values() for n, c in v.items() if n.startswith("vs_")
    )
    return report


# Complex by design: one line for each section of the report.
def _print_report(report: dict[str, Any], out: TextIO) -> None:  # noqa: C901
    print(f"rebatch check: {report['source']}", file=out)
    if "function" in report:
        print(f"  rebatch's drop-in for {report['function']}", file=out)
    if "rejected" in report:
        print(f"  rejected by rebatch: {report['rejected']}", file=out)
    facts = [
        f"{name} {report[name]}"
        for name in ("rows", "tokens", "micro_batches", "token_budget")
        if name in report
    ]
    if facts:
        print("  " + ", ".join(facts).replace("_", " "), file=out)
    for key, info in report.get("keys", {}).items():
        checks = []
        for name, c in info.items():
            if name.startswith("vs_") and c is not None:
                label = name.removeprefix("vs_").replace("_", " ")
                checks.append(f"{label}: {'identical' if c['agree'] else 'MISMATCH'}")
        print(
            f"  {key:<16} {info.get('dtype', ''):<9} {info.get('shape', '')}  " + "; ".join(checks), file=out
        )
        for name, c in info.items():
            if name.startswith("vs_") and c is not None and not c["agree"]:
                print(
                    f"    {name.removeprefix('vs_')}: key {key!r} first differs at original row "
                    f"{c['first_bad_row']}: {c['detail']}",
                    file=out,
                )
    if "candidate_error" in report:
        print(f"  candidate raised {report['candidate_error']}", file=out)
    if "seconds" in report:
        s = report["seconds"]
        ref_time = "not run" if s["ref"] is None else f"{s['ref'] * 1e3:.1f} ms"
        print(
            f"  time: torch_impl {s['torch_impl'] * 1e3:.1f} ms, ref (JAX, eager) {ref_time}, "
            f"per-row baseline {s['per_row_baseline'] * 1e3:.1f} ms "
            f"({s['per_row_baseline'] / s['torch_impl']:.1f}x slower than torch_impl)",
            file=out,
        )
    if "witness" in report:
        w = report["witness"]["stats"]
        calls = f"{w['calls']} call" + ("" if w["calls"] == 1 else "s")
        print(
            f"  alignment witness (data['input_ids']): {calls}, {w['keys_witnessed']} keys "
            f"witnessed, {w['keys_unbound']} left unbound, {w['calls_binding_nothing']} binding nothing",
            file=out,
        )
        for kind, c in report["witness"]["caught"].items():
            print(
                f"    {kind}: caught {c['caught']} of {c['trials']}; missed {c['missed']} "
                f"({c['missed_equal_lengths']} only among rows of equal length, {c['unexplained']} "
                "unexplained)",
                file=out,
            )
    for step, rates in report.get("provenance", {}).items():
        print(
            f"  exact provenance (split by rebatch's prepare_micro_batches), {step.replace('_', '-')} step:",
            file=out,
        )
        for kind, c in rates.items():
            print(
                f"    {kind}: caught {c['caught']} of {c['trials']}; {c['unexplained']} unexplained", file=out
            )
    if "note" in report:
        print(f"  note: {report['note']}", file=out)
    print(f"  result: {'all identical' if report['agree'] else 'MISMATCH'}", file=out)


def run_check(dump: str | None, candidate: str | None, as_json: bool, out: TextIO | None = None) -> int:
    """Exit code: 0 all identical (an AReaL or SkyRL dump: rebatch's drop-in accepts its inputs), 1 a
    mismatch or inputs rebatch rejects, 2 an unusable dump or candidate (unreadable, not a dump, or
    naming a global outside `DUMP_GLOBALS`: `UnsafeDumpError`)."""
    out = out or sys.stdout
    try:
        report = _dump_check(dump, candidate) if dump else _default_check()
    except DumpError as err:
        if as_json:
            print(json.dumps({"error": str(err)}), file=out)
        else:
            print(f"rebatch check: {err}", file=sys.stderr)
        return 2
    if as_json:
        print(json.dumps(report, indent=2, default=str), file=out)
    else:
        _print_report(report, out)
    return 0 if report["agree"] else 1
