"""``xgrad.autograd.compiled``: run backwards as cached ``jax.jit`` programs.

See NOTE [Compiled backward] in ``xgrad/engine/compiled/__init__.py`` for how it works.

On a cache hit the backward rules of xgrad's ops and everything marked ``pure_hook``
(hooks, a custom ``Function.backward``) do not run in Python: as under ``jax.jit``,
their bodies run only when traced. Hooks not marked pure and custom Function
backwards run on the host at their point, on every call, exactly as in eager.

A long backward (more than ``CHUNK_THRESHOLD`` steps between host hooks, 1024; in
``xgrad.engine.compiled.program``) is compiled in chunks of at most ``CHUNK_STEPS`` (256),
each cached by its own structure, so chunks that repeat (the links of a chain, a deep
model's identical blocks) compile once: ``stats()`` counts ``chunk_compiles`` and
``chunk_reuses``. Each chunk is one more call on a cache hit.

>>> import xgrad
>>> w = xgrad.tensor([1.0, 2.0], requires_grad=True)
>>> with xgrad.autograd.compiled.enable():
...     (w * w).sum().backward()
>>> w.grad.tolist()
[2.0, 4.0]
"""

from xgrad.engine.compiled.cache import DEFAULT_CACHE_SIZE, RECOMPILE_WARNING_LIMIT, reset, set_cache_size, stats
from xgrad.engine.compiled.switch import (
    CompiledFallbackError,
    CompiledFallbackWarning,
    HostHook,
    PureHook,
    RecompileWarning,
    enable,
    host_hook,
    is_enabled,
    pure_hook,
    set_enabled,
)

__all__ = [
    "DEFAULT_CACHE_SIZE", "RECOMPILE_WARNING_LIMIT", "CompiledFallbackError", "CompiledFallbackWarning", "HostHook",
    "PureHook", "RecompileWarning", "enable", "host_hook", "is_enabled", "pure_hook", "reset", "set_cache_size",
    "set_enabled", "stats",
]
