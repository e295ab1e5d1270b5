"""Turn rebatch on in verl with one call: `install()` (and `uninstall()`).

verl's engines bind ``postprocess_batch_func`` and ``prepare_micro_batches`` at import
(``from ..utils import postprocess_batch_func, prepare_micro_batches`` in the fsdp, megatron, automodel,
torchtitan and veomni engines), so replacing them in ``verl.workers.engine.utils`` alone changes none
of the engines already imported. `install` replaces them there (so every engine imported later binds
rebatch's) and in every loaded ``verl`` module that bound verl's originals; it is idempotent, and
`uninstall` puts verl's originals back wherever `install` replaced them.

verl is imported only when `install` is called. In Ray worker processes (verl's workers are Ray
actors), run it in every worker with Ray's setup hook::

    ray.init(runtime_env={"worker_process_setup_hook": "torch_impl.integrations.verl.install"})

(verl's trainer passes ``ray_kwargs.ray_init`` to ``ray.init``: see the README for the command-line form).
"""

from __future__ import annotations

import importlib
import sys
import threading
from typing import Any

__all__ = ["ENGINE_UTILS", "install", "installed", "replacements", "uninstall"]

#: The module verl's engines import the two functions from.
ENGINE_UTILS = "verl.workers.engine.utils"

_lock = threading.Lock()
#: (module name, attribute, verl's original) for every replacement made, to undo them.
_replaced: list[tuple[str, str, Any]] = []


def replacements() -> dict[str, Any]:
    """verl's name -> rebatch's function that `install` puts in its place."""
    from torch_impl import postprocess_batch_func, prepare_micro_batches

    return {"postprocess_batch_func": postprocess_batch_func, "prepare_micro_batches": prepare_micro_batches}


def installed() -> bool:
    """True between `install` and `uninstall`."""
    return bool(_replaced)


def install() -> None:
    """Replace verl's ``postprocess_batch_func`` and ``prepare_micro_batches`` with rebatch's, in
    ``verl.workers.engine.utils`` and in every loaded ``verl`` module that bound them. Idempotent."""
    with _lock:
        if _replaced:
            return
        utils = importlib.import_module(ENGINE_UTILS)
        ours = replacements()
        originals = {name: getattr(utils, name) for name in ours}
        for module_name, module in list(sys.modules.items()):
            if module is None or not (module_name == "verl" or module_name.startswith("verl.")):
                continue
            namespace = vars(module)
            for name, original in originals.items():
                for attr, value in list(namespace.items()):
                    if value is original:
                        namespace[attr] = ours[name]
                        _replaced.append((module_name, attr, original))


def uninstall() -> None:
    """Put verl's originals back wherever `install` replaced them. Idempotent."""
    with _lock:
        while _replaced:
            module_name, attr, original = _replaced.pop()
            module = sys.modules.get(module_name)
            if module is not None:
                setattr(module, attr, original)
