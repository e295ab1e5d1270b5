"""The structural checks of ``postprocess_batch``: settings, output keys, partition count.

Pure Python (no JAX, no torch): `ref` and `torch_impl` both run these, so the first steps of checking
are one piece of code and raise the same classes by construction. The data checks that follow
(permutation, layouts, dtypes, offsets, row counts) are written separately in each implementation.
"""

from __future__ import annotations

import bisect
import itertools
import operator
from collections.abc import Mapping, Sequence
from typing import Any

from .errors import (
    InvalidJaggedError,
    KeyMismatchError,
    MisalignmentError,
    PartitionMismatchError,
    ShapeMismatchError,
    UnsupportedSettingError,
    where,
)

__all__ = [
    "PAD_MODES",
    "PADDING",
    "WITNESS",
    "as_flag",
    "as_integer",
    "check_lengths",
    "check_max_len",
    "check_metrics",
    "check_pad_value",
    "check_partition",
    "check_partition_count",
    "check_partitions",
    "check_readable",
    "check_settings",
    "drop_padding",
    "locate",
    "misalignment",
    "model_outputs",
    "witness_binds",
    "witness_form",
]

#: The values of verl's ``DatasetPadMode`` (a str Enum: its members compare equal to these strings).
PAD_MODES = ("no_padding", "right", "left_right")


