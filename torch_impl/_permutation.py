"""Partitions flattened and checked as a permutation, vectorized (no Python work per row)."""

from __future__ import annotations

import itertools
import marshal
import numbers
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from ref.errors import NotAPermutationError
from ref.structure import check_partition, check_partitions, locate

from ._entry import entry
from ._parts import numpy_bridge

__all__ = [
    "flatten_partitions",
    "inverse_permutation",
    "check_permutation",
    "is_identity",
    "plain_int_lists",
    "plain_int_lists_of",
    "Locator",
]

#: The NumPy dtypes besides the integers that ``torch.as_tensor`` takes (refused below by dtype); an
#: array of any other dtype (object, string, date, long double) is taken entry by entry, as a list is.
_AS_TENSOR = frozenset(
    np.dtype(t) for t in ("bool", "float16", "float32", "float64", "complex64", "complex128")
)

#: How a message names flat position ``j``'s place: ``(micro-batch, position inside it) -> text``.
Locator = Callable[[int, int], str]


def _in_micro_batch(m: int, pos: int) -> str:
    return f"micro-batch {m}, position {pos}"


def _flat_indices(
    partitions: Sequence[Any], num_rows: int, at: Locator = _in_micro_batch
) -> tuple[torch.Tensor, list[int]]:
    """``[i for p in partitions for i in p]`` as a CPU int64 tensor, and each partition's size.

    Lists of Python ints take the fast path: one C-level flatten and one ``torch.tensor``. A 0-d integer
    array or tensor counts as its value. An entry that is not an integer (a float, a bool, a sequence)
    raises `NotAPermutationError`, as does one outside int64
    (named with its micro-batch and position, never wrapped: a uint64 ``2**64 - 1`` is not ``-1``).
    """
    if type(partitions) is list and partitions and all(type(p) is list for p in partitions):
        # the common case (verl's lists of ints), without a loop over the partitions in Python
        # (docs/kernels.md, "Host bookkeeping")
        return _from_lists(dict(enumerate(partitions)), num_rows, at), list(map(len, partitions))
    sizes: list[int] = []
    pieces: dict[int, torch.Tensor] = {}
    lists: dict[int, Any] = {}
    for m, part in enumerate(check_partitions(partitions)):
        check_partition(part, m)
        if hasattr(part, "__array__") and not isinstance(part, torch.Tensor | np.ndarray):
            part = np.asarray(
                part
            )  # another framework's array (JAX's): its values on the host, as `ref` reads it
        if isinstance(part, np.ndarray) and not part.flags.writeable:
            part = (
                part.copy()
            )  # torch warns of a tensor over read-only memory (the copy below is ours anyway)
        if isinstance(part, np.ndarray) and not (part.dtype.kind in "iu" or part.dtype in _AS_TENSOR):
            lists[m] = list(part.astype(object))  # each entry checked as a list's is (as `ref` takes it)
            sizes.append(len(part))
        elif isinstance(part, torch.Tensor | np.ndarray):
            t = part if isinstance(part, torch.Tensor) else torch.as_tensor(part, device="cpu")
            if t.numel() and (t.dtype == torch.bool or t.dtype.is_floating_point or t.dtype.is_complex):
                raise NotAPermutationError(f"micro-batch {m}: indices must be integers, got dtype {t.dtype}")
            if t.dtype == torch.uint64:  # past int64: through Python ints, checked like a list
                lists[m] = t.tolist()
            else:
                pieces[m] = t.detach().to("cpu", torch.int64, copy=True)  # never the caller's storage
            sizes.append(t.numel())
        else:
            lists[m] = part
            sizes.append(len(part))
    if lists:
        whole = _from_lists(lists, num_rows, at)
        if len(lists) == len(sizes):  # every partition a sequence: already flat, in order
            return whole, sizes
        pieces.update(zip(lists, torch.split(whole, [len(lists[m]) for m in lists]), strict=True))
    if len(pieces) == 1:
        return next(iter(pieces.values())), sizes
    ordered = [pieces[m] for m in range(len(sizes))]
    return (torch.cat(ordered) if ordered else torch.zeros(0, dtype=torch.int64, device="cpu")), sizes


_INT64 = range(-(2**63), 2**63)


