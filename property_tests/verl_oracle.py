"""verl itself as an oracle (the installed release: 0.8.0, 0.9.0 or 0.9.1): engine-style inputs drawn by
Hypothesis, and each drop-in name of ``torch_impl`` run beside verl's own function on them (results
and order compared exactly, errors compared as "both raise").

verl is optional: `verl_or_skip` skips with a visible reason where it is not installed, and fails
instead when ``REBATCH_REQUIRE_VERL=1`` (set by CI's pins environment, where verl must run).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch
from hypothesis import strategies as st

from .compare import first_difference
from .data import jagged, random_tensor, rows_of
from .strategies import partitions
from .trainer_import import import_trainer_module

__all__ = [
    "REQUIRE_ENV",
    "EngineCall",
    "PartitionCall",
    "both",
    "engine_calls",
    "metric_folds",
    "partition_calls",
    "verl_or_skip",
]

#: Set to 1 where verl must be importable (a missing verl then fails instead of skipping).
REQUIRE_ENV = "REBATCH_REQUIRE_VERL"


def verl_or_skip() -> Any:
    """verl's modules as a namespace (``engine_utils``, ``seqlen_balancing``, ``py_functional``,
    ``metric``, and ``version``: the release imported, from its metadata, checked against
    ``verl.__version__``), or ``pytest.skip`` with the reason (``pytest.fail`` under
    ``REBATCH_REQUIRE_VERL=1``)."""
    import importlib.metadata

    import pytest

    try:
        metric = import_trainer_module("verl.utils.metric")
        py_functional = import_trainer_module("verl.utils.py_functional")
        seqlen_balancing = import_trainer_module("verl.utils.seqlen_balancing")
        engine_utils = import_trainer_module("verl.workers.engine.utils")
    except ImportError as err:  # verl, or one of what it imports, is missing
        why = (
            f"verl is not installed here ({err}); CI runs these in its pins environment "
            "(verl 0.9.1, 0.8.0, 0.9.0)"
        )
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(why)
        pytest.skip(why, allow_module_level=True)

    verl = import_trainer_module("verl")
    version = importlib.metadata.version("verl")  # what rebatch's install reads
    imported = getattr(verl, "__version__", version)
    assert imported == version, (
        f"verl's metadata says {version}, the verl imported ({verl.__file__}) {imported}"
    )

    class Verl(NamedTuple):
        engine_utils: Any
        seqlen_balancing: Any
        py_functional: Any
        metric: Any
        version: str

    return Verl(engine_utils, seqlen_balancing, py_functional, metric, version)


def both(
    ours: Callable[[], Any], theirs: Callable[[], Any]
) -> tuple[Any, Any, BaseException | None, BaseException | None]:
    """Run both; each result or the exception it raised."""
    out: list[Any] = []
    for fn in (ours, theirs):
        try:
            out.append((fn(), None))
        except Exception as err:  # compared by the caller: both raise, or neither
            out.append((None, err))
    (a, ea), (b, eb) = out
    return a, b, ea, eb


class EngineCall(NamedTuple):
    """A ``postprocess_batch_func`` call as verl's engines make it, and how to build ``data``."""

    output_lst: list[dict[str, Any]]
    indices: list[list[int]] | None
    settings: dict[str, Any]  # NonTensorData entries of ``data`` (empty: verl's defaults)


#: Each metric key's kind of value, fixed (verl's ``Metric`` accepts numbers, not tuples or lists of them).
_KINDS = {"lr": "scalar", "grad_norm": "metric", "kl": "tuple", "clip": "list", "tokens": "tensor"}


