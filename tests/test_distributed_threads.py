"""The many-rank workers with threads as ranks (torch's threaded process group): the same checks as
`test_distributed.py` runs in processes over gloo, in seconds. The first stage of the many-rank
mutation session (`.ci/mutation/torch_impl_distributed.toml`)."""

from __future__ import annotations

import pytest

from property_tests import dist_workers
from ref import errors
from torch_impl._agree import Failure, raise_first_failure


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


class _OutsideError(errors.OutputMismatchError):
    """A `RebatchError` subclass defined outside ``ref.errors`` (a caller's own)."""


@pytest.mark.parametrize(
    ("failure", "me", "raised", "message"),
    [
        (Failure("KeyMismatchError", True, "key 'x'"), 0, errors.KeyMismatchError, "rank 1: key 'x'"),
        (Failure("_OutsideError", True, "custom"), 1, errors.RebatchError, "rank 1: custom"),
        (Failure("where", True, "not a class"), 0, errors.RebatchError, "rank 1: not a class"),
        (Failure("KeyError", False, "'x'"), 0, errors.RankFailedError, "rank 1 failed: KeyError: 'x'"),
    ],
)
def test_a_failure_is_raised_as_its_nearest_known_class(failure, me, raised, message) -> None:
    """The verdict from the gathered statuses (rank 1 failed): a `RebatchError` of ``ref.errors`` as
    itself, any other `RebatchError` (or a name that is not a class there) as `RebatchError`, a foreign
    error as `RankFailedError` on the other ranks; the failing rank re-raises its own exception."""
    with pytest.raises(raised, match=f"^{message}$") as info:
        raise_first_failure([None, failure], None, me)
    assert type(info.value) is raised
    own = _OutsideError("mine")
    with pytest.raises(_OutsideError if not failure.rebatch else raised) as info:
        raise_first_failure([None, failure], own, 1)  # rank 1's own failure
    if failure.rebatch:
        assert info.value.__cause__ is own
    else:
        assert info.value is own
    with pytest.raises(raised) as info:
        raise_first_failure([None, failure, failure], own, 2)  # rank 2 failed too, after rank 1
    assert info.value.__cause__ is None
    raise_first_failure([None, None], None, 0)  # no failure: returns
