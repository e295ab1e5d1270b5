"""`postprocess_batch` and verl's drop-in `postprocess_batch_func`."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from enum import Enum
from typing import Any

import torch
from tensordict import NonTensorData, TensorDictBase

from ref._torch_private import non_tensor_stored
from ref.errors import PartitionMismatchError, ShapeMismatchError, UnsupportedSettingError, where
from ref.metrics import fold_metrics
from ref.structure import check_metrics, check_partition_count, check_settings, drop_padding, model_outputs

from ._alignment import Witness, read_witness, recorded, witness_config
from ._entry import entry
from ._jagged import Seqlens, njt, seqlens_of
from ._kernels import move
from ._parts import NestedTensor, check_parts
from ._permutation import check_permutation
from ._plan import KeyPlan, plan_key
from ._rows import CallRows

__all__ = ["check_batch_func", "postprocess_batch", "postprocess_batch_func", "read_setting"]


@entry
def postprocess_batch(
    output_lst: Sequence[Mapping[str, Any]],
    indices: Sequence[Sequence[int]] | None,
    *,
    use_dynamic_bsz: bool = True,
    pad_mode: str = "no_padding",
    witness: Any = None,
    unbound: Collection[Any] = (),
    provenance: Any = None,
) -> dict[str, Any]:
    """Put micro-batch outputs back together in original sample order (``ref.postprocess_batch``'s meaning).

    ``output_lst[m]`` may hold ``model_output`` (a dict of jagged ``[b_m, (j), *F]`` or dense
    ``[b_m, *F]`` tensors), ``loss`` and ``metrics``; ``indices[m]`` lists the original positions of
    micro-batch ``m``'s rows. With ``perm = [i for p in indices for i in p]``, row ``perm[n]`` of each
    result is row ``n`` of the concatenation. Returns ``{"model_output": {key: [B, ...]}, "loss":
    [...], "metrics": {...}}``. Every defect raises a `ref.errors.RebatchError` subclass, in the
    order documented in ``docs/spec.md``. ``witness``: the alignment witness, ``[B]`` row lengths in
    original order (a list, or a 1-D integer tensor or array), which every bound key's restored rows
    must have (`ref.errors.MisalignmentError`; ``unbound`` keys left out; ``docs/spec.md``, "The
    alignment witness"). ``provenance``: the record of the split (`torch_impl.recorded(batch)`): the
    indices must be the split's and each output in its micro-batch's slot, by its nested ints
    (``docs/spec.md``, "Exact provenance").
    """
    return _postprocess_batch(output_lst, indices, use_dynamic_bsz, pad_mode, witness, unbound, provenance)


def _postprocess_batch(
    output_lst: Sequence[Mapping[str, Any]], indices: Sequence[Sequence[int]] | None, *settings: Any
) -> dict[str, Any]:
    """`postprocess_batch` itself (its public name adds the entry checks, which verl's drop-in has made),
    one pipeline for every call: check and plan every key (`_checked_plans`, whose ``settings`` these
    are), then move each key's data
    with the kernel the registry chooses (`torch_impl._kernels.move`), then fold the losses and metrics."""
    output_lst, plans = _checked_plans(output_lst, indices, *settings)
    model_output = {plan.key: move(plan) for plan in plans}
    losses = [o["loss"] for o in output_lst if "loss" in o]
    metrics = fold_metrics(o["metrics"] for o in output_lst if "metrics" in o)
    return {"model_output": model_output, "loss": losses, "metrics": metrics}


def _checked_plans(
    output_lst: Sequence[Mapping[str, Any]],
    indices: Sequence[Sequence[int]] | None,
    use_dynamic_bsz: Any,
    pad_mode: Any,
    witness: Any = None,
    unbound: Collection[Any] = (),
    provenance: Any = None,
) -> tuple[Sequence[Mapping[str, Any]], list[KeyPlan]]:
    """Every check of a call, in ``docs/spec.md``'s order, and every key's plan, no data moved: the
    settings (step 1), the outputs without padding micro-batches, the permutation, each key's parts
    (`_check_keys`), each key's offsets as it is planned (`plan_key`), the provenance's verdict (step
    6p, judged before planning, raised after it) and the alignment witness's verdict on every key's restored
    lengths, computed once from the plans. Returns the outputs
    without padding micro-batches and the plans, in the keys' order."""
    pad_mode, dynamic = _settings(use_dynamic_bsz, pad_mode, indices)
    output_lst, indices = drop_padding(output_lst, indices)
    outs = model_outputs(output_lst)
    check_metrics(output_lst)
    perm = None
    if dynamic:
        check_partition_count(indices, len(outs))
        # a live split's own indices vouch for themselves (a permutation, checked when recorded)
        perm = provenance.permutation(indices) if provenance is not None else None
        if perm is None:
            perm = check_permutation(indices, sum(map(len, indices)))
    keys = list(outs[0]) if outs else []
    sizes = [len(p) for p in indices] if perm is not None and indices is not None else None
    checked = _check_keys(outs, keys, sizes, pad_mode)
    if not checked:
        return output_lst, []
    rows = CallRows([p.rows for p in checked[keys[0]]], perm)
    stray = provenance.judge(checked, sizes, perm, rows.given)[1] if provenance is not None else None
    judge = Witness(witness, sum(rows.rows), rows.perm, rows.rows, unbound) if witness is not None else None
    plans = []
    groups: dict[tuple[int, ...], KeyPlan] = {}  # keys on the same offsets tensors share one plan
    for key, parts in checked.items():
        witnessed = (
            judge.known if judge is not None else None
        )  # the witness's lengths, where it binds the key
        plan = plan_key(parts, key, rows, [mo[key] for mo in outs], groups, witnessed)
        if judge is not None:
            judge.observe(plan)
        plans.append(plan)
    if stray is not None:
        raise stray
    if judge is not None:
        judge.verdict()
        if judge.host is not None and any(p.seqlens is None and p.offsets is not None for p in plans):
            # judged: a bound key's rows have the host witness's lengths, so its result caches their sizes
            seqlens = seqlens_of(judge.host)
            plans = [_sized(p, seqlens) if p.key in judge.bound_keys else p for p in plans]
    return output_lst, plans


def _sized(plan: KeyPlan, sizes: Seqlens) -> KeyPlan:
    """``plan`` with the result's cached sizes where it had none (off the CPU, never read there; not on
    ``meta``, where nothing was judged)."""
    unknown = plan.offsets is not None and plan.seqlens is None and plan.device.type != "meta"
    return plan._replace(seqlens=sizes) if unknown else plan


def _settings(
    use_dynamic_bsz: Any, pad_mode: Any, indices: Sequence[Sequence[int]] | None
) -> tuple[str, bool]:
    """The first check of a call (`check_settings`): ``pad_mode`` (verl's enum read as its value) and
    ``use_dynamic_bsz`` as a bool."""
    if isinstance(pad_mode, Enum):
        pad_mode = pad_mode.value
    return pad_mode, check_settings(use_dynamic_bsz, pad_mode, indices)


def _check_keys(
    outs: Sequence[Mapping[str, Any]], keys: list[Any], sizes: list[int] | None, pad_mode: str
) -> dict[Any, list[Any]]:
    """Each key's parts, checked; ``sizes``: each partition's size (None without dynamic batch size)."""
    checked: dict[Any, list[Any]] = {}
    first_rows: list[int] = []
    for key in keys:
        parts = check_parts([mo[key] for mo in outs], key, allow_jagged=pad_mode == "no_padding")
        rows = [p.rows for p in parts]
        if key == keys[0]:
            first_rows = rows
        held = sizes if sizes is not None else first_rows
        if rows != held:  # one comparison of the lists, then the first micro-batch that differs
            m = next(m for m, (a, b) in enumerate(zip(rows, held, strict=True)) if a != b)
            at, got, n = where(key, m), rows[m], held[m]
            if sizes is not None:
                raise PartitionMismatchError(f"{at}{got} rows, but its partition has {n} indices")
            raise ShapeMismatchError(f"{at}{got} rows, but key {keys[0]!r} has {n} there")
        checked[key] = parts
    return checked


def read_setting(data: Any, key: str, default: Any) -> Any:
    """A setting read as verl reads it: ``data.get(key, default)``, unwrapping ``NonTensorData``.

    ``data``: a TensorDict, a mapping, or None (every setting its default); anything else raises
    `UnsupportedSettingError` naming its type (never an ``AttributeError`` from ``.get``)."""
    if data is None:
        return default
    if not isinstance(data, TensorDictBase | Mapping):
        raise UnsupportedSettingError(
            f"data must be a TensorDict (or a mapping, or None), got {type(data).__name__}"
        )
    value = data.get(key, default)
    if isinstance(
        value, NonTensorData
    ):  # a plain field as stored (tensorclass's getter: 4 µs on tensordict 0.10)
        stored = non_tensor_stored(value, value)  # shared or memory-mapped: a wrapper
        value = stored if type(stored) in (bool, int, str) or isinstance(stored, Enum) else value.data
    return value


@entry
def postprocess_batch_func(
    output_lst: Sequence[Mapping[str, Any]], indices: Sequence[Sequence[int]] | None, data: Any
) -> dict[str, Any]:
    """Drop-in for verl's ``postprocess_batch_func(output_lst, indices, data)``: same call, same result.

    ``data`` (a TensorDict, or None) carries ``use_dynamic_bsz`` (default True; a bool or a bool-like
    0/1) and ``pad_mode`` (default ``"no_padding"``; a string or verl's ``DatasetPadMode``) as
    ``NonTensorData``. A ``model_output`` may be a dict or a TensorDict. As verl, every output comes
    back as a jagged nested tensor: a dense ``[B, S, *F]`` one as ``[B, (S), *F]`` (`postprocess_batch`
    keeps it dense); a dense ``[B]`` one, which verl cannot nest, stays dense.

    Beyond verl: the alignment witness is read from ``data`` (``data["input_ids"]``'s row lengths,
    `torch_impl._alignment.read_witness`), so a valid permutation that is the wrong one, or micro-batch
    outputs in the wrong order, raise `ref.errors.MisalignmentError` for every per-token key
    (``docs/spec.md``, "The alignment witness"; off for the process with `torch_impl.set_witness`); and
    where rebatch's split made ``data``'s micro-batches, the split's provenance: the indices must be its
    own and each output in its micro-batch's slot, whatever the lengths ("Exact provenance").
    """
    output_lst, settings = _verl_call(output_lst, data)
    result = _postprocess_batch(output_lst, indices, *settings)
    result["model_output"] = {k: _nested_like_verl(v) for k, v in result["model_output"].items()}
    return result


@entry
def check_batch_func(
    output_lst: Sequence[Mapping[str, Any]], indices: Sequence[Sequence[int]] | None, data: Any
) -> None:
    """Every check `postprocess_batch_func` makes of this call, without moving data: returns None or
    raises the same `ref.errors.RebatchError` (verl's shadow mode runs it on unsampled calls)."""
    output_lst, settings = _verl_call(output_lst, data)
    _checked_plans(output_lst, indices, *settings)


def _verl_call(output_lst: Any, data: Any) -> tuple[Any, tuple[Any, Any, Any, Collection[Any], Any]]:
    """verl's ``(output_lst, data)`` as `_postprocess_batch`'s: the outputs with plain ``model_output``
    dicts, and ``(use_dynamic_bsz, pad_mode, witness, unbound, provenance)`` read from ``data``."""
    use_dynamic_bsz = read_setting(data, "use_dynamic_bsz", True)
    pad_mode = read_setting(data, "pad_mode", "no_padding")
    output_lst = (
        [_plain_model_output(o) for o in output_lst] if isinstance(output_lst, list | tuple) else output_lst
    )
    witness = read_witness(data)
    unbound = witness_config()[1] if witness is not None else ()
    provenance = recorded(data) if witness_config()[0] else None  # one switch for both alignment checks
    return output_lst, (use_dynamic_bsz, pad_mode, witness, unbound, provenance)


def _plain_model_output(o: Any) -> Any:
    """``o`` with a TensorDict ``model_output`` as a dict of its entries (verl reads ``.items()``)."""
    if type(o) is dict and type(o.get("model_output")) is dict:  # the common case, without abstract classes
        return o
    if isinstance(o, Mapping) and isinstance(o.get("model_output"), TensorDictBase):
        td = o["model_output"]
        return {**o, "model_output": {k: td.get(k) for k in td.keys()}}
    return o


def _nested_like_verl(x: torch.Tensor) -> torch.Tensor:
    """A dense ``[B, S, *F]`` result as the jagged ``[B, (S), *F]`` verl returns (every row of length
    ``S``; a view of the result's own fresh storage); jagged and ``[B]`` results as they are."""
    if (
        isinstance(x, NestedTensor) or x.is_nested or x.dim() < 2
    ):  # the class first: no __torch_function__ for it
        return x
    b, s = int(x.shape[0]), int(x.shape[1])
    offsets = (
        torch.arange(0, (b + 1) * s, s, dtype=torch.int64, device=x.device)
        if s
        else x.new_zeros(b + 1, dtype=torch.int64)
    )
    return njt(x.reshape(b * s, *x.shape[2:]), offsets, None, (s, s) if b else None)
