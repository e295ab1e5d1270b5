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

verl is imported only when `install` is called. In Ray worker processes (verl's workers are Ray
actors), run it in every worker with Ray's setup hook::

    ray.init(runtime_env={"worker_process_setup_hook": "torch_impl.integrations.verl.install"})

(verl's trainer passes ``ray_kwargs.ray_init`` to ``ray.init``: see the README for the command-line form).
"""

from __future__ import annotations

import functools
import threading
from typing import Any

from ._patch import Patcher

__all__ = ["ENGINE_UTILS", "PY_FUNCTIONAL", "SEQLEN_BALANCING", "install", "installed", "replacements", "uninstall"]

#: The verl modules whose functions `install` replaces (see `replacements`).
ENGINE_UTILS = "verl.workers.engine.utils"
SEQLEN_BALANCING = "verl.utils.seqlen_balancing"
PY_FUNCTIONAL = "verl.utils.py_functional"


def replacements(dump: str | None = None) -> dict[tuple[str, str], Any]:
    """``(verl module, name) -> rebatch's function`` that `install` puts in verl's place."""
    import torch_impl

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
            import torch

            torch.save((output_lst, indices, data), path)
        return fn(output_lst, indices, data)

    return postprocess_batch_func


def install(dump: str | None = None) -> None:
    """Replace verl's functions (`replacements`) with rebatch's, in their verl modules and in every
    loaded ``verl`` module that bound them. Idempotent; `uninstall` undoes it.

    ``dump``: a file to save the first step's ``(output_lst, indices, data)`` to, for
    ``rebatch check --dump FILE`` (no edit of verl's source needed to capture a real step).
    """
    _patcher.install(dump)


def uninstall() -> None:
    """Put verl's originals back wherever `install` replaced them. Idempotent."""
    _patcher.uninstall()
