"""The provenance state machine (``docs/spec.md``, "Exact provenance"): several batches, each split any
number of times with any budget (token budgets, fixed-size chunks, padding micro-batches, and splits
rebatch did not make), restored in any order, from several threads, through ``data`` or a shallow clone of
it, with correct outputs (in the split's order, in another order with their indices, from another split of
identical partition, copied into static buffers that persist across steps) or with each named
misalignment (two micro-batches swapped, rows transposed, another step's indices, the inverse given for the
forward, an output of another split or of another batch, a padding micro-batch's output in a real slot, a
dynamic split restored as fixed); and router replay's routes, merged and restored by
``restore_dynamic_batch``, correct or with two micro-batches' routes swapped before the merge.

Every restore goes through verl's drop-in (``torch_impl.postprocess_batch_func`` and shadow mode's
``check_batch_func``) and through ``ref.postprocess_batch`` given the batch's live splits as torch
recorded them (`property_tests.splits.ref_splits`), each output carrying what its nested int names
(`ref.provenance.Carried`: the split and batch that made its micro-batch, and that micro-batch's rows).
Whether a restore is correct is the machine's own truth: each output's rows against its slot's. The
machine keeps its own model of which splits are live (the newest ``MAX_SPLITS`` of each batch) and
asserts:

- **0 false positives**: a correct restore raises nowhere and is the oracle's result (verl's own
  function where it is installed, `property_tests.baseline`'s reading of it always);
- **0 misses**: every misalignment a live recorded split proves wrong raises `MisalignmentError`;
- **one verdict**: ``ref`` and ``torch_impl`` raise the same class with the same message, or neither.
"""

from __future__ import annotations

import gc
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
from torch_impl.testing import check_batch_func, named_by

from .baseline import verl_postprocess_batch_func
from .compare import first_difference
from .convert import outputs_to_ref
from .splits import ref_splits
from .trainer_import import trainer_module_or_none

__all__ = ["MISALIGNMENTS", "ProvenanceMachine", "engine_outputs"]

#: The live splits kept for a batch (torch_impl's bound, read once: the machine's model follows it).
MAX_SPLITS = 8

