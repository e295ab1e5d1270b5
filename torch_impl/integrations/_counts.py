"""``on`` mode's counters: what rebatch did in a trainer where it is in charge (no data moved, no sync).

`Counts.wrap` wraps each of rebatch's functions an ``on`` install puts in place and counts, per name:
``calls``, ``rows`` (host-side facts only: an index list's length, a tensor's shape; 0 without a rule, and
0 where the rule raises: counted under ``caught`` as ``rows of NAME``, logged once),
``keys_witnessed`` (this thread's count of the alignment witness, `torch_impl._alignment.keys_witnessed_here`)
and ``errors`` (`ref.errors.RebatchError`, re-raised unchanged). `Counts.stats` has a shadow report's
shape (``mode`` ``"on"``; ``sampled``, ``differences``, ``defects`` 0), written when ``report`` is set at a
name's 1st, 2nd, 4th, 8th, ... call, at each error and at exit (`_files.Counters`).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from ref.errors import RebatchError

from .._alignment import keys_witnessed_here
from ._files import Counters

__all__ = ["FIELDS", "Counts", "Rows", "rows_of_partitions"]

#: The counters of each name.
FIELDS = ("calls", "rows", "keys_witnessed", "errors")
#: Shadow's counters, always 0 in ``on`` mode (so every report has the same fields).
_SHADOW_ONLY = ("sampled", "differences", "defects")

#: How many rows a call has, from its arguments (host-side facts only).
Rows = Callable[..., int]


def rows_of_partitions(partitions: Any) -> int:
    """The rows of a list of partitions (index lists or 1-D tensors): the sum of their lengths."""
    return sum(len(p) for p in partitions)


class Counts(Counters):
    """The counters of one ``on`` install of ``trainer`` (release ``version``); ``report``: a JSON file."""

    def wrap(self, name: str, fn: Callable[..., Any], rows: Rows | None = None) -> Callable[..., Any]:
        """``fn``, counted under ``name``; ``rows(*args, **kwargs)`` the rows of a call."""

        @functools.wraps(fn)
        def counted(*args: Any, **kwargs: Any) -> Any:
            before = keys_witnessed_here()
            try:
                result = fn(*args, **kwargs)
            except RebatchError:
                self._count(name, args, kwargs, rows, before, error=True)
                raise
            self._count(name, args, kwargs, rows, before, error=False)
            return result

        return counted

    def _count(
        self, name: str, args: Any, kwargs: Any, rows: Rows | None, before: int, *, error: bool
    ) -> None:
        n = 0
        if rows is not None:
            try:
                n = int(rows(*args, **kwargs))
            except (
                Exception
            ) as err:  # an input too broken to count its rows: counted; said once unless refused
                refused = " (a refused call)" if error else ""
                self._said(
                    f"rows of {name}{refused}", f"cannot count the rows of a call of {name}", err, quiet=error
                )
        with self.lock:
            c = self.by_name.setdefault(name, dict.fromkeys(FIELDS, 0))
            c["calls"] += 1
            c["rows"] += n
            c["keys_witnessed"] += keys_witnessed_here() - before
            c["errors"] += error
            calls = c["calls"]
        if self.file is not None and (
            error or int(calls) & (int(calls) - 1) == 0
        ):  # an error, or a power of two
            self.write_report()

    def write_report(self) -> None:
        try:
            super().write_report()
        except Exception as err:  # a report that cannot be written never breaks the run: counted, said once
            self._said("report", f"cannot write the on-mode report {self.report}", err)

    def _said(self, reason: str, what: str, err: Exception, *, quiet: bool = False) -> None:
        """``err`` caught for ``reason``: counted (`caught`), said once unless ``quiet`` (the call's error
        says it)."""
        if self.caught(reason) and not quiet:
            logging.getLogger("rebatch").warning(
                f"rebatch: {self.trainer}: {what}: {type(err).__name__}: {err}"
            )

    def stats(self, json_path: str | None = None) -> dict[str, Any]:
        """Totals over every name and ``"by_name"`` (each: `FIELDS`, and shadow's counters at 0), with
        ``trainer``, ``version``, ``mode`` (``"on"``), ``witness`` and ``process``; also written to
        ``json_path`` when given."""
        with self.lock:
            by_name: dict[str, dict[str, Any]] = {
                name: {**c, **dict.fromkeys(_SHADOW_ONLY, 0)} for name, c in self.by_name.items()
            }
        total: dict[str, Any] = {f: sum(c[f] for c in by_name.values()) for f in (*FIELDS, *_SHADOW_ONLY)}
        total["by_name"] = by_name
        return self.finished(total, json_path, mode="on")
