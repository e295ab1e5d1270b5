"""The split side: verl's token-budget partitioner, micro-batches of a TensorDict, and their cost."""

from __future__ import annotations

import pytest
import torch
from tensordict import NonTensorStack, TensorDict

import ref
import torch_impl
from property_tests.compare import assert_same
from property_tests.data import jagged
from property_tests.opcount import CountOps
from ref.errors import TokenBudgetError, UnsupportedSettingError
from ref.partition import karmarkar_karp, workload


def test_count_starts_from_the_budget_and_respects_minimum_and_multiple() -> None:
    lengths = [4] * 10  # 40 tokens
    assert len(ref.balanced_partitions(lengths, 20)) == 2
    assert len(ref.balanced_partitions(lengths, 20, min_num_micro_batches=3)) == 3
    assert len(ref.balanced_partitions(lengths, 20, min_num_micro_batches=3, multiple_of=2)) == 4
    assert len(ref.balanced_partitions(lengths, 40)) == 1


def test_count_grows_until_every_micro_batch_fits() -> None:
    lengths = [7, 7, 7, 1, 1, 1]  # 24 tokens, budget 12: 2 micro-batches cannot hold 7 + 7 apart
    parts = ref.balanced_partitions(lengths, 12)
    assert all(sum(lengths[i] for i in p) <= 12 for p in parts)
    assert len(parts) == 3


def test_balance_puts_the_lightest_at_both_ends() -> None:
    lengths = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    parts = ref.balanced_partitions(lengths, 11, balance=True)
    loads = [sum(workload(lengths[i]) for i in p) for p in parts]
    heaviest = loads.index(max(loads))
    assert 0 < heaviest < len(loads) - 1 or len(loads) < 3
    unbalanced = ref.balanced_partitions(lengths, 11, balance=False)
    assert sorted(map(tuple, parts)) == sorted(map(tuple, unbalanced))


def test_indices_ascend_and_result_is_deterministic() -> None:
    lengths = [9, 1, 8, 2, 7, 3, 6, 4, 5]
    first = ref.balanced_partitions(lengths, 15)
    assert all(p == sorted(p) for p in first)
    assert (
        first
        == ref.balanced_partitions(lengths, 15)
        == torch_impl.balanced_partitions(torch.tensor(lengths), 15)
    )


def test_largest_differencing_is_not_always_better_than_greedy() -> None:
    """The counterexample Hypothesis found to "spread no worse than greedy": recorded, not hidden."""
    lengths = [2, 3, 3, 4, 6, 6, 6, 7]
    loads = [workload(n) for n in lengths]
    kk = [sum(loads[i] for i in p) for p in karmarkar_karp(loads, 3)]
    greedy = [0, 0, 0]
    for i in sorted(range(len(loads)), key=lambda i: -loads[i]):
        greedy[greedy.index(min(greedy))] += loads[i]
    assert max(kk) - min(kk) == 24_587
    assert max(greedy) - min(greedy) == 24_575
    assert max(kk) - min(kk) <= max(loads)


@pytest.mark.parametrize("impl", [ref, torch_impl], ids=["ref", "torch_impl"])
def test_budget_errors(impl) -> None:
    with pytest.raises(TokenBudgetError, match="row 1: length 9 exceeds the token budget of 8"):
        impl.balanced_partitions([3, 9, 2], 8)
    with pytest.raises(TokenBudgetError, match="max_token_len must be positive"):
        impl.balanced_partitions([3], 0)


def _batch() -> TensorDict:
    lengths = [3, 0, 5, 2, 4, 0, 1]
    n = sum(lengths)
    td = TensorDict(
        {
            "input_ids": jagged(torch.arange(n), lengths),
            "top_k": jagged(torch.arange(3.0 * n).reshape(n, 3), lengths),
            "advantages": torch.arange(7.0),
        },
        batch_size=[7],
    )
    td["uid"] = NonTensorStack(*[f"u{i}" for i in range(7)])
    return td


