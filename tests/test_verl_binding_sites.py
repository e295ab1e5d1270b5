"""Every place verl binds a name `install` replaces (``from X import name``), and `install` /
`uninstall` at each one that imports here, for modules imported before and after `install`, on the
installed release (0.9.1; 0.9.0 binds them at the same sites; 0.8.0 at the ones `SITES_0_8_0` says).

`SITES` is the table (found by grepping the installed verl; `test_the_table_covers_every_site_in_verl`
re-derives it with `ast`, so a new verl site fails here). A row whose module cannot be imported in this
environment (its engine or trainer needs a package not installed: megatron, hydra, ...) is skipped with
the ImportError, and `test_which_site_modules_import_here` asserts exactly which import, so a module
that stops importing (or starts) is seen. Needs verl (skipped, with the reason, without it; CI runs these
in its pins environment with ``REBATCH_REQUIRE_VERL=1``, where a skip fails)."""

from __future__ import annotations

import ast
import importlib
import json
import pathlib
import subprocess
import sys
import warnings
from types import ModuleType
from typing import Any

import pytest

from property_tests import verl_oracle as vo
from torch_impl.integrations import verl as integration

VERL = vo.verl_or_skip()

ENGINE_UTILS, SEQLEN, PYF = integration.ENGINE_UTILS, integration.SEQLEN_BALANCING, integration.PY_FUNCTIONAL

#: (verl module, bound name, the module it is imported from): every module-level ``from X import name``
#: of a replaced name in verl 0.9.1.
SITES: list[tuple[str, str, str]] = [
    ("verl.trainer.ppo.ray_trainer", "get_seqlen_balanced_partitions", SEQLEN),
    ("verl.trainer.ppo.v1.trainer_base", "get_seqlen_balanced_partitions", SEQLEN),
    ("verl.trainer.sft_trainer_ray", "get_seqlen_balanced_partitions", SEQLEN),
    ("verl.utils.dynamic_cp_scheduler", "append_to_dict", PYF),
    ("verl.workers.engine.automodel.transformer_impl", "postprocess_batch_func", ENGINE_UTILS),
    ("verl.workers.engine.automodel.transformer_impl", "prepare_micro_batches", ENGINE_UTILS),
    ("verl.workers.engine.fsdp.transformer_impl", "postprocess_batch_func", ENGINE_UTILS),
    ("verl.workers.engine.fsdp.transformer_impl", "prepare_micro_batches", ENGINE_UTILS),
    ("verl.workers.engine.megatron.transformer_impl", "restore_dynamic_batch", SEQLEN),
    ("verl.workers.engine.megatron.transformer_impl", "postprocess_batch_func", ENGINE_UTILS),
    ("verl.workers.engine.megatron.transformer_impl", "prepare_micro_batches", ENGINE_UTILS),
    ("verl.workers.engine.torchtitan.transformer_impl", "postprocess_batch_func", ENGINE_UTILS),
    ("verl.workers.engine.torchtitan.transformer_impl", "prepare_micro_batches", ENGINE_UTILS),
    ("verl.workers.engine.utils", "append_to_dict", PYF),
    ("verl.workers.engine.utils", "rearrange_micro_batches", SEQLEN),
    ("verl.workers.engine.utils", "restore_dynamic_batch", SEQLEN),
    ("verl.workers.engine.veomni.transformer_impl", "postprocess_batch_func", ENGINE_UTILS),
    ("verl.workers.engine.veomni.transformer_impl", "prepare_micro_batches", ENGINE_UTILS),
    ("verl.workers.engine_workers", "append_to_dict", PYF),
]

#: verl 0.8.0 (0.9.0 binds at 0.9.1's sites): ``main_ppo_sync`` binds the partitioner too; there is no
#: ``ppo.v1`` trainer and no ``dynamic_cp_scheduler``.
SITES_0_8_0_ADDS = [("verl.trainer.main_ppo_sync", "get_seqlen_balanced_partitions", SEQLEN)]
SITES_0_8_0_LACKS = {"verl.trainer.ppo.v1.trainer_base", "verl.utils.dynamic_cp_scheduler"}
if VERL.version == "0.8.0":
    SITES = sorted([s for s in SITES if s[0] not in SITES_0_8_0_LACKS] + SITES_0_8_0_ADDS)

#: Imports inside a function: they read the name from its module at call time, so replacing it in its
#: defining module (what `install` does) is what they see; no module-level binding to check.
CALL_TIME: list[tuple[str, str, str]] = [
    ("verl.trainer.ppo.ray_trainer", "get_group_balanced_partitions", SEQLEN),
]

#: The site modules that import in this environment (torch 2.9.1, verl 0.9.1 --no-deps and the few
#: packages installed with it: uvicorn and fastapi for ``engine_workers``, which the engine lane,
#: tests/test_verl_engine.py, drives); every other one with the top-level package its import is missing.
IMPORTABLE = {
    "verl.utils.dynamic_cp_scheduler",
    "verl.workers.engine.fsdp.transformer_impl",
    "verl.workers.engine.utils",
    "verl.workers.engine_workers",
}
MISSING = {
    "verl.trainer.ppo.ray_trainer": "torchdata",
    "verl.trainer.ppo.v1.trainer_base": "transfer_queue",
    "verl.trainer.sft_trainer_ray": "hydra",
    "verl.workers.engine.automodel.transformer_impl": "nemo_automodel",
    "verl.workers.engine.megatron.transformer_impl": "megatron",
    "verl.workers.engine.torchtitan.transformer_impl": "torchtitan",
    "verl.workers.engine.veomni.transformer_impl": "veomni",
}

