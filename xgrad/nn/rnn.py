"""Recurrent layers: ``RNN``, ``LSTM``, ``GRU`` and their cells, with PyTorch's signatures and parameters.

Each direction of each layer runs as one primitive, a ``jax.lax.scan`` over time with one
backward rule (NOTE [Recurrent scans] in ``xgrad/ops/rnn.py``); a cell is the same
primitive over one step. Parameters are named and shaped as PyTorch names them
(``weight_ih_l0``, ``bias_hh_l1_reverse``; gates i, f, g, o for the LSTM and r, z, n for
the GRU), so a PyTorch state dict loads as it is.

>>> import xgrad
>>> lstm = xgrad.nn.LSTM(3, 4, num_layers=2, key=0)
>>> out, (h, c) = lstm(xgrad.ones(5, 2, 3))
>>> out.shape, h.shape, c.shape
((5, 2, 4), (2, 2, 4), (2, 2, 4))
"""

from __future__ import annotations

import math
import numbers
import warnings
from typing import Any

import jax
import jax.numpy as jnp

from xgrad import ops
from xgrad.generator import KeyState
from xgrad.nn.init import prng_key
from xgrad.nn.module import Module, Parameter
from xgrad.ops.rnn import lstm_scan, recurrent_scan
from xgrad.tensor import Tensor
from xgrad.tensor.dtypes import parameter_dtype, torch_dtype_name

__all__ = ["GRU", "LSTM", "RNN", "GRUCell", "LSTMCell", "RNNCell"]

_GATES = {"rnn_tanh": 1, "rnn_relu": 1, "lstm": 4, "gru": 3}
_NONLINEARITY_MODES = {"tanh": "rnn_tanh", "relu": "rnn_relu"}


def _nonlinearity_mode(nonlinearity: str) -> str:
    if nonlinearity not in _NONLINEARITY_MODES:
        raise ValueError(f"Unknown nonlinearity '{nonlinearity}'. Select from 'tanh' or 'relu'.")
    return _NONLINEARITY_MODES[nonlinearity]


def _uniform_parameters(owner: Module, shapes: dict[str, tuple[int, ...]], hidden_size: int, key: Any, dtype: Any) -> jax.Array:
    """Set ``shapes``' parameters on ``owner``, uniform in ±1/sqrt(hidden_size) as PyTorch's ``reset_parameters``.

    Returns one more key, split off with the parameters' keys, for the module's own randomness.
    """
    keys = jax.random.split(prng_key(key), len(shapes) + 1)
    bound = 1.0 / math.sqrt(hidden_size)
    for k, (name, shape) in zip(keys, shapes.items(), strict=False):
        setattr(owner, name, Parameter(jax.random.uniform(k, shape, dtype, -bound, bound)))
    return keys[-1]


def _run(mode: str, x: Tensor, h: Tensor, c: Tensor | None, weights: list[Tensor | None], reverse: bool) -> tuple[Tensor, Tensor | None]:
    """One direction of one layer on ``x`` of shape (T, B, input): (hidden states, last cell state or None)."""
    if mode == "lstm":
        return lstm_scan(x, h, c, *weights, reverse=reverse)
    return recurrent_scan(x, h, *weights, mode=mode, reverse=reverse), None