def test_prepare_micro_batches_round_trip_dynamic_and_fixed() -> None:
    data = _batch()
    micro, indices = torch_impl.prepare_micro_batches(data, max_token_len=6)
    assert all(int(mb["input_ids"].offsets()[-1]) <= 6 for mb in micro)
    assert [list(mb["uid"]) for mb in micro] == [[f"u{i}" for i in p] for p in indices]
    outs = [
        {"model_output": {"ids": mb["input_ids"], "topk": mb["top_k"], "adv": mb["advantages"]}}
        for mb in micro
    ]
    res = torch_impl.postprocess_batch_func(outs, indices, None)["model_output"]
    assert torch.equal(res["ids"].values(), data["input_ids"].values())
    assert torch.equal(res["topk"].offsets(), data["top_k"].offsets())
    assert torch.equal(res["adv"], data["advantages"])
    fixed, chunks = torch_impl.prepare_micro_batches(data, micro_batch_size=3)
    assert chunks == [[0, 1, 2], [3, 4, 5], [6]]  # its chunks' indices: right whatever data says
    assert [mb.batch_size[0] for mb in fixed] == [3, 3, 1]


def test_row_lengths_from_a_dense_mask() -> None:
    data = TensorDict({"attention_mask": torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]])}, batch_size=[3])
    assert torch_impl.row_lengths(data).tolist() == [2, 1, 3]
    with pytest.raises(UnsupportedSettingError, match="max_token_len_per_gpu must be set"):
        torch_impl.prepare_micro_batches(data)


def _gathers(fields: int, parts: int) -> int:
    b = 64
    lengths = [(i * 7) % 11 for i in range(b)]
    td = TensorDict(
        {f"f{k}": jagged(torch.arange(float(sum(lengths))), lengths) for k in range(fields)}, batch_size=[b]
    )
    partitions = [list(range(i, b, parts)) for i in range(parts)]
    with CountOps() as counter:
        torch_impl.split(td, partitions)
    return counter.on_values["aten.index_select.default"]


def test_split_gathers_once_per_field_whatever_the_partitions() -> None:
    """One gather of each field's values, whatever the number of partitions (the int64 bookkeeping
    of row lengths and offsets is not counted)."""
    assert _gathers(3, 2) == _gathers(3, 16) == 3
    assert _gathers(1, 8) == 1


def _fields_on_shared_offsets() -> tuple[TensorDict, dict[str, torch.Tensor]]:
    """A TensorDict whose jagged fields ``a`` and ``b`` share one offsets tensor, ``c`` holds an equal
    copy of it, ``d`` has offsets of its own, ``e`` is dense; and each field alone."""
    lengths, others = [3, 0, 2, 4, 1], [1, 2, 0, 1, 5]
    offsets = torch.tensor([0, 3, 3, 5, 9, 10])
    n = int(offsets[-1])
    fields = {
        "a": torch_impl.from_packed(torch.arange(float(n)), lengths),
        "d": jagged(torch.arange(100.0, 100.0 + sum(others)), others),
        "e": torch.arange(10.0).reshape(5, 2),
    }
    shared = fields["a"].offsets()
    fields["b"] = torch.nested.nested_tensor_from_jagged(-torch.arange(float(n)), shared)
    fields["c"] = torch.nested.nested_tensor_from_jagged(torch.arange(float(n)) * 2, offsets.clone())
    return TensorDict(dict(fields), batch_size=[5]), fields