class _Padding:
    """The partition of a padding micro-batch: one a data-parallel rank runs only so that every rank runs
    the same number of micro-batches. Its outputs, loss and metrics are left out of the result."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "PADDING"

    def __reduce__(self) -> str:
        return "PADDING"  # unpickles as this module's singleton


#: Marks a padding micro-batch in ``indices`` (``indices[m] is PADDING``).
PADDING = _Padding()


def drop_padding(output_lst: Any, indices: Any) -> tuple[Any, Any]:
    """Step 1b: micro-batches whose partition is `PADDING` left out, outputs and partition together."""
    if isinstance(indices, (str, bytes, Mapping)) or not isinstance(indices, Sequence):
        return output_lst, indices
    if not any(p is PADDING for p in indices):
        return output_lst, indices
    if not isinstance(output_lst, Sequence) or len(indices) != len(output_lst):
        raise PartitionMismatchError(
            f"{len(indices)} partitions (padding included) for {len(output_lst)} micro-batch outputs: "
            "with padding micro-batches, indices must have one entry per output"
        )
    keep = [m for m, p in enumerate(indices) if p is not PADDING]
    return [output_lst[m] for m in keep], [indices[m] for m in keep]


def as_flag(value: Any, name: str) -> bool:
    """A setting that verl tests for truth, as a bool: ``True``/``False``, or a bool-like equal to 1 or 0
    (``numpy.bool_``, the ints 1 and 0, a one-element tensor). Anything else, a string such as
    ``"False"`` included (whose truth would read as on), raises `UnsupportedSettingError`."""
    if isinstance(value, bool):
        return value
    if value is not None and not isinstance(value, (str, bytes, float)):
        try:
            for flag in (True, False):
                if bool(value == int(flag)):
                    return flag
        except (TypeError, ValueError, RuntimeError):  # not comparable with an int, or not one value
            pass
    raise UnsupportedSettingError(f"{name} must be a bool (or 0 or 1), got {value!r}")


def as_integer(value: Any, name: str) -> int:
    """A whole-number setting (a token budget, a micro-batch size or count) as an int.

    An int, an integer scalar (NumPy's, a 0-d integer tensor: anything ``operator.index`` takes) or a
    float without a fraction is that int. A bool (``True`` is an int to Python, never a count here), a
    string, a float with a fraction, None or anything else raises `UnsupportedSettingError` naming the
    setting and its value.

    >>> [as_integer(v, "max_token_len") for v in (8, 8.0)]
    [8, 8]
    """
    dtype = str(getattr(value, "dtype", ""))
    if isinstance(value, bool) or dtype in ("bool", "torch.bool"):
        raise UnsupportedSettingError(f"{name} must be an integer, got {value!r}")
    if isinstance(value, float):
        if value.is_integer():
            return int(value)
        raise UnsupportedSettingError(f"{name} must be an integer, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise UnsupportedSettingError(f"{name} must be an integer, got {value!r}") from None


def locate(position: int, sizes: Sequence[int]) -> tuple[int, int]:
    """A position of the micro-batches laid end to end, as ``(micro-batch, position inside it)``.

    ``sizes``: each micro-batch's rows (an empty micro-batch holds no position); a position past the last
    is ``(len(sizes), position - sum(sizes))``. The one reading of a flat position in every message.

    >>> sizes = [2, 0, 3]
    >>> [locate(j, sizes) for j in range(5)]
    [(0, 0), (0, 1), (2, 0), (2, 1), (2, 2)]
    """
    ends = list(itertools.accumulate(sizes))
    m = bisect.bisect_right(ends, position)
    return m, position - (ends[m - 1] if m else 0)


def check_settings(use_dynamic_bsz: Any, pad_mode: Any, indices: Any) -> bool:
    """Step 1: the settings (`UnsupportedSettingError`); returns ``use_dynamic_bsz`` as a bool (`as_flag`)."""
    if not isinstance(pad_mode, str) or pad_mode not in PAD_MODES:
        raise UnsupportedSettingError(f"pad_mode must be one of {PAD_MODES}, got {pad_mode!r}")
    dynamic = as_flag(use_dynamic_bsz, "use_dynamic_bsz")
    if dynamic and indices is None:
        raise UnsupportedSettingError(
            "indices is None while use_dynamic_bsz is on: the original order is unknown"
        )
    return dynamic


def model_outputs(output_lst: Sequence[Any]) -> list[Mapping[str, Any]]:
    """Step 2: the ``model_output`` dicts, in all micro-batches or none, all with the same keys.

    Raises `UnsupportedSettingError` for an output that is not a dict and `KeyMismatchError` for a
    ``model_output`` or a key that some micro-batches have and others lack.
    """
    if type(output_lst) not in _SEQUENCES and (
        isinstance(output_lst, (str, bytes, Mapping)) or not isinstance(output_lst, Sequence)
    ):
        raise UnsupportedSettingError(f"output_lst must be a list of dicts, got {type(output_lst).__name__}")
    for m, o in enumerate(output_lst):
        if type(o) is not dict and not isinstance(o, Mapping):
            raise UnsupportedSettingError(
                f"micro-batch {m}: an output must be a dict, got {type(o).__name__}"
            )
    carriers = [m for m, o in enumerate(output_lst) if "model_output" in o]
    if carriers and len(carriers) != len(output_lst):
        m = next(m for m, o in enumerate(output_lst) if "model_output" not in o)
        raise KeyMismatchError(f"{where('model_output', m)}missing, while micro-batch {carriers[0]} has it")
    outs = [output_lst[m]["model_output"] for m in carriers]
    for m, mo in enumerate(outs):
        if type(mo) is not dict and not isinstance(mo, Mapping):
            raise UnsupportedSettingError(
                f"micro-batch {m}: model_output must be a dict, got {type(mo).__name__}"
            )
    for m, mo in enumerate(outs[1:], start=1):
        for key in outs[0]:
            if key not in mo:
                raise KeyMismatchError(f"{where(key, m)}missing, while micro-batch 0 has it")
        for key in mo:
            if key not in outs[0]:
                raise KeyMismatchError(f"{where(key, m)}present, while micro-batch 0 lacks it")
    return outs


def check_metrics(output_lst: Sequence[Mapping[str, Any]]) -> None:
    """Step 2b: every ``metrics`` present is a dict (`UnsupportedSettingError` naming the micro-batch and
    the type: verl's fold would fail on ``None``, a list or a tensor with an ``AttributeError``)."""
    for m, o in enumerate(output_lst):
        if "metrics" in o and not isinstance(o["metrics"], Mapping):
            raise UnsupportedSettingError(
                f"{where('metrics', m)}metrics must be a dict, got {type(o['metrics']).__name__}"
            )


#: Built-in sequences, which the checks accept without asking the abstract ``Sequence`` (a slower
#: check): every ``isinstance`` test below gives them the same answer.
_SEQUENCES = (list, tuple, range)


def check_partitions(partitions: Any, name: str = "partitions") -> Sequence[Any]:
    """``partitions`` is a sequence of partitions: a list, a tuple, or an array of at least one dimension
    (`PartitionMismatchError` for a scalar, ``None``, a string, a mapping, a 0-d array, an iterator)."""
    if type(partitions) in _SEQUENCES:  # the common case, without the abstract class's check
        return partitions
    if (
        isinstance(partitions, (str, bytes, Mapping))
        or not hasattr(partitions, "__len__")
        or not hasattr(partitions, "__getitem__")
        or getattr(partitions, "ndim", 1) == 0
    ):
        raise PartitionMismatchError(f"{name} must be a list of partitions, got {_kind(partitions)}")
    return partitions


def check_partition(part: Any, m: int | None = None) -> None:
    """One partition is 1-D: a 1-D array (NumPy, JAX, torch) or a sequence (list, tuple, range) of row
    indices (`PartitionMismatchError`; its entries are checked by the permutation check). A tensor on
    torch's ``meta`` device holds no values to check: `UnsupportedSettingError`."""
    if type(part) in _SEQUENCES:  # the common case, without the abstract class's check
        return
    sequence = isinstance(part, Sequence) and not isinstance(part, (str, bytes))
    at = "" if m is None else f"micro-batch {m}: "
    if not (
        part.ndim == 1 if hasattr(part, "ndim") else sequence
    ):  # an array (NumPy, JAX, torch) or a sequence
        raise PartitionMismatchError(
            f"{at}a partition must be a 1-D sequence of row indices, got {_kind(part)}"
        )
    check_readable(part, m)
    if not hasattr(part, "ndim"):
        _check_length(part, at)


def _check_length(part: Sequence[Any], at: str) -> None:
    """A sequence's ``len()`` is the number of entries iterating it gives (`PartitionMismatchError`
    otherwise): every later step sizes its work by it, so a claim is checked, by counting at most one entry
    past it, before anything is allocated by it."""
    try:
        claimed = len(part)
    except (TypeError, ValueError, OverflowError) as err:  # a __len__ that is negative, huge or not an int
        raise PartitionMismatchError(f"{at}a partition's len() fails: {type(err).__name__}: {err}") from None
    held = sum(1 for _ in itertools.islice(iter(part), claimed + 1))
    if held != claimed:
        more = "more than " if held > claimed else ""
        raise PartitionMismatchError(
            f"{at}a partition's len() is {claimed}, but iterating it gives {more}{min(held, claimed)} indices"
        )


def check_readable(indices: Any, m: int | None = None) -> None:
    """`UnsupportedSettingError` for indices on torch's ``meta`` device (read without importing torch), which
    hold no values to check; ``m`` names the micro-batch."""
    if getattr(indices, "is_meta", False) is True:
        at = "" if m is None else f"micro-batch {m}: "
        raise UnsupportedSettingError(
            f"{at}the indices are on the meta device, which holds no values to check as a permutation"
        )


def _kind(x: Any) -> str:
    """``x``'s type, with its shape when it has one (an array): what a message shows of a bad container."""
    shape = getattr(x, "shape", None)
    return type(x).__name__ if shape is None else f"{type(x).__name__} of shape {tuple(shape)}"


def check_partition_count(indices: Any, num_outputs: int) -> Sequence[Any]:
    """Step 3: ``indices`` is a list with one partition per micro-batch that carries a ``model_output``,
    each partition 1-D (`check_partitions`, `check_partition`).

    (With no ``model_output`` at all, any number of partitions is accepted.) `PartitionMismatchError`.
    """
    check_partitions(indices, "indices")
    for m, part in enumerate(indices):
        check_partition(part, m)
    if num_outputs and len(indices) != num_outputs:
        raise PartitionMismatchError(
            f"{len(indices)} partitions for {num_outputs} micro-batches that carry a model_output"
        )
    return indices


def _is_integer_dtype(dtype: Any) -> bool:
    """An integer dtype of NumPy, JAX or torch (by name: ``int8`` ... ``uint64``; never bool)."""
    name = str(dtype).removeprefix("torch.")
    return name.startswith(("int", "uint"))


def check_lengths(
    lengths: Any,
    *,
    rows: int | None = None,
    total: int | None = None,
    limit: int | None = None,
    key: Any = None,
    name: str = "lengths",
) -> list[int]:
    """The rule of per-row lengths (packed or padded layouts), on lengths the host holds; returns them as
    ints.

    ``lengths``: a sequence of integers (Python or 0-d integer arrays) or a 1-D integer array (NumPy,
    JAX, torch on the CPU); ``name`` is how messages call them. In order, each an `InvalidJaggedError`
    naming the first offender: 1-D
    integers, not bool; ``rows`` of them when given; none negative; none above ``limit`` (the padded
    length) when given; adding up to ``total`` (the number of values) when given.

    >>> check_lengths([2, 0, 3], rows=3, total=5)
    [2, 0, 3]
    """
    at = where(key, None)
    dtype = getattr(lengths, "dtype", None)
    if dtype is not None:
        shape = [int(n) for n in getattr(lengths, "shape", ())]
        empty = len(shape) == 1 and shape[0] == 0  # an empty array of any dtype holds no length
        if len(shape) != 1 or not (_is_integer_dtype(dtype) or empty) or str(dtype).endswith("bool"):
            raise InvalidJaggedError(f"{at}{name} must be 1-D integers, got {dtype}{shape}")
        values = [int(v) for v in lengths.tolist()]
    elif type(lengths) is list and set(map(type, lengths)) <= {int}:  # plain ints (a trainer's list)
        values = list(lengths)
    else:
        if isinstance(lengths, (str, bytes, Mapping)) or not isinstance(lengths, Sequence):
            raise InvalidJaggedError(f"{at}{name} must be 1-D integers, got {type(lengths).__name__}")
        values = []
        for i, v in enumerate(lengths):
            if getattr(v, "ndim", None) == 0 and _is_integer_dtype(getattr(v, "dtype", "")):
                v = v.item()
            if isinstance(v, bool) or not isinstance(v, int):
                raise InvalidJaggedError(f"{at}{name}[{i}] = {v!r} is not an integer")
            values.append(int(v))
    if rows is not None and len(values) != rows:
        raise InvalidJaggedError(f"{at}{len(values)} {name} for {rows} rows")
    if values and min(values) < 0:
        i = next(i for i, v in enumerate(values) if v < 0)
        raise InvalidJaggedError(f"{at}{name}[{i}] = {values[i]} is negative")
    if limit is not None and values and max(values) > limit:
        i = next(i for i, v in enumerate(values) if v > limit)
        raise InvalidJaggedError(f"{at}{name}[{i}] = {values[i]} exceeds the padded length {limit}")
    if total is not None and sum(values) != total:
        raise InvalidJaggedError(f"{at}the {name} add up to {sum(values)}, but the values have {total} rows")
    return values


def check_max_len(max_len: Any, longest: int | None, *, key: Any = None) -> int:
    """``to_padded``'s ``max_len``: a non-negative int (`UnsupportedSettingError`), at least the longest
    row (``longest``, when known: `ShapeMismatchError`)."""
    at = where(key, None)
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 0:
        raise UnsupportedSettingError(f"{at}max_len must be a non-negative int, got {max_len!r}")
    if longest is not None and longest > max_len:
        raise ShapeMismatchError(f"{at}a row has {longest} values, more than max_len = {max_len}")
    return max_len


def check_pad_value(pad_value: Any, dtype: Any, *, key: Any = None) -> None:
    """A pad value is a bool, int or float; an integer (or bool) for an integer or bool dtype
    (`UnsupportedSettingError`: it would be silently rounded)."""
    at = where(key, None)
    if not isinstance(pad_value, (bool, int, float)):
        raise UnsupportedSettingError(
            f"{at}pad_value must be a bool, int or float, got {type(pad_value).__name__}"
        )
    name = str(dtype).removeprefix("torch.")
    if (
        (_is_integer_dtype(dtype) or name == "bool")
        and isinstance(pad_value, float)
        and not pad_value.is_integer()
    ):
        raise UnsupportedSettingError(
            f"{at}pad_value {pad_value!r} is not an integer, but the values are {name}"
        )


# -- the alignment witness (docs/spec.md, "The alignment witness"): the rules both implementations share


#: How messages name the witness (`check_lengths`' ``name`` too).
WITNESS = "witness lengths"


def witness_form(witness: Any, rows: int) -> tuple[str, ...]:
    """Step 6a on the witness's shape and dtype (an array's or tensor's, traced or not): 1-D integers,
    ``rows`` of them (`InvalidJaggedError`, named ``witness``); returns its shape's description for
    messages. A Python sequence is checked by `check_lengths` instead (values and all)."""
    dtype = getattr(witness, "dtype", None)
    shape = [int(n) for n in getattr(witness, "shape", ())]
    empty = len(shape) == 1 and shape[0] == 0
    if len(shape) != 1 or not (_is_integer_dtype(dtype) or empty) or str(dtype).endswith("bool"):
        raise InvalidJaggedError(f"{WITNESS} must be 1-D integers, got {dtype}{shape}")
    if shape[0] != rows:
        raise InvalidJaggedError(f"{shape[0]} {WITNESS} for {rows} rows")
    return tuple(str(n) for n in shape)


def witness_binds(key: Any, jagged: bool, values: int, witness_total: int, unbound: Any) -> bool:
    """Whether the witness binds ``key``: a jagged key, not declared unbound, whose values number
    exactly the witness's total (``values == sum(witness)``; a permutation keeps the total, so this
    does not depend on the alignment it checks).

    >>> witness_binds("lp", True, 7, 7, ()), witness_binds("lp", True, 7, 7, ("lp",))
    (True, False)
    >>> witness_binds("v", False, 7, 7, ())
    False
    """
    return jagged and values == witness_total and key not in unbound


def misalignment(
    key: Any, micro_batch: int, position: int, row: int, got: int, want: int
) -> MisalignmentError:
    """Step 6b's error: original row ``row`` of bound key ``key``, which came from micro-batch
    ``micro_batch`` at ``position``, restored with ``got`` values where the witness gives ``want``."""
    return MisalignmentError(misalignment_text(key, micro_batch, position, row, got, want))


def misalignment_text(key: Any, micro_batch: Any, position: Any, row: Any, got: Any, want: Any) -> str:
    """The message of `misalignment` (its values may be ``"{}"`` placeholders: `ref`'s traced check)."""
    return (
        f"key {key!r}, micro-batch {micro_batch}, position {position}: {got} values restored as original row "
        f"{row}, whose length the alignment witness gives as {want} (a wrong permutation, micro-batches in "
        f"the wrong order or another step's indices; if key {key!r} is not per-token, declare it unbound, or "
        "switch the check off: witness=None, torch_impl.set_witness(False) or REBATCH_WITNESS=off)"
    )
