"""Paired ratios with a bootstrap confidence interval: the one statistic our GPU numbers use.

A benchmark that measures configurations A and B back to back in each repeat gets one ratio
A/B per repeat; drift between repeats (clocks, other tenants) cancels within a pair. We report
the median of those ratios, its 95 % confidence interval by a percentile bootstrap over the
pairs (resampling whole repeats), and the inter-quartile range as the spread of single pairs.
A verdict "faster"/"slower" is only supported when the interval excludes 1.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence


def paired_ratios(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """Per-repeat ratios a[i] / b[i]; both sequences must come from the same repeats."""
    if len(a) != len(b):
        raise ValueError(f"unpaired series: {len(a)} vs {len(b)} values")
    return [x / y for x, y in zip(a, b, strict=True)]


def bootstrap_median_ci(values: Sequence[float], level: float = 0.95, resamples: int = 4000,
                        seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the median (seeded: the same data gives the same CI)."""
    if len(values) < 2:
        raise ValueError("a confidence interval needs at least two pairs")
    rng = random.Random(seed)
    n = len(values)
    meds = sorted(statistics.median(rng.choices(values, k=n)) for _ in range(resamples))
    lo = meds[int((1 - level) / 2 * resamples)]
    hi = meds[min(resamples - 1, int((1 + level) / 2 * resamples))]
    return lo, hi


def verdict(lo: float, hi: float) -> str:
    """What the interval supports against parity (ratio 1)."""
    if lo > 1.0:
        return "faster"
    if hi < 1.0:
        return "slower"
    return "no difference shown"


def summarize_pairs(a: Sequence[float], b: Sequence[float]) -> dict:
    ratios = paired_ratios(a, b)
    q1, _, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (ratios[0],) * 3
    lo, hi = bootstrap_median_ci(ratios)
    return {"n": len(ratios), "median": statistics.median(ratios), "ci95": [lo, hi],
            "iqr": [q1, q3], "verdict": verdict(lo, hi)}
