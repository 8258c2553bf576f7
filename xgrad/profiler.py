"""Backward profiler: per-node wall times as a table and as a Chrome/Perfetto trace.

``xgrad.autograd.profile()`` installs the engine's node timer (NOTE [Profiler hook]
in engine.py) for as long as it is open; every node any thread runs in that time
becomes one ``Event``, as the reference engine's ``RECORD_FUNCTION`` around each
``evaluate_function`` does. Code outside the engine (the compiled backward, a user's
own phases) adds spans with ``record`` or ``span``; both cost one list check when no
profiler is open.

Each node and ``span`` is also a ``jax.profiler.TraceAnnotation``: open
``xgrad.autograd.profile()`` inside a ``jax.profiler.trace(log_dir)`` and the XLA trace
(TensorBoard, Perfetto) shows xgrad's backward nodes above the kernels they launched.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import jax

from xgrad.engine import engine

__all__ = ["Event", "is_active", "profile", "record", "span"]

SORT_KEYS = ("total", "calls", "mean", "max", "name")


class Event(NamedTuple):
    """One timed span: ``start``/``end`` in ``time.perf_counter()`` seconds.

    ``thread_id`` is the OS thread id (``threading.get_native_id()``): small, stable for
    the thread's life, and the id ``jax.profiler`` traces use for the same thread.
    """

    name: str
    start: float
    end: float
    thread_id: int
    thread_name: str
    args: dict[str, Any]

    @property
    def duration(self) -> float:
        return self.end - self.start


_active: list[profile] = []  # open profilers; each receives every event
_active_lock = threading.Lock()


def is_active() -> bool:
    """Whether a profiler is open (callers may skip building span arguments when not)."""
    return bool(_active)


def record(name: str, start: float, end: float, **args: Any) -> None:
    """Add a span that ran from ``start`` to ``end`` (``time.perf_counter()`` seconds) on this thread.

    Args:
        name: what ran; the table groups spans by name.
        start, end: the span's bounds.
        args: extra fields shown in the trace viewer (shapes, cache hit, phase…).

    >>> import time, xgrad
    >>> with xgrad.autograd.profile() as prof:
    ...     t0 = time.perf_counter()
    ...     xgrad.profiler.record("load data", t0, t0 + 0.5, batch=3)
    >>> [e.name for e in prof.events], prof.events[0].args
    (['load data'], {'batch': 3})
    """
    if not _active:
        return
    thread = threading.current_thread()
    event = Event(name, start, end, threading.get_native_id(), thread.name, args)
    for prof in tuple(_active):
        prof.events.append(event)


@contextmanager
def span(name: str, **args: Any) -> Iterator[None]:
    """Context manager: ``record`` the time its body takes.

    >>> import xgrad
    >>> with xgrad.autograd.profile() as prof:
    ...     with xgrad.profiler.span("compile", nodes=4):
    ...         pass
    >>> prof.events[0].name
    'compile'
    """
    if not _active:
        yield
        return
    start = time.perf_counter()
    try:
        with jax.profiler.TraceAnnotation(name):
            yield
    finally:
        record(name, start, time.perf_counter(), **args)


def _block(outputs: list[Any]) -> None:
    arrays = [out._array for out in outputs if out is not None]
    if arrays:
        jax.block_until_ready(arrays)


def _time_node(call_function: Callable[..., list[Any]], graph_task: Any, fn: Any, inputs: list[Any]) -> list[Any]:
    """The engine's node timer while any profiler is open (NOTE [Profiler hook])."""
    name = fn.name()
    start = time.perf_counter()
    try:
        with jax.profiler.TraceAnnotation(name):
            outputs = call_function(graph_task, fn, inputs)
            if outputs and any(prof.sync for prof in tuple(_active)):
                _block(outputs)
    finally:
        device = fn.device()
        record(name, start, time.perf_counter(), sequence_nr=fn.sequence_nr, device=str(device) if device is not None else "cpu")
    return outputs


def _busy_seconds(events: list[Event]) -> float:
    """Time covered by at least one event, per thread, summed over threads.

    Spans nest (a user's ``span`` around a backward, a reentrant backward inside a node),
    so summing durations would count the nested time twice.
    """
    by_thread: dict[int, list[tuple[float, float]]] = {}
    for e in events:
        by_thread.setdefault(e.thread_id, []).append((e.start, e.end))
    busy = 0.0
    for intervals in by_thread.values():
        intervals.sort()
        run_start, run_end = intervals[0]
        for start, end in intervals[1:]:
            if start > run_end:
                busy += run_end - run_start
                run_start, run_end = start, end
            else:
                run_end = max(run_end, end)
        busy += run_end - run_start
    return busy


class Row(NamedTuple):
    """Aggregated times of all events with one name."""

    name: str
    calls: int
    total: float
    mean: float
    max: float