def _plans(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the gather plans made (`torch_impl._jagged.plan_gather` as `torch_impl._ops` calls it)."""
    made: list[int] = []
    plan = torch_impl._ops.plan_gather

    def counted(*args: object, **kwargs: object) -> object:
        made.append(1)
        return plan(*args, **kwargs)

    monkeypatch.setattr(torch_impl._ops, "plan_gather", counted)
    return made


def test_fields_on_one_offsets_tensor_or_equal_ones_are_planned_once_and_each_keeps_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """take and split of a TensorDict plan once a call for each offsets tensor (``a`` and ``b``), and once for
    offsets equal on the CPU (``c``): two plans (``d`` has its own), where each field alone makes one.
    Every field's result is the one it has taken alone: values, offsets, cached sizes, and offsets of
    its own (a tensor no other field's result holds, as each trainer's own functions make them)."""
    from ref._torch_private import metadata_cache

    td, fields = _fields_on_shared_offsets()
    made = _plans(monkeypatch)
    rows, parts = [4, 0, 0, 2], [[3, 0], [4, 1, 2]]
    taken = torch_impl.take(td, rows)
    pieces = torch_impl.split(td, parts)
    assert len(made) == 2 + 2
    made.clear()
    for key, x in fields.items():
        alone = torch_impl.take(x, rows)
        assert_same(taken[key], alone)
        for got, want in zip((mb[key] for mb in pieces), torch_impl.split(x, parts), strict=True):
            assert_same(got, want)
            if got.is_nested:
                assert {k: v.shape for k, v in metadata_cache(got).items()} == {
                    k: v.shape for k, v in metadata_cache(want).items()
                }
        if x.is_nested:
            assert {k: v.shape for k, v in metadata_cache(taken[key]).items()} == {
                k: v.shape for k, v in metadata_cache(alone).items()
            }
    assert len(made) == 2 * 4  # alone: each jagged field's own plan, for take and for split
    jagged_keys = ["a", "b", "c", "d"]
    held = [taken[k].offsets() for k in jagged_keys] + [mb[k].offsets() for mb in pieces for k in jagged_keys]
    assert len({t.untyped_storage().data_ptr() for t in held}) == len(held)


def test_a_field_whose_values_do_not_fill_a_shared_offsets_tensor_still_raises_naming_it() -> None:
    """A field on another's offsets tensor but with fewer values is planned, and checked, on its own."""
    from ref.errors import InvalidJaggedError
    from torch_impl._jagged import njt

    td, fields = _fields_on_shared_offsets()
    short = njt(torch.zeros(int(fields["a"].offsets()[-1]) - 1), fields["a"].offsets())
    td = TensorDict({**fields, "short": short}, batch_size=[5])
    with pytest.raises(InvalidJaggedError, match="'short'"):
        torch_impl.split(td, [[0, 1], [2, 3, 4]])
    with pytest.raises(InvalidJaggedError, match="'short'"):
        torch_impl.take(td, [1, 0])


def test_split_and_take_carry_the_gradient_of_every_value() -> None:
    """Pieces built over gathered values keep autograd: each value receives exactly its gradient."""
    leaf = torch.randn(10, requires_grad=True)
    x = torch_impl.from_packed(leaf, [3, 0, 2, 4, 1])
    weights = torch.randn(10)
    pieces = torch_impl.split(x, [[3, 0], [4, 1, 2]])
    taken = torch_impl.take(x, [4, 0, 2])
    flat = torch.cat([p.values() for p in pieces])
    order = torch.tensor([5, 6, 7, 8, 0, 1, 2, 9, 3, 4])  # the split's values in micro-batch order
    (flat * weights).sum().backward()
    assert torch.equal(leaf.grad, torch.empty(10).index_copy_(0, order, weights))
    leaf.grad = None
    taken.values().sum().backward()
    assert torch.equal(leaf.grad, torch.tensor([1.0, 1, 1, 1, 1, 0, 0, 0, 0, 1]))


@pytest.mark.parametrize("op", ["take", "split"])
def test_off_the_cpu_each_field_on_a_shared_plan_is_counted_as_trusted(op: str) -> None:
    """Offsets off the CPU are trusted, and each field's counted (``skipped_device_offsets``), whether its
    plan is its own or its offsets tensor's."""
    offsets = torch.tensor([0, 2, 2, 6], device="meta")
    fields = {
        k: torch.nested.nested_tensor_from_jagged(torch.zeros(6, device="meta"), offsets) for k in "abc"
    }
    td = TensorDict(fields, batch_size=[3])
    torch_impl.witness_stats(reset=True)
    if op == "take":
        torch_impl.take(td, [2, 0, 1])
    else:
        with pytest.raises(UnsupportedSettingError, match="meta"):  # a piece's size needs the lengths
            torch_impl.split(td, [[2], [0, 1]])
    assert torch_impl.witness_stats()["skipped_device_offsets"] == (3 if op == "take" else 0)
