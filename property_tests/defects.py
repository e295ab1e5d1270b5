"""The one table of defects: each a way to break a valid call, the error it must raise, and its message.

Both the named error cases (`property_tests.error_cases`) and the malformed-input strategy
(`property_tests.strategies.malformed_inputs`) are drawn from `TABLE`:

- a `Defect` names the operation it breaks (``op``), the `RebatchError` subclass both implementations
  must raise, the pattern its message matches on the named valid call, what it needs of a valid call,
  and a ``breaker(call, choose) -> call`` that applies it to a copy of a valid call, asking ``choose``
  (a `Chooser`) for every choice it makes;
- ``error_cases()`` applies each breaker to a named valid call (`VALID`, by the defect's ``base``) with
  a `Scripted` chooser (the defect's ``script`` of option numbers), so each named case is deterministic
  and its message is known;
- ``malformed_inputs()`` applies the breakers of ``postprocess_batch`` to drawn valid calls, with a
  chooser that draws (so Hypothesis explores, and shrinks, every choice).

Inputs are built in torch (the reference gets them through ``ref.interop``). No Hypothesis here.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol, TypeVar

import torch

from ref import errors
from ref.structure import PADDING
from torch_impl._jagged import njt

from .data import from_rows, jagged, offsets_of, rows_of

__all__ = [
    "Call",
    "Chooser",
    "Defect",
    "DEFECT_ALIASES",
    "Scripted",
    "TABLE",
    "VALID",
    "apply",
    "postprocess_defects",
    "strided_nested",
]

T = TypeVar("T")


class Call(NamedTuple):
    """One call of a public operation: ``getattr(impl, op)(*args, **kwargs)``."""

    op: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


class Chooser(Protocol):
    """Every choice a breaker makes goes through one of these (a draw, or a scripted pick)."""

    def choice(self, options: Sequence[T]) -> T: ...

    def integer(self, lo: int, hi: int) -> int: ...


class Scripted:
    """A deterministic `Chooser`: choice ``n`` takes option ``script[n]`` (0 once the script runs out);
    an integer choice takes ``lo + script[n]``."""

    def __init__(self, script: Sequence[int] = ()) -> None:
        self.script = list(script)
        self.n = 0

    def _next(self) -> int:
        k = self.script[self.n] if self.n < len(self.script) else 0
        self.n += 1
        return k

    def choice(self, options: Sequence[T]) -> T:
        return options[self._next()]

    def integer(self, lo: int, hi: int) -> int:
        return min(lo + self._next(), hi)


Breaker = Callable[[Call, Chooser], Call]


class Defect(NamedTuple):
    name: str
    #: the operation it breaks (a public function of both `ref` and `torch_impl`)
    op: str
    error: type[errors.RebatchError]
    #: a pattern the message matches on the named valid call ``VALID[base]`` broken with ``script``
    pattern: str
    #: what it needs of a valid call (the breaker adds a key where it needs one)
    needs: str
    breaker: Breaker
    #: the named valid call it breaks for its named error case (default: ``op``)
    base: str = ""
    #: the option numbers the `Scripted` chooser takes for the named error case
    script: tuple[int, ...] = ()


# -- valid calls ----------------------------------------------------------------------------------


def _lp(*lengths: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return jagged(torch.arange(sum(lengths)).to(dtype), list(lengths))


def _valid_postprocess() -> Call:
    """Two micro-batches (2 rows, then 1 row) with a jagged key 'lp' and a dense key 'v'."""
    outs = [
        {"model_output": {"lp": _lp(2, 0), "v": torch.zeros(2)}},
        {"model_output": {"lp": _lp(1), "v": torch.zeros(1)}},
    ]
    return Call("postprocess_batch", (outs, [[1, 2], [0]]), {})


#: Named valid calls, one per name (built fresh on each call).
VALID: dict[str, Callable[[], Call]] = {
    "postprocess_batch": _valid_postprocess,
    "flatten_partitions": lambda: Call("flatten_partitions", ([[1, 2], [0]], 3), {}),
    "inverse_permutation": lambda: Call("inverse_permutation", ([0, 2, 1],), {}),
    "restore": lambda: Call("restore", (_lp(1, 2), [[1], [0]]), {}),
    "split": lambda: Call("split", (_lp(1, 2), [[1], [0]]), {}),
    "concat": lambda: Call("concat", ([_lp(1), _lp(2)],), {}),
    "balanced_partitions": lambda: Call("balanced_partitions", ([3, 2], 8), {}),
    "take": lambda: Call("take", (_lp(1, 2), [0, 1]), {}),
    "take_dense": lambda: Call("take", (torch.zeros(3), [0, 1, 2]), {}),
    "from_packed": lambda: Call("from_packed", (torch.arange(5.0), [2, 0, 3]), {}),
    "to_padded": lambda: Call("to_padded", (_lp(1, 2),), {}),
    "to_padded_int": lambda: Call("to_padded", (_lp(1, 2, dtype=torch.int32),), {}),
    "from_padded": lambda: Call("from_padded", (torch.arange(6.0).reshape(2, 3), [1, 3]), {}),
}


def postprocess_call(
    output_lst: list[dict[str, Any]], indices: Any, *, use_dynamic_bsz: bool = True, pad_mode: Any = "no_padding"
) -> Call:
    """A ``postprocess_batch`` call, its containers copied (so a breaker can change them in place)."""
    outs = [dict(o, model_output=dict(o["model_output"])) if "model_output" in o else dict(o) for o in output_lst]
    idx = [list(p) for p in indices] if indices is not None else None
    return Call("postprocess_batch", (outs, idx), {"use_dynamic_bsz": use_dynamic_bsz, "pad_mode": pad_mode})


def _copy(call: Call) -> Call:
    if call.op == "postprocess_batch":
        outs, indices = call.args
        return postprocess_call(outs, indices, **call.kwargs)
    args = tuple(
        [list(a) if isinstance(a, list) else a for a in arg] if isinstance(arg, list) else arg for arg in call.args
    )
    return Call(call.op, args, dict(call.kwargs))


def apply(defect: Defect, call: Call, choose: Chooser) -> Call:
    """``defect`` applied to a copy of the valid ``call`` (which is left unchanged)."""
    return defect.breaker(_copy(call), choose)


# -- helpers of the breakers ----------------------------------------------------------------------


def strided_nested(rows: list[torch.Tensor]) -> torch.Tensor:
    """A nested tensor with torch's older strided layout (not jagged), its prototype warning silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.nested.nested_tensor(rows)