#: The ways a restore is made: correct (``"none"``, and the right restores schedulers and engines make),
#: or misaligned (every other).
MISALIGNMENTS = (
    "none",
    "micro_batches_reordered_with_their_indices",
    "output_of_an_identical_partition",
    "static_buffers",
    "swapped_micro_batches",
    "rows_transposed_across_micro_batches",
    "rows_transposed_in_a_micro_batch",
    "another_steps_indices",
    "inverse_for_forward",
    "output_of_another_split",
    "output_of_another_batch",
    "padding_swapped_into_a_real_slot",
    "dynamic_restored_as_fixed",
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
    engine_utils = trainer_module_or_none("verl.workers.engine.utils")
    return None if engine_utils is None else engine_utils.postprocess_batch_func


class ProvenanceMachine(RuleBasedStateMachine):
    """See the module's docstring."""

    def __init__(self) -> None:
        super().__init__()
        gc.collect()  # an earlier run's batches (and their records) gone: the model starts from none
        self.batches: list[Batch | None] = []
        self.splits: list[Split] = []
        self.live: dict[int, list[int]] = {}  # batch -> its recorded splits' names, oldest first
        self.threads = False  # whether threads made splits the model does not know
        self.buffers: dict[tuple[int, int], Any] = {}  # an engine's static buffers, by shape
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
        if kind == "chunks":  # restored as verl's fixed mode: no indices (the override's chunks unused)
            indices = None
            rows_of = in_order
        given = [list(p) if p is not PADDING else PADDING for p in indices] if indices is not None else None
        self.splits.append(Split(b, kind, name, engine_outputs(mbs), given, rows_of))

    @precondition(lambda self: any(b is not None for b in self.batches))
    @rule(data=st.data())
    def drop_batch(self, data: st.DataObject) -> None:
        """A batch's step ends: the batch goes, and its records with it."""
        b = data.draw(st.sampled_from([i for i, x in enumerate(self.batches) if x is not None]))
        self.batches[b] = None  # its records go with it (no restore can name it now)
        self.live[b] = []
        gc.collect()  # at once, so that the model's live splits are torch's

    # -- restoring ----------------------------------------------------------------------------------

    @precondition(lambda self: any(self.batches[s.batch] is not None for s in self.splits))
    @rule(data=st.data())
    def restore(self, data: st.DataObject) -> None:
        """One split restored correctly, then by each named way it has room for (through ``data`` or a
        shallow clone of it)."""
        choices = [i for i, s in enumerate(self.splits) if self.batches[s.batch] is not None]
        split = self.splits[data.draw(st.sampled_from(choices))]
        clone = data.draw(st.booleans())
        for way in MISALIGNMENTS:
            outputs = list(split.outputs)
            indices = (
                None if split.indices is None else [p if p is PADDING else list(p) for p in split.indices]
            )
            carried = [Held(split.batch, split.name, r) for r in split.rows]
            made = _misaligned(way, split, self, outputs, indices, carried, data)
            if made is not False:
                self._check(
                    split,
                    outputs,
                    made if way == "dynamic_restored_as_fixed" else indices,
                    carried,
                    way,
                    clone,
                )

    def _check(
        self, split: Split, outputs: list[Any], indices: Any, carried: list[Held], way: str, clone: bool
    ) -> None:
        batch = self.batches[split.batch]
        assert batch is not None
        batch.data["use_dynamic_bsz"] = NonTensorData(indices is not None)
        data = batch.data.clone(False) if clone else batch.data
        ours, err = _outcome(lambda: torch_impl.postprocess_batch_func(outputs, indices, data))
        shadow = _outcome(lambda: check_batch_func(outputs, indices, data))[1]
        theirs = _outcome(lambda: self._ref(batch, data, outputs, indices, carried))[1]
        assert _words(shadow) == _words(err), (shadow, err)
        assert _words(theirs) == _words(err), f"ref: {theirs!r}, torch_impl: {err!r}"
        real = [m for m, p in enumerate(indices or [None] * len(outputs)) if p is not PADDING]
        slots = _slot_rows(outputs, indices, real)
        correct = all(carried[m].batch == split.batch and carried[m].rows == slots[m] for m in real)
        proven_wrong = not correct and self._proven_wrong(split.batch, carried, slots, real)
        verdict = type(err).__name__ if err is not None else "silent"
        right = "right" if correct else "wrong"
        event(f"{split.kind}, {way}, {right}: {verdict}{' (proven wrong)' if proven_wrong else ''}")
        if correct:
            assert err is None, f"a false positive on a correct restore ({way}): {err!r}"
            kept = [outputs[i] for i in real]
            kept_indices = None if indices is None else [indices[i] for i in real]
            oracle = verl_postprocess_batch_func(kept, kept_indices, batch.data)
            assert first_difference(ours, oracle) is None
            if self.verl is not None:
                assert first_difference(ours, self.verl(kept, kept_indices, batch.data)) is None
        elif proven_wrong:
            assert isinstance(err, MisalignmentError), (
                f"a misalignment a recorded split proves wrong ({way}): {err!r}"
            )

    def _ref(self, batch: Batch, data: Any, outputs: list[Any], indices: Any, carried: list[Held]) -> Any:
        """``ref``'s verdict, each output carrying what its nested int names in torch's records (nothing
        where it names no live record's micro-batch)."""
        outs = outputs_to_ref(outputs)
        for o, out, held in zip(outs, outputs, carried, strict=True):
            named = named_by(out["model_output"]["log_probs"])
            if named is not None:
                rows = tuple(held.rows) if held.rows is not PADDING else PADDING
                o["provenance"] = Carried(named[1], rows, named[0])
        return ref.postprocess_batch(
            outs,
            indices,
            use_dynamic_bsz=indices is not None,
            witness=batch.lengths,
            provenance=ref_splits(data),
        )

    def _proven_wrong(self, b: int, carried: list[Held], slots: dict[int, Any], real: list[int]) -> bool:
        """Whether a live recorded split proves this restore of batch ``b`` wrong, by the machine's model:
        an output naming a live split of ``b`` whose rows are not its slot's (or a padding micro-batch's),
        or, ``b`` recorded, an output naming a live split of another batch."""
        for m in real:
            held = carried[m]
            if held.batch == b and held.name in self.live[b]:
                if held.rows is PADDING or held.rows != slots[m]:
                    return True
            elif held.batch != b and self.live[b] and held.name in self.live.get(held.batch, []):
                return True
        return False

    @precondition(
        lambda self: any(self.batches[s.batch] is not None and s.kind == "budget" for s in self.splits)
    )
    @rule(data=st.data())
    def restore_routes(self, data: st.DataObject) -> None:
        """Router replay: each micro-batch's routes (int16, a value a token naming its row) joined into one
        jagged tensor, as verl's Megatron engine merges them (no identity survives), then restored by
        ``restore_dynamic_batch``; correct, then with two micro-batches' routes swapped before the join."""
        choices = [s for s in self.splits if self.batches[s.batch] is not None and s.kind == "budget"]
        split = data.draw(st.sampled_from(choices))
        batch = self.batches[split.batch]
        assert batch is not None
        assert split.indices is not None
        parts = [list(p) for p in split.indices]
        merged = _routes(batch.lengths, parts)
        ours = torch_impl.restore_dynamic_batch(merged, parts)
        want = [r for _, r in sorted(zip([i for p in parts for i in p], merged.unbind(), strict=True))]
        assert all(torch.equal(a, b) for a, b in zip(ours.unbind(), want, strict=True))
        pairs = [
            (m, n)
            for m, n in itertools.combinations(range(len(parts)), 2)
            if len(parts[m]) == len(parts[n])
            and [batch.lengths[i] for i in parts[m]] != [batch.lengths[i] for i in parts[n]]
        ]
        if not pairs:
            return
        m, n = data.draw(st.sampled_from(pairs))
        swapped = list(parts)
        swapped[m], swapped[n] = swapped[n], swapped[m]
        shuffled = _routes(batch.lengths, swapped)  # the routes of micro-batch n where m's should be
        err = _outcome(lambda: torch_impl.restore_dynamic_batch(shuffled, parts))[1]
        # every live recorded split of the same indices (fixed-size chunks: the rows in order) recorded the
        # same lengths: then the restore compares them
        same_rows = [
            s
            for s in self.splits
            if s.name in self.live.get(s.batch, []) and _flat_rows(s.rows) == _flat_rows(split.rows)
        ]
        alike = all(self.batches[s.batch].lengths == batch.lengths for s in same_rows)  # type: ignore[union-attr]
        expected = split.name in self.live[split.batch] and alike and not self.threads
        verdict = type(err).__name__ if err else "silent"
        event(f"routes swapped: {verdict}{' (proven wrong)' if expected else ''}")
        if expected:
            assert isinstance(err, MisalignmentError), f"routes swapped before the merge: {err!r}"

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
        self.threads = True

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


class Held(NamedTuple):
    """What an output truly holds: the batch and split (None: no split rebatch recorded) that made its
    micro-batch, and that micro-batch's rows (`PADDING` for a padding micro-batch's)."""

    batch: int
    name: int | None
    rows: Any


def _slot_rows(outputs: list[Any], indices: Any, real: list[int]) -> dict[int, Any]:
    """Each real slot's rows: its indices, or without them the positions after the slots before it."""
    if indices is not None:
        return {m: list(indices[m]) for m in real}
    sizes = [int(o["model_output"]["log_probs"].size(0)) for o in outputs]
    starts = list(itertools.accumulate(sizes, initial=0))
    return {m: list(range(starts[m], starts[m + 1])) for m in real}


def _flat_rows(rows: list[Any]) -> tuple[tuple[int, ...], ...]:
    """A split's real micro-batches' rows, as a restore's indices give them."""
    return tuple(tuple(r) for r in rows if r is not PADDING)


def _routes(lengths: list[int], parts: list[list[int]]) -> torch.Tensor:
    """Router replay's routes of micro-batches ``parts`` joined as verl's Megatron engine merges them: each
    row ``[len, 2, 3]`` int16 naming its original row, every row unbound and joined anew."""
    rows = [torch.full((lengths[i], 2, 3), i, dtype=torch.int16, device="cpu") for p in parts for i in p]
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


def _swap(outputs: list[Any], carried: list[Any], m: int, n: int) -> None:
    """Outputs ``m`` and ``n`` swapped, with what each holds."""
    outputs[m], outputs[n] = outputs[n], outputs[m]
    carried[m], carried[n] = carried[n], carried[m]


def _buffered(machine: ProvenanceMachine, outputs: list[Any]) -> list[Any]:
    """Each output's ``log_probs`` copied into the engine's static buffer of its shape, made once on
    offsets of its own (it names no micro-batch) and kept across steps."""
    out = []
    for o in outputs:
        lp = o["model_output"]["log_probs"]
        lengths = lp.offsets().diff()
        key = (int(lp.size(0)), int(lengths.sum()))
        buffer = machine.buffers.get(key)
        if buffer is None or not torch.equal(buffer.offsets(), lp.offsets()):
            buffer = torch.nested.nested_tensor_from_jagged(
                torch.zeros_like(lp.values()), lp.offsets().clone()
            )
            machine.buffers[key] = buffer
        buffer.values().copy_(lp.values())
        out.append({**o, "model_output": {**o["model_output"], "log_probs": buffer}})
    return out


# Complex by design: one branch for each way the machine restores.
def _misaligned(  # noqa: C901
    name: str,
    split: Split,
    machine: ProvenanceMachine,
    outputs: list[Any],
    indices: list[Any] | None,
    carried: list[Held],
    data: st.DataObject,
) -> Any:
    """``outputs``, ``indices`` and ``carried`` changed in place by the named way; False where this split
    has no room for it (nothing changed); for ``dynamic_restored_as_fixed``, the indices to give (None)."""
    real = [m for m in range(len(outputs)) if indices is None or indices[m] is not PADDING]
    sizes = {m: int(outputs[m]["model_output"]["log_probs"].size(0)) for m in real}
    if name == "none":
        return True
    if name == "static_buffers":
        outputs[:] = _buffered(machine, outputs)
        carried[:] = [Held(h.batch, None, h.rows) for h in carried]
        return True
    if name == "micro_batches_reordered_with_their_indices":
        if indices is None or len(real) < 2:
            return False
        order = data.draw(st.permutations(real))
        if order == real:
            return False
        moved = [(outputs[k], indices[k], carried[k]) for k in order]
        for m, (o, p, h) in zip(real, moved, strict=True):
            outputs[m], indices[m], carried[m] = o, p, h
        return True
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
    if name in ("output_of_another_split", "output_of_an_identical_partition", "output_of_another_batch"):
        same = name != "output_of_another_batch"
        others = [
            (s, q, m)
            for s in machine.splits
            if (s.batch == split.batch) == same and s is not split and machine.batches[s.batch] is not None
            for q, r in enumerate(s.rows)
            if r is not PADDING
            for m in real
            if len(r) == sizes[m]
            and (not same or (name == "output_of_another_split") == (r != carried[m].rows))
        ]
        if not others:
            return False
        s, q, m = data.draw(st.sampled_from(others))
        outputs[m] = s.outputs[q]
        carried[m] = Held(s.batch, s.name, s.rows[q])
        return True
    if name == "dynamic_restored_as_fixed":
        if indices is None or len(real) != len(indices):
            return False
        in_order = [i for m in real for i in indices[m]] == list(range(sum(sizes.values())))
        return False if in_order else None
    if indices is None:
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