if VERL.version == "0.8.0":
    IMPORTABLE -= SITES_0_8_0_LACKS
    MISSING = {m: why for m, why in MISSING.items() if m not in SITES_0_8_0_LACKS} | {
        "verl.trainer.main_ppo_sync": "hydra"
    }

#: The importable site modules that `install` itself does not import (``verl.workers.engine``'s
#: ``__init__`` imports the fsdp engine with ``verl.workers.engine.utils``): imported after it.
LATE = {"verl.utils.dynamic_cp_scheduler", "verl.workers.engine_workers"} & IMPORTABLE


def _replaced_names() -> set[str]:
    return {name for _, name in integration.replacements()}


def _scan() -> tuple[set[tuple[str, str, str]], set[tuple[str, str, str]]]:
    """(module-level, in-function) ``from X import name`` of every replaced name in the installed verl's
    source, as (module, name, X resolved to an absolute module)."""
    import verl

    root = pathlib.Path(verl.__file__).parent
    names = _replaced_names()
    defining = {module for module, _ in integration.replacements()}
    top: set[tuple[str, str, str]] = set()
    nested: set[tuple[str, str, str]] = set()
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
            package = parts
        else:
            package = parts[:-1]
        module = ".".join(parts)
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        in_function = {
            id(inner)
            for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            for inner in ast.walk(node)
        }
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = package[: len(package) - (node.level - 1)] if node.level else []
            source = (
                ".".join([*base, node.module] if node.module else base) if node.level else str(node.module)
            )
            for alias in node.names:
                if alias.name == "*" and source in defining:  # binds every replaced name it exports
                    (nested if id(node) in in_function else top).add((module, "*", source))
                if alias.name in names:
                    bound = alias.asname or alias.name
                    (nested if id(node) in in_function else top).add((module, bound, source))
    return top, nested


def test_the_table_covers_every_site_in_verl() -> None:
    top, nested = _scan()
    assert top, "the scan found no site: the scan is broken"
    assert top - set(SITES) == set(), (
        f"verl binds a replaced name where SITES does not list: {top - set(SITES)}"
    )
    assert set(SITES) - top == set(), f"SITES lists a binding verl no longer has: {set(SITES) - top}"
    assert nested == set(CALL_TIME), (nested, CALL_TIME)
    defining = {name: module for module, name in integration.replacements()}
    for module, name, source in [*SITES, *CALL_TIME]:  # each imports from the module install patches
        assert source == defining[name], (module, name, source)


_imports: dict[str, ModuleType | ImportError] = {}


def _import(name: str) -> ModuleType | ImportError:
    if name not in _imports:
        try:
            with warnings.catch_warnings():  # verl warns of every optional engine it cannot import
                warnings.simplefilter("ignore")
                _imports[name] = importlib.import_module(name)
        except ImportError as err:
            _imports[name] = err
    return _imports[name]


def test_which_site_modules_import_here() -> None:
    modules = sorted({module for module, _, _ in SITES})
    assert set(modules) == IMPORTABLE | set(MISSING)
    got = {m: _import(m) for m in modules}
    assert {m for m, r in got.items() if isinstance(r, ModuleType)} == IMPORTABLE, got
    missing = {m: str(r.name).split(".")[0] for m, r in got.items() if isinstance(r, ImportError)}
    assert missing == MISSING, got


@pytest.fixture(autouse=True)
def _restored() -> Any:
    yield
    integration.uninstall()


@pytest.mark.parametrize(("module_name", "name", "source"), SITES, ids=[f"{m}:{n}" for m, n, _ in SITES])
def test_install_replaces_the_binding_and_uninstall_restores_it(
    module_name: str, name: str, source: str
) -> None:
    module = _import(module_name)
    if isinstance(module, ImportError):
        pytest.skip(
            f"{module_name} does not import here ({module!r}); test_which_site_modules_import_here pins this"
        )
    integration.uninstall()
    theirs = vars(sys.modules[source])[name]
    mine = integration.replacements()[source, name]
    assert theirs is not mine
    assert getattr(module, name) is theirs, "the site does not hold verl's function before install"
    integration.install()
    assert getattr(module, name).__wrapped__ is mine  # counted (on mode's counters) around rebatch's
    integration.uninstall()
    assert getattr(module, name) is theirs


def test_modules_imported_after_install_bind_rebatch() -> None:
    """In one fresh interpreter: `install()`, then each importable site module (`LATE`: those it has not
    loaded) is imported and holds rebatch's functions; `uninstall()` puts verl's back there too."""
    rows = [[m, n, s] for m, n, s in SITES if m in IMPORTABLE]
    code = f"""
import importlib, json, sys, warnings
warnings.simplefilter("ignore")
from torch_impl.integrations import verl as integration
rows = {rows!r}
integration.install()
table = integration.replacements()
out = {{
    "preloaded": sorted({{m for m, _, _ in rows if m in sys.modules}}),
    "after_install": [],
    "after_uninstall": [],
}}
for m, n, s in rows:
    out["after_install"].append(
        [m, n, getattr(getattr(importlib.import_module(m), n), "__wrapped__", None) is table[s, n]]
    )
integration.uninstall()
for m, n, s in rows:
    out["after_uninstall"].append([m, n, getattr(sys.modules[m], n) is vars(sys.modules[s])[n]
                                   and vars(sys.modules[s])[n] is not table[s, n]])
print(json.dumps(out))
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(out["preloaded"]) == IMPORTABLE - LATE, out["preloaded"]
    assert len(out["after_install"]) == len(rows) > 0
    assert all(ok for _, _, ok in out["after_install"]), out["after_install"]
    assert all(ok for _, _, ok in out["after_uninstall"]), out["after_uninstall"]
