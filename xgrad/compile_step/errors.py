"""The errors and warnings of ``xgrad.compile``, and their texts."""

from __future__ import annotations

from xgrad.engine.compiled.switch import RecompileWarning

__all__ = ["HOOK_KEPT", "CompileFallbackError", "CompileFallbackWarning", "CompileSideEffectWarning", "RecompileWarning"]

WARN_FALLBACK = (
    "xgrad.compile ran {name} eagerly: {reason} (at {site}). The results are the same, without the speed; "
    "use fallback='error' to make this an error. (Warned once per line.)"
)
ERR_FALLBACK = "xgrad.compile cannot compile {name}: {reason} (at {site}). Use fallback='eager' to run such calls eagerly."
WARN_RECOMPILE = (
    "xgrad.compile recompiled {name} {count} times; the last change: {reason}. Keep shapes, dtypes, shardings and "
    "the state fn touches fixed between calls, or pad inputs to a few sizes."
)
WARN_REBINDS = (
    "xgrad.compile: {name} rebinds the {kind} variable {var!r} at {site}; plain Python in a compiled function runs "
    "when it is traced (the first call of each signature), not at every call, as under jax.jit. Keep such state in a "
    "Tensor, return it, or run the function eagerly."
)
HOOK_KEPT = (
    "a hook registered inside the function stays on a tensor or node that outlives the call (eager adds one more every "
    "call, and they pile up); register it once outside the function, or remove its handle inside it"
)

MODULE_FORWARD_HOOKS = (
    "{module} has forward hooks or forward pre-hooks, which eager runs at every call and a compiled step only when it "
    "is traced; mark them xgrad.autograd.compiled.pure_hook if they are traceable and have no effects of their own"
)

MODULE_ATTRIBUTE_TRACED = (
    "{name} was set to a tensor the function computed, Python state a program cannot write back (it would hold a "
    "value of the trace); return the tensor from the function instead"
)

UNPRINTED = (
    "Python needs a concrete value here: the text of a tensor ({construct}) went somewhere other than print(), "
    "which prints it at every call; print it, or return the tensor and use its text after the call"
)


class CompileFallbackWarning(UserWarning):
    """A call of an ``xgrad.compile`` function ran eagerly (the warning says why and where)."""


class CompileSideEffectWarning(UserWarning):
    """A compiled function's own code rebinds a global or closed-over variable: that runs at trace time only."""


class CompileFallbackError(RuntimeError):
    """Raised instead of running eagerly under ``xgrad.compile(fn, fallback="error")``."""


class NotCompilable(Exception):
    """Why a call cannot be compiled, and the user's line: it runs eagerly, or raises under ``fallback="error"``."""

    def __init__(self, reason: str, site: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.site = site

