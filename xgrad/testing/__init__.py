"""``xgrad.testing``: gradient checks, invariants and hypothesis strategies for your own ops and Functions.

- ``gradcheck`` / ``gradgradcheck``: analytical gradients against float64 finite differences.
- ``assert_grads_match``: xgrad eager vs xgrad compiled vs ``jax`` on one function.
- ``xgrad.testing.invariants``: hook order and counts, ``grad`` vs ``backward``, compiled vs
  eager, ``retain_graph`` semantics, on any graph.
- ``xgrad.testing.strategies``: hypothesis strategies (``tensors``, ``shapes``, ``programs``, …)
  and ``harness_settings()``, the settings their tests need (no deadline for first-call compiles).
- ``xgrad.testing.op_specs``: the table of op specs the op tests are generated from.
"""

from xgrad.testing.compare import GradientMismatch, assert_grads_match
from xgrad.testing.finite_differences import GradcheckError, gradcheck, gradgradcheck

__all__ = ["GradcheckError", "GradientMismatch", "assert_grads_match", "gradcheck", "gradgradcheck"]
