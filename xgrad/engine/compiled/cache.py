"""The bounded program cache, its counters, and why a call site recompiled (in words)."""

from __future__ import annotations

import collections
import os
import sys
import threading
import warnings
from typing import Any

from xgrad.engine.compiled.key import FIELDS, K_ACC, K_FUNC, K_PRIM, K_ROOT, TOP_FIELDS
from xgrad.engine.compiled.switch import WARN_RECOMPILE, RecompileWarning

DEFAULT_CACHE_SIZE = 256
#: Misses at one call site beyond this many warn once, naming what changed in the key.
RECOMPILE_WARNING_LIMIT = 8
_XGRAD_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class _Stats:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.clear()

    def clear(self) -> None:
        self.hits = 0
        self.misses = 0
        self.compiles = 0
        self.traces = 0
        self.compile_seconds = 0.0
        self.fallbacks: collections.Counter[str] = collections.Counter()
        self.recompile_reasons: collections.deque[str] = collections.deque(maxlen=16)
        self.sites: dict[str, tuple[int, Any]] = {}
        self.warned_sites: set[str] = set()

    def add(self, name: str, amount: Any = 1) -> None:
        with self.lock:
            setattr(self, name, getattr(self, name) + amount)


counters = _Stats()
programs: collections.OrderedDict[CacheKey, Any] = collections.OrderedDict()
_cache_lock = threading.Lock()
_cache_size = DEFAULT_CACHE_SIZE
warned_reasons: set[str] = set()


def stats() -> dict[str, Any]:
    """Counters of the compiled backward since the last ``reset``.

    Keys: ``hits``, ``misses``, ``compiles`` (segments compiled), ``traces`` (times
    the backward rules were traced), ``fallbacks`` (a dict: reason kind → count),
    ``compile_seconds``, ``cache_size`` and ``recompile_reasons`` (latest last).

    >>> import xgrad
    >>> xgrad.autograd.compiled.reset()
    >>> x = xgrad.tensor([1.0], requires_grad=True)
    >>> for _ in range(2):
    ...     x.grad = None  # a leaf with or without a .grad is a different structure
    ...     (x * 2).sum().backward(compiled=True)
    >>> s = xgrad.autograd.compiled.stats(); (s["misses"], s["hits"])
    (1, 1)
    """
    with counters.lock:
        return {
            "hits": counters.hits,
            "misses": counters.misses,
            "compiles": counters.compiles,
            "traces": counters.traces,
            "fallbacks": dict(counters.fallbacks),
            "compile_seconds": counters.compile_seconds,
            "cache_size": len(programs),
            "recompile_reasons": list(counters.recompile_reasons),
        }


def reset() -> None:
    """Empty the program cache and zero the statistics (one-time warnings warn again).

    >>> import xgrad
    >>> xgrad.autograd.compiled.reset(); xgrad.autograd.compiled.stats()["cache_size"]
    0
    """
    with _cache_lock:
        programs.clear()
        counters.clear()
        warned_reasons.clear()


def set_cache_size(size: int) -> None:
    """Bound the number of cached programs (least recently used go first; default 256).

    >>> import xgrad
    >>> xgrad.autograd.compiled.set_cache_size(64); xgrad.autograd.compiled.set_cache_size(256)
    """
    global _cache_size
    if int(size) < 1:
        raise ValueError(f"cache size must be at least 1, got {size}")
    with _cache_lock:
        _cache_size = int(size)
        while len(programs) > _cache_size:
            programs.popitem(last=False)


class CacheKey:
    """A structural key with its hash computed once.

    Tuples do not cache their hash, and a key has a few entries per node: a lookup
    would hash it twice (``get``, ``move_to_end``) and compare it twice. Once equal to
    the cached key, this one adopts the cached tuple, so the second comparison is by
    identity.
    """

    __slots__ = ("hash", "value")

    def __init__(self, value: tuple[Any, ...]) -> None:
        self.value = value
        self.hash = hash(value)

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other: object) -> bool:
        if type(other) is not CacheKey or other.hash != self.hash:
            return False
        if other.value is self.value:
            return True
        if other.value != self.value:
            return False
        self.value = other.value
        return True


def lookup(key: CacheKey) -> Any:
    entry = programs.get(key)
    if entry is not None:
        try:
            programs.move_to_end(key)
        except KeyError:  # evicted by another thread just now; the entry still works
            pass
    return entry


def insert(key: CacheKey, entry: Any) -> Any:
    with _cache_lock:
        entry = programs.setdefault(key, entry)
        programs.move_to_end(key)
        while len(programs) > _cache_size:
            programs.popitem(last=False)
    return entry


# -- the walk: order, structural key, flat saved arrays ------------------------------



# -- recompile reasons ---------------------------------------------------------------


def call_site() -> str:
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_XGRAD_DIR):
        frame = frame.f_back  # type: ignore[assignment]
    return "<unknown>" if frame is None else f"{frame.f_code.co_filename}:{frame.f_lineno}"


def _node_label(nkey: Any) -> str:
    kind = nkey[0]
    if kind == K_PRIM:
        return nkey[1].node_name
    if kind == K_FUNC:
        return f"{nkey[1].__name__}Backward"
    return {K_ACC: "AccumulateGrad", K_ROOT: "GraphRoot"}.get(kind, "a captured node")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def describe_change(old: Any, new: Any) -> str:
    """What differs between two structural keys, in words (the "recompile reason")."""
    for i, field in enumerate(TOP_FIELDS):
        if old[i] != new[i]:
            return f"{field} changed from {old[i]!r} to {new[i]!r}"
    before, after = old[4], new[4]
    for pos, (a, b) in enumerate(zip(before, after)):  # noqa: B905  (lengths may differ)
        if a == b:
            continue
        label = _node_label(b)
        if a[0] != b[0]:
            return f"node {pos} is now {label}, was {_node_label(a)}"
        for field, x, y in zip(FIELDS[b[0]], a, b):  # noqa: B905
            if x != y:
                return f"node {pos} ({label}): {field} changed from {_short(x)} to {_short(y)}"
    if len(before) != len(after):
        return f"the graph has {len(after)} nodes, was {len(before)}"
    return "the same structure as before: its program was evicted from the cache (see set_cache_size)"


def note_miss(site: str, key: Any) -> None:
    with counters.lock:
        counters.misses += 1
        previous = counters.sites.get(site)
        count = 1 if previous is None else previous[0] + 1
        counters.sites[site] = (count, key)
        if previous is None:
            return
        reason = describe_change(previous[1], key)
        counters.recompile_reasons.append(reason)
        warn = count - 1 > RECOMPILE_WARNING_LIMIT and site not in counters.warned_sites
        if warn:
            counters.warned_sites.add(site)
    if warn:
        warnings.warn(WARN_RECOMPILE.format(count=count - 1, site=site, reason=reason), RecompileWarning, stacklevel=4)


