"""The provenance state machine (``docs/spec.md``, "Exact provenance"): several batches, each split any
number of times with any budget (token budgets, fixed-size chunks, padding micro-batches, and splits
rebatch did not make), restored in any order, from several threads, with correct outputs or with each
named misalignment.

Every restore goes through verl's drop-in (``torch_impl.postprocess_batch_func`` and shadow mode's
``check_batch_func``) and through ``ref.postprocess_batch`` given the batch's live splits as torch
recorded them (`property_tests.convert.ref_splits`), each output carrying what its nested int says
(`ref.provenance.Carried`: the split that made its micro-batch and that micro-batch's rows). The machine
keeps its own model of which splits are live (the newest ``MAX_SPLITS`` of each batch) and asserts:

- **0 false positives**: a correct restore raises nowhere and is the oracle's result (verl's own
  function where it is installed, `property_tests.baseline`'s reading of it always);
- **0 misses**: every misalignment a live recorded split proves wrong raises `MisalignmentError`;
- **one verdict**: ``ref`` and ``torch_impl`` raise the same class with the same message, or neither.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any, NamedTuple

import torch
from hypothesis import event, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from tensordict import NonTensorData, TensorDict

import ref
import torch_impl
from ref import PADDING
from ref.errors import MisalignmentError, RebatchError
from ref.provenance import Carried
from torch_impl.testing import check_batch_func

from .baseline import verl_postprocess_batch_func
from .compare import first_difference
from .convert import outputs_to_ref
from .splits import ref_splits

__all__ = ["MISALIGNMENTS", "ProvenanceMachine", "engine_outputs"]

#: The live splits kept for a batch (torch_impl's bound, read once: the machine's model follows it).
MAX_SPLITS = 8

#: The ways a restore is misaligned (``"none"``: the correct restore).
MISALIGNMENTS = (
    "none",
    "swapped_micro_batches",
    "rows_transposed_across_micro_batches",
    "rows_transposed_in_a_micro_batch",
    "another_steps_indices",
    "inverse_for_forward",
    "output_of_another_split",
    "padding_swapped_into_a_real_slot",
)

#: How a split is made: rebatch's token budget, its fixed-size chunks, its token budget with padding
#: micro-batches, or a split rebatch did not make (its micro-batches cut by ``torch_impl.split``).
KINDS = ("budget", "chunks", "padded", "unrecorded")


class Batch(NamedTuple):
    data: TensorDict
    lengths: list[int]


class Split(NamedTuple):
    """One split as the machine knows it: its batch, kind, name (None where rebatch recorded none), the
    outputs each micro-batch's forward made, the indices it returned (None: fixed-size chunks) and each
    micro-batch's rows (`PADDING` for a padding one)."""

    batch: int
    kind: str
    name: int | None
    outputs: list[dict[str, Any]]
    indices: list[Any] | None
    rows: list[Any]


def engine_outputs(micro_batches: Any) -> list[dict[str, Any]]:
    """Each micro-batch's outputs as verl's FSDP engine builds them: per-token ``log_probs`` on its
    ``input_ids``' offsets (so they carry its nested int), a dense ``score`` ``[b_m, 2]``, a loss."""
    outs = []
    for mb in micro_batches:
        ids = mb["input_ids"]
        log_probs = torch.nested.nested_tensor_from_jagged(
            ids.values().to(torch.float32) * -0.5, ids.offsets()
        )
        rows = int(mb.batch_size[0])
        score = (
            torch.arange(rows * 2, dtype=torch.float32, device="cpu").reshape(rows, 2)
            + ids.values()[:1].float()
        )
        outs.append(
            {"model_output": {"log_probs": log_probs, "score": score}, "loss": torch.tensor(float(rows))}
        )
    return outs


def _verl() -> Any:
    """verl's own ``postprocess_batch_func`` where verl is installed, else None."""
    try:
        import verl.workers.engine.utils as engine_utils
    except ImportError:
        return None
    return engine_utils.postprocess_batch_func


