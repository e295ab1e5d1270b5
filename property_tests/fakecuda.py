"""The CUDA path without a GPU: a call traced on fake CUDA tensors, its host work run for real.

`trace` runs a call inside `FakeCuda`: tensors made on ``"cuda"`` are
`torch._subclasses.fake_tensor.FakeTensor` s (shapes, dtype, device ``cuda:0``, no data; jagged nested
tensors need the fake mode's shape environment), while every operation whose tensors all live on the
host runs for real, as it would beside a GPU (the partitions checked with NumPy, ``data`` kept on the
host as verl keeps it). The trace records, for the operations that touch the device:

- ``ops``: every ATen operation in order (its kernel launches are those of `Trace.launches`);
- ``reads``: each read of device data on the host, which on a GPU is a host-device synchronisation
  (``.item()``, ``.tolist()``, ``bool()`` of a device tensor, a copy to the host, an operation whose
  output shape depends on device data); a read answers zeros (``False``: "no mismatch") so the call
  goes on to its end;
- ``mixed``: each operation where a host tensor (not a 0-d scalar) meets a device one, which CUDA
  refuses: `MixedDevices` is raised there, as the GPU would;
- ``bytes``: the memory traffic, counted as `property_tests.opcount.CountOps` counts it.

CUDA is not needed, nor a CUDA build of torch. One gap of torch's fake mode on a CPU-only build is
bridged: Python indexing (``x[a:b]``) of a fake CUDA tensor opens a CUDA device guard, which such a
build lacks; inside ``__getitem__`` and ``__setitem__`` the tensor's device is reported as ``meta`` to
that guard only (the operations themselves still run on the fake CUDA tensors).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import torch
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.overrides import TorchFunctionMode

from torch_impl.testing import (
    FakeTensor,
    FakeTensorMode,
    TorchDispatchMode,
    aten_ops,
    kernel_choices,
    tree_leaves,
    tree_map,
    unset_fake_temporarily,
)

from .data import offsets_of
from .nondeterministic import Op, refusal, switch

__all__ = ["READS", "FakeCuda", "MixedDevices", "Refused", "Trace", "fake_like", "trace", "trace_of"]

_aten = torch.ops.aten
#: aten's underscored operations this module tells apart: a scalar read, ``torch.unique``, ``to(device)``.
_SCALAR, _UNIQUE, _TO_COPY = aten_ops()

#: Operations that read device data on the host (a synchronisation on a GPU): a scalar read, or an output
#: whose shape depends on the data. A copy of a device tensor to the host is one too (see `FakeCuda`).
READS: frozenset[Any] = frozenset(
    {
        _SCALAR,
        _aten.item.default,
        _aten.nonzero.default,
        _aten.nonzero_static.default,
        _aten.masked_select.default,
        _aten.unique_consecutive.default,
        _UNIQUE,
        _aten.unique_dim.default,
        _aten.equal.default,
        _aten.is_nonzero.default,
        _aten.allclose.default,
        _aten.repeat_interleave.Tensor,
    }
)

#: Operations that launch no kernel: views, allocations, metadata.
_NO_LAUNCH = ("empty", "prim.device", "sym_", "lift_fresh", "_nested_")


class MixedDevices(RuntimeError):
    """A host tensor met a (fake) CUDA one in one operation: a GPU raises there too."""


class Refused(RuntimeError):
    """An operation a GPU refuses under ``torch.use_deterministic_algorithms(True)``
    (`property_tests.nondeterministic`)."""


class Trace(NamedTuple):
    """What one traced call did on the device (see the module's docstring)."""

    ops: list[str]
    reads: list[str]
    mixed: list[str]
    bytes: int
    #: each operation a GPU refuses under deterministic mode (raised there when the mode is on)
    refused: list[str]
    #: the documented functions a GPU swaps for a deterministic algorithm under deterministic mode
    switched: set[str]
    #: device allocations (``empty``): under deterministic mode each is filled (one more launch)
    allocations: int
    #: the kernel of the registry chosen for each key, in order
    kernels: list[str]
    #: the host-device synchronisations: the reads, those of one tensor's elements in a row counted once
    #: (the fake mode reads ``.tolist()`` element by element, where a GPU copies the tensor once)
    syncs: int

    @property
    def launches(self) -> list[str]:
        """The operations that launch a kernel: not a view, an allocation nor a metadata query (an
        estimate: torch may fuse nothing and split nothing; ``cuda_check`` counts the real ones)."""
        return [op for op in self.ops if not _is_view(op) and not any(s in op for s in _NO_LAUNCH)]

    @property
    def op_set(self) -> set[str]:
        """The distinct ATen operations, by overload name (``aten.index_select.default``)."""
        return set(self.ops)


_VIEWS: dict[str, bool] = {}


def _is_view(name: str) -> bool:
    return _VIEWS.get(name, False)


_guard = {"indexing": 0}  # inside Python indexing: report ``meta`` to its device guard


#: Python methods whose C++ binding opens a device guard on their tensor's device.
_GUARDED = frozenset(
    {
        torch.Tensor.__getitem__,
        torch.Tensor.__setitem__,
        torch.Tensor.__int__,
        torch.Tensor.__index__,
        torch.Tensor.__float__,
        torch.Tensor.__bool__,
        torch.Tensor.item,
        torch.Tensor.tolist,
    }
)


class _Indexing(TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func in _GUARDED:
            _guard["indexing"] += 1
            try:
                return func(*args, **(kwargs or {}))
            finally:
                _guard["indexing"] -= 1
        return func(*args, **(kwargs or {}))


def _where(depth: int = 6) -> str:
    """The innermost frames outside torch and this module: where in rebatch (or a trainer) it happened."""
    shown: list[str] = []
    frame = sys._getframe(1)
    while frame is not None and len(shown) < depth:
        name = frame.f_code.co_filename
        if "/torch/" not in name and name != __file__:
            shown.append(f"{name.rsplit('/', 1)[-1]}:{frame.f_lineno}")
        frame = frame.f_back  # type: ignore[assignment]
    return " <- ".join(shown)


class FakeCuda(TorchDispatchMode):
    """``with FakeCuda() as fc: ...``: see the module's docstring; ``fc.trace()`` gives the `Trace`.
    ``strict`` (default): `MixedDevices` raised where a host tensor meets a device one."""

    def __init__(self, *, strict: bool = True) -> None:
        super().__init__()
        self.fake = FakeTensorMode(shape_env=ShapeEnv(), allow_non_fake_inputs=True)
        self.strict = strict
        self.ops: list[str] = []
        self.reads: list[str] = []
        self.mixed: list[str] = []
        self.bytes = 0
        self.refused: list[str] = []
        self.switched: set[str] = set()
        self.allocations = 0
        self.kernels: list[str] = []
        self._indexing = _Indexing()
        self._choices: Any = (
            None  # the kernel-choice hook, while inside (`torch_impl.testing.kernel_choices`)
        )
        #: id(fake) -> (the fake, its shadow: the same computation on real host tensors)
        self._shadows: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        # : id(element) -> the group of the tensor it was taken from (``unbind``, ``select``), for
        # `Trace.syncs`
        self._unbound: dict[int, tuple[int, torch.Tensor]] = {}
        self._read_groups: list[int] = []
        self._sources: dict[int, tuple[int, torch.Tensor]] = {}  # id(tensor) -> (its group, the tensor)

    def shadow(self, fake: torch.Tensor, real: torch.Tensor) -> None:
        """Let ``real`` (a host tensor) hold ``fake``'s values: reads of ``fake`` answer from it."""
        self._shadows[id(fake)] = (fake, real)

    def _real_args(self, args: Any, kwargs: Any) -> tuple[Any, Any] | None:
        """``(args, kwargs)`` with each fake tensor replaced by its shadow and ``cuda`` by ``cpu``; None
        where a fake tensor has none."""
        missing = []

        def real(x: Any) -> Any:
            if isinstance(x, FakeTensor):
                pair = self._shadows.get(id(x))
                if pair is None or pair[0] is not x:
                    missing.append(x)
                    return x
                return pair[1]
            if isinstance(x, torch.device) and x.type == "cuda":
                return torch.device("cpu")
            return x

        mapped = tree_map(real, (args, kwargs))
        return None if missing else mapped

    def _run_shadow(self, func: Any, args: Any, kwargs: Any, out: Any) -> None:
        """``func`` on the shadows too; each fake output gets the matching real one."""
        mapped = self._real_args(args, kwargs)
        if mapped is None:
            return
        with unset_fake_temporarily():
            real = func(*mapped[0], **mapped[1])
        fakes = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        reals = [t for t in tree_leaves(real) if isinstance(t, torch.Tensor)]
        if len(fakes) == len(reals):
            for f, r in zip(fakes, reals, strict=True):
                self.shadow(f, r)

    def __enter__(self) -> FakeCuda:
        self._choices = kernel_choices(self.record_kernel)
        self._choices.__enter__()
        self.fake.__enter__()
        super().__enter__()
        self._indexing.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._indexing.__exit__(*exc)
        super().__exit__(*exc)
        self.fake.__exit__(*exc)
        self._choices.__exit__(*exc)

    def record_kernel(self, plan: Any, kernel: Any) -> Any:
        """Record the kernel a key takes (`kernels`), and take it."""
        self.kernels.append(kernel.name)
        return kernel

    def reset(self) -> None:
        """Forget what was recorded (the shadows stay)."""
        self.ops, self.reads, self.mixed, self.refused, self.kernels = [], [], [], [], []
        self.bytes, self.allocations, self.switched = 0, 0, set()
        self._read_groups = []

    def trace(self) -> Trace:
        return Trace(
            list(self.ops),
            list(self.reads),
            list(self.mixed),
            self.bytes,
            list(self.refused),
            set(self.switched),
            self.allocations,
            list(self.kernels),
            sum(1 for i, g in enumerate(self._read_groups) if i == 0 or g != self._read_groups[i - 1]),
        )

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if any(t.is_nested for t in tensors):  # a nested tensor's own dispatch: its operations come back here
            return NotImplemented
        fakes = [t for t in tensors if isinstance(t, FakeTensor)]
        device = kwargs.get("device")
        to_cuda = device is not None and torch.device(device).type == "cuda"
        if not fakes and not to_cuda:  # host work: for real, as beside a GPU
            with unset_fake_temporarily():
                return func(*args, **kwargs)
        name = str(func)
        if func is torch.ops.prim.device.default:
            return torch.device("meta") if _guard["indexing"] else func(*args, **kwargs)
        _VIEWS.setdefault(name, bool(func.is_view))
        self.ops.append(name)
        host = [t for t in tensors if not isinstance(t, FakeTensor) and t.is_cpu and t.dim() > 0]
        if fakes and host and func is not _TO_COPY:
            self.mixed.append(f"{name} at {_where()}")
            if self.strict:
                shown = ", ".join(f"{t.device}{list(t.shape)}" for t in tensors)
                raise MixedDevices(f"{name} mixes host and device tensors ({shown}) at {_where()}")
        self._deterministic(Op(name, tensors, tuple(args), dict(kwargs)))
        if func in READS or _to_host(func, args, kwargs, fakes):
            self.reads.append(f"{name} at {_where()}")
            first = args[0] if args else None
            pair = self._unbound.get(id(first))
            self._read_groups.append(pair[0] if pair is not None and pair[1] is first else -len(self.reads))
            return self._answer(func, args, kwargs)
        if func is _TO_COPY and not fakes:  # a host tensor moved to the device
            (t,) = args
            if not kwargs.get(
                "non_blocking", False
            ):  # a blocking upload waits for the stream: a sync on a GPU
                self.reads.append(f"{name} (a blocking upload) at {_where()}")
                self._read_groups.append(-len(self.reads))
            out = torch.empty_strided(
                t.shape, t.stride(), dtype=kwargs.get("dtype") or t.dtype, device=device
            )
            with unset_fake_temporarily():
                self.shadow(out, t.to(kwargs.get("dtype") or t.dtype, copy=True))
            self.bytes += 2 * t.numel() * t.element_size()
            return out
        out = func(*args, **kwargs)
        self._run_shadow(func, args, kwargs, out)
        if func is _aten.unbind.int or func is _aten.select.int:  # ``.tolist()``'s elements, one by one
            source = args[0]
            group = self._sources.setdefault(id(source), (len(self._sources) + 1, source))[0]
            self._unbound.update(
                {id(t): (group, t) for t in (out if isinstance(out, list | tuple) else [out])}
            )
        if "empty" in name:
            self.allocations += 1
        if not func.is_view and "empty" not in name:
            ids = {id(t) for t in tensors}
            returned = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and id(t) not in ids]
            self.bytes += sum(_nbytes(t) for t in tensors) + sum(_nbytes(t) for t in returned)
        return out

    def _deterministic(self, op: Op) -> None:
        """``op`` against torch's documented lists: refused (raised under deterministic mode), or swapped."""
        why = refusal(op)
        if why is not None:
            self.refused.append(f"{why} at {_where()}")
            if torch.are_deterministic_algorithms_enabled() and self.strict:
                raise Refused(f"{why} at {_where()}")
        documented = switch(op)
        if documented is not None:
            self.switched.add(documented)

    def _answer(self, func: Any, args: Any, kwargs: Any) -> Any:
        """A device read answered from the shadows where they hold it, else with zeros (so the call goes
        on): a Python scalar, a host tensor, or a device tensor of a data-dependent shape."""
        mapped = self._real_args(args, kwargs)
        if mapped is not None:
            with unset_fake_temporarily():
                real = func(*mapped[0], **mapped[1])
            if not isinstance(real, torch.Tensor) or _to_host(func, args, kwargs, [args[0]]):
                if func is _aten.copy_.default:
                    with unset_fake_temporarily():
                        return args[0]
                return real
            out = torch.empty_strided(real.shape, real.stride(), dtype=real.dtype, device="cuda")
            self.shadow(out, real)
            return out
        if func is _SCALAR or func is _aten.item.default:
            return False if args[0].dtype == torch.bool else 0
        if func in (_aten.equal.default, _aten.is_nonzero.default, _aten.allclose.default):
            return False
        if func is _TO_COPY or func is _aten.copy_.default:
            src = args[0] if func is _TO_COPY else args[1]
            with unset_fake_temporarily():
                shape = [int(s) for s in src.shape]
                out = torch.zeros(shape, dtype=kwargs.get("dtype") or src.dtype, device="cpu")
                return args[0].copy_(out) if func is _aten.copy_.default else out
        raise MixedDevices(f"{func} reads device data to shape its output at {_where()}")


def _to_host(func: Any, args: Any, kwargs: Any, fakes: Sequence[torch.Tensor]) -> bool:
    """A copy of a device tensor to the host (a read)."""
    if func is _TO_COPY:
        device = kwargs.get("device")
        return bool(fakes) and device is not None and torch.device(device).type == "cpu"
    if func is _aten.copy_.default:
        dst, src = args[0], args[1]
        return not isinstance(dst, FakeTensor) and isinstance(src, FakeTensor)
    return False


def _nbytes(t: torch.Tensor) -> int:
    return int(t.numel()) * t.element_size()


def fake_like(x: Any, fc: FakeCuda) -> Any:
    """``x`` (tensors, nested tensors, in lists and dicts) as fake CUDA tensors of the same shapes and
    dtypes (made inside ``fc``); a jagged nested tensor's offsets carried over (their values: the
    host's, as a trainer's micro-batch holds them after ``.to("cuda")``). One tensor is one fake tensor
    however often it occurs: keys built on one offsets tensor (as verl's engines build every per-token
    key of a micro-batch) keep one offsets tensor on the device."""
    made: dict[int, tuple[torch.Tensor, Any]] = {}  # id -> (the source, kept: its id stays its own; the fake)

    def one(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        if id(t) in made:
            return made[id(t)][1]
        if t.is_nested:
            values, offsets = one(t.values()), one(offsets_of(t))
            fake = torch.nested.nested_tensor_from_jagged(values, offsets)
        else:
            fake = torch.empty_strided(tuple(t.shape), t.stride(), dtype=t.dtype, device="cuda")
            fc.shadow(fake, t.detach().clone())
        made[id(t)] = (t, fake)
        return fake

    with fc:
        moved = tree_map(one, x)
    fc.reset()  # the inputs' making is not the call's
    return moved


def trace_of(fn: Callable[[], Any], fc: FakeCuda | None = None) -> tuple[Any, Trace]:
    """``fn()`` run inside ``fc`` (a new `FakeCuda` by default): its result and its `Trace`."""
    fc = fc or FakeCuda()
    with fc:
        result = fn()
    return result, fc.trace()


@contextlib.contextmanager
def trace() -> Iterator[FakeCuda]:
    """``with trace() as fc: ...`` then ``fc.trace()``."""
    with FakeCuda() as fc:
        yield fc
