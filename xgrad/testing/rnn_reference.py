"""PyTorch's documented recurrent equations, step by step in ``jnp``: the reference for the recurrent ops.

A Python loop over time with each gate written out as in ``torch.nn.RNN``, ``LSTM`` and
``GRU``'s documentation, independent of ``jax.lax.scan`` and of the primitives' code
(``xgrad/ops/rnn.py``); differentiable with ``jax.grad``.

>>> import jax.numpy as jnp
>>> hs = reference_recurrent(jnp.ones((2, 1, 1)), jnp.zeros((1, 1)), jnp.ones((1, 1)), jnp.ones((1, 1)),
...                          mode="rnn_relu", reverse=False)
>>> hs.ravel().tolist()
[1.0, 2.0]
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["reference_lstm", "reference_recurrent"]


def _linear(x: Any, w: Any, b: Any) -> Any:
    return x @ w.T + (0.0 if b is None else b)


def _gates(w: Any, b: Any, count: int) -> list[tuple[Any, Any]]:
    """``w``, ``b`` cut into ``count`` gates' rows (``W_ir, W_iz, W_in`` from ``weight_ih``)."""
    rows = w.shape[0] // count
    return [(w[k * rows : (k + 1) * rows], None if b is None else b[k * rows : (k + 1) * rows]) for k in range(count)]


def _steps(length: int, reverse: bool) -> range:
    return range(length - 1, -1, -1) if reverse else range(length)


def reference_recurrent(x: Any, h0: Any, w_ih: Any, w_hh: Any, b_ih: Any = None, b_hh: Any = None, *, mode: str,
                        reverse: bool) -> Any:
    """Hidden states (T, B, H) of one Elman (``"rnn_tanh"``, ``"rnn_relu"``) or GRU (``"gru"``) layer direction."""
    h = h0
    hs: list[Any] = [None] * x.shape[0]
    for t in _steps(x.shape[0], reverse):
        if mode == "gru":
            (w_ir, b_ir), (w_iz, b_iz), (w_in, b_in) = _gates(w_ih, b_ih, 3)
            (w_hr, b_hr), (w_hz, b_hz), (w_hn, b_hn) = _gates(w_hh, b_hh, 3)
            r = jax.nn.sigmoid(_linear(x[t], w_ir, b_ir) + _linear(h, w_hr, b_hr))
            z = jax.nn.sigmoid(_linear(x[t], w_iz, b_iz) + _linear(h, w_hz, b_hz))
            n = jnp.tanh(_linear(x[t], w_in, b_in) + r * _linear(h, w_hn, b_hn))
            h = (1 - z) * n + z * h
        else:
            pre = _linear(x[t], w_ih, b_ih) + _linear(h, w_hh, b_hh)
            h = jnp.tanh(pre) if mode == "rnn_tanh" else jnp.maximum(pre, 0.0)
        hs[t] = h
    return jnp.stack(hs)


def reference_lstm(x: Any, h0: Any, c0: Any, w_ih: Any, w_hh: Any, b_ih: Any = None, b_hh: Any = None, w_hr: Any = None,
                   *, reverse: bool) -> tuple[Any, Any]:
    """Hidden states (T, B, H) and last cell state (B, H) of one LSTM layer direction (gates i, f, g, o).

    With ``w_hr`` (``proj_size``), each hidden state is ``W_hr h``, of ``proj_size`` features.
    """
    (w_ii, b_ii), (w_if, b_if), (w_ig, b_ig), (w_io, b_io) = _gates(w_ih, b_ih, 4)
    (w_hi, b_hi), (w_hf, b_hf), (w_hg, b_hg), (w_ho, b_ho) = _gates(w_hh, b_hh, 4)
    h, c = h0, c0
    hs: list[Any] = [None] * x.shape[0]
    for t in _steps(x.shape[0], reverse):
        i = jax.nn.sigmoid(_linear(x[t], w_ii, b_ii) + _linear(h, w_hi, b_hi))
        f = jax.nn.sigmoid(_linear(x[t], w_if, b_if) + _linear(h, w_hf, b_hf))
        g = jnp.tanh(_linear(x[t], w_ig, b_ig) + _linear(h, w_hg, b_hg))
        o = jax.nn.sigmoid(_linear(x[t], w_io, b_io) + _linear(h, w_ho, b_ho))
        c = f * c + i * g
        h = o * jnp.tanh(c)
        if w_hr is not None:
            h = h @ w_hr.T
        hs[t] = h
    return jnp.stack(hs), c