class ProvenanceMachine(RuleBasedStateMachine):
    """See the module's docstring."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[Batch | None] = []
        self.splits: list[Split] = []
        self.live: dict[int, list[int]] = {}  # batch -> its recorded splits' names, oldest first
        self.verl = _verl()

    # -- making batches and splits ------------------------------------------------------------------

    @initialize(
        rows=st.integers(2, 8), two=st.lists(st.integers(1, 3), min_size=2, max_size=2), data=st.data()
    )
    def first_batch(self, rows: int, two: list[int], data: st.DataObject) -> None:
        """A batch and a split of it to start from (then any rule applies)."""
        self.new_batch(rows, two, data)
        self.split(data.draw(st.sampled_from(KINDS)), data.draw(st.integers(1, 4)), data)

    @rule(rows=st.integers(2, 8), two=st.lists(st.integers(1, 3), min_size=2, max_size=2), data=st.data())
    def new_batch(self, rows: int, two: list[int], data: st.DataObject) -> None:
        """A batch whose rows take at most two lengths (where lengths tell little)."""
        lengths = data.draw(st.lists(st.sampled_from(two), min_size=rows, max_size=rows))
        offsets = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int64, device="cpu")
        values = torch.arange(int(offsets[-1]), device="cpu") + 100 * len(self.batches)
        ids = torch.nested.nested_tensor_from_jagged(values, offsets)
        batch = TensorDict({"input_ids": ids, "use_dynamic_bsz": NonTensorData(True)}, batch_size=[rows])
        self.batches.append(Batch(batch, lengths))
        self.live[len(self.batches) - 1] = []

    @precondition(lambda self: any(b is not None for b in self.batches))
    @rule(kind=st.sampled_from(KINDS), rows_a_micro_batch=st.integers(1, 4), data=st.data())
    def split(self, kind: str, rows_a_micro_batch: int, data: st.DataObject) -> None:
        b = data.draw(st.sampled_from([i for i, x in enumerate(self.batches) if x is not None]))
        batch = self.batches[b]
        assert batch is not None
        budget = max(batch.lengths) * rows_a_micro_batch
        rows = len(batch.lengths)
        if kind == "budget":
            mbs, indices = torch_impl.prepare_micro_batches(batch.data, max_token_len=budget)
        elif kind == "chunks":
            mbs, indices = torch_impl.prepare_micro_batches(batch.data, micro_batch_size=rows_a_micro_batch)
        elif kind == "padded":
            count = data.draw(st.integers(1, rows + 2))
            mbs, indices = torch_impl.rearrange_micro_batches(
                batch.data, budget, min_num_micro_batch=count, pad_micro_batches=True
            )
        else:
            order = data.draw(st.permutations(range(rows)))
            cuts = sorted(data.draw(st.sets(st.integers(1, rows - 1), max_size=rows - 1)))
            indices = [list(order[a:e]) for a, e in itertools.pairwise([0, *cuts, rows])]
            mbs = torch_impl.split(batch.data, indices)
        name = None
        if kind != "unrecorded":
            kept = torch_impl.recorded(batch.data)
            name = kept.splits[-1].name  # type: ignore[union-attr]
            self.live[b] = [*self.live[b], name][-MAX_SPLITS:]
        in_order = [list(range(a, e)) for a, e in itertools.pairwise(_bounds(mbs))]
        rows_of = (
            [list(p) if p is not PADDING else PADDING for p in indices] if indices is not None else in_order
        )
        given = [list(p) if p is not PADDING else PADDING for p in indices] if indices is not None else None
        self.splits.append(Split(b, kind, name, engine_outputs(mbs), given, rows_of))

    @precondition(lambda self: any(b is not None for b in self.batches))
    @rule(data=st.data())
    def drop_batch(self, data: st.DataObject) -> None:
        """A batch's step ends: the batch goes, and its records with it."""
        b = data.draw(st.sampled_from([i for i, x in enumerate(self.batches) if x is not None]))
        self.batches[b] = None  # its records go when the collector frees it (no restore can name it now)
        self.live[b] = []

    # -- restoring ----------------------------------------------------------------------------------

    @precondition(lambda self: any(self.batches[s.batch] is not None for s in self.splits))
    @rule(data=st.data())
    def restore(self, data: st.DataObject) -> None:
        """One split restored correctly, then misaligned by each named misalignment it has room for."""
        choices = [i for i, s in enumerate(self.splits) if self.batches[s.batch] is not None]
        split = self.splits[data.draw(st.sampled_from(choices))]
        for misalignment in MISALIGNMENTS:
            outputs = list(split.outputs)
            indices = (
                None if split.indices is None else [p if p is PADDING else list(p) for p in split.indices]
            )
            carried = [(split.name, r) for r in split.rows]
            made = _misaligned(misalignment, split, self.splits, outputs, indices, carried, data)
            if made or misalignment == "none":
                self._check(split, outputs, indices, carried, misalignment)

    def _check(
        self, split: Split, outputs: list[Any], indices: Any, carried: list[Any], misalignment: str
    ) -> None:
        correct = misalignment == "none"
        batch = self.batches[split.batch]
        assert batch is not None
        batch.data["use_dynamic_bsz"] = NonTensorData(split.indices is not None)
        ours, err = _outcome(lambda: torch_impl.postprocess_batch_func(outputs, indices, batch.data))
        shadow = _outcome(lambda: check_batch_func(outputs, indices, batch.data))[1]
        theirs = _outcome(lambda: self._ref(batch, split, outputs, indices, carried))[1]
        assert _words(shadow) == _words(err), (shadow, err)
        assert _words(theirs) == _words(err), f"ref: {theirs!r}, torch_impl: {err!r}"
        proven_wrong = not correct and self._proven_wrong(split, carried, indices)
        verdict = type(err).__name__ if err is not None else "silent"
        event(f"{split.kind}, {misalignment}: {verdict}{' (proven wrong)' if proven_wrong else ''}")
        if correct:
            assert err is None, f"a false positive on a correct restore: {err!r}"
            real = [i for i, p in enumerate(indices or [None] * len(outputs)) if p is not PADDING]
            kept = [outputs[i] for i in real]
            kept_indices = None if indices is None else [indices[i] for i in real]
            oracle = verl_postprocess_batch_func(kept, kept_indices, batch.data)
            assert first_difference(ours, oracle) is None
            if self.verl is not None:
                assert first_difference(ours, self.verl(kept, kept_indices, batch.data)) is None
        elif proven_wrong:
            assert isinstance(err, MisalignmentError), (
                f"a misalignment a recorded split proves wrong: {err!r}"
            )

    def _ref(self, batch: Batch, split: Split, outputs: list[Any], indices: Any, carried: list[Any]) -> Any:
        outs = outputs_to_ref(outputs)
        for o, (name, rows) in zip(outs, carried, strict=True):
            if name is not None:
                o["provenance"] = Carried(name, tuple(rows) if rows is not PADDING else PADDING)
        return ref.postprocess_batch(
            outs,
            indices,
            use_dynamic_bsz=indices is not None,
            witness=batch.lengths,
            provenance=ref_splits(batch.data),
        )

    def _proven_wrong(self, split: Split, carried: list[Any], indices: Any) -> bool:
        """Whether a live recorded split proves this misaligned restore wrong, by the machine's own model:
        the first output whose split is live decides it; then another live split's output, indices not
        its own, or an output of another of its slots."""
        live = self.live[split.batch]
        by_name = {s.name: s for s in self.splits if s.name in live}
        real = [m for m, p in enumerate(indices or [None] * len(carried)) if p is not PADDING]
        tags = [carried[m] for m in real]
        known = [(m, tag) for m, tag in enumerate(tags) if tag[0] in by_name]
        if not known:
            return False
        decided = by_name[known[0][1][0]]
        if any(tag[0] != decided.name for _m, tag in known):
            return True
        own = [r for r in decided.rows if r is not PADDING]
        if indices is not None and [indices[m] for m in real] != own:  # chunks: their rows in order
            return True
        return any(tag[1] is PADDING or tag[1] != own[m] for m, tag in known if m < len(own))

    # -- threads --------------------------------------------------------------------------------------

    @precondition(lambda self: any(b is not None for b in self.batches))
    @rule(budgets=st.lists(st.integers(1, 4), min_size=2, max_size=3), data=st.data())
    def restore_from_threads(self, budgets: list[int], data: st.DataObject) -> None:
        """Threads sharing one batch, each splitting it with its own budget and restoring its outputs."""
        b = data.draw(st.sampled_from([i for i, x in enumerate(self.batches) if x is not None]))
        batch = self.batches[b]
        assert batch is not None
        batch.data["use_dynamic_bsz"] = NonTensorData(True)
        errors: list[BaseException] = []

        def work(rows: int) -> None:
            try:
                for _ in range(3):
                    mbs, indices = torch_impl.prepare_micro_batches(
                        batch.data, max_token_len=max(batch.lengths) * rows
                    )
                    outs = engine_outputs(mbs)
                    ours = torch_impl.postprocess_batch_func(outs, indices, batch.data)
                    assert (
                        first_difference(ours, verl_postprocess_batch_func(outs, indices, batch.data)) is None
                    )
            except BaseException as err:  # reported below
                errors.append(err)

        threads = [threading.Thread(target=work, args=(rows,)) for rows in budgets]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == [], errors
        self.live[b] = []  # which splits the threads left newest is theirs to race: unknown, so none

    @invariant()
    def records_bounded(self) -> None:
        for batch in self.batches:
            if batch is not None:
                kept = torch_impl.recorded(batch.data)
                assert len(getattr(kept, "splits", ())) <= MAX_SPLITS


