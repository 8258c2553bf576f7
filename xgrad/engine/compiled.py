"""Compiled backward: the switch (the lowering lives here once built)."""

from __future__ import annotations

import threading


class _CompiledState(threading.local):
    enabled = False


_state = _CompiledState()


def is_enabled() -> bool:
    return _state.enabled