def _mo(call: Call, m: int) -> dict[str, Any]:
    return call.args[0][m]["model_output"]


def _keys(call: Call) -> list[str]:
    return list(_mo(call, 0))


def _positions(indices: Sequence[Sequence[Any]]) -> list[tuple[int, int]]:
    return [(m, j) for m, p in enumerate(indices) if isinstance(p, list) for j in range(len(p))]


def _rows(x: torch.Tensor) -> int:
    return int(x.size(0))


def _nonempty(call: Call, key: str) -> list[int]:
    return [m for m in range(len(call.args[0])) if _rows(_mo(call, m)[key]) > 0]


def _add_key(call: Call, name: str, *, dense: bool) -> str:
    """A new key ``name`` in every micro-batch (one zero entry per row), valid with the rest."""
    first = _keys(call)[0]
    for m in range(len(call.args[0])):
        n = _rows(_mo(call, m)[first])
        _mo(call, m)[name] = torch.zeros(n) if dense else jagged(torch.zeros(n), [1] * n)
    return name


def _jagged_key(call: Call, choose: Chooser) -> str:
    """A jagged key of the call (one is added, ``tokens``, if it has none)."""
    keys = [k for k in _keys(call) if _mo(call, 0)[k].is_nested]
    return choose.choice(keys) if keys else _add_key(call, "tokens", dense=False)


def _later_key(call: Call, choose: Chooser) -> str:
    """A key other than the first (``extra``, dense, is added if the call has one key)."""
    keys = _keys(call)[1:]
    return choose.choice(keys) if keys else _add_key(call, "extra", dense=True)


def _retype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if x.is_nested:
        return njt(x.values().to(dtype), offsets_of(x))
    return x.to(dtype)


def _other_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float32 if x.dtype != torch.float32 else torch.float64