class profile:
    """Context manager: time every backward node run while it is open.

    Args:
        sync: wait for each node's output arrays before stopping its clock, so a time
            covers the device work and not only its dispatch (JAX runs asynchronously).
            ``False`` measures dispatch alone and perturbs the run less.

    Nodes on every thread are recorded: the caller's, each device worker's and the
    reentrant pool's. Profilers may nest; each sees every event.

    >>> import xgrad
    >>> x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    >>> with xgrad.autograd.profile() as prof:
    ...     (x.exp() * 3).sum().backward()
    >>> sorted(row.name for row in prof.key_averages())
    ['AccumulateGrad', 'ExpBackward', 'MulBackward', 'SumBackward']
    """

    def __init__(self, sync: bool = True) -> None:
        self.sync = sync
        self.events: list[Event] = []

    def __enter__(self) -> profile:
        with _active_lock:
            _active.append(self)
            engine.profile_node = _time_node  # one timer serves all open profilers: record() fans out
        return self

    def __exit__(self, *exc: object) -> None:
        with _active_lock:
            _active.remove(self)
            if not _active:
                engine.profile_node = None

    def key_averages(self) -> list[Row]:
        """One ``Row`` per event name, in first-seen order."""
        groups: dict[str, list[float]] = {}
        for event in self.events:
            groups.setdefault(event.name, []).append(event.duration)
        return [Row(name, len(d), sum(d), sum(d) / len(d), max(d)) for name, d in groups.items()]

    def table(self, sort_by: str = "total", row_limit: int | None = None) -> str:
        """The per-name times as a text table.

        Args:
            sort_by: ``"total"``, ``"calls"``, ``"mean"``, ``"max"`` (all descending)
                or ``"name"``.
            row_limit: show at most this many rows.

        "% of total" is a row's time over the time at least one event ran (per thread,
        summed over threads), so a span that encloses others reads 100%, not half.

        >>> import xgrad
        >>> x = xgrad.tensor([1.0], requires_grad=True)
        >>> with xgrad.autograd.profile() as prof:
        ...     x.tanh().sum().backward()
        >>> print(prof.table(sort_by="name"))  # doctest: +ELLIPSIS
        Name              Calls   Total (ms)   Mean (us)   Max (us)   % of total
        ------------------------------------------------------------------------
        AccumulateGrad        1 ...
        SumBackward           1 ...
        TanhBackward          1 ...
        """
        if sort_by not in SORT_KEYS:
            raise ValueError(f"sort_by must be one of {', '.join(SORT_KEYS)}; got {sort_by!r}")
        rows = self.key_averages()
        if sort_by == "name":
            rows.sort(key=lambda r: r.name)
        else:
            rows.sort(key=lambda r: getattr(r, sort_by), reverse=True)
        if row_limit is not None:
            rows = rows[:row_limit]
        grand_total = _busy_seconds(self.events) or 1.0
        width = max([len("Name"), *(len(r.name) for r in rows)]) + 2
        header = f"{'Name':<{width}}{'Calls':>7}{'Total (ms)':>13}{'Mean (us)':>12}{'Max (us)':>11}{'% of total':>13}"
        lines = [header, "-" * len(header)]
        for r in rows:
            lines.append(
                f"{r.name:<{width}}{r.calls:>7}{r.total * 1e3:>13.3f}{r.mean * 1e6:>12.1f}{r.max * 1e6:>11.1f}"
                f"{100 * r.total / grand_total:>12.1f}%"
            )
        return "\n".join(lines)

    def chrome_trace(self) -> dict[str, Any]:
        """The events in Chrome trace format (``chrome://tracing``, ui.perfetto.dev): one track per thread.

        Tracks are keyed by the OS thread id (32-bit, as Perfetto reads it) and named by
        ``thread_name`` metadata events.
        """
        origin = min((e.start for e in self.events), default=0.0)
        pid = os.getpid()
        trace: list[dict[str, Any]] = [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": "xgrad"}}]
        named: set[int] = set()
        for e in self.events:
            if e.thread_id not in named:
                named.add(e.thread_id)
                trace.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": e.thread_id, "args": {"name": e.thread_name}})
            trace.append({
                "name": e.name, "cat": "backward", "ph": "X", "pid": pid, "tid": e.thread_id,
                "ts": (e.start - origin) * 1e6, "dur": e.duration * 1e6, "args": e.args,
            })
        return {"traceEvents": trace, "displayTimeUnit": "ms"}

    def export_chrome_trace(self, path: str | os.PathLike[str]) -> None:
        """Write ``chrome_trace()`` as JSON to ``path`` (open it in Perfetto or ``chrome://tracing``)."""
        with open(path, "w") as f:
            json.dump(self.chrome_trace(), f, default=str)
