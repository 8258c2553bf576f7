"""The bounded program cache, its counters, and why a call site recompiled (in words)."""

from __future__ import annotations

import collections
import inspect
import os
import threading
import warnings
from typing import Any

from xgrad.engine.compiled.key import FIELDS, HOST, K_ACC, K_FUNC, K_PRIM, K_ROOT, KEYED, TOP_FIELDS
from xgrad.engine.compiled.switch import WARN_RECOMPILE, RecompileWarning

DEFAULT_CACHE_SIZE = 256
#: Compiled chunks of long graphs kept for reuse (NOTE [Chunks] in program.py), least recently used go first.
CHUNK_CACHE_SIZE = 256
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
        self.chunk_compiles = 0
        self.chunk_reuses = 0
        self.compile_seconds = 0.0
        self.fallbacks: collections.Counter[str] = collections.Counter()
        self.recompile_reasons: collections.deque[str] = collections.deque(maxlen=16)
        self.sites: dict[str, tuple[int, Any]] = {}
        self.warned_sites: set[str] = set()
        self.warned_reasons: set[str] = set()  # fallback reasons warned of once (``__init__._fallback``)

    def add(self, name: str, amount: Any = 1) -> None:
        with self.lock:
            setattr(self, name, getattr(self, name) + amount)


counters = _Stats()
programs: collections.OrderedDict[CacheKey, Any] = collections.OrderedDict()
chunks: collections.OrderedDict[Any, Any] = collections.OrderedDict()  # a chunk's structure -> its traced program
_cache_lock = threading.Lock()
_cache_size = DEFAULT_CACHE_SIZE


def stats() -> dict[str, Any]:
    """Counters of the compiled backward since the last ``reset``.

    Keys: ``hits``, ``misses``, ``compiles`` (segments compiled), ``traces`` (times
    the backward rules were traced), ``fallbacks`` (a dict: reason kind → count),
    ``compile_seconds``, ``cache_size`` and ``recompile_reasons`` (latest last). A long
    graph is compiled in chunks, each cached by its own structure so a repeated chunk
    (the links of a chain, a deep model's identical blocks) compiles once:
    ``chunk_compiles`` counts the chunks traced and compiled (also in ``compiles``),
    ``chunk_reuses`` those that took an already compiled chunk, ``chunk_cache_size``
    the chunks kept.

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
            "chunk_compiles": counters.chunk_compiles,
            "chunk_reuses": counters.chunk_reuses,
            "compile_seconds": counters.compile_seconds,
            "cache_size": len(programs),
            "chunk_cache_size": len(chunks),
            "recompile_reasons": list(counters.recompile_reasons),
        }


def reset() -> None:
    """Empty the program and chunk caches and zero the statistics (one-time warnings warn again).

    >>> import xgrad
    >>> xgrad.autograd.compiled.reset(); xgrad.autograd.compiled.stats()["cache_size"]
    0
    """
    with _cache_lock:
        programs.clear()
        chunks.clear()
        counters.clear()


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


def lookup(key: Any, table: collections.OrderedDict[Any, Any] = programs) -> Any:
    """The entry cached under ``key`` in ``table`` (programs, or ``chunks``), or ``None``."""
    entry = table.get(key)
    if entry is not None:
        try:
            table.move_to_end(key)
        except KeyError:  # evicted by another thread just now; the entry still works
            pass
    return entry


def insert(key: Any, entry: Any, table: collections.OrderedDict[Any, Any] = programs) -> Any:
    """Cache ``entry`` under ``key`` unless another thread did first; return the cached one."""
    with _cache_lock:
        entry = table.setdefault(key, entry)
        table.move_to_end(key)
        size = _cache_size if table is programs else CHUNK_CACHE_SIZE
        while len(table) > size:
            table.popitem(last=False)
    return entry


# -- recompile reasons ---------------------------------------------------------------


def call_site() -> str:
    """``file:line`` of the innermost frame outside xgrad: the user's line, for messages."""
    frame = inspect.currentframe()
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


