"""Private torch in one room (issue 58): every private torch and tensordict access of rebatch is a named
function or constant of `ref._torch_private`, each checked here for what rebatch relies on (on torch 2.13
here; on torch 2.9.1 in verl's pins environment and 2.14.1 in CI's torch lane, which run this file too)
and listed in ``docs/architecture.md`` ("Private torch APIs"); a check of the syntax tree fails on a private
torch or tensordict name anywhere else: an attribute, an import, a string (``getattr``, ``attrgetter``, a
pickle's name) or a keyword argument. Each of those forms is planted below and shown flagged.
"""

from __future__ import annotations

import ast
import importlib
import io
import pickletools
import pkgutil
import re
import sys
import zipfile
from collections.abc import Callable, Iterable, Iterator
from functools import cache
from operator import attrgetter
from pathlib import Path
from typing import Any

import pytest
import tensordict
import torch
import torch.distributed as dist
from tensordict import NonTensorData, TensorDict

from ref import _torch_private as _private
from torch_impl._jagged import size_cache

ROOT = Path(__file__).resolve().parents[1]
#: The code the check reads: the five packages and the tests.
SCANNED = ("ref", "torch_impl", "rebatch_startup", "rebatch", "property_tests", "tests")
#: The room itself and this file, its test, are the two places a private torch name may appear.
ROOM = ROOT / "ref" / "_torch_private.py"
EXEMPT = frozenset({ROOM, Path(__file__).resolve()})
#: The distributions whose private names the check flags.
ROOTS = ("torch", "tensordict")
#: A name torch keeps undocumented without an underscore, reached by rebatch (`_private.kineto_events`).
UNDOCUMENTED = frozenset({"kineto_results"})
#: A dotted private path of torch or tensordict inside a string (``"torch._utils._rebuild_tensor_v2"``).
PRIVATE_PATH = re.compile(r"\b(?:torch|tensordict)(?:\.\w+)*?\._[A-Za-z]\w*")


def _private_name(name: str) -> bool:
    """A single-underscore name (``_values``), not a dunder (``__init__``) nor ``_`` alone."""
    return len(name) > 1 and name.startswith("_") and not name.startswith("__")


def _sources() -> list[Path]:
    return [p for package in SCANNED for p in sorted((ROOT / package).rglob("*.py")) if p not in EXEMPT]


def _jagged(lengths: list[int], *, holes: bool = False) -> torch.Tensor:
    values = torch.arange(float(sum(lengths) + 2))
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    if holes:
        return torch.nested.nested_tensor_from_jagged(values, offsets, lengths=torch.tensor(lengths))
    return torch.nested.nested_tensor_from_jagged(values[: sum(lengths)], offsets)


def _reached() -> list[Any]:
    """The torch and tensordict objects rebatch's code reaches (classes, instances, modules), whose
    underscored names are private: computed from the running torch, not listed."""
    x = _jagged([2, 1])
    td = TensorDict({"a": torch.ones(2)}, batch_size=[2])
    nested_module = sys.modules[_private.NestedTensor.__module__]
    return [
        torch,
        torch.Tensor,
        torch.ones(1),
        _private.NestedTensor,
        x,
        _private.ragged_size(x),
        nested_module,
        torch.nested,
        torch.ops.aten,
        torch._C,
        torch._C._distributed_c10d,
        _private.threaded_process_group(),
        torch.autograd.profiler.profile(),
        torch.profiler.profile,
        torch.testing,
        torch.utils,
        torch.distributed,
        torch.func,
        torch.fx,
        torch.overrides,
        torch.serialization,
        torch.SymInt,
        tensordict,
        tensordict.TensorDictBase,
        TensorDict,
        td,
        NonTensorData,
        NonTensorData("x"),
        tensordict.NonTensorStack,
    ]


def _submodule_names() -> set[str]:
    """The underscored submodules of torch's and tensordict's packages rebatch reaches (``torch._dynamo``,
    ``torch.nested._internal``, ``tensordict._td``, ...), found on disk (nothing imported)."""
    packages = [torch, torch.nested, torch.testing, torch.utils, torch.distributed, tensordict]
    packages.append(sys.modules[_private.NestedTensor.__module__.rpartition(".")[0]])
    return {m.name for p in packages for m in pkgutil.iter_modules(p.__path__) if _private_name(m.name)}