def _metrics(draw: st.DrawFn, rng: np.random.Generator, metric_cls: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in draw(st.lists(st.sampled_from(sorted(_KINDS)), unique=True, max_size=3)):
        kind = _KINDS[key]
        value = float(rng.standard_normal())
        if kind == "scalar":
            out[key] = value
        elif kind == "list":
            out[key] = [value, float(rng.standard_normal())]
        elif kind == "tuple":
            out[key] = (value, 1)
        elif kind == "metric":
            out[key] = metric_cls("mean", value)  # one aggregation per key, as a trainer logs it
        else:
            out[key] = torch.tensor(value)
    return out


@st.composite
def engine_calls(
    draw: st.DrawFn, *, metric_cls: Any, max_rows: int = 12, max_micro_batches: int = 5
) -> EngineCall:
    """Engine-style outputs: jagged log-probs (float32), entropy (bfloat16), top-k ``[b, (j), k]``, a
    dense ``[b, S]`` value head; losses; metrics with verl ``Metric`` objects, lists, tuples, tensors;
    ``model_output`` a dict or a TensorDict; settings as verl's ``data`` carries them (bool-likes too)."""
    from tensordict import TensorDict

    b = draw(st.integers(1, max_rows))
    dynamic = draw(st.booleans())
    parts = draw(
        partitions(num_rows=b, min_micro_batches=1, max_micro_batches=max_micro_batches, shuffle=dynamic)
    ).parts
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    lengths = draw(st.lists(st.integers(0, 7), min_size=b, max_size=b))
    n, k, s = sum(lengths), draw(st.integers(1, 3)), draw(st.integers(1, 3))
    whole = {
        "log_probs": jagged(random_tensor(rng, (n,), "float32"), lengths),
        "entropy": jagged(random_tensor(rng, (n,), "bfloat16"), lengths),
        "top_k": jagged(random_tensor(rng, (n, k), "float32"), lengths),
        "values": random_tensor(rng, (b, s), "float32"),
    }
    keys = draw(st.lists(st.sampled_from(sorted(whole)), unique=True, min_size=1))
    as_td = draw(st.booleans())
    output_lst: list[dict[str, Any]] = []
    for part in parts:
        o: dict[str, Any] = {}
        mo = {key: _rows(whole[key], part) for key in keys}
        o["model_output"] = TensorDict(mo, batch_size=[len(part)]) if as_td else mo
        if draw(st.booleans()):
            o["loss"] = torch.tensor(float(rng.standard_normal()))
        if draw(st.booleans()):
            o["metrics"] = _metrics(draw, rng, metric_cls)
        output_lst.append(o)
    settings: dict[str, Any] = {}
    if draw(st.booleans()) or not dynamic:
        flag = draw(st.sampled_from([True, np.bool_(True), 1] if dynamic else [False, np.bool_(False), 0]))
        settings["use_dynamic_bsz"] = flag
        if draw(st.booleans()):
            settings["pad_mode"] = "no_padding"
    return EngineCall(output_lst, parts if dynamic else None, settings)


def _rows(x: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """``x``'s rows ``rows`` (per row, so the oracle input is built independently of rebatch)."""
    picked = [rows_of(x)[i] for i in rows]
    if x.is_nested:
        feature = tuple(x.shape[2:])
        values = torch.cat(picked) if picked else x.values().new_empty((0, *feature))
        return jagged(values, [r.shape[0] for r in picked])
    return torch.stack(picked) if picked else x.new_empty((0, *x.shape[1:]))


def make_data(settings: dict[str, Any], **fields: Any) -> Any:
    """A TensorDict (verl's ``data`` is never None) holding ``fields`` and ``settings`` as
    ``NonTensorData``."""
    from tensordict import NonTensorData, TensorDict

    batch = [int(next(iter(fields.values())).shape[0])] if fields else []
    data = TensorDict(dict(fields), batch_size=batch)
    for key, value in settings.items():
        data[key] = NonTensorData(value)
    return data


class PartitionCall(NamedTuple):
    """A split-side call: row lengths, a budget and verl's options."""

    lengths: list[int]
    max_token_len: int
    min_num_micro_batch: int | None
    num_batches_divided_by: int | None
    use_dynamic_bsz_balance: bool
    force_group_size: int


@st.composite
def partition_calls(draw: st.DrawFn, *, max_rows: int = 24, max_length: int = 40) -> PartitionCall:
    """Lengths with ties (verl's tie-breaks matter), budgets around the rows' sizes, and verl's options."""
    fgs = draw(st.sampled_from([1, 1, 1, 2, 3]))
    groups = draw(st.integers(1, max(1, max_rows // fgs)))
    pool = draw(st.lists(st.integers(0, max_length), min_size=1, max_size=4))  # few distinct values: ties
    lengths = draw(st.lists(st.sampled_from(pool), min_size=groups * fgs, max_size=groups * fgs))
    if sum(lengths) == 0:  # verl cannot plan zero tokens (it indexes an empty partition list)
        lengths[0] = 1
    budget = draw(st.integers(max(1, max(lengths) // 2), max(1, sum(lengths)) + 2))
    return PartitionCall(
        lengths,
        budget,
        draw(st.none() | st.integers(1, 6)),
        draw(st.none() | st.integers(1, 3)),
        draw(st.booleans()),
        fgs,
    )


@st.composite
def metric_folds(draw: st.DrawFn, *, metric_cls: Any) -> tuple[dict[str, Any], list[dict[str, Any]], str]:
    """A starting accumulator, dicts to fold in, and a prefix (some keys already carry it)."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    prefix = draw(st.sampled_from(["", "train/", "actor/"]))
    count: int = draw(st.integers(1, 4))
    news = [_metrics(draw, rng, metric_cls) for _ in range(count)]
    carried: bool = draw(st.booleans())
    if prefix and carried:
        news[0] = {f"{prefix}{k}": v for k, v in news[0].items()}
    return {}, news, prefix


def same(a: Any, b: Any) -> str | None:
    """None when ``a`` and ``b`` are identical (tensors bit for bit, types included), else the difference."""
    return first_difference(a, b)
