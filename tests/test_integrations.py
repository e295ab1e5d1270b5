"""The shared patcher and the AReaL and SkyRL drop-ins on stand-in objects (no trainer installed).

The same drop-ins against AReaL's and SkyRL's own functions are in ``tests/test_peers.py`` (their
environments); here: the binding swap, undo and idempotence on a fake package, the semantics of each
drop-in on hand-checked inputs, and every silent case of the trainers refused with a `RebatchError`.
"""

from __future__ import annotations

import importlib
import itertools
import logging
import math
import sys
import types
from typing import Any

import pytest
import torch

from property_tests.compare import assert_same
from ref import errors
from torch_impl.integrations import _patch, areal, skyrl

# -- the patcher ---------------------------------------------------------------------------------


def _theirs(x: int) -> int:
    return x + 1


def _ours(x: int) -> int:
    return x + 100


class _Iterator:
    def combine(self) -> str:
        return "theirs"


def _our_combine(self: Any) -> str:
    return "ours"


@pytest.fixture
def fake_package():
    """``fakepkg.core`` defines a function and a class; ``fakepkg.engine`` bound the function at import."""
    core = types.ModuleType("fakepkg.core")
    core.fn = _theirs  # type: ignore[attr-defined]
    core.Iterator = _Iterator  # type: ignore[attr-defined]
    engine = types.ModuleType("fakepkg.engine")
    engine.fn = _theirs  # type: ignore[attr-defined]
    engine.other = _theirs  # type: ignore[attr-defined]  # bound under another name
    outside = types.ModuleType("otherpkg")
    outside.fn = _theirs  # type: ignore[attr-defined]
    modules = {
        "fakepkg": types.ModuleType("fakepkg"),
        "fakepkg.core": core,
        "fakepkg.engine": engine,
        "otherpkg": outside,
    }
    sys.modules.update(modules)
    yield modules
    for name in modules:
        sys.modules.pop(name, None)
    _Iterator.combine = _Iterator.__dict__.get("combine", _Iterator.combine)


def _table() -> dict[tuple[str, str], Any]:
    return {("fakepkg.core", "fn"): _ours, ("fakepkg.core", "Iterator.combine"): _our_combine}


def test_patcher_swaps_every_binding_in_the_package_and_undoes_it(fake_package) -> None:
    patcher = _patch.Patcher("fakepkg", _table)
    core, engine, outside = (
        fake_package["fakepkg.core"],
        fake_package["fakepkg.engine"],
        fake_package["otherpkg"],
    )
    places = patcher.install()
    assert patcher.installed()
    assert core.fn is _ours
    assert engine.fn is _ours
    assert engine.other is _ours
    assert outside.fn is _theirs  # another package is never touched
    assert _Iterator().combine() == "ours"
    assert set(places) == {
        "fakepkg.core.fn",
        "fakepkg.engine.fn",
        "fakepkg.engine.other",
        f"{__name__}._Iterator.combine",
    }
    assert patcher.install() == places  # idempotent: nothing replaced twice
    assert patcher.places() == places
    patcher.uninstall()
    assert not patcher.installed()
    assert core.fn is _theirs
    assert engine.fn is _theirs
    assert engine.other is _theirs
    assert _Iterator().combine() == "theirs"
    patcher.uninstall()  # idempotent too


def test_a_module_imported_after_install_binds_the_replacement(fake_package) -> None:
    patcher = _patch.Patcher("fakepkg", _table)
    patcher.install()
    late = types.ModuleType("fakepkg.late")
    exec("from fakepkg.core import fn", late.__dict__)  # what `from ..core import fn` does at import
    assert late.fn is _ours
    patcher.uninstall()


def test_the_table_is_built_only_when_install_runs(fake_package) -> None:
    built: list[int] = []

    def table() -> dict[tuple[str, str], Any]:
        built.append(1)
        return _table()

    patcher = _patch.Patcher("fakepkg", table)
    assert not built
    patcher.install()
    patcher.install()
    assert built == [1]
    patcher.uninstall()


