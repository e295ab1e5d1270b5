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
or set ``REBATCH_VERL=on`` (or ``shadow``) in their environment: `torch_impl.integrations.verl_plugin`,
a ``verl.plugins`` entry point, installs then in every process that imports verl.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

from ._patch import Patcher, Wrap
from ._shadow import Shadow

__all__ = [
    "ENGINE_UTILS",
    "PY_FUNCTIONAL",
    "SEQLEN_BALANCING",
    "install",
    "installed",
    "replacements",
    "stats",
    "uninstall",
]

#: The verl modules whose functions `install` replaces (see `replacements`).
ENGINE_UTILS = "verl.workers.engine.utils"
SEQLEN_BALANCING = "verl.utils.seqlen_balancing"
PY_FUNCTIONAL = "verl.utils.py_functional"


def replacements(dump: str | None = None, shadow: Shadow | None = None) -> dict[tuple[str, str], Any]:
    """``(verl module, name) -> rebatch's function`` that `install` puts in verl's place (with
    ``shadow``: a `Wrap` building the shadowing wrapper around verl's own function)."""
    import torch_impl

    if shadow is not None:
        from .._postprocess import check_batch_func

        def shadowing(name: str, ours: Any) -> Wrap:
            is_post = name == "postprocess_batch_func"
            return Wrap(
                lambda theirs: shadow.wrap(
                    name,
                    theirs,
                    ours,
                    check=check_batch_func if is_post else None,
                    on_first_difference=functools.partial(_save, dump) if is_post and dump else None,
                    keys_of=_keys if is_post else None,
                    mutates=name == "append_to_dict",
                )
            )

        return {place: shadowing(place[1], ours) for place, ours in replacements().items()}
    return {
        (ENGINE_UTILS, "postprocess_batch_func"): _dumping(torch_impl.postprocess_batch_func, dump),
        (ENGINE_UTILS, "prepare_micro_batches"): torch_impl.prepare_micro_batches,
        (SEQLEN_BALANCING, "rearrange_micro_batches"): torch_impl.rearrange_micro_batches,
        (SEQLEN_BALANCING, "restore_dynamic_batch"): torch_impl.restore_dynamic_batch,
        (SEQLEN_BALANCING, "get_seqlen_balanced_partitions"): torch_impl.get_seqlen_balanced_partitions,
        (SEQLEN_BALANCING, "get_group_balanced_partitions"): torch_impl.get_group_balanced_partitions,
        (PY_FUNCTIONAL, "append_to_dict"): torch_impl.append_to_dict,
    }


_patcher = Patcher("verl", replacements)
_shadow: Shadow | None = None  # the last shadow install's counters (kept after uninstall, for stats)


def installed() -> bool:
    """True between `install` and `uninstall`."""
    return _patcher.installed()


def _dumping(fn: Any, path: str | None) -> Any:
    """``fn``, saving its first call's ``(output_lst, indices, data)`` to ``path`` (for ``rebatch check
    --dump``) when a path is given."""
    if path is None:
        return fn
    saved = threading.Event()

    @functools.wraps(fn)
    def postprocess_batch_func(output_lst: Any, indices: Any, data: Any) -> Any:
        if not saved.is_set():
            saved.set()
            _save(path, output_lst, indices, data)
        return fn(output_lst, indices, data)

    return postprocess_batch_func


def _save(path: str, output_lst: Any, indices: Any, data: Any) -> None:
    """The format ``rebatch check --dump`` reads."""
    import torch

    torch.save((output_lst, indices, data), path)


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
) -> None:
    """Replace verl's functions (`replacements`) with rebatch's, in their verl modules and in every
    loaded ``verl`` module that bound them. Idempotent (a second call, whatever its arguments, changes
    nothing); `uninstall` undoes it.

    ``dump``: a file to save the first step's ``(output_lst, indices, data)`` to, for
    ``rebatch check --dump FILE`` (no edit of verl's source needed to capture a real step); in shadow
    mode, the first step where rebatch and verl differ, or rebatch finds a defect.

    ``mode="shadow"``: verl's functions stay in charge, rebatch's shadow them (module docstring):
    ``sample`` the fraction of calls compared, ``on_defect`` ``"log"`` (an ERROR on the
    ``rebatch.shadow`` logger) or ``"raise"`` (rebatch's `ref.errors.RebatchError`, stopping the run),
    ``report`` a JSON file of `stats` rewritten at each sampled call.

    ``lazy=True``: import nothing of verl; names of modules already loaded are replaced now, the others
    as their modules finish importing (the form `torch_impl.integrations.verl_plugin` uses while verl
    is half-imported).
    """
    global _shadow
    if mode not in ("on", "shadow"):
        from ref.errors import UnsupportedSettingError

        raise UnsupportedSettingError(f"mode must be 'on' or 'shadow', got {mode!r}")
    if _patcher.installed():
        return
    shadow = Shadow(sample, on_defect, report) if mode == "shadow" else None
    if lazy:
        _patcher.install_as_imported(dump, shadow)
    else:
        _patcher.install(dump, shadow)
    if shadow is not None:
        _shadow = shadow


def stats(json_path: str | None = None) -> dict[str, Any]:
    """Shadow mode's counters since its `install`: ``calls``, ``sampled``, ``differences``,
    ``defects``, ``errors`` (rebatch's other exceptions), ``verl_seconds``, ``rebatch_seconds``
    (totals over every name), ``by_name`` (the same per replaced name) and ``messages`` (the first 100
    logged lines); written as JSON to ``json_path`` when given. All zero without a shadow install."""
    if _shadow is None:
        return Shadow(0.0, "log", None).stats(json_path)
    return _shadow.stats(json_path)


def uninstall() -> None:
    """Put verl's originals back wherever `install` replaced them. Idempotent."""
    _patcher.uninstall()
