"""verl's table for the trainer contract (`_integration.Integration`): `install()` turns rebatch on in verl.

verl's engines bind ``postprocess_batch_func`` and ``prepare_micro_batches`` at import (``from ..utils
import ...`` in the fsdp, megatron, automodel, torchtitan and veomni engines): `install` replaces them in
``verl.workers.engine.utils`` and in every loaded ``verl`` module that bound them, with verl's partitioner
functions (``rearrange_micro_batches``, ``restore_dynamic_batch``, ``get_seqlen_balanced_partitions``,
``get_group_balanced_partitions`` in ``verl.utils.seqlen_balancing``) and ``append_to_dict``
(``verl.utils.py_functional``); `uninstall` puts verl's back.

`VERSIONS` says, for verl 0.8.0, 0.9.0 and 0.9.1, which names rebatch replaces and with which rule (0.8.0
and 0.9.0 partition in one pass, 0.9.1 until every micro-batch fits the budget); the INFO line `install`
logs is that release's `Plan` (`plan(version)` gives it without installing). In shadow mode only
``postprocess_batch_func`` has a check of its own on unsampled calls: the other names' inputs are verl's
own computation, checked by rebatch's function on sampled calls (the cost: ``docs/shadow.md``); verl's
own split is observed there, so the restore checks its provenance as it checks rebatch's. Sampling
counts per process and name, so every rank samples the same calls (``prepare_micro_batches`` with a
``dp_group`` runs rebatch's collectives, then verl's, on every rank alike).

verl is imported only when `install` runs. In verl's Ray workers: Ray's setup hook
(``ray.init(runtime_env={"worker_process_setup_hook": "torch_impl.integrations.verl.install"})``), or
``REBATCH=on`` (or ``shadow``; ``REBATCH_VERL`` wins when set) in their environment (`rebatch_startup.verl`,
a ``verl.plugins`` entry point, installs then in every process that imports verl).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

from ._counts import Rows, rows_of_partitions
from ._integration import Installed, Integration, Replaced
from ._patch import Versions

__all__ = [
    "ENGINE_UTILS",
    "INTEGRATION",
    "NAMES",
    "PY_FUNCTIONAL",
    "SEQLEN_BALANCING",
    "VERSIONS",
    "Installed",
    "Plan",
    "install",
    "installed",
    "mode",
    "plan",
    "replacements",
    "stats",
    "uninstall",
]

#: The verl modules whose functions `install` replaces (see `replacements`).
ENGINE_UTILS = "verl.workers.engine.utils"
SEQLEN_BALANCING = "verl.utils.seqlen_balancing"
PY_FUNCTIONAL = "verl.utils.py_functional"

#: Every name rebatch can put in verl's place, with the verl module defining it.
NAMES: dict[str, str] = {
    "postprocess_batch_func": ENGINE_UTILS,
    "prepare_micro_batches": ENGINE_UTILS,
    "rearrange_micro_batches": SEQLEN_BALANCING,
    "restore_dynamic_batch": SEQLEN_BALANCING,
    "get_seqlen_balanced_partitions": SEQLEN_BALANCING,
    "get_group_balanced_partitions": SEQLEN_BALANCING,
    "append_to_dict": PY_FUNCTIONAL,
}

_SAME: dict[str, Any] = {}  # rebatch's function as it is
_ONE_PASS: dict[str, Any] = {"one_pass": True}  # verl 0.8.0's and 0.9.0's count rule
_PARTITIONER = ("prepare_micro_batches", "rearrange_micro_batches")  # the names the count rule reaches

#: THE table: supported verl release -> the names `install` replaces there, each with the keywords
#: rebatch's function is bound with for that release (``{}``: as it is). A name of `NAMES` missing from
#: a release's row is left as verl's (none is, today). Another release is refused unless
#: ``install(force=True)``, which uses 0.9.1's row.
#:
#: The facts (verl 0.8.0, 0.9.0 and 0.9.1's sources compared function by function):
#: ``postprocess_batch_func``, ``prepare_micro_batches``, ``restore_dynamic_batch``,
#: ``get_seqlen_balanced_partitions``, ``get_group_balanced_partitions``, ``append_to_dict`` and what
#: they call (``karmarkar_karp``, ``calculate_workload``, ``ceildiv``, ``roundup_divisible``,
#: ``verl.utils.metric``, ``verl.utils.tensordict_utils``) are the same code, signatures and defaults in
#: all three. ``rearrange_micro_batches`` is the same in 0.8.0 and 0.9.0: one partitioning pass with
#: ``min(groups, ceil(total / max_token_len))`` micro-batches (raised to ``min_num_micro_batch``, the
#: largest over the DP group, rounded up to ``num_batches_divided_by``), ``assert count <= groups``,
#: so a micro-batch may hold more than ``max_token_len`` tokens and a forced group longer than the
#: budget is not refused; 0.9.1 (verl PR #7553) refuses such a group (``ValueError``) and raises the
#: count by ``num_batches_divided_by`` (or 1) until every micro-batch fits (``ValueError`` once it
#: exceeds the groups). rebatch's ``one_pass=True`` is the former rule
#: (`ref.partition.plan_micro_batches`); ``prepare_micro_batches`` calls the partitioner, so it is
#: bound the same way.
VERSIONS: dict[str, dict[str, dict[str, Any]]] = {
    "0.8.0": {**dict.fromkeys(NAMES, _SAME), **dict.fromkeys(_PARTITIONER, _ONE_PASS)},
    "0.9.0": {**dict.fromkeys(NAMES, _SAME), **dict.fromkeys(_PARTITIONER, _ONE_PASS)},
    "0.9.1": dict.fromkeys(NAMES, _SAME),
}


class Plan(NamedTuple):
    """What `install` does on a verl release (`plan`)."""

    #: The verl version read (None: no distribution metadata).
    verl: str | None
    #: The release of `VERSIONS` whose row applies (``"0.9.1"`` for another version with ``force``).
    row: str
    #: ``"module.name"`` of each name rebatch replaces, in `NAMES`' order.
    replaced: tuple[str, ...]
    #: ``"module.name"`` of each name of `NAMES` left as verl's.
    left: tuple[str, ...]
    #: The replaced names bound with keywords there (``{"rearrange_micro_batches": {"one_pass": True}}``).
    bound: dict[str, dict[str, Any]]

    def describe(self, how: str = "replaces") -> str:
        """The one line `install` logs."""
        verl = f"verl {self.verl}" if self.verl else "verl (version unknown)"
        if self.row != self.verl:
            verl += f", treated as {self.row}"
        rules = "".join(
            f"; {name} with {', '.join(f'{k}={v!r}' for k, v in kw.items())}"
            for name, kw in self.bound.items()
        )
        return (
            f"rebatch: {verl}: rebatch {how} verl's {', '.join(self.replaced) or 'nothing'}{rules}; "
            f"left as verl's: {', '.join(self.left) or 'none'}"
        )


def plan(version: str | None = None, *, force: bool = False) -> Plan:
    """What `install` does on verl ``version`` (default: the installed one, read from its metadata, verl
    not imported): the names replaced and those left as verl's (`VERSIONS`). Another version raises
    `ref.errors.UnsupportedSettingError` naming it and the supported ones, unless ``force`` (0.9.1's row,
    with a warning logged)."""
    if version is None:
        version = INTEGRATION.versions.installed()
    row_version, _ = INTEGRATION.versions.pick(version, force=force)
    return _plan_of(version, row_version)


@functools.cache
def _plan_of(version: str | None, row_version: str) -> Plan:
    """The `Plan` of verl ``version`` given the release ``row_version`` of `VERSIONS` that applies."""
    row = VERSIONS[row_version]
    return Plan(
        version,
        row_version,
        tuple(f"{NAMES[name]}.{name}" for name in NAMES if name in row),
        tuple(f"{NAMES[name]}.{name}" for name in NAMES if name not in row),
        {name: dict(kw) for name, kw in row.items() if kw},
    )


@functools.cache
def _functions(row: str) -> dict[str, Any]:
    """rebatch's function for each name of release ``row`` (built once: the same objects every call)."""
    import torch_impl

    out: dict[str, Any] = {}
    for name, kwargs in VERSIONS[row].items():
        fn = getattr(torch_impl, name)
        out[name] = functools.update_wrapper(functools.partial(fn, **kwargs), fn) if kwargs else fn
    return out