# Per key field (``FIELDS``), what its change means to a user: ``{node}`` is the node's
# name, ``{old}``/``{new}`` the values (``{kinds}``: the kinds of hook that changed).
_CHANGE_WORDS = {
    "primitive": "an op of the graph changed: {node} now, where {old} was",
    "params": "the arguments of {node} changed ({old} -> {new})",
    "output shapes/dtypes": "the shape or dtype of what {node} differentiates changed ({old} -> {new})",
    "saved values": "the shape, dtype or value of what {node} saved for backward changed ({old} -> {new})",
    "edges": "the graph is wired differently: {node} takes its inputs from other places",
    "hooks": "the hooks on {node} changed ({kinds} hooks; a hook not marked pure_hook counts by presence, a pure one by identity)",
    "exec_info": "which nodes inputs=/grad() need changed at {node}",
    "leaf shape/dtype/sharding": "a leaf's shape, dtype or sharding changed ({old} -> {new})",
    "leaf .grad": "a leaf's .grad changed between None and a tensor, or its shape/dtype ({old} -> {new}); "
                  "set .grad to None (zero_grad) at the same point every step",
    "Function": "a different custom Function is at {node}",
    "ctx attributes": "a non-tensor value stored on ctx for {node} changed ({old} -> {new}): "
                      "it is a constant of the traced program",
}


def _ctx_change(old: Any, new: Any) -> tuple[str, str]:
    """The first ctx attribute that differs between two ctx keys, as ``ctx.name = value`` texts."""
    before, after = dict(old[2]), dict(new[2])
    for name in (*after, *before):
        x, y = before.get(name), after.get(name)
        if x != y:
            # A constant is keyed as (type, value): show the value.
            show = lambda v: "unset" if v is None else repr(v[1] if len(v) == 2 and isinstance(v[0], type) else v)  # noqa: E731
            return f"ctx.{name} = {show(x)}", f"ctx.{name} = {show(y)}"
    return "materialize_grads/needs_input_grad " + repr(old[:2]), repr(new[:2])


def _hooks_change(old: Any, new: Any) -> str:
    """Which kinds of hook differ between two hooks keys (NOTE [Hooks in the key]), by their labels.

    A group keyed ``HOST`` does not say which of its kinds it has: then any of them may have changed.
    """
    labels: list[str] = []
    for i, kinds in enumerate(KEYED):
        a, b = (None if key is None else key[i] for key in (old, new))
        if a == b:
            continue
        if a is HOST or b is HOST:
            labels += [kind.label for kind in kinds]
            continue
        a, b = a or (None,) * len(kinds), b or (None,) * len(kinds)
        labels += [kind.label for kind, x, y in zip(kinds, a, b, strict=True) if x != y]
    return labels[0] if len(labels) == 1 else ", ".join(labels[:-1]) + " or " + labels[-1]


def describe_change(old: Any, new: Any) -> str:
    """What differs between two structural keys, in a user's words (the "recompile reason")."""
    for i, field in enumerate(TOP_FIELDS):
        if old[i] != new[i]:
            return f"{field} changed from {old[i]!r} to {new[i]!r}"
    before, after = old[4], new[4]
    for pos, (a, b) in enumerate(zip(before, after)):  # noqa: B905  (lengths may differ)
        if a == b:
            continue
        label = _node_label(b)
        if a[0] != b[0]:
            return (
                f"the graph's structure changed: the backward's node {pos} (in run order) is now {label}, "
                f"was {_node_label(a)}"
            )
        for field, x, y in zip(FIELDS[b[0]], a, b):  # noqa: B905
            if x != y:
                if field == "ctx attributes":
                    x, y = _ctx_change(x, y)
                    return _CHANGE_WORDS[field].format(node=label, old=x, new=y)
                if field == "hooks":
                    return _CHANGE_WORDS[field].format(node=label, kinds=_hooks_change(x, y))
                old_text = _node_label(a) if field == "primitive" else _short(x)
                return _CHANGE_WORDS[field].format(node=label, old=old_text, new=_short(y))
    if len(before) != len(after):
        return f"the graph's structure changed: it has {len(after)} nodes, was {len(before)}"
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