@cache
def torch_private_names() -> frozenset[str]:
    """Every underscored name of the objects `_reached` gives and of their packages' submodules."""
    names = {n for obj in _reached() for n in dir(obj) if _private_name(n)}
    return frozenset(names | _submodule_names())


def _module_level_names(tree: ast.Module) -> Iterator[str]:
    """Names a module or class body defines (functions, classes, assignments): reachable as attributes."""
    scopes: list[Any] = [tree, *(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef))]
    for scope in scopes:
        for stmt in scope.body:
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                yield stmt.name
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
            for target in targets:
                yield from (n.id for n in ast.walk(target) if isinstance(n, ast.Name)) if target else ()


def _own_names_of(tree: ast.Module) -> Iterator[str]:
    """The names one module of ours defines: its and its classes' definitions, ``self.x``/``cls.x``
    attributes, parameters (a keyword argument of our own function), import aliases."""
    yield from _module_level_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.arg):
            yield node.arg
        elif isinstance(node, ast.alias) and node.asname:
            yield node.asname
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id in ("self", "cls")
        ):
            yield node.attr


@cache
def own_names() -> frozenset[str]:
    """The underscored names the repository defines itself (its modules' names included), so our own
    private helpers are not taken for torch's."""
    names = {p.stem for p in _sources()}
    for path in _sources():
        names.update(_own_names_of(ast.parse(path.read_text(), str(path))))
    return frozenset(n for n in names if _private_name(n))


def _room_tree() -> ast.Module:
    return ast.parse(ROOM.read_text(), str(ROOM))


@cache
def room_names() -> frozenset[str]:
    """The private names the room reads: attributes, strings (``attrgetter``, ``getattr``), keywords."""
    found: set[str] = set()
    for node in ast.walk(_room_tree()):
        if isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
            found.add(node.value)
        elif isinstance(node, ast.keyword) and node.arg:
            found.add(node.arg)
    return frozenset(n for n in found if _private_name(n))


@cache
def flagged_names() -> frozenset[str]:
    """The private names the check flags: torch's and tensordict's, less those we define ourselves; a name
    the room reads is torch's whatever we define, so it stays flagged."""
    torch_names = torch_private_names()
    return frozenset((torch_names - own_names()) | (torch_names & room_names()) | UNDOCUMENTED)


