"""JAX's persistent compilation cache for xgrad's programs, on request: faster cold starts.

Eager xgrad runs every primitive as a small ``jax.jit`` program per shape (NOTE
[Jitted dispatch]); the first step of a model compiles each of them. With JAX's
persistent cache those programs are read back from disk in later processes, so the
first step costs tracing and a file read per primitive.

JAX's cache is one setting for the whole process, so ``import xgrad`` leaves it alone:
the cache is on only when asked for, by ``xgrad.enable_compilation_cache()`` or by the
environment variable ``XGRAD_COMPILATION_CACHE`` read at import (``1`` for the default
directory ``$XDG_CACHE_HOME/xgrad/jax``, i.e. ``~/.cache/xgrad/jax``; a path for
another directory; unset, empty or ``0`` for off). A cache the user configured in JAX
already is never changed.
"""

from __future__ import annotations

import logging
import os

import jax

from xgrad.jax_internals import reset_compilation_cache

__all__ = ["ENV", "cache_dir", "default_cache_dir", "enable_compilation_cache", "setup"]

logger = logging.getLogger(__name__)
ENV = "XGRAD_COMPILATION_CACHE"
_OFF = ("", "0", "off", "false", "no")
_ON = ("1", "on", "true", "yes")


def default_cache_dir() -> str:
    """``$XDG_CACHE_HOME/xgrad/jax`` (``~/.cache/xgrad/jax``).

    >>> import os, xgrad.compile_cache as cc
    >>> cc.default_cache_dir().endswith(os.path.join("xgrad", "jax"))
    True
    """
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "xgrad", "jax")


def cache_dir() -> str | None:
    """The directory ``XGRAD_COMPILATION_CACHE`` asks for (``None``: unset or off).

    >>> import os, xgrad.compile_cache as cc
    >>> saved = os.environ.get(cc.ENV)
    >>> os.environ[cc.ENV] = "1"
    >>> cc.cache_dir() == cc.default_cache_dir()
    True
    >>> os.environ[cc.ENV] = "0"
    >>> cc.cache_dir() is None
    True
    >>> _ = os.environ.pop(cc.ENV) if saved is None else os.environ.update({cc.ENV: saved})
    """
    setting = os.environ.get(ENV, "").strip()
    if setting.lower() in _OFF:
        return None
    if setting.lower() in _ON:
        return default_cache_dir()
    return os.path.expanduser(setting)


def enable_compilation_cache(path: str | None = None) -> str | None:
    """Turn JAX's persistent compilation cache on, for xgrad's programs and all others.

    Later processes then read the small per-primitive programs of eager xgrad (and the
    programs of ``backward(compiled=True)`` and ``xgrad.compile``) back from disk instead
    of compiling them: the first step of a model takes a fraction of the time. The
    setting is JAX's and process-wide; a cache directory the user already gave JAX is
    kept as it is.

    Args:
        path: the directory (default: ``$XDG_CACHE_HOME/xgrad/jax``, i.e.
            ``~/.cache/xgrad/jax``).

    Returns:
        The directory JAX now caches in, or ``None`` when it cannot be created (a
        read-only home): xgrad then runs without the cache.

    >>> import xgrad
    >>> xgrad.enable_compilation_cache()  # doctest: +SKIP
    '/home/me/.cache/xgrad/jax'
    """
    configured = getattr(jax.config, "jax_compilation_cache_dir")  # noqa: B009 (not in the stubs)
    if configured is not None:
        return str(configured)
    path = os.path.expanduser(path) if path is not None else default_cache_dir()
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        logger.info("xgrad: no persistent compilation cache (%s)", exc)
        return None
    jax.config.update("jax_compilation_cache_dir", path)
    # xgrad's programs are small: JAX's default skips those that compile in under 1 s.
    if getattr(jax.config, "jax_persistent_cache_min_compile_time_secs") == 1.0:  # noqa: B009
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    # JAX decides once, at the first compile, whether the cache is used: make it look again.
    reset_compilation_cache()
    return path


def setup() -> None:
    """At import: enable the cache only when ``XGRAD_COMPILATION_CACHE`` asks for it.

    >>> import xgrad.compile_cache as cc
    >>> cc.setup()  # with the variable unset, JAX's configuration is not touched
    """
    path = cache_dir()
    if path is not None:
        enable_compilation_cache(path)
