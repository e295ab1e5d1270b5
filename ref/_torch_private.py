"""Every private torch and tensordict access of rebatch, in one room (issue 58).

Each is a named function or constant here, its docstring saying what it relies on and why no public API
serves; ``docs/architecture.md`` ("Private torch APIs") lists each, ``tests/test_private_torch.py`` checks
what rebatch relies on of each on the torches CI tests (2.9.1, 2.13 and 2.14), and fails on a private
torch or tensordict name read anywhere else (an attribute, an import, a string, a keyword argument). The
testing kit reaches the ones it needs through `torch_impl.testing`.

Imports torch only; what is not loaded with torch (``torch._dynamo``, torch's threaded process group) is
imported by the function that needs it.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from operator import attrgetter
from typing import Any, NamedTuple

import torch

# Each loaded with torch: the fake tensors and dispatch modes the testing kit traces calls with (below),
# and the class of every jagged nested tensor (torch >= 2.2).
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, unset_fake_temporarily
from torch.nested._internal.nested_tensor import NestedTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

__all__ = [
    "JAGGED_BUFFERS",
    "JAGGED_FLAGS",
    "PICKLE_NAMES_TORCH_ADMITS",
    "PICKLE_NAMES_TO_ALLOW",
    "AtenOps",
    "DisableTorchFunctionSubclass",
    "FakeTensor",
    "FakeTensorMode",
    "NestedTensor",
    "TorchDispatchMode",
    "aten_ops",
    "cached_seqlen_bounds",
    "find_nested_view",
    "functorch_level",
    "install_threaded_process_group",
    "kineto_events",
    "mark_dynamic",
    "metadata_cache",
    "neg_view",
    "nested_view",
    "nested_with_cache",
    "non_tensor_stored",
    "ragged_idx",
    "ragged_size",
    "raw_lengths",
    "raw_offsets",
    "raw_values",
    "set_raw_offsets",
    "threaded_process_group",
    "tree_leaves",
    "tree_map",
    "uninstall_threaded_process_group",
    "unset_fake_temporarily",
]

# --- a jagged nested tensor's own attributes -----------------------------------------------------------
# Public: ``values()``, ``offsets()``, ``lengths()``, each a dispatched, differentiable view op (tens of µs a
# read, per key and micro-batch); the ragged dimension and its nested int have no public accessor.


def ragged_idx(x: Any) -> int:
    """``x._ragged_idx``: which dimension of a jagged nested tensor is ragged (rebatch takes 1 only). No
    public accessor (``x.shape`` holds a symbolic size there)."""
    return x._ragged_idx


def ragged_size(x: Any) -> Any:
    """``x._size[1]``: a jagged nested tensor's ragged size, its nested int, a host object torch keeps
    through moves and views (exact provenance rests on its identity). ``x.size(1)`` dispatches and may
    return another object of the same value."""
    return x._size[1]


def raw_values(x: Any) -> torch.Tensor:
    """``x._values``: the values buffer itself, no view op, no autograd record (read where no gradient
    flows; ``values()`` where one does)."""
    return x._values


def raw_offsets(x: Any) -> torch.Tensor:
    """``x._offsets``: the offsets tensor itself (``offsets()`` dispatches)."""
    return x._offsets


def raw_lengths(x: Any) -> Any:
    """``x._lengths``: the lengths tensor of a tensor with holes, None without (``lengths()`` dispatches)."""
    return x._lengths


def set_raw_offsets(x: Any, offsets: torch.Tensor) -> None:
    """Sets ``x._offsets`` (tests only): offsets no public constructor accepts (floating, boolean, not 1-D),
    to show `torch_impl` refuses them."""
    x._offsets = offsets


#: What `torch_impl._parts._plain_jagged` reads of each part, one C-level call a part for many parts:
#: ``(ragged dimension, lengths, requires_grad)``. A Python function a part costs what the loop saves.
JAGGED_FLAGS = attrgetter("_ragged_idx", "_lengths", "requires_grad")
#: ``(values buffer, offsets, sizes)`` of each part (the nested int at ``sizes[1]``), as `JAGGED_FLAGS`.
JAGGED_BUFFERS = attrgetter("_values", "_offsets", "_size")


def cached_seqlen_bounds(x: Any) -> tuple[int | None, int | None]:
    """``(x._maybe_min_seqlen, x._maybe_max_seqlen)``: the shortest and longest row a jagged tensor caches,
    None where not cached, without computing them (``to_padded_tensor()`` pads to the cached longest). The
    public way to see them computes them when absent, which would hide a missing cache."""
    return x._maybe_min_seqlen, x._maybe_max_seqlen


def metadata_cache(x: Any) -> dict[str, Any]:
    """``x._metadata_cache``: the sizes a jagged tensor caches (``min_seqlen``, ``max_seqlen``: each the
    length of an empty host tensor), ``{}`` where it has none (or ``x`` is not a nested tensor). No public
    accessor."""
    return getattr(x, "_metadata_cache", None) or {}


def nested_with_cache(values: torch.Tensor, offsets: torch.Tensor, cache: dict[str, torch.Tensor]) -> Any:
    """``NestedTensor(values, offsets, _metadata_cache=cache)``: a jagged tensor built directly, its sizes
    cached, not recorded as a view (only autograd reads that: about 20 µs instead of 90). The public
    constructor records the view and takes the sizes one by one."""
    return NestedTensor(values, offsets, _metadata_cache=cache)


def find_nested_view() -> Callable[..., torch.Tensor] | None:
    """``torch.nested._internal.nested_tensor.nested_view_from_values_offsets_lengths``, what
    ``torch.nested.nested_tensor_from_jagged`` calls after its ``is_fx_tracing()`` probe (which logs a
    warning on stderr the first time a process calls it); None in a torch without it (callers then call the
    public function)."""
    try:
        module = importlib.import_module(NestedTensor.__module__)
    except ImportError:  # pragma: no cover
        return None
    return getattr(module, "nested_view_from_values_offsets_lengths", None)


#: `find_nested_view` on this torch.
nested_view = find_nested_view()

# --- switches of torch's C core ----------------------------------------------------------------------

#: ``torch._C.DisableTorchFunctionSubclass``: a context manager under which a subclass's
#: ``__torch_function__`` is off, so a jagged tensor's attribute reads skip its dispatch (38% of building
#: one on torch 2.9.1). ``torch.overrides`` offers no public switch for plain attribute reads.
DisableTorchFunctionSubclass = torch._C.DisableTorchFunctionSubclass


def functorch_level() -> Any:
    """``torch._C._functorch.maybe_current_level()``: None outside a ``torch.func`` transform, its level
    inside one (rebatch refuses a call there: the gradient would miss micro-batches). ``torch.func`` has no
    "is a transform active" query."""
    return torch._C._functorch.maybe_current_level()


# --- tensordict ------------------------------------------------------------------------------------------


def non_tensor_stored(value: Any, default: Any) -> Any:
    """``value._non_tensordict.get("data", default)``: a ``NonTensorData``'s field as stored, without
    tensorclass's getter (4 µs on tensordict 0.10); ``default`` where ``value`` keeps none. ``value.data``
    is the getter."""
    return getattr(value, "_non_tensordict", {}).get("data", default)


# --- names a dump's pickle holds (``rebatch check --dump``) ----------------------------------------------

#: Private globals torch's own ``weights_only`` unpickler admits, as a tensor's pickle names them (torch
#: writes its private rebuild functions): a dump's allowlist must spell them as torch does.
PICKLE_NAMES_TORCH_ADMITS = frozenset(
    {"torch._utils._rebuild_tensor_v2", "torch._tensor._rebuild_from_type_v2"}
)
#: Private globals a dump's pickle names that must be allowed (``torch.serialization.safe_globals``): the
#: jagged tensor's class and rebuild function, tensordict's TensorDict and its rebuild function, and the
#: range a tensor marked dynamic keeps (verl's engine marks its inputs). A release without one skips it.
PICKLE_NAMES_TO_ALLOW = frozenset(
    {
        "torch.nested._internal.nested_tensor.NestedTensor",
        "torch.nested._internal.nested_tensor._rebuild_njt",
        "tensordict._td.TensorDict",
        "tensordict._reductions._make_td",
        "torch._dynamo.decorators._DimRange",
    }
)


def mark_dynamic(t: torch.Tensor, dim: int, *, min: int, max: int) -> None:
    """``torch._dynamo.mark_dynamic(t, dim, min=, max=)``, as verl's engine marks its inputs (what a dump
    then holds: tests only). ``torch.compiler`` has no public equivalent on torch 2.9.1 or 2.13."""
    dynamo = importlib.import_module("torch._dynamo")
    dynamo.mark_dynamic(t, dim, min=min, max=max)


# --- the testing kit's tools (through `torch_impl.testing`) ----------------------------------------------
# ``tree_map``, ``tree_leaves`` (``torch.utils._pytree``: torch's own pytree, which knows its containers;
# no public module on 2.9.1 or 2.13), ``TorchDispatchMode`` (``torch.utils._python_dispatch``: the one way
# to see every aten operation a call dispatches), ``FakeTensor``, ``FakeTensorMode`` and
# ``unset_fake_temporarily`` (``torch._subclasses.fake_tensor``: tensors with shapes and a device but no
# data, the fake accelerator), imported above.


def kineto_events(prof: Any) -> Any:
    """``prof.profiler.kineto_results.events()``: the events of a finished ``torch.profiler.profile``
    (undocumented), its ``[memory]`` allocations and frees with their sizes and times among them.
    ``prof.events()`` aggregates memory per operator, without the order a peak needs."""
    return prof.profiler.kineto_results.events()


class AtenOps(NamedTuple):
    """The underscored aten operations the fake accelerator (`property_tests.fakecuda`) must tell apart."""

    #: ``torch.ops.aten._local_scalar_dense.default``: what a scalar read (``item()``, ``int(t)``) runs.
    local_scalar_dense: Any
    #: ``torch.ops.aten._unique2.default``: what ``torch.unique`` runs (its output's shape is the data's).
    unique2: Any
    #: ``torch.ops.aten._to_copy.default``: what ``t.to(device)`` runs (an upload, or a read to the host).
    to_copy: Any


@functools.cache
def aten_ops() -> AtenOps:
    """`AtenOps` of this torch: underscored in aten, a dispatch mode sees these operations only under these
    names (no public alias); looked up at the first call, not at import."""
    aten = torch.ops.aten
    return AtenOps(aten._local_scalar_dense.default, aten._unique2.default, aten._to_copy.default)


def neg_view(t: torch.Tensor) -> torch.Tensor:
    """``torch._neg_view(t)``: a view of ``t`` with its negative bit set (tests only: rebatch must resolve
    it). No public function sets the bit alone."""
    return torch._neg_view(t)


def threaded_process_group() -> Any:
    """``torch.testing._internal.distributed.multi_threaded_pg``: torch's process group whose ranks are
    threads of one process (tests only: the many-rank workers in seconds). No public backend runs ranks as
    threads."""
    return importlib.import_module("torch.testing._internal.distributed.multi_threaded_pg")


def install_threaded_process_group() -> Any:
    """`threaded_process_group` installed (``_install_threaded_pg``), process group names per thread
    (``torch._C._distributed_c10d._set_thread_isolation_mode(True)``), as torch's own threaded tests do;
    the module."""
    threaded = threaded_process_group()
    isolate = torch._C._distributed_c10d._set_thread_isolation_mode  # type: ignore[attr-defined]
    threaded._install_threaded_pg()
    isolate(True)
    return threaded


def uninstall_threaded_process_group() -> None:
    """`install_threaded_process_group` undone: names shared again, its groups reset, the backend
    uninstalled."""
    threaded = threaded_process_group()
    torch._C._distributed_c10d._set_thread_isolation_mode(False)  # type: ignore[attr-defined]
    threaded.ProcessLocalGroup.reset()
    threaded._uninstall_threaded_pg()
