"""Turn rebatch on in verl with one call: `install()` (and `uninstall()`).

verl's engines bind ``postprocess_batch_func`` and ``prepare_micro_batches`` at import
(``from ..utils import postprocess_batch_func, prepare_micro_batches`` in the fsdp, megatron, automodel,
torchtitan and veomni engines), so replacing them in ``verl.workers.engine.utils`` alone changes none
of the engines already imported. `install` replaces them there (so every engine imported later binds
rebatch's) and in every loaded ``verl`` module that bound verl's originals; the same for verl's
partitioner functions (``rearrange_micro_batches``, ``restore_dynamic_batch``,
``get_seqlen_balanced_partitions``, ``get_group_balanced_partitions`` in ``verl.utils.seqlen_balancing``)
and ``append_to_dict`` (``verl.utils.py_functional``); it is idempotent, and
`uninstall` puts verl's originals back wherever `install` replaced them.

Each verl release gets its own result: `VERSIONS` (the one table) says, for verl 0.8.0, 0.9.0 and
0.9.1, which names rebatch replaces there and with which rule (0.8.0 and 0.9.0 partition in one pass,
0.9.1 until every micro-batch fits the budget); `install` reads the installed release from verl's
metadata, logs one INFO line saying what it replaces and what it leaves as verl's, and returns that
`Plan` (`plan(version)` gives it for any release without installing). Another release is refused
(`ref.errors.UnsupportedSettingError`) unless ``install(force=True)``.

``install(mode="shadow")`` adopts rebatch safely: verl's functions stay in charge (the trainer gets
verl's results, the same objects); each call's input goes through rebatch's checks, a sampled fraction
of calls (``sample``: the first, then every ``round(1 / sample)``-th) is also run through rebatch's
function and compared with verl's bit for bit, and `stats` counts and times both (see
`torch_impl.integrations._shadow`). Measured (``python -m rebatch.bench.shadow``, CPU, one thread,
torch 2.9.1, 3 keys): on unsampled calls, where only rebatch's checks run, 16.1 ms against verl's
15.9 ms for 256 rows in 8 micro-batches (+1%), 6.5 against 5.9 ms for 64 rows in 4 (+0.6 ms), within
noise for 1024 rows in 16; a sampled call (rebatch's function and the comparison too) 1.4-2x verl's.
The other names run nothing of rebatch's on unsampled calls (their inputs are verl's own
computation; rebatch's checks of them are part of their function, run on sampled calls). Sampling is
a per-process counter per name, so every rank samples the same calls: ``prepare_micro_batches`` with a
``dp_group`` runs rebatch's collectives, then verl's, on every rank alike.

verl is imported only when `install` is called. In Ray worker processes (verl's workers are Ray
actors), run it in every worker with Ray's setup hook::

    ray.init(runtime_env={"worker_process_setup_hook": "torch_impl.integrations.verl.install"})

(verl's trainer passes ``ray_kwargs.ray_init`` to ``ray.init``: see the README for the command-line form),
or set ``REBATCH=on`` (or ``shadow``; ``REBATCH_VERL``, verl's alias, wins when both are set) in their
environment: `rebatch_startup.verl`, a ``verl.plugins`` entry point, installs then in every process that
imports verl.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Iterable
from typing import Any, NamedTuple

from ._counts import Rows, rows_of_partitions
from ._files import ProcessFile, save_dump
from ._integration import Integration, shadowing
from ._patch import Versions
from ._shadow import Shadow

__all__ = [
    "ENGINE_UTILS",
    "NAMES",
    "PY_FUNCTIONAL",
    "SEQLEN_BALANCING",
    "VERSIONS",
    "Plan",
    "install",
    "installed",
    "plan",
    "replacements",
    "stats",
    "uninstall",
]

log = logging.getLogger("rebatch")

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
            f"; {name} with {', '.join(f'{k}={v!r}' for k, v in kw.items())}" for name, kw in self.bound.items()
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
        version = _versions.installed()
    row_version, _ = _versions.pick(version, force=force)
    return _plan_of(version, row_version)


@functools.cache
def _plan_of(version: str | None, row_version: str) -> Plan:
    """The `Plan` of verl ``version`` given the release ``row_version`` of `VERSIONS` that applies (one
    object each: a second `install` returns the first's)."""
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


def replacements(
    dump: str | None = None, shadow: Shadow | None = None, version: str | None = None, carry: bool = False
) -> dict[tuple[str, str], Any]:
    """``(verl module, name) -> rebatch's function`` that `install` puts in verl's place on verl release
    ``version`` (`VERSIONS`; default: the installed one, 0.9.1's row for a release not there); with
    ``shadow``: a `Wrap` building the shadowing wrapper around verl's own function. ``carry`` is unused:
    verl's workers activate through verl's own plugin mechanisms (`rebatch_startup.verl`)."""
    if version is None:
        installed_version = _versions.installed()
        version = installed_version if installed_version in VERSIONS else _versions.fallback
    functions = _functions(version)
    if shadow is not None:
        from .._postprocess import check_batch_func

        post = "postprocess_batch_func"
        return {
            (NAMES[name], name): shadowing(
                shadow,
                name,
                ours,
                check=check_batch_func if name == post else None,
                save=_save if name == post else None,
                dump=dump,
                keys_of=_keys if name == post else None,
                mutates=name == "append_to_dict",
            )
            for name, ours in functions.items()
        }
    return {
        (NAMES[name], name): _dumping(ours, dump) if name == "postprocess_batch_func" else ours
        for name, ours in functions.items()
    }


#: The rows of a call of each name, for ``on`` mode's counters (host-side facts: lengths, batch sizes).
ROWS: dict[str, Rows] = {
    "postprocess_batch_func": lambda output_lst, indices, data: rows_of_partitions(indices),
    "restore_dynamic_batch": lambda data, batch_idx_list: rows_of_partitions(batch_idx_list),
    "prepare_micro_batches": lambda data, *args, **kwargs: int(data.batch_size[0]),
    "rearrange_micro_batches": lambda batch, *args, **kwargs: int(batch.batch_size[0]),
    "get_seqlen_balanced_partitions": lambda seqlen_list, *args, **kwargs: len(seqlen_list),
    "get_group_balanced_partitions": lambda seqlen_list, *args, **kwargs: len(seqlen_list),
}

_versions = Versions("verl", VERSIONS, fallback="0.9.1")
_integration = Integration(
    "verl", replacements, _versions, lambda version, row, how: _plan_of(version, row).describe(how), ROWS
)
_patcher = _integration.patcher


def installed() -> bool:
    """True between `install` and `uninstall`."""
    return _integration.installed()


def _dumping(fn: Any, path: str | None) -> Any:
    """``fn``, saving its first call's inputs to ``path`` (`_save`, for ``rebatch check --dump``) when a
    path is given."""
    if path is None:
        return fn
    saved = threading.Event()
    where = ProcessFile(path)

    @functools.wraps(fn)
    def postprocess_batch_func(output_lst: Any, indices: Any, data: Any) -> Any:
        if not saved.is_set():
            saved.set()
            _save(where.now(), output_lst, indices, data)
        return fn(output_lst, indices, data)

    return postprocess_batch_func


def _portable(data: Any) -> Any:
    """``data`` with each enum value among its non-tensor entries (verl's ``pad_mode``, a str ``Enum``)
    replaced by its value, in a shallow copy: a dump that loads without verl's classes."""
    import enum

    from tensordict import NonTensorData, TensorDictBase

    if not isinstance(data, TensorDictBase):
        return data
    enums = [(k, v.data) for k, v in data.non_tensor_items() if isinstance(getattr(v, "data", None), enum.Enum)]
    if not enums:
        return data
    copied = data.copy()
    for key, value in enums:
        copied[key] = NonTensorData(value.value)
    return copied


def _save(path: str, output_lst: Any, indices: Any, data: Any) -> None:
    """The step in rebatch's dump format (`_files.save_dump`): inputs ``output_lst``, ``indices``, ``data``."""
    save_dump(
        path,
        trainer="verl",
        version=_versions.installed(),
        function=f"{ENGINE_UTILS}.postprocess_batch_func",
        inputs={"output_lst": list(output_lst), "indices": indices, "data": _portable(data)},
    )


def _keys(output_lst: Any, indices: Any, data: Any) -> list[Any]:
    """The model-output keys of a call (those a misaligned permutation misaligns)."""
    for o in output_lst:
        if "model_output" in o:
            return list(o["model_output"].keys())
    return []


def install(
    dump: str | None = None,
    *,
    mode: str = "on",
    sample: float = 0.05,
    on_defect: str = "log",
    report: str | None = None,
    lazy: bool = False,
    force: bool = False,
    witness: bool | None = None,
    unbound: Iterable[str] | None = None,
) -> Plan:
    """Replace verl's functions (`replacements`) with rebatch's, in their verl modules and in every
    loaded ``verl`` module that bound them; returns the `Plan` (the names replaced, and left as verl's,
    on the installed verl release), also logged as one INFO line on the ``"rebatch"`` logger. Idempotent
    (a second call, whatever its arguments, changes nothing and returns the first's plan); `uninstall`
    undoes it.

    The installed verl must be a release of `VERSIONS` (0.8.0, 0.9.0, 0.9.1; read from its metadata):
    another raises `ref.errors.UnsupportedSettingError`, replacing nothing, unless ``force=True`` (then
    0.9.1's replacements, with a warning logged).

    ``dump``: a file to save the first step's ``(output_lst, indices, data)`` to, for
    ``rebatch check --dump FILE`` (no edit of verl's source needed to capture a real step); in shadow
    mode, the first step where rebatch and verl differ, or rebatch finds a defect.

    ``mode="shadow"``: verl's functions stay in charge, rebatch's shadow them (module docstring):
    ``sample`` the fraction of calls compared, ``on_defect`` ``"log"`` (an ERROR on the
    ``rebatch.shadow`` logger) or ``"raise"`` (rebatch's `ref.errors.RebatchError`, stopping the run),
    ``report`` a JSON file of `stats` rewritten at each sampled call. In ``on`` mode ``report`` is the
    file of its counters (`torch_impl.integrations._counts`: calls, rows, keys witnessed, errors).

    ``lazy=True``: import nothing of verl; names of modules already loaded are replaced now, the others
    as their modules finish importing (the form `torch_impl.integrations.verl_plugin` uses while verl
    is half-imported).

    ``witness=False``: switch the alignment witness off for the process (`torch_impl.set_witness`;
    default: as ``REBATCH_WITNESS`` says, on); ``unbound``: keys it leaves unbound (a custom loss whose
    rows are not the batch's rows). Both only on a fresh install, and put back by `uninstall`
    (`_integration.Integration`, one copy for every trainer). The witness is on by default: a
    valid permutation that is the wrong one, or micro-batches in the wrong order, raise
    `ref.errors.MisalignmentError` (in shadow mode, a defect of verl's step).
    """
    with _integration.lock:
        _integration.install(
            dump,
            mode=mode,
            sample=sample,
            on_defect=on_defect,
            report=report,
            lazy=lazy,
            force=force,
            witness=witness,
            unbound=unbound,
        )
        assert _integration.release is not None  # just installed
        return _plan_of(*_integration.release)


def stats(json_path: str | None = None) -> dict[str, Any]:
    """Shadow mode's counters since its `install`: ``calls``, ``sampled``, ``differences``,
    ``defects``, ``errors`` (rebatch's other exceptions), ``verl_seconds`` (the same as
    ``trainer_seconds``, the name every trainer's shadow has), ``rebatch_seconds``
    (totals over every name), ``by_name`` (the same per replaced name), ``messages`` (the first 100
    logged lines), ``trainer``, ``version``, ``mode`` and ``process``; written as JSON to ``json_path``
    when given. After an ``on`` install: its counters (``mode`` ``"on"``: calls, rows, keys_witnessed,
    errors per name). All zero without an install."""
    return _integration.stats(json_path)


def uninstall() -> None:
    """Put verl's originals back wherever `install` replaced them, and the alignment witness's switch as
    it was before `install` changed it. Idempotent."""
    _integration.uninstall()