class RNNBase(Module):
    """What ``RNN``, ``LSTM`` and ``GRU`` share: the stacked, optionally bidirectional layers."""

    def __init__(
        self, mode: str, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
        batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False, proj_size: int = 0,
        *, key: Any = None, dtype: Any = None,
    ) -> None:
        dtype = parameter_dtype(dtype)
        if not isinstance(dropout, numbers.Number) or isinstance(dropout, bool) or not 0 <= dropout <= 1:
            raise ValueError(
                "dropout should be a number in range [0, 1] representing the probability of an element being zeroed"
            )
        if dropout > 0 and num_layers == 1:
            warnings.warn(
                "dropout option adds dropout after all but last recurrent layer, so non-zero dropout expects "
                f"num_layers greater than 1, but got dropout={dropout} and num_layers={num_layers}", stacklevel=3,
            )
        if not isinstance(hidden_size, int) or isinstance(hidden_size, bool):
            raise TypeError(f"hidden_size should be of type int, got: {type(hidden_size).__name__}")
        if hidden_size <= 0:
            raise ValueError("hidden_size must be greater than zero")
        if num_layers <= 0:
            raise ValueError("num_layers must be greater than zero")
        if proj_size < 0:
            raise ValueError("proj_size should be a positive integer or zero to disable projections")
        if proj_size >= hidden_size:
            raise ValueError("proj_size has to be smaller than hidden_size")
        self.mode = mode
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.bias, self.batch_first, self.dropout = bias, batch_first, float(dropout)
        self.bidirectional, self.proj_size = bidirectional, proj_size
        gate_size = _GATES[mode] * hidden_size
        directions = 2 if bidirectional else 1
        state_size = proj_size or hidden_size  # the hidden state's features, projected or not
        shapes: dict[str, tuple[int, ...]] = {}
        for layer in range(num_layers):
            layer_input = input_size if layer == 0 else state_size * directions
            for suffix in self._suffixes(layer):
                shapes[f"weight_ih{suffix}"] = (gate_size, layer_input)
                shapes[f"weight_hh{suffix}"] = (gate_size, state_size)
                if bias:
                    shapes[f"bias_ih{suffix}"] = (gate_size,)
                    shapes[f"bias_hh{suffix}"] = (gate_size,)
                if proj_size:
                    shapes[f"weight_hr{suffix}"] = (proj_size, hidden_size)
        dropout_key = _uniform_parameters(self, shapes, hidden_size, key, dtype)
        self._rng = KeyState(dropout_key)  # state of a compiled step (NOTE [Random state])

    def _suffixes(self, layer: int) -> list[str]:
        return [f"_l{layer}", f"_l{layer}_reverse"] if self.bidirectional else [f"_l{layer}"]

    def _layer_weights(self, suffix: str) -> list[Tensor | None]:
        names = ("weight_ih", "weight_hh", "bias_ih", "bias_hh") + (("weight_hr",) if self.mode == "lstm" else ())
        return [getattr(self, name + suffix, None) for name in names]  # None: no bias, no projection

    @property
    def all_weights(self) -> list[list[Tensor]]:
        """The parameters, one list per layer and direction, as PyTorch's ``all_weights``."""
        return [
            [w for w in self._layer_weights(suffix) if w is not None]
            for layer in range(self.num_layers) for suffix in self._suffixes(layer)
        ]

    def flatten_parameters(self) -> None:
        """Does nothing: kept so that PyTorch programs that call it run (each weight is one array already)."""

    def _check_input(self, x: Tensor) -> bool:
        """Check ``x``'s rank and width; whether it is batched."""
        if x.ndim not in (2, 3):
            raise ValueError(f"{type(self).__name__}: Expected input to be 2D or 3D, got {x.ndim}D tensor instead")
        if x.shape[-1] != self.input_size:
            raise RuntimeError(f"input.size(-1) must be equal to input_size. Expected {self.input_size}, got {x.shape[-1]}")
        weight = self.weight_ih_l0.dtype
        if x.dtype != weight:  # PyTorch's check: JAX would promote the weights silently
            raise ValueError(
                f"RNN input dtype ({x.dtype}) does not match weight dtype ({weight}). Convert input: "
                f"input.to({weight}), or convert model: model.to({x.dtype})"
            )
        return x.ndim == 3

    def _initial_state(self, hx: Tensor | None, batch: int, size: int, dtype: Any, which: str) -> list[Tensor]:
        """The initial state of each layer and direction, from ``hx`` of shape (D * num_layers, B, size), or zeros."""
        count = self.num_layers * (2 if self.bidirectional else 1)
        if hx is None:
            zeros = Tensor(jnp.zeros((batch, size), dtype))
            return [zeros] * count
        expected = (count, batch, size)
        if tuple(hx.shape) != expected:
            raise RuntimeError(f"Expected {which} size {expected}, got {list(hx.shape)}")
        return list(hx.unbind(0))

    def _layers(self, x: Tensor, h0: list[Tensor], c0: list[Tensor] | None) -> tuple[Tensor, list[Tensor], list[Tensor]]:
        """Run the stacked layers on ``x`` of shape (T, B, input): (output, last hidden states, last cell states)."""
        h_n: list[Tensor] = []
        c_n: list[Tensor] = []
        for layer in range(self.num_layers):
            if layer and self.training and self.dropout > 0:
                x = ops.dropout(x, self.dropout, key=self._rng.draw())
            outputs = []
            for direction, suffix in enumerate(self._suffixes(layer)):
                index = len(h_n)
                hs, c = _run(self.mode, x, h0[index], None if c0 is None else c0[index], self._layer_weights(suffix),
                             reverse=bool(direction))
                outputs.append(hs)
                h_n.append(hs[0] if direction else hs[-1])  # the reverse direction ends at the first step
                if c is not None:
                    c_n.append(c)
            x = outputs[0] if len(outputs) == 1 else ops.cat(outputs, dim=-1)
        return x, h_n, c_n

    def forward(self, input: Tensor, hx: Any = None) -> tuple[Tensor, Any]:
        batched = self._check_input(input)
        lstm = self.mode == "lstm"
        if not batched:
            input = input.unsqueeze(1)
            if hx is not None:
                _check_unbatched_state(hx, lstm)
                hx = (hx[0].unsqueeze(1), hx[1].unsqueeze(1)) if lstm else hx.unsqueeze(1)
        else:
            _check_batched_state(hx, lstm)
            if self.batch_first:
                input = input.transpose(0, 1)
        if input.shape[0] == 0:  # PyTorch's check (the scan would have no last step to return)
            raise RuntimeError("Expected sequence length to be larger than 0 in RNN")
        batch = input.shape[1]
        h0 = self._initial_state(hx[0] if lstm and hx is not None else hx, batch, self.proj_size or self.hidden_size,
                                 input.dtype, "hidden[0]" if lstm else "hidden")
        c0 = None
        if lstm:
            c0 = self._initial_state(None if hx is None else hx[1], batch, self.hidden_size, input.dtype, "hidden[1]")
        output, h_n, c_n = self._layers(input, h0, c0)
        if batched and self.batch_first:
            output = output.transpose(0, 1)
        h = ops.stack(h_n)
        state: Any = (h, ops.stack(c_n)) if lstm else h
        if not batched:
            output = output.squeeze(1)
            state = (state[0].squeeze(1), state[1].squeeze(1)) if lstm else state.squeeze(1)
        return output, state

    def extra_repr(self) -> str:
        text = f"{self.input_size}, {self.hidden_size}"
        if self.num_layers != 1:
            text += f", num_layers={self.num_layers}"
        if self.mode == "rnn_relu":
            text += ", nonlinearity='relu'"
        for name, default in (("bias", True), ("batch_first", False), ("dropout", 0.0), ("bidirectional", False),
                              ("proj_size", 0)):
            if getattr(self, name) != default:
                text += f", {name}={getattr(self, name)}"
        return text