#: The rows of a call of each name, for ``on`` mode's counters (host-side facts: lengths, batch sizes).
ROWS: dict[str, Rows] = {
    "postprocess_batch_func": lambda output_lst, indices, data: rows_of_partitions(indices),
    "restore_dynamic_batch": lambda data, batch_idx_list: rows_of_partitions(batch_idx_list),
    "prepare_micro_batches": lambda data, *args, **kwargs: int(data.batch_size[0]),
    "rearrange_micro_batches": lambda batch, *args, **kwargs: int(batch.batch_size[0]),
    "get_seqlen_balanced_partitions": lambda seqlen_list, *args, **kwargs: len(seqlen_list),
    "get_group_balanced_partitions": lambda seqlen_list, *args, **kwargs: len(seqlen_list),
}


def _portable(data: Any) -> Any:
    """``data`` with each enum value among its non-tensor entries (verl's ``pad_mode``, a str ``Enum``)
    replaced by its value, in a shallow copy: a dump that loads without verl's classes."""
    import enum

    from tensordict import NonTensorData, TensorDictBase

    if not isinstance(data, TensorDictBase):
        return data
    enums = [
        (k, v.data) for k, v in data.non_tensor_items() if isinstance(getattr(v, "data", None), enum.Enum)
    ]
    if not enums:
        return data
    copied = data.copy()
    for key, value in enums:
        copied[key] = NonTensorData(value.value)
    return copied


