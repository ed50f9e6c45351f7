"""Buckets of a series: their packed records, and exact merges (numpy, no database)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_BUCKETS = 2048  # stored per series; above charts.MAX_POINTS, so a read can always be served
COARSE = 4  # a second, coarser copy merges this many buckets into one


# Stored as little-endian records, one per bucket: ``buckets`` (and ``coarse``) hold what
# charts read, ``extremes`` the steps of each bucket's min and max (for the single-series
# API). Records, not columns, so that many series read together are one numpy array.
CHART_RECORD = np.dtype(
    [("last", "<i8"), ("count", "<i8"), ("total", "<f8"), ("low", "<f8"), ("high", "<f8")]
)
EXTREME_RECORD = np.dtype([("low_step", "<i8"), ("high_step", "<i8")])


@dataclass
class Buckets:
    """Buckets in step order. ``last`` is the highest step in each; ``low_step`` and
    ``high_step`` (absent on a chart read) where its min and max were reached."""

    last: np.ndarray
    count: np.ndarray
    total: np.ndarray
    low: np.ndarray
    high: np.ndarray
    low_step: np.ndarray | None = None
    high_step: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.last)

    @classmethod
    def of_points(cls, steps: np.ndarray, values: np.ndarray) -> Buckets:
        """Each point as a bucket of its own."""
        return cls(
            last=steps,
            count=np.ones(len(steps), dtype=np.int64),
            total=values,
            low=values,
            high=values,
            low_step=steps,
            high_step=steps,
        )

    def index(self, *, origin: int, width: int) -> np.ndarray:
        return (self.last - origin) // width

    def take(self, mask: np.ndarray) -> Buckets:
        return Buckets(
            *(None if a is None else a[mask] for a in self._arrays())  # type: ignore[arg-type]
        )

    def then(self, other: Buckets) -> Buckets:
        """These buckets followed by ``other`` (which starts after them)."""
        return Buckets(
            *(
                None if a is None or b is None else np.concatenate([a, b])
                for a, b in zip(self._arrays(), other._arrays(), strict=True)
            )  # type: ignore[arg-type]
        )

    def merge(self, labels: np.ndarray) -> Buckets:
        """Merge neighbouring buckets that share a label (labels never decrease)."""
        size = len(labels)
        if size == 0:
            return self
        starts = group_starts(labels)
        if len(starts) == size:
            return self
        ends = np.r_[starts[1:], size]
        low = np.minimum.reduceat(self.low, starts)
        high = np.maximum.reduceat(self.high, starts)
        merged = Buckets(
            last=self.last[ends - 1],
            count=np.add.reduceat(self.count, starts),
            total=np.add.reduceat(self.total, starts),
            low=low,
            high=high,
        )
        if self.low_step is not None and self.high_step is not None:
            lengths = ends - starts
            merged.low_step = self.low_step[_first_hit(self.low, low, lengths)]
            merged.high_step = self.high_step[_first_hit(self.high, high, lengths)]
        return merged

    def chart_only(self) -> Buckets:
        return Buckets(self.last, self.count, self.total, self.low, self.high)

    def pack(self) -> tuple[bytes, bytes]:
        chart = np.empty(len(self), dtype=CHART_RECORD)
        for name in CHART_RECORD.names or ():
            chart[name] = getattr(self, name)
        extremes = np.empty(len(self) if self.low_step is not None else 0, dtype=EXTREME_RECORD)
        if self.low_step is not None and self.high_step is not None:
            extremes["low_step"], extremes["high_step"] = self.low_step, self.high_step
        return chart.tobytes(), extremes.tobytes()

    @classmethod
    def unpack(
        cls, chart: bytes | memoryview, extremes: bytes | memoryview | None = None
    ) -> Buckets:
        return cls.of_records(
            np.frombuffer(chart, dtype=CHART_RECORD),
            None if extremes is None else np.frombuffer(extremes, dtype=EXTREME_RECORD),
        )

    @classmethod
    def of_records(cls, chart: np.ndarray, extremes: np.ndarray | None = None) -> Buckets:
        buckets = cls(*(chart[name] for name in CHART_RECORD.names or ()))
        if extremes is not None and len(extremes) == len(chart):
            buckets.low_step, buckets.high_step = extremes["low_step"], extremes["high_step"]
        return buckets

    def _arrays(self) -> tuple[np.ndarray | None, ...]:
        return (
            self.last,
            self.count,
            self.total,
            self.low,
            self.high,
            self.low_step,
            self.high_step,
        )


def group_starts(labels: np.ndarray) -> np.ndarray:
    """Where each run of equal labels starts."""
    if not len(labels):
        return np.zeros(0, dtype=np.int64)
    changes = np.flatnonzero(labels[1:] != labels[:-1]) + 1
    return np.concatenate([np.zeros(1, dtype=changes.dtype), changes])


def _first_hit(values: np.ndarray, group_values: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """For each group of ``lengths`` consecutive items, the position of its first item equal
    to the group's value (its min or max, so there always is one)."""
    hits = np.flatnonzero(values == np.repeat(group_values, lengths))
    groups = np.repeat(np.arange(len(lengths)), lengths)[hits]
    return hits[np.r_[True, groups[1:] != groups[:-1]]]


def width_for(span: int) -> int:
    """The smallest power of two that cuts ``span + 1`` steps into at most MAX_BUCKETS."""
    width = 1
    while span >= MAX_BUCKETS * width:
        width *= 2
    return width