def _check_unbatched_state(hx: Any, lstm: bool) -> None:
    if lstm:
        if hx[0].ndim != 2 or hx[1].ndim != 2:
            raise RuntimeError(
                f"For unbatched 2-D input, hx and cx should also be 2-D but got ({hx[0].ndim}-D, {hx[1].ndim}-D) tensors"
            )
    elif hx.ndim != 2:
        raise RuntimeError(f"For unbatched 2-D input, hx should also be 2-D but got {hx.ndim}-D tensor")


def _check_batched_state(hx: Any, lstm: bool) -> None:
    if hx is None:
        return
    if lstm:
        if hx[0].ndim != 3 or hx[1].ndim != 3:
            raise RuntimeError(
                f"For batched 3-D input, hx and cx should also be 3-D but got ({hx[0].ndim}-D, {hx[1].ndim}-D) tensors"
            )
    elif hx.ndim != 3:
        raise RuntimeError(f"For batched 3-D input, hx should also be 3-D but got {hx.ndim}-D tensor")


class RNN(RNNBase):
    """Elman RNN: ``h_t = tanh(W_ih x_t + b_ih + W_hh h_(t-1) + b_hh)`` (or ReLU), stacked and optionally bidirectional.

    ``forward(input, hx=None)`` returns ``(output, h_n)`` as PyTorch does: input ``(T, B, input_size)``
    (``(B, T, input_size)`` with ``batch_first=True``, or unbatched ``(T, input_size)``), ``hx`` and
    ``h_n`` of shape ``(D * num_layers, B, hidden_size)``, output ``(T, B, D * hidden_size)``.
    Dropout, when set, applies to each layer's output but the last, in training mode.

    Args:
        input_size, hidden_size, num_layers, nonlinearity, bias, batch_first, dropout, bidirectional:
            as in PyTorch.
        key: a ``jax.random`` key or int seed for the initialisation and the dropout.
        dtype: parameter dtype (``xgrad.get_default_dtype()``, float32 unless set, by default).

    >>> import xgrad
    >>> rnn = xgrad.nn.RNN(3, 4, bidirectional=True, key=0)
    >>> out, h = rnn(xgrad.ones(5, 2, 3))
    >>> out.shape, h.shape, sorted(rnn.state_dict())[:2]
    ((5, 2, 8), (2, 2, 4), ['bias_hh_l0', 'bias_hh_l0_reverse'])
    """

    def __init__(
        self, input_size: int, hidden_size: int, num_layers: int = 1, nonlinearity: str = "tanh", bias: bool = True,
        batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
        *, key: Any = None, dtype: Any = None,
    ) -> None:
        self.nonlinearity = nonlinearity
        super().__init__(_nonlinearity_mode(nonlinearity), input_size, hidden_size, num_layers, bias, batch_first,
                         dropout, bidirectional, key=key, dtype=dtype)


