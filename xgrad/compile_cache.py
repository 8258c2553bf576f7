"""JAX's persistent compilation cache under a user cache directory: fast cold starts.

Eager xgrad runs every primitive as a small ``jax.jit`` program per shape (NOTE
[Jitted dispatch]); the first step of a model compiles each of them, which took
seconds. With JAX's persistent cache those programs are read back from disk in later
processes, so the first step costs tracing and a file read per primitive.

xgrad turns the cache on at import, unless the user configured JAX's cache already:
``XGRAD_COMPILATION_CACHE=0`` leaves it off, ``XGRAD_COMPILATION_CACHE=/some/dir``
puts it there; by default it lives in ``$XDG_CACHE_HOME/xgrad/jax`` (``~/.cache``).
"""

from __future__ import annotations

import logging
import os

import jax

__all__ = ["cache_dir", "setup"]

logger = logging.getLogger(__name__)
ENV = "XGRAD_COMPILATION_CACHE"


def cache_dir() -> str | None:
    """Where xgrad asks JAX to keep compiled programs (``None``: off)."""
    setting = os.environ.get(ENV)
    if setting is not None:
        return None if setting.strip() in ("", "0", "off", "false") else os.path.expanduser(setting)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "xgrad", "jax")


def setup() -> None:
    """Turn JAX's persistent compilation cache on (see the module docstring); called at import.

    >>> import xgrad.compile_cache as cc
    >>> cc.setup()  # idempotent; a cache the user configured is left as it is
    """
    if getattr(jax.config, "jax_compilation_cache_dir") is not None:  # noqa: B009 (not in the stubs)
        return
    path = cache_dir()
    if path is None:
        return
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:  # a read-only home: run without the cache
        logger.info("xgrad: no persistent compilation cache (%s)", exc)
        return
    jax.config.update("jax_compilation_cache_dir", path)
    # xgrad's programs are small: JAX's default skips those that compile in under 1 s.
    if getattr(jax.config, "jax_persistent_cache_min_compile_time_secs") == 1.0:  # noqa: B009
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