def _from_lists(lists: dict[int, Any], num_rows: int, at: Locator) -> torch.Tensor:
    """Partitions given as Python sequences (micro-batch ``m`` -> entries), all converted at once: their
    entries end to end, in the order of ``lists``."""
    ms = list(lists)
    flat = list(itertools.chain.from_iterable(lists[m] for m in ms))
    fast = _plain_ints(flat)
    if fast is not None:
        return fast
    local_sizes = [len(lists[m]) for m in ms]
    kinds = set(map(type, flat))
    if not kinds <= {int}:
        # a 0-d array or tensor counts as its value (iterating a tensor gives 0-d tensors; verl indexes with
        # them)
        flat = [i.item() if getattr(i, "ndim", None) == 0 and hasattr(i, "item") else i for i in flat]
        kinds = set(map(type, flat))
        bad = [k for k in kinds if k is bool or not issubclass(k, numbers.Integral)]
        if bad:
            j = next(j for j, i in enumerate(flat) if type(i) in bad)
            m, pos = locate(j, local_sizes)
            raise NotAPermutationError(f"{at(ms[m], pos)}: index {flat[j]!r} is not an integer")
    try:
        if (
            kinds <= {int} and numpy_bridge()
        ):  # NumPy converts Python ints in a fraction of torch.tensor's time
            whole = torch.from_numpy(np.array(flat, dtype=np.int64))
        else:
            whole = torch.tensor(flat, dtype=torch.int64, device="cpu")
    except (OverflowError, RuntimeError, ValueError):
        wide = next((k for k, i in enumerate(flat) if int(i) not in _INT64), None)
        if wide is None:  # every index fits int64: the conversion failed for another reason, not the input's
            raise
        m, pos = locate(wide, local_sizes)
        i = int(flat[wide])
        what = (
            "is negative (negative indices are not wrapped)"
            if i < 0
            else f"is out of range for {num_rows} rows"
        )
        raise NotAPermutationError(f"{at(ms[m], pos)}: index {i} {what}") from None
    return whole


#: Indices at or below this value are where a bool can hide in an int64 array (``True`` reads as 1).
_BOOL_MAX = 1


def _plain_ints(flat: list[Any]) -> torch.Tensor | None:
    """``flat`` as a CPU int64 tensor where it is a list of plain Python ints (verl's, miles'), else None
    (`_from_lists`' entry-by-entry path decides, and names a defect).

    One NumPy conversion reads the values and their kinds at once: NumPy makes an int64 array only of
    integers (a float, a string, an int past int64 or any other object gives another dtype). A bool
    reads as 0 or 1, so the entries at most 1 (two in a permutation) are checked to be ints by type.
    """
    if not flat or not numpy_bridge():
        return None
    try:
        host = np.array(flat)
    # ragged or unconvertible entries (a device tensor among them): the entry-by-entry path decides
    except (ValueError, TypeError, OverflowError, RuntimeError):
        return None
    if host.dtype != np.int64 or host.ndim != 1:
        return None
    low = np.flatnonzero(host <= _BOOL_MAX)
    if any(type(flat[j]) is not int for j in low.tolist()):
        return None
    return torch.from_numpy(host)


def plain_int_lists(partitions: Any) -> bytes | None:
    """``partitions`` as bytes that only the very same lists of plain Python ints give, where it is a list
    of lists of ints (``int`` itself); else None.

    A split that checked its indices when it was recorded vouches for a restore whose indices give its
    bytes (`torch_impl._alignment.Record.vouching`, miles' recorded iterators): the same
    permutation, with no conversion or count. Not ``==``, which takes ``3.0`` and ``True`` for ints, where
    the restore's own check refuses them: the bytes are ``marshal``'s (format 2, one C-level pass), which
    writes an int, a bool and a float each with its own code, a NumPy integer or array as its buffer,
    and refuses subclasses (an ``IntEnum``, a list subclass) and every other object. Lists as a split
    records them (`plain_int_lists_of`) give the same bytes again on a restore given them unchanged.
    """
    if type(partitions) is not list:
        return None
    try:
        return marshal.dumps(partitions, _NO_REFERENCES)
    except ValueError:  # an object marshal cannot write (an array, a tensor): not plain ints
        return None


#: marshal's format 2: each object written whole (format 3 adds back references, which depend on how
#: many references each object has, so equal lists could give other bytes).
_NO_REFERENCES = 2


def plain_int_lists_of(partitions: Any) -> bytes | None:
    """`plain_int_lists` of a split's indices as it records them: None unless every entry is an ``int``
    (by type; a list of floats has bytes too, which no restore of plain ints gives)."""
    if type(partitions) is not list or not all(type(p) is list for p in partitions):
        return None
    if not set(map(type, itertools.chain.from_iterable(partitions))) <= {int}:
        return None
    return plain_int_lists(partitions)


def check_permutation(
    partitions: Sequence[Any], num_rows: int, *, at: Locator = _in_micro_batch
) -> torch.Tensor:
    """The partitions flattened (CPU int64 ``[B]``), checked to be a permutation of ``range(num_rows)``.

    A constant number of torch operations whatever ``B``; raises `NotAPermutationError` for an index
    that is not an integer, negative, ``>= num_rows``, duplicated, or missing. ``at`` names a position
    in the messages (``"micro-batch m, position p"`` by default).
    """
    perm, sizes = _flat_indices(partitions, num_rows, at)
    n = perm.numel()
    if n and not _valid(perm, num_rows):  # then find the first defect, for its message
        lo, hi = torch.aminmax(perm)
        if int(lo) < 0 or int(hi) >= num_rows:
            bad = (perm < 0) | (perm >= num_rows)
            j = int(bad.nonzero()[0, 0])
            m, pos = locate(j, sizes)
            i = int(perm[j])
            what = (
                "is negative (negative indices are not wrapped)"
                if i < 0
                else f"is out of range for {num_rows} rows"
            )
            raise NotAPermutationError(f"{at(m, pos)}: index {i} {what}")
        if bool((torch.bincount(perm, minlength=num_rows) > 1).any()):
            sorted_perm, order = torch.sort(perm, stable=True)
            repeated = sorted_perm[1:] == sorted_perm[:-1]
            j = int(order[1:][repeated].min())  # earliest position that repeats an earlier one
            i = int(perm[j])
            j0 = int((perm == i).nonzero()[0, 0])
            m, pos = locate(j, sizes)
            m0, pos0 = locate(j0, sizes)
            raise NotAPermutationError(f"{at(m, pos)}: index {i} duplicates {at(m0, pos0)}")
    if n != num_rows:
        present = torch.zeros(num_rows, dtype=torch.bool, device=perm.device)
        present[perm] = True
        missing = int((~present).nonzero()[0, 0])
        raise NotAPermutationError(
            f"index {missing} is missing: the partitions hold {n} indices for {num_rows} rows"
        )
    return perm


