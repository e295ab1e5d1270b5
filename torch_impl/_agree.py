"""Ranks agree on success before they exchange data: a failure on any rank reaches every rank at once.

Each distributed helper does its local work (checks, packing) first, catching what it raises; then one
object collective carries, from every rank, either its payload (a skeleton, a count) or its error
(class name and message). If any rank failed, every rank raises, so none blocks in a later collective
until the process group's timeout: a `RebatchError` with its own class and the message
``"rank r: ..."``, anything else as `RankFailedError` on the other ranks (the failing rank re-raises
its own exception). Every rank computes the same verdict from the same gathered list.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch.distributed as dist

from ref import errors

__all__ = ["Failure", "agree", "raise_first_failure"]


class Failure(NamedTuple):
    """A rank's error, as it travels: its class name, whether it is a `RebatchError`, its message."""

    name: str
    rebatch: bool
    message: str


def _failure(err: BaseException) -> Failure:
    return Failure(type(err).__name__, isinstance(err, errors.RebatchError), str(err))


def raise_first_failure(statuses: list[Any], own: BaseException | None, me: int) -> None:
    """If any status is a `Failure`, raise on this rank (``me``, whose own exception is ``own``)."""
    failed = [(r, s) for r, s in enumerate(statuses) if isinstance(s, Failure)]
    if not failed:
        return
    r, f = failed[0]
    if f.rebatch:
        cls = getattr(errors, f.name, None)
        if not (isinstance(cls, type) and issubclass(cls, errors.RebatchError)):
            cls = errors.RebatchError  # a subclass defined outside ref.errors: its nearest known class
        raise cls(f"rank {r}: {f.message}") from (own if r == me else None)
    if r == me and own is not None:
        raise own
    raise errors.RankFailedError(f"rank {r} failed: {f.name}: {f.message}")


def agree(local: Any, own: BaseException | None, group: Any = None) -> list[Any]:
    """Every rank's ``local`` payload (in group rank order), after checking that no rank failed.

    ``own``: the exception this rank's local work raised (then its payload is ignored), or None.
    One ``all_gather_object``.
    """
    world = dist.get_world_size(group)
    statuses: list[Any] = [None] * world
    dist.all_gather_object(statuses, _failure(own) if own is not None else local, group=group)
    raise_first_failure(statuses, own, dist.get_rank(group))
    return statuses
