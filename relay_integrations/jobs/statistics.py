"""The one percentile and median of the project (``relaygen bench``, the benchmarks)::

    percentile([1, 2, 3, 4], 0.9)   # 3.7: linear between the closest ranks (numpy's default)
    median([])                      # nan: nothing measured

Both take any sequence of numbers; neither needs numpy.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def percentile(values: Sequence[float], fraction: float) -> float:
    """The `fraction` (0 to 1) quantile, linearly interpolated between the closest ranks
    (numpy's default); one value is itself, none is nan."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    position = (len(ordered) - 1) * fraction
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def median(values: Sequence[float]) -> float:
    """The median; nan when there is nothing to take it of."""
    return statistics.median(values) if values else math.nan
