"""``BoundedCache``: the one size-bounded cache xgrad's memo tables use."""

from __future__ import annotations

from typing import Any, TypeVar

K = TypeVar("K")
V = TypeVar("V")

__all__ = ["BoundedCache"]


class BoundedCache(dict[K, V]):
    """A dict of at most ``maxsize`` entries: adding one more drops the oldest.

    Reads are plain dict reads (these caches sit on hot paths); only an insertion pays
    for the bound.

    >>> cache = BoundedCache(2)
    >>> cache["a"], cache["b"], cache["c"] = 1, 2, 3
    >>> list(cache), cache.setdefault("d", 4), list(cache)
    (['b', 'c'], 4, ['c', 'd'])
    """

    __slots__ = ("maxsize",)

    def __init__(self, maxsize: int) -> None:
        super().__init__()
        self.maxsize = maxsize

    def __setitem__(self, key: K, value: V) -> None:
        if key not in self:
            while len(self) >= max(self.maxsize, 1):
                del self[next(iter(self))]
        super().__setitem__(key, value)

    def setdefault(self, key: K, default: Any = None) -> V:
        if key not in self:
            self[key] = default
        return self[key]
