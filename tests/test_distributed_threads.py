"""The many-rank workers with threads as ranks (torch's threaded process group): the same checks as
`test_distributed.py` runs in processes over gloo, in seconds. The first stage of the many-rank
mutation session (`.ci/mutation/torch_impl_distributed.toml`)."""

from __future__ import annotations

import pytest

from property_tests import dist_workers


@pytest.mark.parametrize("world", [1, 2, 4])
def test_ranks_agree_in_threads(world: int) -> None:
    dist_workers.run_in_threads(dist_workers.check_rank, world)


def test_budget_and_rank_order_in_threads() -> None:
    dist_workers.run_in_threads(dist_workers.check_budget_and_rank_order, 3)


@pytest.mark.parametrize("world", [2, 3])
def test_an_error_on_one_rank_reaches_every_rank_in_threads(world: int) -> None:
    dist_workers.run_in_threads(dist_workers.ranks_agree_on_errors, world)


def test_a_failing_thread_rank_is_reported_not_hung() -> None:
    """The runner itself: a rank that raises before a collective releases the others and is reported."""
    with pytest.raises(RuntimeError, match="rank 1 failed on purpose"):
        dist_workers.run_in_threads(_fail_on_rank_1, 2, timeout_s=20)


def _fail_on_rank_1(rank: int, world: int, port: int) -> None:
    dist_workers.raise_on_one_rank(rank, world, port, 20.0)