def _bounds(micro_batches: Any) -> list[int]:
    return [0, *itertools.accumulate(int(mb.batch_size[0]) for mb in micro_batches)]


def _outcome(call: Any) -> tuple[Any, BaseException | None]:
    try:
        return call(), None
    except RebatchError as err:
        return None, err


def _words(err: BaseException | None) -> tuple[str, str] | None:
    return None if err is None else (type(err).__name__, str(err))


def _swap(outputs: list[Any], carried: list[Any], m: int, n: int) -> None:
    """Outputs ``m`` and ``n`` swapped, with what each carries."""
    outputs[m], outputs[n] = outputs[n], outputs[m]
    carried[m], carried[n] = carried[n], carried[m]


# Complex by design: one branch for each misalignment the machine draws.
def _misaligned(  # noqa: C901
    name: str,
    split: Split,
    splits: list[Split],
    outputs: list[Any],
    indices: list[Any] | None,
    carried: list[Any],
    data: st.DataObject,
) -> bool:
    """``outputs``, ``indices`` and ``carried`` misaligned in place by the named misalignment; False where
    this split has no room for it (nothing changed)."""
    real = [m for m in range(len(outputs)) if indices is None or indices[m] is not PADDING]
    sizes = {m: int(outputs[m]["model_output"]["log_probs"].size(0)) for m in real}
    if name == "swapped_micro_batches":
        pairs = [(m, n) for m, n in itertools.combinations(real, 2) if sizes[m] == sizes[n] > 0]
        if not pairs:
            return False
        _swap(outputs, carried, *data.draw(st.sampled_from(pairs)))
        return True
    if name == "padding_swapped_into_a_real_slot":
        padding = [m for m in range(len(outputs)) if m not in sizes]
        fits = [(m, p) for m in real for p in padding if sizes[m] == 1]  # the filler has one row
        if not fits:
            return False
        _swap(outputs, carried, *data.draw(st.sampled_from(fits)))
        return True
    if name == "output_of_another_split":
        others = [
            (s, q)
            for s in splits
            if s.batch == split.batch and s is not split
            for q, r in enumerate(s.rows)
            if r is not PADDING and any(len(r) == sizes[m] for m in real)
        ]
        if not others:
            return False
        s, q = data.draw(st.sampled_from(others))
        m = data.draw(st.sampled_from([m for m in real if sizes[m] == len(s.rows[q])]))
        outputs[m] = s.outputs[q]
        carried[m] = (s.name, s.rows[q])
        return True
    if indices is None or name == "none":
        return False
    flat = [i for m in real for i in indices[m]]
    if name == "rows_transposed_across_micro_batches":
        filled = [m for m in real if sizes[m]]
        if len(filled) < 2:
            return False
        m, n = data.draw(st.sampled_from(list(itertools.combinations(filled, 2))))
        a, c = data.draw(st.integers(0, sizes[m] - 1)), data.draw(st.integers(0, sizes[n] - 1))
        indices[m][a], indices[n][c] = indices[n][c], indices[m][a]
        return True
    if name == "rows_transposed_in_a_micro_batch":
        wide = [m for m in real if sizes[m] >= 2]
        if not wide:
            return False
        m = data.draw(st.sampled_from(wide))
        a, c = data.draw(st.lists(st.integers(0, sizes[m] - 1), min_size=2, max_size=2, unique=True))
        indices[m][a], indices[m][c] = indices[m][c], indices[m][a]
        return True
    if name == "another_steps_indices":
        shift = data.draw(st.integers(1, len(flat) - 1))
        changed = flat[shift:] + flat[:shift]
    else:
        changed = [0] * len(flat)
        for k, i in enumerate(flat):
            changed[i] = k
    if changed == flat:
        return False
    pieces = iter(changed)
    for m in real:
        indices[m] = [next(pieces) for _ in range(sizes[m])]
    return True
