"""`FakeMetric`: a stand-in with the methods of verl's ``Metric`` (``init_list``, ``append``, ``extend``)."""

from __future__ import annotations

from typing import Any


class FakeMetric:
    """Values with an aggregation; appending a ``FakeMetric`` extends, as verl's ``Metric`` does."""

    def __init__(self, aggregation: str = "mean", value: Any = None) -> None:
        self.aggregation = aggregation
        self.values: list[Any] = [] if value is None else [value]

    def init_list(self) -> FakeMetric:
        return FakeMetric(self.aggregation)

    def append(self, value: Any) -> None:
        if isinstance(value, FakeMetric):
            self.extend(value)
        else:
            self.values.append(value)

    def extend(self, values: Any) -> None:
        self.values.extend(values.values if isinstance(values, FakeMetric) else values)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FakeMetric) and (self.aggregation, self.values) == (
            other.aggregation,
            other.values,
        )

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        return f"FakeMetric({self.aggregation!r}, {self.values!r})"
