"""Shared helpers for the benchmarks: medians of many repeats, tables, the chain workload."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def median_seconds(fn: Callable[[], object], repeats: int = 30, warmup: int = 3) -> float:
    """Median wall time of ``fn()`` over ``repeats`` runs (after ``warmup`` runs)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def interleaved(timers: dict[str, Callable[[], float]], repeats: int, warmup: int = 3) -> dict[str, float]:
    """Median seconds of each timer (each returns the seconds it measured), taken in turns
    so that load on the shared machine hits them all alike."""
    times: dict[str, list[float]] = {name: [] for name in timers}
    for i in range(repeats + warmup):
        for name, timer in timers.items():
            seconds = timer()
            if i >= warmup:
                times[name].append(seconds)
    return {name: statistics.median(t) for name, t in times.items()}


def table(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> str:
    """A GitHub-markdown table."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) + " |"  # noqa: E731
    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])


def mul_chain(x: Any, n: int) -> Any:
    """The chain workload: ``n`` elementwise multiplies of a 1-element tensor, then a sum."""
    y = x
    for _ in range(n):
        y = y * 1.0001
    return y.sum()
