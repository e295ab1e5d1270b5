"""The one helper for the Markdown tables the kit and the ``rebatch`` tool write into docs/
(`property_tests.peer_report`, `rebatch.bench`): pure Python."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

__all__ = ["table"]

#: A column's rule: left-aligned (Markdown's default); ``"---:"`` right-aligns.
LEFT = "---"


def table(head: Sequence[str], rows: Iterable[Sequence[object]], *, rules: Sequence[str] = ()) -> list[str]:
    """A Markdown table's lines: ``head``, its rule (``rules``: each column's, default `LEFT`), then one
    line per row of ``rows``, each cell as ``str``."""
    rule = list(rules) or [LEFT] * len(head)
    if len(rule) != len(head):
        raise ValueError(f"{len(rule)} rules for {len(head)} columns")
    return [_line(head), "|" + "|".join(rule) + "|", *(_line([str(c) for c in row]) for row in rows)]


def _line(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"