class LSTM(RNNBase):
    """LSTM with PyTorch's gates (i, f, g, o), stacked and optionally bidirectional.

    ``forward(input, hx=None)`` with ``hx = (h_0, c_0)`` returns ``(output, (h_n, c_n))``, shapes as
    ``RNN``'s. With ``proj_size > 0`` each hidden state is projected by ``weight_hr_l{k}`` of shape
    ``(proj_size, hidden_size)``: ``output``, ``h_0`` and ``h_n`` have ``proj_size`` features.

    >>> import xgrad
    >>> lstm = xgrad.nn.LSTM(3, 4, batch_first=True, key=0)
    >>> out, (h, c) = lstm(xgrad.ones(2, 5, 3))
    >>> out.shape, h.shape, lstm.weight_ih_l0.shape
    ((2, 5, 4), (1, 2, 4), (16, 3))
    """

    def __init__(
        self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True, batch_first: bool = False,
        dropout: float = 0.0, bidirectional: bool = False, proj_size: int = 0,
        *, key: Any = None, dtype: Any = None,
    ) -> None:
        super().__init__("lstm", input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                         proj_size, key=key, dtype=dtype)


class GRU(RNNBase):
    """GRU with PyTorch's gates (r, z, n; ``n = tanh(W_in x + b_in + r * (W_hn h + b_hn))``).

    ``forward(input, hx=None)`` returns ``(output, h_n)``, shapes as ``RNN``'s.

    >>> import xgrad
    >>> gru = xgrad.nn.GRU(3, 4, num_layers=2, key=0)
    >>> out, h = gru(xgrad.ones(5, 3))
    >>> out.shape, h.shape, gru.weight_hh_l1.shape
    ((5, 4), (2, 4), (12, 4))
    """

    def __init__(
        self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True, batch_first: bool = False,
        dropout: float = 0.0, bidirectional: bool = False, *, key: Any = None, dtype: Any = None,
    ) -> None:
        super().__init__("gru", input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                         key=key, dtype=dtype)


class RNNCellBase(Module):
    """What the cells share: parameters ``weight_ih``, ``weight_hh``, ``bias_ih``, ``bias_hh`` and one step."""

    def __init__(self, mode: str, input_size: int, hidden_size: int, bias: bool, key: Any, dtype: Any) -> None:
        dtype = parameter_dtype(dtype)
        self.mode = mode
        self.input_size, self.hidden_size, self.bias = input_size, hidden_size, bias
        gate_size = _GATES[mode] * hidden_size
        shapes: dict[str, tuple[int, ...]] = {"weight_ih": (gate_size, input_size), "weight_hh": (gate_size, hidden_size)}
        if bias:
            shapes.update(bias_ih=(gate_size,), bias_hh=(gate_size,))
        else:
            self.bias_ih = self.bias_hh = None
        _uniform_parameters(self, shapes, hidden_size, key, dtype)

    def _check_input(self, x: Tensor) -> bool:
        if x.ndim not in (1, 2):
            raise ValueError(f"{type(self).__name__}: Expected input to be 1D or 2D, got {x.ndim}D instead")
        if x.shape[-1] != self.input_size:
            raise RuntimeError(f"input has inconsistent input_size: got {x.shape[-1]} expected {self.input_size}")
        if x.dtype != self.weight_ih.dtype:  # PyTorch's matmul error: JAX would promote the weights silently
            raise RuntimeError(
                "mat1 and mat2 must have the same dtype, but got "
                f"{torch_dtype_name(x.dtype)} and {torch_dtype_name(self.weight_ih.dtype)}"
            )
        return x.ndim == 2

    def _state(self, hx: Tensor | None, x: Tensor, batched: bool, which: int | None = None) -> Tensor:
        """The state ``hx`` (``LSTMCell``'s ``hx[which]``) for the batch ``x`` (2-D: unbatched input is unsqueezed
        first), or zeros; PyTorch's messages (its C++ checks call the state ``hidden0``/``hidden1``)."""
        label, number = ("hidden", 0) if which is None else (f"hx[{which}]", which)
        if hx is None:
            return Tensor(jnp.zeros((x.shape[0], self.hidden_size), x.dtype))
        if hx.ndim not in (1, 2):
            raise ValueError(f"{type(self).__name__}: Expected {label} to be 1D or 2D, got {hx.ndim}D instead")
        if hx.ndim != (2 if batched else 1):
            raise RuntimeError(
                f"{type(self).__name__}: Expected {label} to be {2 if batched else 1}D for "
                f"{'batched 2D' if batched else 'unbatched 1D'} input, got {hx.ndim}D instead"
            )
        state = hx if batched else hx.unsqueeze(0)
        if state.shape[0] != x.shape[0]:
            raise RuntimeError(f"Input batch size {x.shape[0]} doesn't match hidden{number} batch size {state.shape[0]}")
        if state.shape[1] != self.hidden_size:
            raise RuntimeError(
                f"hidden{number} has inconsistent hidden_size: got {state.shape[1]}, expected {self.hidden_size}"
            )
        return state

    def _step(self, x: Tensor, h: Tensor) -> Tensor:
        """One RNN or GRU step on a batch: the scan primitive over a sequence of one."""
        weights = (self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh)
        return recurrent_scan(x.unsqueeze(0), h, *weights, mode=self.mode, reverse=False)[0]

    def extra_repr(self) -> str:
        text = f"{self.input_size}, {self.hidden_size}"
        if not self.bias:
            text += ", bias=False"
        if self.mode == "rnn_relu":
            text += ", nonlinearity='relu'"
        return text