def _with_offsets(x: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    return njt(x.values(), offsets)


def _decreasing(x: torch.Tensor) -> torch.Tensor:
    """Offsets broken so that ``offsets[1] > offsets[2]`` (``offsets[1] = -1`` with a single row)."""
    o = offsets_of(x.contiguous()).clone()
    if o.numel() >= 3:
        o[1] = o[2] + 1
    else:
        o[1] = -1
    return _with_offsets(x.contiguous(), o)


def _drop_last_row(x: torch.Tensor) -> torch.Tensor:
    rows = rows_of(x)
    return from_rows(rows[:-1], x)


# -- the breakers of postprocess_batch ------------------------------------------------------------


def _bad_index(make: Callable[[Call, Chooser, int, int], Any]) -> Breaker:
    """One position of ``indices`` replaced by ``make(call, choose, m, j)``."""

    def breaker(call: Call, choose: Chooser) -> Call:
        indices = call.args[1]
        m, j = choose.choice(_positions(indices))
        indices[m][j] = make(call, choose, m, j)
        return call

    return breaker


def _uint64_partition(call: Call, choose: Chooser) -> Call:
    """One partition as a uint64 array whose chosen entry is ``2**64 - 1`` (it must not wrap to -1)."""
    import numpy as np

    indices = call.args[1]
    m, j = choose.choice(_positions(indices))
    row = [int(i) for i in indices[m]]
    row[j] = 2**64 - 1
    indices[m] = np.array(row, dtype=np.uint64)
    return call


def _float_after_an_array(call: Call, choose: Chooser) -> Call:
    """Micro-batch 0's partition as an integer array, then a float index in a later micro-batch."""
    import numpy as np

    indices = call.args[1]
    m, j = choose.choice([(m, j) for m, j in _positions(indices) if m > 0])
    indices[m][j] = float(indices[m][j])
    indices[0] = np.array(indices[0], dtype=np.int64)
    return call


def _holed_lengths(make_lengths: Callable[[int], list[int]]) -> Breaker:
    """One jagged key of one micro-batch with rows as a nested tensor with holes (``lengths``), rows
    4 values apart in ``4 * n + 2`` values, lengths ``make_lengths(n)`` (broken: past the values or negative)."""

    def breaker(call: Call, choose: Chooser) -> Call:
        key = _jagged_key(call, choose)
        m = choose.choice(_nonempty(call, key))
        x = _mo(call, m)[key]
        n = _rows(x)
        values = torch.arange(4 * n + 2, dtype=x.dtype)
        offsets = torch.arange(0, 4 * n + 1, 4, dtype=torch.int64)
        _mo(call, m)[key] = njt(values, offsets, torch.tensor(make_lengths(n), dtype=torch.int64))
        return call

    return breaker


def _metrics_not_a_dict(call: Call, choose: Chooser) -> Call:
    outs = call.args[0]
    outs[choose.choice(range(len(outs)))]["metrics"] = choose.choice([None, [1.0], torch.ones(2)])
    return call


def _num_rows(call: Call) -> int:
    return sum(len(p) for p in call.args[1])


def _duplicate(call: Call, choose: Chooser, m: int, j: int) -> Any:
    indices = call.args[1]
    return choose.choice([i for p in indices for i in p if i != indices[m][j]])


def _dropped_row(call: Call, choose: Chooser) -> Call:
    """One row (not the last index) left out of its partition and of every key's output."""
    indices = call.args[1]
    b = _num_rows(call)
    m, j = choose.choice([(m, j) for m, j in _positions(indices) if indices[m][j] != b - 1])
    del indices[m][j]
    for k in _keys(call):
        rows = rows_of(_mo(call, m)[k])
        _mo(call, m)[k] = from_rows([r for n, r in enumerate(rows) if n != j], _mo(call, m)[k])
    return call


def _extra_partition(call: Call, choose: Chooser) -> Call:
    call.args[1].append([])
    return call


def _moved_index(call: Call, choose: Chooser) -> Call:
    indices = call.args[1]
    m, j = choose.choice(_positions(indices))
    target = choose.choice([t for t in range(len(indices)) if t != m])
    indices[target].append(indices[m].pop(j))
    return call


def _padding_without_output(call: Call, choose: Chooser) -> Call:
    outs, indices = call.args
    m = choose.choice(range(len(outs)))
    indices[m] = PADDING
    del outs[m]
    return call


def _missing_key(call: Call, choose: Chooser) -> Call:
    key = choose.choice(_keys(call))
    del _mo(call, choose.choice(range(1, len(call.args[0]))))[key]
    return call


def _extra_key(call: Call, choose: Chooser) -> Call:
    """A key present in micro-batch ``m >= 1`` only (left out of every other micro-batch)."""
    key = choose.choice(_keys(call))
    keep = choose.choice(range(1, len(call.args[0])))
    for m in range(len(call.args[0])):
        if m != keep:
            del _mo(call, m)[key]
    return call


def _missing_model_output(call: Call, choose: Chooser) -> Call:
    del call.args[0][choose.choice(range(1, len(call.args[0])))]["model_output"]
    return call


def _in_later_micro_batch(change: Callable[[torch.Tensor], torch.Tensor]) -> Breaker:
    """``change`` applied to one key's output in one micro-batch ``m >= 1``."""

    def breaker(call: Call, choose: Chooser) -> Call:
        key = choose.choice(_keys(call))
        m = choose.choice(range(1, len(call.args[0])))
        _mo(call, m)[key] = change(_mo(call, m)[key])
        return call

    return breaker


def _reshape_trailing(x: torch.Tensor) -> torch.Tensor:
    if x.is_nested:
        v = x.values()
        return njt(torch.stack([v, v], dim=-1), offsets_of(x))
    return torch.stack([x, x], dim=-1)


def _relayout(x: torch.Tensor) -> torch.Tensor:
    if x.is_nested:  # jagged -> dense with one entry per row
        return torch.zeros(x.size(0), dtype=x.dtype)
    first = x.reshape(x.shape[0], -1)[:, :1].reshape(-1).clone() if x.numel() else x.new_zeros(x.shape[0])
    return jagged(first, [1] * x.shape[0])


def _scalar_output(call: Call, choose: Chooser) -> Call:
    key = choose.choice(_keys(call))
    m = choose.choice(range(len(call.args[0])))
    _mo(call, m)[key] = torch.zeros((), dtype=_mo(call, m)[key].dtype)
    return call


def _in_jagged_key(change: Callable[[torch.Tensor], torch.Tensor]) -> Breaker:
    """``change`` applied to a jagged key's output in one micro-batch with rows (a key is added if none)."""

    def breaker(call: Call, choose: Chooser) -> Call:
        key = _jagged_key(call, choose)
        m = choose.choice(_nonempty(call, key))
        _mo(call, m)[key] = change(_mo(call, m)[key])
        return call

    return breaker


def _last_offset(x: torch.Tensor) -> torch.Tensor:
    o = offsets_of(x.contiguous()).clone()
    o[-1] += 1  # offsets[-1] no longer equals len(values)
    return _with_offsets(x.contiguous(), o)


def _strided(x: torch.Tensor) -> torch.Tensor:
    return strided_nested([r.clone() for r in rows_of(x)])


def _setting(name: str, options: Sequence[Any]) -> Breaker:
    def breaker(call: Call, choose: Chooser) -> Call:
        call.kwargs[name] = choose.choice(options)
        return call

    return breaker


def _indices_none(call: Call, choose: Chooser) -> Call:
    return call._replace(args=(call.args[0], None))


def _jagged_with_padding(call: Call, choose: Chooser) -> Call:
    _jagged_key(call, choose)
    call.kwargs["pad_mode"] = choose.choice(["right", "left_right"])
    return call


def _not_a_dict(call: Call, choose: Chooser) -> Call:
    outs = call.args[0]
    m = choose.choice(range(len(outs)))
    outs[m] = list(outs[m])
    return call


def _later_key_row_count(*, dynamic: bool) -> Breaker:
    """A key after the first loses its last row in one micro-batch (its partition, and the first key,
    keep theirs); without dynamic batching, the call is made a plain concatenation first."""

    def breaker(call: Call, choose: Chooser) -> Call:
        key = _later_key(call, choose)
        m = choose.choice(_nonempty(call, key))
        _mo(call, m)[key] = _drop_last_row(_mo(call, m)[key])
        if not dynamic:
            call.kwargs["use_dynamic_bsz"] = False
            return call._replace(args=(call.args[0], None))
        return call

    return breaker


# -- the breakers of the other operations ---------------------------------------------------------


def _partition_arg(arg: int, make: Callable[[list[list[Any]], Chooser, int, int], Any]) -> Breaker:
    """One position of the partitions in ``args[arg]`` replaced by ``make(partitions, choose, m, j)``."""

    def breaker(call: Call, choose: Chooser) -> Call:
        parts = call.args[arg]
        m, j = choose.choice(_positions(parts))
        parts[m][j] = make(parts, choose, m, j)
        return call

    return breaker


def _delete_index(call: Call, choose: Chooser) -> Call:
    parts = call.args[0]
    m, j = choose.choice(_positions(parts))
    del parts[m][j]
    return call


def _repeat_in_perm(call: Call, choose: Chooser) -> Call:
    perm = call.args[0]
    j = choose.choice(range(1, len(perm)))
    perm[j] = perm[choose.choice(range(j))]
    return call


def _first_arg(change: Callable[[torch.Tensor], torch.Tensor]) -> Breaker:
    def breaker(call: Call, choose: Chooser) -> Call:
        return call._replace(args=(change(call.args[0]), *call.args[1:]))

    return breaker


def _concat_dtype(call: Call, choose: Chooser) -> Call:
    parts = call.args[0]
    m = choose.choice(range(1, len(parts)))
    parts[m] = _retype(parts[m], torch.int32)
    return call


def _concat_nothing(call: Call, choose: Chooser) -> Call:
    return call._replace(args=([],))


def _row_over_budget(call: Call, choose: Chooser) -> Call:
    lengths, budget = call.args
    i = choose.choice(range(len(lengths)))
    lengths[i] = budget + choose.integer(1, 10)
    return call


def _too_few_rows(call: Call, choose: Chooser) -> Call:
    call.kwargs["min_num_micro_batches"] = len(call.args[0]) + choose.integer(1, 3)
    return call


def _take_index(make: Callable[[int, Chooser], int]) -> Breaker:
    def breaker(call: Call, choose: Chooser) -> Call:
        x, idx = call.args
        j = choose.choice(range(len(idx)))
        idx[j] = make(_rows(x), choose)
        return call

    return breaker


def _lengths_arg(make: Callable[[list[int], Chooser], Any]) -> Breaker:
    """The call's second argument (its lengths) replaced by ``make(lengths, choose)``."""

    def breaker(call: Call, choose: Chooser) -> Call:
        x, lengths = call.args
        return call._replace(args=(x, make(list(lengths), choose)))

    return breaker


def _one_more(lengths: list[int], choose: Chooser) -> list[int]:
    j = choose.choice(range(len(lengths)))
    return [n + 1 if i == j else n for i, n in enumerate(lengths)]


def _negated(lengths: list[int], choose: Chooser) -> list[int]:
    j = choose.choice([i for i, n in enumerate(lengths) if n > 0])
    return [-n if i == j else n for i, n in enumerate(lengths)]


def _past_the_padding(lengths: list[int], choose: Chooser) -> list[int]:
    j = choose.choice(range(len(lengths)))
    return [3 + choose.integer(1, 4) if i == j else n for i, n in enumerate(lengths)]


def _bad_cu_seqlens(call: Call, choose: Chooser) -> Call:
    (values, _lengths) = call.args
    return call._replace(args=(values,), kwargs={"cu_seqlens": [0, 3, 2, 5]})


def _both_lengths_and_cu_seqlens(call: Call, choose: Chooser) -> Call:
    return call._replace(kwargs={"cu_seqlens": [0, 2, 2, 5]})


def _short_max_len(call: Call, choose: Chooser) -> Call:
    return call._replace(kwargs={"max_len": 1})


def _fractional_pad(call: Call, choose: Chooser) -> Call:
    return call._replace(kwargs={"pad_value": choose.choice([0.5, float("nan"), -2.25])})


def _dense_to_padded(call: Call, choose: Chooser) -> Call:
    return call._replace(args=(torch.zeros(3, 2),))


E = errors
_PP = "postprocess_batch"
_TWO = "two micro-batches, a key"

#: The table: every defect both implementations must reject, in the order of ``docs/spec.md``'s checks.
TABLE: tuple[Defect, ...] = (
    # -- settings
    Defect(
        "unknown_pad_mode",
        _PP,
        E.UnsupportedSettingError,
        r"pad_mode must be one of .* got 'left'",
        "nothing",
        _setting("pad_mode", ["left", "bogus", "NO_PADDING", 0, None]),
    ),
    Defect(
        "use_dynamic_bsz_not_a_bool",
        _PP,
        E.UnsupportedSettingError,
        r"use_dynamic_bsz must be a bool.*'False'",
        "nothing",
        _setting("use_dynamic_bsz", ["False", "True", "0", "yes"]),
    ),
    Defect(
        "indices_none",
        _PP,
        E.UnsupportedSettingError,
        r"indices is None while use_dynamic_bsz is on",
        "nothing",
        _indices_none,
    ),
    Defect(
        "padding_without_its_output",
        _PP,
        E.PartitionMismatchError,
        r"2 partitions \(padding included\) for 1 micro-batch outputs",
        "two micro-batches",
        _padding_without_output,
    ),
    # -- structure
    Defect(
        "output_not_a_dict",
        _PP,
        E.UnsupportedSettingError,
        r"micro-batch 0: an output must be a dict",
        "nothing",
        _not_a_dict,
    ),
    Defect(
        "missing_model_output",
        _PP,
        E.KeyMismatchError,
        r"key 'model_output', micro-batch 1: missing",
        _TWO,
        _missing_model_output,
    ),
    Defect("missing_key", _PP, E.KeyMismatchError, r"key 'v', micro-batch 1: missing", _TWO, _missing_key, script=(1,)),
    Defect("extra_key", _PP, E.KeyMismatchError, r"key 'v', micro-batch 1: present", _TWO, _extra_key, script=(1,)),
    # -- partition count
    Defect(
        "too_many_partitions",
        _PP,
        E.PartitionMismatchError,
        r"3 partitions for 2 micro-batches",
        "a key",
        _extra_partition,
    ),
    # -- permutation
    Defect(
        "duplicate_index",
        _PP,
        E.NotAPermutationError,
        r"micro-batch 1, position 0: index 1 duplicates micro-batch 0, position 0",
        "two rows",
        _bad_index(_duplicate),
        script=(2, 0),
    ),
    Defect(
        "negative_index",
        _PP,
        E.NotAPermutationError,
        r"micro-batch 1, position 0: index -1 is negative",
        "one row",
        _bad_index(lambda call, choose, m, j: -choose.integer(1, max(_num_rows(call), 1))),
        script=(2, 0),
    ),
    Defect(
        "out_of_range_index",
        _PP,
        E.NotAPermutationError,
        r"micro-batch 0, position 1: index 3 is out of range for 3 rows",
        "one row",
        _bad_index(lambda call, choose, m, j: _num_rows(call) + choose.integer(0, 3)),
        script=(1, 0),
    ),
    Defect(
        "float_index",
        _PP,
        E.NotAPermutationError,
        r"micro-batch 0, position 0: index 1\.0 is not an integer",
        "one row",
        _bad_index(lambda call, choose, m, j: float(call.args[1][m][j])),
    ),
    Defect(
        "nested_index",
        _PP,
        E.NotAPermutationError,
        r"micro-batch 0, position 0: index \[1\] is not an integer",
        "one row",
        _bad_index(lambda call, choose, m, j: [call.args[1][m][j]]),
    ),
    Defect(
        "index_past_int64",
        _PP,
        E.NotAPermutationError,
        r"micro-batch 0, position 1: index 1180591620717411303424 is out of range for 3 rows",
        "one row",
        _bad_index(lambda call, choose, m, j: 2**70),
        script=(1,),
    ),
    Defect(
        "uint64_index_not_wrapped",
        _PP,
        E.NotAPermutationError,
        r"micro-batch 1, position 0: index 18446744073709551615 is out of range for 3 rows",
        "one row",
        _uint64_partition,
        script=(2,),
    ),
    Defect(
        "float_index_after_an_array_partition",
        _PP,
        E.NotAPermutationError,
        r"micro-batch 1, position 0: index 0\.0 is not an integer",
        "two micro-batches, a row in a later one",
        _float_after_an_array,
    ),
    Defect(
        "dropped_row",
        _PP,
        E.NotAPermutationError,
        r"micro-batch 0, position 0: index 2 is out of range for 2 rows",
        "two rows",
        _dropped_row,
    ),
    # -- per key and micro-batch
    Defect(
        "layout",
        _PP,
        E.ShapeMismatchError,
        r"key 'lp', micro-batch 1: layout dense differs from micro-batch 0's jagged",
        _TWO,
        _in_later_micro_batch(_relayout),
    ),
    Defect(
        "dtype",
        _PP,
        E.DtypeMismatchError,
        r"key 'lp', micro-batch 1: dtype .*float64 differs from micro-batch 0's .*float32",
        _TWO,
        _in_later_micro_batch(lambda x: _retype(x, _other_dtype(x))),
    ),
    Defect(
        "device",
        _PP,
        E.DeviceMismatchError,
        r"key 'lp', micro-batch 1: device .* differs from micro-batch 0's",
        _TWO,
        _in_later_micro_batch(lambda x: x.to("meta")),
    ),
    Defect(
        "trailing_shape",
        _PP,
        E.ShapeMismatchError,
        r"key 'lp', micro-batch 1: trailing shape \(2,\) differs from micro-batch 0's \(\)",
        _TWO,
        _in_later_micro_batch(_reshape_trailing),
    ),
    Defect(
        "scalar_output",
        _PP,
        E.ShapeMismatchError,
        r"key 'v', micro-batch 0: a dense output needs a leading batch dimension",
        "a key",
        _scalar_output,
        script=(1, 0),
    ),
    Defect(
        "strided_nested",
        _PP,
        E.InvalidJaggedError,
        r"jagged layout",
        "a jagged key with a row (added if none)",
        _in_jagged_key(_strided),
        script=(0, 1),
    ),
    Defect(
        "jagged_with_padding",
        _PP,
        E.UnsupportedSettingError,
        r"key 'lp', micro-batch 0: jagged outputs need pad_mode 'no_padding'",
        "a jagged key (added if none)",
        _jagged_with_padding,
    ),
    Defect(
        "row_count",
        _PP,
        E.PartitionMismatchError,
        r"key 'lp', micro-batch 0: 2 rows, but its partition has 1 indices",
        _TWO,
        _moved_index,
        script=(1, 0),
    ),
    Defect(
        "later_key_row_count",
        _PP,
        E.PartitionMismatchError,
        r"key 'v', micro-batch 0: 1 rows, but its partition has 2 indices",
        "a second key (added if none), a row",
        _later_key_row_count(dynamic=True),
    ),
    Defect(
        "later_key_row_count_without_dynamic_bsz",
        _PP,
        E.ShapeMismatchError,
        r"key 'v', micro-batch 0: 1 rows, but key 'lp' has 2 there",
        "a second key (added if none), a row",
        _later_key_row_count(dynamic=False),
    ),
    # -- jagged invariants
    Defect(
        "decreasing_offsets",
        _PP,
        E.InvalidJaggedError,
        r"offsets must be non-decreasing, got offsets\[1\] = 3 > offsets\[2\] = 2",
        "a jagged key with a row (added if none)",
        _in_jagged_key(_decreasing),
    ),
    Defect(
        "bad_offsets",
        _PP,
        E.InvalidJaggedError,
        r"micro-batch 0: offsets\[-1\] must equal len\(values\) = 2, got 3",
        "a jagged key with a row (added if none)",
        _in_jagged_key(_last_offset),
    ),
    # -- the other operations
    Defect(
        "lengths_past_the_values",
        _PP,
        E.InvalidJaggedError,
        r"key 'lp', micro-batch 0: row 1 runs past the values: offsets\[1\] \+ lengths\[1\] = 4 \+ 7 > len\(values\) = 10",
        "a jagged key with a row (added if none)",
        _holed_lengths(lambda n: [2] * (n - 1) + [7]),
    ),
    Defect(
        "negative_lengths",
        _PP,
        E.InvalidJaggedError,
        r"key 'lp', micro-batch 0: lengths\[0\] = -1 is negative",
        "a jagged key with a row (added if none)",
        _holed_lengths(lambda n: [-1] + [2] * (n - 1)),
    ),
    Defect(
        "metrics_not_a_dict",
        _PP,
        E.UnsupportedSettingError,
        r"key 'metrics', micro-batch 0: metrics must be a dict, got NoneType",
        "nothing",
        _metrics_not_a_dict,
    ),
    Defect(
        "missing_index",
        "flatten_partitions",
        E.NotAPermutationError,
        r"index 1 is missing",
        "one index",
        _delete_index,
    ),
    Defect(
        "inverse_of_duplicate",
        "inverse_permutation",
        E.NotAPermutationError,
        r"index 0 duplicates",
        "two indices",
        _repeat_in_perm,
    ),
    Defect(
        "restore_negative",
        "restore",
        E.NotAPermutationError,
        r"index -1 is negative",
        "one row",
        _partition_arg(1, lambda parts, choose, m, j: -choose.integer(1, 3)),
    ),
    Defect(
        "split_duplicate",
        "split",
        E.NotAPermutationError,
        r"index 1 duplicates",
        "two rows",
        _partition_arg(1, lambda parts, choose, m, j: choose.choice([i for p in parts for i in p if i != parts[m][j]])),
        script=(1, 0),
    ),
    Defect(
        "restore_bad_offsets",
        "restore",
        E.InvalidJaggedError,
        r"non-decreasing",
        "two rows",
        _first_arg(_decreasing),
    ),
    Defect("concat_dtypes", "concat", E.DtypeMismatchError, r"micro-batch 1: dtype", "two parts", _concat_dtype),
    Defect("concat_nothing", "concat", E.UnsupportedSettingError, r"at least one part", "nothing", _concat_nothing),
    Defect(
        "row_over_budget",
        "balanced_partitions",
        E.TokenBudgetError,
        r"row 1: length 9 exceeds the token budget of 8",
        "one row",
        _row_over_budget,
        script=(1, 0),
    ),
    Defect(
        "more_micro_batches_than_rows",
        "balanced_partitions",
        E.TokenBudgetError,
        r"3 micro-batches are needed .* only 2 rows",
        "nothing",
        _too_few_rows,
    ),
    Defect(
        "take_negative_row",
        "take",
        E.RowIndexError,
        r"position 1: row index -1 is out of range for 2 rows",
        "one row",
        _take_index(lambda n, choose: -choose.integer(1, n + 2)),
        script=(1, 0),
    ),
    Defect(
        "take_out_of_range",
        "take",
        E.RowIndexError,
        r"row index 3 is out of range for 3 rows",
        "one row",
        _take_index(lambda n, choose: n + choose.integer(0, 3)),
        base="take_dense",
    ),
    # -- the packed and padded layouts
    Defect(
        "lengths_not_adding_up",
        "from_packed",
        E.InvalidJaggedError,
        r"the lengths add up to 6, but the values have 5 rows",
        "lengths",
        _lengths_arg(_one_more),
    ),
    Defect(
        "negative_packed_length",
        "from_packed",
        E.InvalidJaggedError,
        r"lengths\[0\] = -2 is negative",
        "a non-empty row",
        _lengths_arg(_negated),
    ),
    Defect(
        "float_lengths",
        "from_packed",
        E.InvalidJaggedError,
        r"lengths must be 1-D integers",
        "lengths",
        _lengths_arg(lambda lengths, choose: torch.tensor(lengths, dtype=torch.float32)),
    ),
    Defect(
        "decreasing_cu_seqlens",
        "from_packed",
        E.InvalidJaggedError,
        r"offsets must be non-decreasing, got offsets\[1\] = 3 > offsets\[2\] = 2",
        "nothing",
        _bad_cu_seqlens,
    ),
    Defect(
        "lengths_and_cu_seqlens",
        "from_packed",
        E.UnsupportedSettingError,
        r"exactly one of lengths and cu_seqlens",
        "nothing",
        _both_lengths_and_cu_seqlens,
    ),
    Defect(
        "length_past_the_padding",
        "from_padded",
        E.InvalidJaggedError,
        r"lengths\[0\] = 4 exceeds the padded length 3",
        "lengths",
        _lengths_arg(_past_the_padding),
    ),
    Defect(
        "a_length_too_few",
        "from_padded",
        E.InvalidJaggedError,
        r"1 lengths for 2 rows",
        "lengths",
        _lengths_arg(lambda lengths, choose: lengths[1:]),
    ),
    Defect(
        "max_len_too_short",
        "to_padded",
        E.ShapeMismatchError,
        r"a row has 2 values, more than max_len = 1",
        "a row of 2 values",
        _short_max_len,
    ),
    Defect(
        "fractional_pad_for_integers",
        "to_padded",
        E.UnsupportedSettingError,
        r"pad_value 0.5 is not an integer, but the values are int32",
        "integer values",
        _fractional_pad,
        base="to_padded_int",
    ),
    Defect(
        "to_padded_of_dense",
        "to_padded",
        E.ShapeMismatchError,
        r"to_padded needs jagged data",
        "nothing",
        _dense_to_padded,
    ),
)

#: Former names of defects, still accepted by ``malformed_inputs(defects=...)``.
DEFECT_ALIASES = {"extra_partition": "too_many_partitions", "moved_index": "row_count", "missing_index": "dropped_row"}


def postprocess_defects() -> dict[str, Defect]:
    """The defects of ``postprocess_batch`` (those `malformed_inputs` draws), by name."""
    return {d.name: d for d in TABLE if d.op == "postprocess_batch"}


def named_call(defect: Defect) -> Call:
    """``defect`` applied to its named valid call with its script: the input of its named error case."""
    return apply(defect, VALID[defect.base or defect.op](), Scripted(defect.script))