def as_bytes(perm: torch.Tensor, host: np.ndarray | None = None) -> bytes:
    """A CPU int64 tensor's bytes (``host``: its NumPy view where read already, as `is_identity` and `invert`
    take it; where NumPy cannot share its memory, its values')."""
    no_view = host is None and not numpy_bridge()
    return (
        np.array(perm.tolist(), dtype=np.int64) if no_view else perm.numpy() if host is None else host
    ).tobytes()


#: Up to this many indices `_valid` sorts them as Python ints (docs/kernels.md, "Host bookkeeping").
_SORT_MAX = 64


def _valid(perm: torch.Tensor, num_rows: int) -> bool:
    """Every index of ``perm`` (CPU int64, not empty) in ``range(num_rows)`` and none twice, checked
    with NumPy on the tensor's own memory (a fraction of torch's dispatch cost on small inputs), or,
    for a few indices, as ``sorted(perm) == range(num_rows)``; False (also where NumPy cannot read it,
    or where ``perm`` is a valid part of ``range(num_rows)`` but not all of it) sends the caller to
    the torch checks, which name the first defect."""
    if not numpy_bridge():
        return False
    p = perm.numpy()
    if p.shape[0] <= _SORT_MAX:  # a few rows: sorting Python ints beats four NumPy calls
        return p.shape[0] == num_rows and sorted(p.tolist()) == list(range(num_rows))
    if int(p.min()) < 0 or int(p.max()) >= num_rows:
        return False
    return bool(np.bincount(p, minlength=num_rows).max() <= 1)


@entry
def flatten_partitions(partitions: Sequence[Any], num_rows: int) -> torch.Tensor:
    """``perm = [i for p in partitions for i in p]``, int64 ``[B]`` on the CPU.

    Checked to be a permutation of ``range(num_rows)`` (`NotAPermutationError` otherwise).
    """
    return check_permutation(partitions, num_rows)


@entry
def inverse_permutation(perm: Any) -> torch.Tensor:
    """``inv = [perm.index(i) for i in range(len(perm))]``, i.e. ``inv[perm[k]] == k``.

    ``perm``: ``[B]`` integers (checked: `NotAPermutationError`); the result is int64 on ``perm``'s device.
    """
    device = perm.device if isinstance(perm, torch.Tensor) else torch.device("cpu")
    p = check_permutation([perm], len(perm))
    inv = invert(p)
    return inv.to(device, non_blocking=inv.is_cpu)


def is_identity(perm: torch.Tensor, host: np.ndarray | None = None) -> bool:
    """Whether a checked permutation (CPU int64 ``[B]``; ``host``: its NumPy view, where read already) is
    ``range(B)``: ``perm == list(range(B))``. Most are not, and say so at their first or last index; the
    rest are compared whole, with NumPy where torch has it."""
    n = perm.numel()
    if host is None and not numpy_bridge():
        return bool(torch.equal(perm, torch.arange(n, dtype=perm.dtype, device=perm.device)))
    p = perm.numpy() if host is None else host
    if n == 0 or p[0] != 0 or p[-1] != n - 1:
        return n == 0
    return bool((p == np.arange(n, dtype=p.dtype)).all())


def invert(perm: torch.Tensor, host: np.ndarray | None = None) -> torch.Tensor:
    """The inverse of a checked permutation (``host``: its NumPy view, where read already): on the CPU one
    NumPy assignment on its memory, elsewhere one ``scatter_`` (not ``inv[perm] = ...``, whose CPU kernel
    goes parallel from a few thousand rows and leaves torch's OpenMP threads spinning for milliseconds)."""
    if host is not None or (perm.is_cpu and numpy_bridge()):
        p = perm.numpy() if host is None else host
        inv = np.empty_like(p)
        inv[p] = np.arange(p.shape[0], dtype=p.dtype)
        return torch.from_numpy(inv)
    ar = torch.arange(perm.numel(), dtype=perm.dtype, device=perm.device)
    return torch.empty_like(perm).scatter_(0, perm, ar)
