"""The shared core of the table of defects: a `Call`, the `Chooser` every breaker asks (and the `Scripted`
one),
a `Defect`, the named valid calls `VALID`, `apply`, and the helpers more than one family of defects uses.
No Hypothesis here."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol, TypeVar

import torch

from ref import errors
from ref.provenance import Provenance
from torch_impl.testing import njt

from ..data import jagged, offsets_of

__all__ = [
    "POSTPROCESS",
    "TWO_MICRO_BATCHES",
    "VALID",
    "Breaker",
    "Call",
    "Chooser",
    "Defect",
    "Scripted",
    "SplitProvenance",
    "apply",
    "keys_of",
    "made_decreasing",
    "model_output_of",
    "one_index",
    "positions_of",
    "postprocess_call",
    "retyped",
    "row_count",
    "split_call",
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


class SplitProvenance(NamedTuple):
    """The provenance of a call's split (``docs/spec.md``, "Exact provenance"), as each implementation takes
    it: ``data``, the batch rebatch's split (`torch_impl.prepare_micro_batches`) made the call's
    micro-batches of, held here so that its record lives (`for_torch`: ``torch_impl.recorded(data)``;
    verl's drop-in finds the record from ``data``); ``rows``, each micro-batch's original rows (each output
    carries its own as ``output["provenance"]``: bare rows, the first split's). `for_ref`: the split
    first, as ``ref.Provenance(rows)``, then the batch's other live splits as torch recorded them."""

    data: Any
    rows: tuple[tuple[int, ...], ...]

    def for_torch(self) -> Any:
        import torch_impl

        return torch_impl.recorded(self.data)

    def for_ref(self) -> tuple[Provenance, ...]:
        from property_tests.splits import ref_splits

        splits = ref_splits(self.data)
        mine = [p for p in splits if p.rows == self.rows][-1:] or [Provenance(self.rows)]
        return (*mine, *(p for p in splits if p not in mine))


# -- valid calls -----------------------------------------------------------------------------------


def _lp(*lengths: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return jagged(torch.arange(sum(lengths)).to(dtype), list(lengths))


def _valid_postprocess() -> Call:
    """Two micro-batches (2 rows, then 1 row) with a jagged key 'lp' and a dense key 'v'."""
    outs = [
        {"model_output": {"lp": _lp(2, 0), "v": torch.zeros(2)}},
        {"model_output": {"lp": _lp(1), "v": torch.zeros(1)}},
    ]
    return Call("postprocess_batch", (outs, [[1, 2], [0]]), {})


def _valid_three() -> Call:
    """Three micro-batches (2, 2 and 1 rows) with a jagged key 'lp' and a dense key 'v': two of equal size,
    for the alignment family (`property_tests.defects._alignment`)."""
    outs = [
        {"model_output": {"lp": _lp(2, 0), "v": torch.zeros(2)}},
        {"model_output": {"lp": _lp(1, 3), "v": torch.zeros(2)}},
        {"model_output": {"lp": _lp(4), "v": torch.zeros(1)}},
    ]
    return Call("postprocess_batch", (outs, [[1, 2], [0, 4], [3]]), {})


def split_call(rows: int, length: int, budget_rows: int) -> Call:
    """A fixed-length batch (``rows`` rows of ``length`` tokens: no row length tells two rows apart) split
    by rebatch's split with a budget of ``budget_rows`` rows, and the restore's valid call: each
    micro-batch's outputs built as verl's FSDP engine builds them, the per-token ``log_probs`` on its own
    ``input_ids``' offsets (so they carry its nested int: its provenance in torch) beside a dense ``score``
    ``[b_m]``; each output carrying its rows (its provenance in ``ref``); the witness (every row ``length``)
    and the split's `SplitProvenance` as keywords."""
    from tensordict import NonTensorData, TensorDict

    import torch_impl

    ids = jagged(torch.arange(rows * length), [length] * rows)
    data = TensorDict({"input_ids": ids, "use_dynamic_bsz": NonTensorData(True)}, batch_size=[rows])
    micro, indices = torch_impl.prepare_micro_batches(data, max_token_len=length * budget_rows)
    parts = tuple(tuple(int(i) for i in p) for p in indices or ())  # a token budget: always indices
    outs = []
    for mb, part in zip(micro, parts, strict=True):
        x = mb["input_ids"]
        log_probs = torch.nested.nested_tensor_from_jagged(x.values().to(torch.float32) * -0.5, x.offsets())
        score = x.values().reshape(-1, length)[:, 0].to(torch.float32)
        outs.append({"model_output": {"log_probs": log_probs, "score": score}, "provenance": part})
    return postprocess_call(
        outs, [list(p) for p in parts], witness=[length] * rows, provenance=SplitProvenance(data, parts)
    )


#: Named valid calls, one per name (built fresh on each call).
VALID: dict[str, Callable[[], Call]] = {
    "postprocess_batch": _valid_postprocess,
    "postprocess_three": _valid_three,
    # 6 rows of 3 tokens, 2 rows a micro-batch: indices [[0, 5], [2, 3], [1, 4]] (the provenance family)
    "postprocess_split": lambda: split_call(6, 3, 2),
    "flatten_partitions": lambda: Call("flatten_partitions", ([[1, 2], [0]], 3), {}),
    "inverse_permutation": lambda: Call("inverse_permutation", ([0, 2, 1],), {}),
    "restore": lambda: Call("restore", (_lp(1, 2), [[1], [0]]), {}),
    "split": lambda: Call("split", (_lp(1, 2), [[1], [0]]), {}),
    "concat": lambda: Call("concat", ([_lp(1), _lp(2)],), {}),
    "balanced_partitions": lambda: Call("balanced_partitions", ([3, 2], 8), {}),
    "fixed_partitions": lambda: Call("fixed_partitions", (3, 2), {}),
    "take": lambda: Call("take", (_lp(1, 2), [0, 1]), {}),
    "take_dense": lambda: Call("take", (torch.zeros(3), [0, 1, 2]), {}),
    "from_packed": lambda: Call("from_packed", (torch.arange(5.0), [2, 0, 3]), {}),
    "to_padded": lambda: Call("to_padded", (_lp(1, 2),), {}),
    "to_padded_int": lambda: Call("to_padded", (_lp(1, 2, dtype=torch.int32),), {}),
    "from_padded": lambda: Call("from_padded", (torch.arange(6.0).reshape(2, 3), [1, 3]), {}),
}


def postprocess_call(
    output_lst: list[dict[str, Any]],
    indices: Any,
    *,
    use_dynamic_bsz: bool = True,
    pad_mode: Any = "no_padding",
    witness: Any = None,
    provenance: SplitProvenance | None = None,
) -> Call:
    """A ``postprocess_batch`` call, its containers copied (so a breaker can change them in place); a
    ``witness`` (the alignment witness) and a ``provenance`` (the split's) are keywords of the call where
    given."""
    outs = [
        dict(o, model_output=dict(o["model_output"])) if "model_output" in o else dict(o) for o in output_lst
    ]
    idx = [list(p) for p in indices] if indices is not None else None
    kwargs = {"use_dynamic_bsz": use_dynamic_bsz, "pad_mode": pad_mode}
    if witness is not None:
        kwargs["witness"] = list(witness)
    if provenance is not None:
        kwargs["provenance"] = provenance
    return Call("postprocess_batch", (outs, idx), kwargs)


def _copy(call: Call) -> Call:
    if call.op == "postprocess_batch":
        outs, indices = call.args
        return postprocess_call(outs, indices, **call.kwargs)
    args = tuple(
        [list(a) if isinstance(a, list) else a for a in arg] if isinstance(arg, list) else arg
        for arg in call.args
    )
    return Call(call.op, args, dict(call.kwargs))


def apply(defect: Defect, call: Call, choose: Chooser) -> Call:
    """``defect`` applied to a copy of the valid ``call`` (which is left unchanged)."""
    return defect.breaker(_copy(call), choose)


# -- helpers of the breakers -----------------------------------------------------------------------


def strided_nested(rows: list[torch.Tensor]) -> torch.Tensor:
    """A nested tensor with torch's older strided layout (not jagged), its prototype warning silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.nested.nested_tensor(rows)


def model_output_of(call: Call, m: int) -> dict[str, Any]:
    return call.args[0][m]["model_output"]


def keys_of(call: Call) -> list[str]:
    return list(model_output_of(call, 0))


def positions_of(indices: Sequence[Sequence[Any]]) -> list[tuple[int, int]]:
    return [(m, j) for m, p in enumerate(indices) if isinstance(p, list) for j in range(len(p))]


def one_index(arg: int, make: Callable[[Call, Chooser, int, int], Any]) -> Breaker:
    """One position ``(m, j)`` of the partitions in ``args[arg]`` replaced by ``make(call, choose, m, j)``."""

    def breaker(call: Call, choose: Chooser) -> Call:
        parts = call.args[arg]
        m, j = choose.choice(positions_of(parts))
        parts[m][j] = make(call, choose, m, j)
        return call

    return breaker


def row_count(x: torch.Tensor) -> int:
    return int(x.size(0))


def retyped(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if x.is_nested:
        return njt(x.values().to(dtype), offsets_of(x))
    return x.to(dtype)


def _with_offsets(x: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    return njt(x.values(), offsets)


def made_decreasing(x: torch.Tensor) -> torch.Tensor:
    """Offsets broken so that ``offsets[1] > offsets[2]`` (``offsets[1] = -1`` with a single row)."""
    o = offsets_of(x.contiguous()).clone()
    if o.numel() >= 3:
        o[1] = o[2] + 1
    else:
        o[1] = -1
    return _with_offsets(x.contiguous(), o)


POSTPROCESS = "postprocess_batch"
TWO_MICRO_BATCHES = "two micro-batches, a key"