class _HiddenStateCell(RNNCellBase):
    """A cell whose state is one hidden tensor (``RNNCell``, ``GRUCell``)."""

    def forward(self, input: Tensor, hx: Tensor | None = None) -> Tensor:
        """The new hidden state from ``input`` and ``hx`` (zeros when ``None``); unbatched in, unbatched out."""
        batched = self._check_input(input)
        x = input if batched else input.unsqueeze(0)
        h = self._step(x, self._state(hx, x, batched))
        return h if batched else h.squeeze(0)


class RNNCell(_HiddenStateCell):
    """One Elman RNN step: ``forward(input, hx=None)`` returns ``h'`` (``(B, hidden_size)``, or ``(hidden_size,)`` unbatched).

    >>> import xgrad
    >>> cell = xgrad.nn.RNNCell(3, 4, nonlinearity="relu", key=0)
    >>> cell(xgrad.ones(2, 3)).shape, cell(xgrad.ones(3)).shape
    ((2, 4), (4,))
    """

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, nonlinearity: str = "tanh",
                 *, key: Any = None, dtype: Any = None) -> None:
        self.nonlinearity = nonlinearity
        super().__init__(_nonlinearity_mode(nonlinearity), input_size, hidden_size, bias, key, dtype)


class GRUCell(_HiddenStateCell):
    """One GRU step (gates r, z, n as ``GRU``'s): ``forward(input, hx=None)`` returns ``h'``.

    >>> import xgrad
    >>> xgrad.nn.GRUCell(3, 4, key=0)(xgrad.ones(2, 3)).shape
    (2, 4)
    """

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, *, key: Any = None, dtype: Any = None) -> None:
        super().__init__("gru", input_size, hidden_size, bias, key, dtype)


class LSTMCell(RNNCellBase):
    """One LSTM step (gates i, f, g, o): ``forward(input, hx=None)`` with ``hx = (h, c)`` returns ``(h', c')``.

    >>> import xgrad
    >>> h, c = xgrad.nn.LSTMCell(3, 4, key=0)(xgrad.ones(2, 3))
    >>> h.shape, c.shape
    ((2, 4), (2, 4))
    """

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, *, key: Any = None, dtype: Any = None) -> None:
        super().__init__("lstm", input_size, hidden_size, bias, key, dtype)

    def forward(self, input: Tensor, hx: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
        batched = self._check_input(input)
        x = input if batched else input.unsqueeze(0)
        h0 = self._state(None if hx is None else hx[0], x, batched, 0)
        c0 = self._state(None if hx is None else hx[1], x, batched, 1)
        weights = (self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh)
        hs, c = lstm_scan(x.unsqueeze(0), h0, c0, *weights, None, reverse=False)
        h = hs[0]
        return (h, c) if batched else (h.squeeze(0), c.squeeze(0))