def test_a_lazy_install_patches_each_module_as_it_finishes_importing(tmp_path, monkeypatch) -> None:
    """A package on disk, not imported yet: nothing is imported by the install; its defining module is
    patched right after it executes, so a module importing it binds the replacement; `Wrap` builds the
    replacement from the original; the hook leaves ``sys.meta_path`` once done, and uninstall restores."""
    pkg = tmp_path / "lazypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "core.py").write_text("def fn(x):\n    return x + 1\n")
    (pkg / "engine.py").write_text("from .core import fn\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    table = {("lazypkg.core", "fn"): _patch.Wrap(lambda theirs: lambda x: theirs(x) * 10)}
    patcher = _patch.Patcher("lazypkg", lambda: table)
    before = list(sys.meta_path)
    try:
        assert patcher.install(lazy=True) == []
        assert patcher.installed()
        assert "lazypkg.core" not in sys.modules
        import lazypkg.engine as engine  # type: ignore[import-not-found]

        assert engine.fn(1) == 20
        assert sys.modules["lazypkg.core"].fn is engine.fn
        assert sys.modules["lazypkg.core"].__loader__.__class__.__name__ == "SourceFileLoader"
        assert sys.meta_path == before
        assert patcher.places() == ["lazypkg.core.fn"]  # the engine bound the replacement itself
        patcher.uninstall()
        assert engine.fn(1) == 2  # and gets the original back
        assert sys.modules["lazypkg.core"].fn(1) == 2
    finally:
        patcher.uninstall()
        for name in ("lazypkg", "lazypkg.core", "lazypkg.engine"):
            sys.modules.pop(name, None)


def test_uninstall_drops_a_pending_import_hook() -> None:
    patcher = _patch.Patcher("nopkg", lambda: {("nopkg.never", "fn"): _ours})
    before = list(sys.meta_path)
    patcher.install(lazy=True)
    assert patcher.installed()
    assert len(sys.meta_path) == len(before) + 1
    patcher.uninstall()
    assert sys.meta_path == before
    assert not patcher.installed()


# -- AReaL's reorder_and_pad_outputs -------------------------------------------------------------


def _mb_list(forward: list[int]) -> Any:
    backward = [0] * len(forward)
    for k, i in enumerate(forward):
        backward[i] = k
    return types.SimpleNamespace(forward_indices=forward, backward_indices=backward)


#: rows in micro-batch order [4, 0] and [3, 2, 1]; original row lengths.
FORWARD = [4, 0, 3, 2, 1]
SEQLENS = [2, 1, 0, 3, 2]


def _areal_outputs(dtype: torch.dtype = torch.float32, *feature: int) -> list[torch.Tensor]:
    n = [SEQLENS[4] + SEQLENS[0], SEQLENS[3] + SEQLENS[2] + SEQLENS[1]]
    size = math.prod(feature)
    return [(torch.arange(k * size) + 10 * m).to(dtype).reshape(k, *feature) for m, k in enumerate(n)]


def _areal_by_hand(outputs: list[torch.Tensor], seqlens: list[int], forward: list[int]) -> torch.Tensor:
    """AReaL's meaning row by row: cut the concatenation, reorder, right-pad with zeros, stack."""
    values = torch.cat(outputs)
    rows, start = {}, 0
    for i in forward:
        rows[i] = values[start : start + seqlens[i]]
        start += seqlens[i]
    width = max(seqlens)
    return torch.stack(
        [
            torch.cat([rows[i], rows[i].new_zeros((width - len(rows[i]), *rows[i].shape[1:]))])
            for i in range(len(seqlens))
        ]
    )


@pytest.mark.parametrize(
    ("dtype", "feature"),
    [(torch.float32, ()), (torch.bfloat16, (3,)), (torch.int64, ()), (torch.bool, (2, 2))],
)
def test_areal_drop_in_pads_and_reorders(dtype: torch.dtype, feature: tuple[int, ...]) -> None:
    outputs = _areal_outputs(dtype, *feature)
    got = areal.reorder_and_pad_outputs(outputs, SEQLENS, _mb_list(FORWARD))
    assert_same(got, _areal_by_hand(outputs, SEQLENS, FORWARD))


def test_areal_drop_in_one_micro_batch_and_another_aggregate_fn() -> None:
    values = torch.arange(8.0)
    want = _areal_by_hand([values], SEQLENS, FORWARD)
    assert_same(areal.reorder_and_pad_outputs([values], SEQLENS, _mb_list(FORWARD)), want)
    outputs = _areal_outputs()
    joined = areal.reorder_and_pad_outputs(
        outputs, SEQLENS, _mb_list(FORWARD), aggregate_fn=lambda o: torch.cat(o)
    )
    assert_same(joined, _areal_by_hand(outputs, SEQLENS, FORWARD))
    with pytest.raises(errors.UnsupportedSettingError, match="aggregate_fn must return one packed tensor"):
        areal.reorder_and_pad_outputs(outputs, SEQLENS, _mb_list(FORWARD), aggregate_fn=lambda o: list(o))


def test_areal_drop_in_is_differentiable() -> None:
    outputs = [o.requires_grad_() for o in _areal_outputs(torch.float64)]
    out = areal.reorder_and_pad_outputs(outputs, SEQLENS, _mb_list(FORWARD))
    (out * torch.arange(out.numel(), dtype=out.dtype).reshape(out.shape)).sum().backward()
    want = [o.detach().clone().requires_grad_() for o in outputs]
    ref_out = _areal_by_hand(want, SEQLENS, FORWARD)
    (ref_out * torch.arange(ref_out.numel(), dtype=ref_out.dtype).reshape(ref_out.shape)).sum().backward()
    for g, w in zip(outputs, want, strict=True):
        assert_same(g.grad, w.grad)


AREAL_SILENT = [
    # (name, forward, backward, seqlens, outputs' lengths, error, message)
    ("negative_alias_in_backward", FORWARD, [1, -4, 3, 2, 0], SEQLENS, None, errors.NotAPermutationError,
     r"backward_indices\[1\]: index -4 is negative"),
    ("backward_not_the_inverse", FORWARD, [1, 4, 3, 0, 2], SEQLENS, None, errors.NotAPermutationError,
     r"backward_indices\[3\] = 0, but row 3 is at micro-batch 1, position 0"),
    ("duplicate_in_backward", FORWARD, [1, 4, 3, 3, 0], SEQLENS, None, errors.NotAPermutationError,
     r"backward_indices\[3\]: index 3 duplicates backward_indices\[2\]"),
    ("out_of_range_in_backward", FORWARD, [1, 4, 3, 2, 5], SEQLENS, None, errors.NotAPermutationError,
     r"backward_indices\[4\]: index 5 is out of range for 5 rows"),
    ("negative_in_forward", [4, 0, 3, 2, -4], [1, 4, 3, 2, 0], SEQLENS, None, errors.NotAPermutationError,
     r"forward_indices\[4\]: index -4 is negative"),
    ("duplicate_in_forward", [4, 0, 3, 3, 1], [1, 4, 3, 2, 0], SEQLENS, None, errors.NotAPermutationError,
     r"forward_indices\[3\]: index 3 duplicates forward_indices\[2\]"),
    ("seqlens_not_matching_the_outputs", FORWARD, [1, 4, 3, 2, 0], SEQLENS, [4, 3],
     errors.PartitionMismatchError, r"the outputs hold 7 values, but output_seqlens add up to 8"),
    ("more_values_than_seqlens", FORWARD, [1, 4, 3, 2, 0], SEQLENS, [4, 5], errors.PartitionMismatchError,
     r"micro-batch 1: the outputs hold 9 values up to here, but output_seqlens add up to 8"),
    ("micro_batch_ending_inside_a_row", FORWARD, [1, 4, 3, 2, 0], SEQLENS, [3, 5],
     errors.PartitionMismatchError, r"micro-batch 0: its output ends at value 3, inside row 0"),
    ("negative_seqlen", FORWARD, [1, 4, 3, 2, 0], [2, 1, 0, -3, 2], None, errors.InvalidJaggedError,
     r"output_seqlens\[3\] = -3 is negative"),
]  # fmt: skip


@pytest.mark.parametrize("case", AREAL_SILENT, ids=[c[0] for c in AREAL_SILENT])
def test_areal_drop_in_refuses_what_areal_misaligns(case: tuple[Any, ...]) -> None:
    _, forward, backward, seqlens, sizes, error, message = case
    outputs = _areal_outputs() if sizes is None else [torch.zeros(n) for n in sizes]
    mb = types.SimpleNamespace(forward_indices=forward, backward_indices=backward)
    with pytest.raises(error, match=message):
        areal.reorder_and_pad_outputs(outputs, seqlens, mb)


def test_areal_drop_in_refuses_outputs_that_disagree() -> None:
    outputs = _areal_outputs()
    with pytest.raises(errors.DtypeMismatchError, match=r"micro-batch 1: dtype torch\.float64"):
        areal.reorder_and_pad_outputs([outputs[0], outputs[1].double()], SEQLENS, _mb_list(FORWARD))
    with pytest.raises(errors.ShapeMismatchError, match="micro-batch 1: trailing shape"):
        areal.reorder_and_pad_outputs([outputs[0], outputs[1][:, None]], SEQLENS, _mb_list(FORWARD))


def test_areal_drop_in_on_meta_reads_no_device_data() -> None:
    outputs = [o.to("meta") for o in _areal_outputs(torch.float32, 2)]
    got = areal.reorder_and_pad_outputs(outputs, SEQLENS, _mb_list(FORWARD))
    assert got.shape == (5, 3, 2)
    assert got.device.type == "meta"


# -- SkyRL's TokenBasedBatchIterator -------------------------------------------------------------


class _Batch(dict):
    """SkyRL's ``TensorBatch``: a dict of tensors with ``metadata``."""

    metadata: dict[str, Any] | None = None


class _FakeIterator:
    """The attributes SkyRL's methods read."""

    def __init__(self, microbatches: list[list[int]], padding: int = 0) -> None:
        self._microbatches = microbatches
        self._num_padding_microbatches = padding
        self._token_counts = [1] * sum(len(p) for p in microbatches)
        self.data = types.SimpleNamespace(batch_size=len(self._token_counts))


def _skyrl_batches(microbatches: list[list[int]], padding: int = 0) -> list[_Batch]:
    batches = []
    for m, part in enumerate([*microbatches, *([[0]] * padding)]):
        b = _Batch(
            {
                "output": torch.stack([torch.full((3,), float(i)) for i in part]),
                "ids": torch.tensor(part, dtype=torch.int64),
                "none": None,
            }
        )
        b.metadata = {"m": m}
        batches.append(b)
    return batches


def test_skyrl_drop_in_restores_every_key_and_keeps_none_and_metadata() -> None:
    parts = [[3, 0], [2], [1, 4]]
    it = _FakeIterator(parts, padding=2)
    got = skyrl.reorder_and_combine_batches(it, _skyrl_batches(parts, padding=2))
    assert type(got) is _Batch
    assert got.metadata == {"m": 0}
    assert list(got) == ["output", "ids", "none"]
    assert got["none"] is None
    assert_same(got["ids"], torch.arange(5))
    assert_same(got["output"], torch.arange(5.0)[:, None].expand(5, 3).contiguous())
    items = [[{"i": i} for i in p] for p in parts] + [[{"pad": 1}]] * 2
    assert skyrl.reorder_and_combine_items(it, items) == [{"i": i} for i in range(5)]
    assert skyrl.reorder_and_combine_items(it, items[:3]) == [{"i": i} for i in range(5)]


SKYRL_SILENT = [
    # SkyRL passes each silently (its rows all covered, or the stray row never read)
    ("duplicate_still_covering", [[0, 1], [2, 1]], 3, errors.NotAPermutationError,
     r"micro-batch 1, position 1: index 1 duplicates micro-batch 0, position 1"),
    ("extra_index", [[0, 1], [2, 5]], 3, errors.NotAPermutationError,
     r"micro-batch 1, position 1: index 5 is out of range for 3 rows"),
    ("negative_index", [[0, 1], [2, -1]], 3, errors.NotAPermutationError,
     r"micro-batch 1, position 1: index -1 is negative"),
]  # fmt: skip


@pytest.mark.parametrize("case", SKYRL_SILENT, ids=[c[0] for c in SKYRL_SILENT])
def test_skyrl_drop_in_refuses_what_skyrl_passes_silently(case: tuple[Any, ...]) -> None:
    _, parts, rows, error, message = case
    it = _FakeIterator(parts)
    it._token_counts = [1] * rows
    it.data.batch_size = rows
    with pytest.raises(error, match=message):
        skyrl.reorder_and_combine_batches(it, _skyrl_batches(parts))
    with pytest.raises(error, match=message):
        skyrl.reorder_and_combine_items(it, [[{}] * len(p) for p in parts])


def test_skyrl_drop_in_refuses_extra_rows_and_batches() -> None:
    parts = [[1], [0, 2]]
    it = _FakeIterator(parts)
    batches = _skyrl_batches(parts)
    batches[0]["output"] = torch.cat(
        [batches[0]["output"], batches[0]["output"]]
    )  # one row more than indices
    with pytest.raises(
        errors.PartitionMismatchError, match="key 'output', micro-batch 0: 2 rows, but its partition has 1"
    ):
        skyrl.reorder_and_combine_batches(it, batches)
    with pytest.raises(
        errors.PartitionMismatchError, match="micro-batch 0: 2 items, but its partition has 1"
    ):
        skyrl.reorder_and_combine_items(
            it, [[{"i": 1}, {"i": 9}], [{"i": 0}, {"i": 2}]]
        )  # not empty: no padding row
    with pytest.raises(errors.PartitionMismatchError, match="3 micro-batch outputs"):
        skyrl.reorder_and_combine_batches(it, [*_skyrl_batches(parts), _skyrl_batches(parts)[0]])
    with pytest.raises(errors.PartitionMismatchError, match="Cannot reorder an empty list"):
        skyrl.reorder_and_combine_batches(it, [])
    extra_key = _skyrl_batches(parts)
    extra_key[1]["more"] = torch.zeros(2)
    with pytest.raises(errors.KeyMismatchError):
        skyrl.reorder_and_combine_batches(it, extra_key)


def test_areal_drop_in_costs_the_same_operations_at_any_batch_and_micro_batch_count() -> None:
    """A constant number of torch operations (the device path's rule): 5 rows in 2 micro-batches and
    600 rows in 60 cost the same."""
    from property_tests.opcount import CountOps

    def ops(b: int, m: int) -> int:
        seqlens = [(i * 3) % 7 for i in range(b)]
        forward = list(range(b))[::-1]
        cuts = [round(k * b / m) for k in range(m + 1)]
        outputs = [
            torch.zeros(sum(seqlens[i] for i in forward[a:c]), 2, device="meta")
            for a, c in itertools.pairwise(cuts)
        ]
        with CountOps() as c:
            areal.reorder_and_pad_outputs(outputs, seqlens, _mb_list(forward))
        return sum(c.ops.values())

    assert ops(5, 2) == ops(600, 60)


@pytest.mark.parametrize(("name", "release"), [("areal", "1.0.4"), ("skyrl", "0.4.0")])
def test_areal_and_skyrl_refuse_another_release_unless_forced(monkeypatch, name: str, release: str) -> None:
    """The same gate as verl's (`_patch.Versions`): the supported release passes, another (or none
    installed) raises naming it, the supported one and ``force=True``, replacing nothing."""
    integration = importlib.import_module(f"torch_impl.integrations.{name}")
    assert (release,) == integration.VERSIONS
    calls: list[int] = []
    monkeypatch.setattr(
        integration.INTEGRATION.patcher, "install", lambda *a, **k: calls.append(1) or ["place"]
    )
    for version in ("9.9.9", None):
        monkeypatch.setattr(integration.INTEGRATION.versions, "installed", lambda version=version: version)
        with pytest.raises(errors.UnsupportedSettingError) as err:
            integration.install()
        assert f"supported: {release}" in str(err.value)
        assert "force=True" in str(err.value)
        assert str(version or "version unknown") in str(err.value)
    assert calls == []  # refused before anything is replaced
    # a handler on rebatch's own logger: a trainer imported by other tests may have reconfigured logging
    # (AReaL's set-up keeps records from reaching the root logger, where caplog listens)
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("rebatch")
    logger.addHandler(handler)
    try:
        assert integration.install(force=True) == (name, None, release, "on", ("place",))  # `Installed`
    finally:
        logger.removeHandler(handler)
    assert any("not supported" in r.getMessage() for r in records)
    monkeypatch.setattr(integration.INTEGRATION.versions, "installed", lambda: release)
    assert integration.install() == (name, release, release, "on", ("place",))


@pytest.mark.parametrize(("name", "release"), [("verl", "0.9.1"), ("areal", "1.0.4"), ("skyrl", "0.4.0")])
def test_every_trainers_install_sets_the_witness_and_uninstall_puts_it_back(
    monkeypatch: pytest.MonkeyPatch, name: str, release: str
) -> None:
    """``install(witness=, unbound=)`` in every trainer (one copy: `_integration.Integration`): set on a fresh
    install only, put back by `uninstall`; a bad ``witness`` refused before anything is replaced."""
    import torch_impl

    integration = importlib.import_module(f"torch_impl.integrations.{name}")
    monkeypatch.setattr(integration.INTEGRATION.versions, "installed", lambda: release)
    before = torch_impl.witness_config()
    try:
        with pytest.raises(errors.UnsupportedSettingError, match="on must be a bool"):
            integration.install(lazy=True, witness="off")
        assert not integration.installed()
        assert torch_impl.witness_config() == before
        integration.install(lazy=True, witness=not before[0], unbound=["kl"])
        assert torch_impl.witness_config() == (not before[0], frozenset({"kl"}))
        integration.install(lazy=True, witness=before[0], unbound=[])  # installed already: nothing changes
        assert torch_impl.witness_config() == (not before[0], frozenset({"kl"}))
        integration.uninstall()
        assert torch_impl.witness_config() == before
        integration.install(lazy=True)  # neither given: the switch as it is, and as it is after uninstall
        torch_impl.set_witness(unbound=["entropy"])
        integration.uninstall()
        assert torch_impl.witness_config() == (before[0], frozenset({"entropy"}))
    finally:
        integration.uninstall()
        torch_impl.set_witness(before[0], unbound=before[1])
    assert torch_impl.witness_config() == before


def test_every_trainer_declares_one_integration_whose_functions_it_exports() -> None:
    """The one trainer contract: each trainer's ``install``, ``uninstall``, ``stats``, ``mode``,
    ``installed`` and ``replacements`` are its `INTEGRATION`'s (one signature, one return type)."""
    import inspect

    from torch_impl import integrations
    from torch_impl.integrations import _integration

    keywords = {"dump", "mode", "sample", "on_defect", "report", "lazy", "force", "witness", "unbound"}
    for trainer in integrations.TRAINERS:
        module = importlib.import_module(f"torch_impl.integrations.{trainer}")
        assert isinstance(module.INTEGRATION, _integration.Integration)
        assert module.INTEGRATION.trainer == trainer
        for name in ("install", "uninstall", "stats", "mode", "installed", "replacements"):
            function = getattr(module, name)
            assert function.__self__ is module.INTEGRATION, (trainer, name)
            assert function.__func__ is getattr(_integration.Integration, name), (trainer, name)
        assert set(inspect.signature(module.install).parameters) == keywords
        assert inspect.signature(module.install).return_annotation in ("Installed", _integration.Installed)
        assert module.Installed is _integration.Installed


def test_an_on_install_of_areal_dumps_its_first_call(monkeypatch, tmp_path) -> None:
    """``install(dump=...)`` in ``on`` mode saves the first call's inputs in rebatch's dump format, for
    every trainer (AReaL and SkyRL ignored it before): a fake AReaL module, so no AReaL needed."""
    from types import SimpleNamespace

    from rebatch import check
    from torch_impl.integrations import _files

    def theirs(outputs: Any, output_seqlens: Any, mb_list: Any, aggregate_fn: Any = torch.cat) -> Any:
        raise AssertionError("AReaL's own function: replaced")

    names = ["areal", "areal.engine", "areal.engine.core", areal.TRAIN_ENGINE]
    for name in names:
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    sys.modules[areal.TRAIN_ENGINE].reorder_and_pad_outputs = theirs  # type: ignore[attr-defined]
    monkeypatch.setattr(areal.INTEGRATION.versions, "installed", lambda: "1.0.4")
    dump = tmp_path / "first.pt"
    try:
        installed = areal.install(str(dump))
        assert installed == (
            "areal",
            "1.0.4",
            "1.0.4",
            "on",
            (f"{areal.TRAIN_ENGINE}.reorder_and_pad_outputs",),
        )
        assert areal.mode() == "on"
        mb_list = SimpleNamespace(forward_indices=[1, 0], backward_indices=[1, 0])
        got = sys.modules[areal.TRAIN_ENGINE].reorder_and_pad_outputs([torch.arange(3.0)], [1, 2], mb_list)
        assert got.tolist() == [[2.0, 0.0], [0.0, 1.0]]
        saved = check._safe_load(str(dump))
        assert (saved["format"], saved["trainer"], saved["inputs"]["output_seqlens"]) == (
            _files.DUMP_FORMAT,
            "areal",
            [1, 2],
        )
        dump.unlink()
        sys.modules[areal.TRAIN_ENGINE].reorder_and_pad_outputs([torch.arange(3.0)], [1, 2], mb_list)
        assert not dump.exists()  # the first call only
        assert areal.stats()["calls"] == 2
    finally:
        areal.uninstall()
    assert sys.modules[areal.TRAIN_ENGINE].reorder_and_pad_outputs is theirs
    assert areal.mode() is None