def _docstrings(tree: ast.AST) -> set[int]:
    """The string statements of ``tree`` (docstrings, attribute docs): prose, not code."""
    return {
        id(n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
    }


def _torch_module(module: str) -> bool:
    return module.split(".")[0] in ROOTS


def _private_module(module: str) -> bool:
    return _torch_module(module) and any(map(_private_name, module.split(".")))


def _finding(node: ast.AST, names: frozenset[str], prose: set[int]) -> str | None:
    """What is private in ``node``, or None."""
    if isinstance(node, ast.Attribute) and node.attr in names:
        return f"attribute .{node.attr}"
    if isinstance(node, ast.Import):
        bad = [alias.name for alias in node.names if _private_module(alias.name)]
        return f"import {', '.join(bad)}" if bad else None
    if isinstance(node, ast.ImportFrom) and not node.level and _torch_module(node.module or ""):
        module = node.module or ""
        bad = [alias.name for alias in node.names if _private_name(alias.name)]
        return (
            f"from {module} import {', '.join(a.name for a in node.names)}"
            if bad or _private_module(module)
            else None
        )
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
        if node.value in names or PRIVATE_PATH.search(node.value):
            return f"string {node.value[:80]!r}"
        return None
    if isinstance(node, ast.keyword) and node.arg in names:
        return f"keyword argument {node.arg}="
    return None


def private_accesses(source: str, filename: str = "<planted>") -> list[str]:
    """Every private torch or tensordict access of ``source``: ``line: what``."""
    tree = ast.parse(source, filename)
    names, prose = flagged_names(), _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        what = _finding(node, names, prose)
        if what:
            found.append(f"{filename}:{getattr(node, 'lineno', 0)}: {what}")
    return sorted(found)


# --- the check of the syntax tree ------------------------------------------------------------------------


def test_no_private_torch_outside_the_room() -> None:
    found = [
        hit for path in _sources() for hit in private_accesses(path.read_text(), str(path.relative_to(ROOT)))
    ]
    assert not found, "private torch or tensordict outside ref/_torch_private.py:\n" + "\n".join(found)


def test_every_name_the_room_reads_is_flagged_elsewhere() -> None:
    """The computed names cover what the room reads: none of them is missing from torch's objects on this
    torch (the computation would then miss it elsewhere)."""
    missing = room_names() - torch_private_names()
    assert not missing, f"names the room reads that no reached torch object has: {sorted(missing)}"
    assert room_names() <= flagged_names()


#: Each form of private access, planted: ``(source, what the check reports)``.
PLANTED: dict[str, tuple[str, str]] = {
    "attribute": ("y = x._values", "attribute ._values"),
    "attribute_of_the_c_core": ("torch._C._functorch.maybe_current_level()", "attribute ._C"),
    "nested_int_size": ("ragged = x._size[1]", "attribute ._size"),
    "attribute_set": ("x._offsets = offsets", "attribute ._offsets"),
    "tensordict_non_tensordict": ("stored = value._non_tensordict", "attribute ._non_tensordict"),
    "cached_seqlen": ("lo = x._maybe_min_seqlen", "attribute ._maybe_min_seqlen"),
    "undocumented_kineto": ("events = prof.profiler.kineto_results.events()", "attribute .kineto_results"),
    "import": ("import torch._dynamo", "import torch._dynamo"),
    "import_nested_internal": (
        "import torch.nested._internal.nested_tensor as nt",
        "import torch.nested._internal",
    ),
    "from_import": (
        "from torch.nested._internal.nested_tensor import NestedTensor",
        "from torch.nested._internal",
    ),
    "from_import_of_a_private_name": ("from torch import _C", "from torch import _C"),
    "from_import_testing_internal": (
        "from torch.testing._internal.distributed import multi_threaded_pg",
        "from torch",
    ),
    "from_import_tensordict": ("from tensordict._td import TensorDict", "from tensordict._td import"),
    "getattr_string": ('cache = getattr(x, "_metadata_cache", None)', "string '_metadata_cache'"),
    "hasattr_string": ('holes = hasattr(x, "_lengths")', "string '_lengths'"),
    "attrgetter_string": ('read = attrgetter("_ragged_idx", "requires_grad")', "string '_ragged_idx'"),
    "tensordict_getattr_string": ('stored = getattr(v, "_non_tensordict", {})', "string '_non_tensordict'"),
    "pickle_name_string": ('NAMES = {"torch._utils._rebuild_tensor_v2"}', "string 'torch._utils"),
    "import_module_string": ('dynamo = importlib.import_module("torch._dynamo")', "string 'torch._dynamo'"),
    "keyword_argument": (
        "t = NestedTensor(v, o, _metadata_cache=sizes)",
        "keyword argument _metadata_cache=",
    ),
}


@pytest.mark.parametrize("form", sorted(PLANTED))
def test_the_check_flags_each_form_when_planted(form: str) -> None:
    """The acceptance's "fails on each form above when planted": each form in a source of its own, flagged."""
    source, expected = PLANTED[form]
    found = private_accesses(f"import torch\n{source}\n")
    assert found, f"{form}: not flagged: {source}"
    assert any(expected in hit for hit in found), (form, found)


def test_the_check_leaves_our_own_private_names_and_prose_alone() -> None:
    source = '''
"""A module docstring naming torch._C and x._values: prose."""
from torch_impl import _postprocess, testing
from . import _parts


class Ours:
    """``torch.nested._internal`` named in a docstring."""

    def __init__(self) -> None:
        self._lock = None

    def run(self, _unused: int = 0) -> None:
        self._lock = _postprocess._checked_plans
        _parts._plain_jagged([])
        testing.raw_values(None)
'''
    assert private_accesses(source) == []


def test_the_check_fails_on_a_planted_line_of_a_real_module(tmp_path: Path) -> None:
    """A real module with one private access added: only that line is reported."""
    real = (ROOT / "torch_impl" / "_alignment" / "_witness.py").read_text()
    planted = real + "\n\ndef _planted(ids):\n    return ids._offsets\n"
    found = private_accesses(planted, "torch_impl/_alignment/_witness.py")
    assert found == [f"torch_impl/_alignment/_witness.py:{len(planted.splitlines())}: attribute ._offsets"]


# --- each of the room's names: what rebatch relies on ------------------------------------------------------

#: The room's names each behaviour test below covers (`covers`); every name of the room is covered.
COVERED: set[str] = set()


def covers(*names: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    def register(test: Callable[..., None]) -> Callable[..., None]:
        COVERED.update(names)
        return test

    return register


def _plain_jagged_tensors() -> list[torch.Tensor]:
    return [
        _jagged([2, 0, 3]),
        torch.nested.as_nested_tensor([torch.ones(2), torch.ones(1)], layout=torch.jagged),
    ]


@covers("NestedTensor", "raw_values", "raw_offsets", "raw_lengths")
def test_the_nested_tensor_class_and_its_buffers() -> None:
    """`NestedTensor` is the class of every jagged tensor; ``_values``, ``_offsets`` and ``_lengths`` are
    what the public accessors return, the values buffer itself (no view op)."""
    for x in _plain_jagged_tensors():
        assert type(x) is _private.NestedTensor
        assert _private.raw_lengths(x) is None
        assert _private.raw_values(x) is _private.raw_values(x)
        assert _private.raw_values(x).data_ptr() == x.values().data_ptr()
        assert torch.equal(_private.raw_values(x), x.values())
        assert torch.equal(_private.raw_offsets(x), x.offsets())
    holed = _jagged([2, 1], holes=True)
    assert torch.equal(_private.raw_lengths(holed), holed.lengths())


@covers("ragged_idx")
def test_the_ragged_dimension() -> None:
    """1 for every jagged tensor a trainer builds; another for a transposed one (which rebatch refuses)."""
    x = torch.nested.nested_tensor_from_jagged(torch.ones(3, 2, 4), torch.tensor([0, 1, 3]))
    assert _private.ragged_idx(x) == 1
    assert _private.ragged_idx(x.transpose(1, 2)) == 2
    assert all(_private.ragged_idx(t) == 1 for t in _plain_jagged_tensors())


@covers("ragged_size")
def test_the_nested_int_is_one_object_through_moves() -> None:
    """The nested int: one host object kept through the moves and ops a trainer makes (provenance rests on
    its identity), another for other offsets."""
    x = _jagged([2, 3])
    n = _private.ragged_size(x)
    assert isinstance(n, torch.SymInt)
    for moved in (x.detach(), x * 2, x.to(torch.float64), x.clone()):
        assert _private.ragged_size(moved) is n
    assert _private.ragged_size(_jagged([2, 3])) is not n


@covers("set_raw_offsets")
def test_offsets_can_be_planted() -> None:
    x = _jagged([1, 2])
    floating = torch.tensor([0.0, 1.0, 3.0])
    _private.set_raw_offsets(x, floating)
    assert _private.raw_offsets(x) is floating


@covers("JAGGED_FLAGS", "JAGGED_BUFFERS")
def test_the_many_parts_reads() -> None:
    """`JAGGED_FLAGS` of a plain part is ``(1, None, False)`` (taken as it is); `JAGGED_BUFFERS` are its
    buffers and sizes, the nested int at ``[1]``."""
    for x in _plain_jagged_tensors():
        assert _private.JAGGED_FLAGS(x) == (1, None, False)
        values, offsets, sizes = _private.JAGGED_BUFFERS(x)
        assert values is _private.raw_values(x)
        assert offsets is _private.raw_offsets(x)
        assert sizes[1] is _private.ragged_size(x)
    assert _private.JAGGED_FLAGS(_jagged([1], holes=True))[1] is not None
    assert _private.JAGGED_FLAGS(_jagged([1, 2]).requires_grad_())[2] is True


@covers("cached_seqlen_bounds", "metadata_cache")
def test_the_cached_sizes() -> None:
    """Cached sizes read as cached (each the length of an empty host tensor), None or ``{}`` where not
    cached, never computed by the read."""
    offsets = torch.tensor([0, 2, 5])
    cached = torch.nested.nested_tensor_from_jagged(torch.arange(5.0), offsets, min_seqlen=2, max_seqlen=3)
    assert _private.cached_seqlen_bounds(cached) == (2, 3)
    cache = _private.metadata_cache(cached)
    assert {k: tuple(v.shape) for k, v in cache.items()} == {"min_seqlen": (2, 0), "max_seqlen": (3, 0)}
    bare = torch.nested.nested_tensor_from_jagged(torch.arange(5.0), offsets)
    assert _private.cached_seqlen_bounds(bare) == (None, None)
    assert _private.metadata_cache(bare) == {}
    assert _private.metadata_cache(torch.ones(2)) == {}


@covers("nested_with_cache")
def test_the_direct_constructor_makes_the_public_tensor() -> None:
    """Built directly, sizes cached: the same jagged tensor as the public constructor's, over the same
    memory, not a view autograd records."""
    values, offsets = torch.arange(5.0), torch.tensor([0, 2, 5])
    ours = _private.nested_with_cache(values, offsets, size_cache((2, 3)))
    theirs = torch.nested.nested_tensor_from_jagged(values, offsets, min_seqlen=2, max_seqlen=3)
    assert type(ours) is type(theirs)
    assert ours.values().data_ptr() == values.data_ptr()
    assert _private.cached_seqlen_bounds(ours) == (2, 3)
    assert [r.tolist() for r in ours.unbind()] == [r.tolist() for r in theirs.unbind()]
    assert ours.to_padded_tensor(0.0).shape == (2, 3)
    assert not ours._is_view()


@covers("find_nested_view", "nested_view")
def test_the_internal_nested_view_is_the_public_constructors() -> None:
    """Present (the fallback, the public constructor, is never needed on CI's torches) and the same view."""
    assert _private.nested_view is not None
    assert _private.find_nested_view() is _private.nested_view
    values, offsets = torch.arange(5.0), torch.tensor([0, 2, 2, 5])
    ours = _private.nested_view(values, offsets, None, min_seqlen=0, max_seqlen=3)
    theirs = torch.nested.nested_tensor_from_jagged(values, offsets)
    assert ours.values().data_ptr() == values.data_ptr()
    assert [r.tolist() for r in ours.unbind()] == [r.tolist() for r in theirs.unbind()]
    assert type(ours) is type(theirs)


@covers("DisableTorchFunctionSubclass")
def test_disable_torch_function_subclass_keeps_what_is_read() -> None:
    """Attributes read the same under it (only without the subclass's per-read dispatch)."""
    x = _jagged([2, 0, 3])
    read = attrgetter("requires_grad", "dtype", "device")
    with _private.DisableTorchFunctionSubclass():
        inside = (*_private.JAGGED_BUFFERS(x), _private.ragged_idx(x), *read(x))
    assert inside == (*_private.JAGGED_BUFFERS(x), _private.ragged_idx(x), *read(x))


@covers("functorch_level")
def test_functorch_level_tells_a_transform_apart() -> None:
    """None outside a ``torch.func`` transform, a level inside one."""
    assert _private.functorch_level() is None
    levels: list[object] = []

    def f(x: torch.Tensor) -> torch.Tensor:
        levels.append(_private.functorch_level())
        return x.sum()

    torch.func.grad(f)(torch.ones(2))
    torch.func.vmap(f)(torch.ones(2, 2))
    assert len(levels) == 2
    assert all(level is not None for level in levels)


@covers("non_tensor_stored")
def test_a_non_tensor_field_as_stored() -> None:
    for plain in (True, 3, "dynamic"):
        assert _private.non_tensor_stored(NonTensorData(plain), None) == plain
    td = TensorDict({"flag": NonTensorData(False)}, batch_size=[])
    assert _private.non_tensor_stored(td.get("flag"), None) is False
    assert _private.non_tensor_stored(object(), "default") == "default"


def _pickle_names(obj: Any) -> set[str]:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    names = set()
    with zipfile.ZipFile(io.BytesIO(buffer.getvalue())) as archive:
        for info in archive.infolist():
            if info.filename.endswith(".pkl"):
                for op, arg, _ in pickletools.genops(archive.read(info)):
                    if op.name == "GLOBAL":
                        names.add(str(arg).replace(" ", "."))
    return names


@covers("PICKLE_NAMES_TORCH_ADMITS", "PICKLE_NAMES_TO_ALLOW", "mark_dynamic")
def test_the_pickle_names_are_those_a_dump_holds_and_exist() -> None:
    """A dump of jagged tensors, a TensorDict and a tensor marked dynamic names private globals of these
    two lists only, each exists on this torch and tensordict, and the dump loads with ``weights_only``
    once those to allow are allowed."""
    marked = torch.zeros(4, 3)
    _private.mark_dynamic(marked, 0, min=2, max=64)
    obj = {"x": _jagged([2, 1]), "td": TensorDict({"a": torch.ones(2)}, batch_size=[2]), "marked": marked}
    private = {n for n in _pickle_names(obj) if PRIVATE_PATH.search(n)}
    known = _private.PICKLE_NAMES_TORCH_ADMITS | _private.PICKLE_NAMES_TO_ALLOW
    assert private <= known
    assert "torch._dynamo.decorators._DimRange" in private  # the mark is what a dump holds
    allowed = []
    for name in sorted(known):
        module, _, attr = name.rpartition(".")
        assert hasattr(importlib.import_module(module), attr), name
        if name in _private.PICKLE_NAMES_TO_ALLOW:
            allowed.append(getattr(importlib.import_module(module), attr))
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    with torch.serialization.safe_globals(allowed):
        loaded = torch.load(buffer, weights_only=True)
    assert torch.equal(loaded["marked"], marked)


@pytest.mark.parametrize(
    "name", sorted(n for n in importlib.import_module("rebatch.check").DUMP_GLOBALS if n.startswith("torch."))
)
def test_every_torch_name_of_the_dump_allowlist_exists(name: str) -> None:
    """`rebatch.check` skips a name a release lacks, so a missing one would silently refuse dumps."""
    module, _, attr = name.rpartition(".")
    assert hasattr(importlib.import_module(module), attr)


@covers("kineto_events")
def test_the_profilers_memory_events() -> None:
    """A finished profile's events hold its ``[memory]`` allocations, sizes and times readable."""
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
    ) as prof:
        kept = torch.ones(1 << 16)
    memory = [e for e in _private.kineto_events(prof) if e.name() == "[memory]"]
    assert memory
    assert max(e.nbytes() for e in memory) >= kept.numel() * kept.element_size()
    assert all(isinstance(e.start_ns(), int) for e in memory)


class _Ops(_private.TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[Any] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops.append(func)
        return func(*args, **(kwargs or {}))


@covers("TorchDispatchMode", "AtenOps", "aten_ops")
def test_a_dispatch_mode_sees_the_underscored_aten_ops() -> None:
    """A dispatch mode sees every aten operation; a scalar read, ``torch.unique`` and a conversion are
    these, under these names."""
    t = torch.tensor([3, 1, 3])
    ops = _private.aten_ops()
    with _Ops() as seen:
        t.sum().item()
    assert ops.local_scalar_dense in seen.ops
    with _Ops() as seen:
        torch.unique(t)
    assert ops.unique2 in seen.ops
    with _Ops() as seen:
        t.to(torch.float64)
    assert seen.ops == [ops.to_copy]


@covers("FakeTensor", "FakeTensorMode", "unset_fake_temporarily")
def test_fake_tensors() -> None:
    """Under the mode, tensors are fakes (shapes, dtype, device, no data); real again inside
    ``unset_fake_temporarily``."""
    with _private.FakeTensorMode():
        fake = torch.ones(3, 2)
        assert isinstance(fake, _private.FakeTensor)
        assert fake.shape == (3, 2)
        with _private.unset_fake_temporarily():
            real = torch.ones(2)
        assert not isinstance(real, _private.FakeTensor)
        assert real.tolist() == [1.0, 1.0]


@covers("tree_map", "tree_leaves")
def test_torchs_pytree() -> None:
    """Dicts, lists and tuples walked in order, tensors the leaves."""
    tree = {"b": [torch.ones(1), (torch.zeros(2), 3)], "a": torch.full((1,), 2.0)}
    assert [
        leaf.tolist() if isinstance(leaf, torch.Tensor) else leaf for leaf in _private.tree_leaves(tree)
    ] == [
        [1.0],
        [0.0, 0.0],
        3,
        [2.0],
    ]
    doubled = _private.tree_map(lambda t: t * 2 if isinstance(t, torch.Tensor) else t, tree)
    assert doubled["b"][1][0].tolist() == [0.0, 0.0]
    assert doubled["a"].tolist() == [4.0]
    assert doubled["b"][1][1] == 3


@covers("neg_view")
def test_a_negative_view() -> None:
    base = torch.tensor([1.0, -2.0])
    view = _private.neg_view(base)
    assert view.is_neg()
    assert view.resolve_neg().tolist() == [-1.0, 2.0]


def _sum_ranks(rank: int, world: int, port: int) -> None:
    from property_tests import dist_workers

    dist_workers.init_group(rank, world, port, 30.0)
    total = torch.tensor([rank])
    dist.all_reduce(total)
    assert int(total) == sum(range(world))
    dist.destroy_process_group()


@covers("threaded_process_group", "install_threaded_process_group", "uninstall_threaded_process_group")
def test_the_threaded_process_group() -> None:
    """Ranks as threads of this process reduce together, and uninstalling puts torch's world back."""
    from property_tests import dist_workers

    threaded = _private.threaded_process_group()
    assert hasattr(threaded, "ProcessLocalGroup")
    before = dist.distributed_c10d._world
    dist_workers.run_in_threads(_sum_ranks, 3, timeout_s=60)
    assert dist.distributed_c10d._world is before


def _room_exports() -> list[str]:
    return list(_private.__all__)


def test_every_name_of_the_room_has_a_behaviour_test() -> None:
    assert set(_room_exports()) == COVERED


def test_the_room_defines_only_what_it_exports() -> None:
    """Every function and constant of the room is in its ``__all__`` (so each is tested and documented)."""
    defined = set()
    for stmt in _room_tree().body:
        if isinstance(stmt, ast.FunctionDef | ast.ClassDef):
            defined.add(stmt.name)
        elif isinstance(stmt, ast.Assign | ast.AnnAssign):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            defined.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    assert defined - {"__all__"} <= set(_room_exports())


# --- the documentation --------------------------------------------------------------------------------------


def _doc_section() -> str:
    text = (ROOT / "docs" / "architecture.md").read_text()
    start = text.index("## Private torch APIs")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else len(text)]


def _table_rows(section: str) -> Iterable[list[str]]:
    for line in section.splitlines():
        if line.startswith("| `"):
            yield [cell.strip() for cell in line.strip().strip("|").split("|")]


def test_every_name_of_the_room_is_listed_in_the_architecture() -> None:
    """Each of the room's names in the table's first column, each row with where it is used, the public
    alternative and why that does not serve."""
    rows = list(_table_rows(_doc_section()))
    assert all(len(row) == 4 and all(row) for row in rows), [row for row in rows if len(row) != 4]
    listed = {name for row in rows for name in re.findall(r"`([A-Za-z_]\w*)`", row[0])}
    missing = set(_room_exports()) - listed
    assert not missing, f"room names not in docs/architecture.md's 'Private torch APIs': {sorted(missing)}"