def _dumped(output_lst: Any, indices: Any, data: Any) -> dict[str, Any]:
    """A call's inputs as rebatch's dump holds them (`_files.save_dump`)."""
    return {"output_lst": list(output_lst), "indices": indices, "data": _portable(data)}


def _keys(output_lst: Any, indices: Any, data: Any) -> list[Any]:
    """The model-output keys of a call (those a misaligned permutation misaligns)."""
    for o in output_lst:
        if "model_output" in o:
            return list(o["model_output"].keys())
    return []


def _table(row: str) -> list[Replaced]:
    """The table of release ``row``: rebatch's function for each name (`_functions`), and
    ``postprocess_batch_func``'s adapters (its check, dump and keys)."""
    from .._alignment import observe_split
    from .._postprocess import check_batch_func

    post = "postprocess_batch_func"
    return [
        Replaced(
            NAMES[name],
            name,
            ours,
            rows=ROWS.get(name),
            mutates=name == "append_to_dict",
            observe=observe_split if name in _PARTITIONER else None,
        )
        if name != post
        else Replaced(NAMES[name], name, ours, check_batch_func, _dumped, _keys, ROWS[name])
        for name, ours in _functions(row).items()
    ]


#: verl's integration (`_integration.Integration`): its public functions are this object's.
INTEGRATION = Integration(
    "verl",
    Versions("verl", VERSIONS, fallback="0.9.1"),
    _table,
    label="verl",
    describe=lambda version, row, how: _plan_of(version, row).describe(how),
)
install, uninstall, stats = INTEGRATION.install, INTEGRATION.uninstall, INTEGRATION.stats
mode, installed, replacements = INTEGRATION.mode, INTEGRATION.installed, INTEGRATION.replacements
