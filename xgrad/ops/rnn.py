"""Recurrent layers as primitives: one direction of one layer is one op, a ``jax.lax.scan`` over time.

# NOTE [Recurrent scans]
# Unrolled as xgrad ops, a layer over T steps records T × (a dozen) nodes, and its eager
# backward dispatches each of them. As one primitive it records one node: the forward is a
# jitted ``jax.lax.scan`` (the input projection of every step done before it as one
# matmul), and the rule is one jitted call, ``jax.vjp`` of that scan, made a ``from_jax``
# op so that its own gradient (``create_graph=True``) is ``jax.vjp`` of the rule. The rule
# recomputes the forward's hidden states rather than saving them (the primitive saves only
# its inputs), as the attention primitive recomputes its probabilities. Gates are in
# PyTorch's order (i, f, g, o for the LSTM; r, z, n for the GRU), so its weights load.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from xgrad.ops.jaxop import from_jax
from xgrad.ops.registry import defprim
from xgrad.tensor import Tensor

__all__ = ["RECURRENT_MODES", "lstm_scan", "recurrent_scan"]

#: The cells ``recurrent_scan`` runs (``lstm_scan`` runs the LSTM, which carries a cell state too).
RECURRENT_MODES = ("rnn_tanh", "rnn_relu", "gru")


def _affine(x: Any, w: Any, b: Any) -> Any:
    y = jnp.matmul(x, w.T)
    return y if b is None else y + b


def _recurrent_step(mode: str, h: Any, x_proj: Any, w_hh: Any, b_hh: Any) -> Any:
    """The next hidden state from ``h`` and the step's input projection ``W_ih x + b_ih``."""
    h_proj = _affine(h, w_hh, b_hh)
    if mode == "gru":
        x_r, x_z, x_n = jnp.split(x_proj, 3, axis=-1)
        h_r, h_z, h_n = jnp.split(h_proj, 3, axis=-1)
        r = jax.nn.sigmoid(x_r + h_r)
        z = jax.nn.sigmoid(x_z + h_z)
        n = jnp.tanh(x_n + r * h_n)
        return (1 - z) * n + z * h
    pre = x_proj + h_proj
    return jnp.tanh(pre) if mode == "rnn_tanh" else jax.nn.relu(pre)


def _recurrent_scan_impl(x: Any, h0: Any, w_ih: Any, w_hh: Any, b_ih: Any, b_hh: Any, *, mode: str, reverse: bool) -> Any:
    def step(h: Any, x_proj: Any) -> tuple[Any, Any]:
        h = _recurrent_step(mode, h, x_proj, w_hh, b_hh)
        return h, h

    _, hs = jax.lax.scan(step, h0, _affine(x, w_ih, b_ih), reverse=reverse)
    return hs


def _lstm_scan_impl(x: Any, h0: Any, c0: Any, w_ih: Any, w_hh: Any, b_ih: Any, b_hh: Any, w_hr: Any, *, reverse: bool) -> Any:
    def step(carry: tuple[Any, Any], x_proj: Any) -> tuple[tuple[Any, Any], Any]:
        h, c = carry
        i, f, g, o = jnp.split(x_proj + _affine(h, w_hh, b_hh), 4, axis=-1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        if w_hr is not None:  # PyTorch's proj_size: the hidden state projected to fewer features
            h = jnp.matmul(h, w_hr.T)
        return (h, c), h

    (_, c_n), hs = jax.lax.scan(step, (h0, c0), _affine(x, w_ih, b_ih), reverse=reverse)
    return hs, c_n


def _recurrent_scan_backward_impl(g: Any, *inputs: Any, mode: str, reverse: bool) -> Any:
    _, pullback = jax.vjp(lambda *a: _recurrent_scan_impl(*a, mode=mode, reverse=reverse), *inputs)
    return pullback(g)


def _lstm_scan_backward_impl(g_hs: Any, g_c: Any, *inputs: Any, reverse: bool) -> Any:
    _, pullback = jax.vjp(lambda *a: _lstm_scan_impl(*a, reverse=reverse), *inputs)
    return pullback((g_hs, g_c))


# Each rule is one op: the scan's vjp in one jitted call (NOTE [Recurrent scans]).
_recurrent_scan_backward = from_jax(_recurrent_scan_backward_impl, name="recurrent_scan_backward")
_lstm_scan_backward = from_jax(_lstm_scan_backward_impl, name="lstm_scan_backward")


def _recurrent_scan_grad(g: Tensor, out: Any, *inputs: Any, mode: str, reverse: bool) -> tuple[Any, ...]:
    return tuple(_recurrent_scan_backward(g, *inputs, mode=mode, reverse=reverse))


def _lstm_scan_grad(g: tuple[Tensor, Tensor], out: Any, *inputs: Any, reverse: bool) -> tuple[Any, ...]:
    return tuple(_lstm_scan_backward(*g, *inputs, reverse=reverse))


recurrent_scan = defprim("recurrent_scan", _recurrent_scan_impl, joint_vjp=_recurrent_scan_grad, doc="""\
One direction of one Elman RNN (``mode="rnn_tanh"`` or ``"rnn_relu"``) or GRU (``mode="gru"``) layer.

    ``recurrent_scan(x, h0, w_ih, w_hh, b_ih, b_hh, mode=..., reverse=...)`` with ``x`` of shape
    ``(T, B, input_size)``, ``h0`` of ``(B, hidden_size)`` and PyTorch's weight layout (biases may
    be ``None``) returns the hidden states ``(T, B, hidden_size)``; ``reverse=True`` runs from the
    last step to the first, each state at its step's position.

    >>> import xgrad
    >>> from xgrad.ops.rnn import recurrent_scan
    >>> w_ih, w_hh = xgrad.ones(2, 1) * 0.5, xgrad.zeros(2, 2)
    >>> recurrent_scan(xgrad.zeros(3, 1, 1), xgrad.zeros(1, 2), w_ih, w_hh, None, None, mode="rnn_relu", reverse=False).shape
    (3, 1, 2)
    """)

lstm_scan = defprim("lstm_scan", _lstm_scan_impl, joint_vjp=_lstm_scan_grad, num_outputs=2, doc="""\
One direction of one LSTM layer: ``(hidden states, last cell state)``.

    ``lstm_scan(x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, reverse=...)`` with ``x`` of shape
    ``(T, B, input_size)``, ``h0`` and ``c0`` of ``(B, hidden_size)`` and PyTorch's weight layout
    (gates i, f, g, o; biases may be ``None``); ``w_hr``, PyTorch's ``weight_hr`` of shape
    ``(proj_size, hidden_size)`` or ``None``, projects each hidden state (``h0`` then has
    ``proj_size`` features, and so does ``w_hh``'s second dim).

    >>> import xgrad
    >>> from xgrad.ops.rnn import lstm_scan
    >>> hs, c = lstm_scan(xgrad.ones(3, 1, 1), xgrad.zeros(1, 2), xgrad.zeros(1, 2), xgrad.ones(8, 1), xgrad.zeros(8, 2),
    ...                   None, None, None, reverse=False)
    >>> hs.shape, c.shape
    ((3, 1, 2), (1, 2))
    """)
