"""Initialisation: where layers' random parameters get their ``jax.random`` key."""

from __future__ import annotations

from typing import Any

import jax

from xgrad.creation import next_key

__all__ = ["prng_key"]


def prng_key(key: Any) -> jax.Array:
    """A ``jax.random`` key from a key, an int seed, or the default key when ``None``.

    >>> from xgrad.nn.init import prng_key
    >>> bool((jax.random.key_data(prng_key(0)) == jax.random.key_data(jax.random.key(0))).all())
    True
    """
    if key is None:
        return next_key()
    if isinstance(key, int):
        return jax.random.key(key)
    return key
