"""Op families for random programs beyond the op table: ``nn.functional`` activations, the
losses, recurrent cells and chains of in-place ops (on a tensor or through a view).

# NOTE [Program namespaces]
# A program line is Python over a namespace ``np`` (``programs.py``). The op table's lines
# use names that ``xgrad`` and ``jax.numpy`` share (``np.exp``); these families also use
# ``np.nn.functional.<f>`` and a few helpers (``np.class_targets``, ``np.rnn_cell``,
# ``np.inplace``). ``namespace(np)`` resolves them: for ``xgrad``, the xgrad functions (the
# code under test); for ``jax.numpy`` (and NumPy), the references below, each written in
# ``jnp`` from PyTorch's documented formula, with PyTorch's choices at the kinks (``x > 0``
# or ``x >= 0``), so the gradients JAX takes of them are PyTorch's there too.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import xgrad
from xgrad.testing.op_specs import REAL, OpSpec
from xgrad.testing.rnn_reference import reference_lstm, reference_recurrent

__all__ = [
    "FAMILIES", "INPLACE_OPS", "KINKS", "SAVES_RESULT", "family_ops", "inplace_chain_raises", "namespace",
]

#: Input values drawn exactly where the families' functions have kinks or boundaries.
KINKS = (0.0, 0.5, -0.5, 1.0, -1.0, 3.0, -3.0)
IGNORE_INDEX = -100


# -- references (jnp) ------------------------------------------------------------------------
def _abs(x: Any) -> Any:
    # PyTorch's derivative of |x| is sign(x), 0 at 0 (JAX's is 1 there).
    return jnp.sign(x) * x


def _elu(x: Any, alpha: float = 1.0) -> Any:
    return jnp.where(x > 0, x, alpha * jnp.expm1(jnp.where(x > 0, 0.0, x)))


def _hardtanh(x: Any, lo: float = -1.0, hi: float = 1.0) -> Any:
    return jnp.where(x <= lo, lo, jnp.where(x >= hi, hi, x))


def _log_softmax(x: Any, dim: int = -1) -> Any:
    return jax.nn.log_softmax(x, axis=dim)


def _same_shapes(*arrays: Any) -> None:
    """PyTorch's losses here take operands of one shape (a broadcast warns): other draws are not programs."""
    if len({jnp.shape(a) for a in arrays}) != 1:
        raise ValueError("loss operands of different shapes")


def _pointwise_loss(pointwise: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    def loss(a: Any, b: Any) -> Any:
        _same_shapes(a, b)
        return jnp.mean(pointwise(a, b))

    return loss


def _huber(d: Any, delta: float) -> Any:
    return jnp.where(_abs(d) < delta, 0.5 * d**2, delta * (_abs(d) - 0.5 * delta))


def _kl_div(logq: Any, p: Any, reduction: str) -> Any:
    _same_shapes(logq, p)
    return jnp.sum(jax.scipy.special.xlogy(p, p) - p * logq) / logq.shape[0]


def _margin_ranking_loss(a: Any, b: Any, t: Any) -> Any:
    if not jnp.ndim(a) == jnp.ndim(b) == jnp.ndim(t):
        raise ValueError("margin_ranking_loss takes operands of one dimension")
    return jnp.mean(jnp.maximum(-t * (a - b), 0.0))


def _cross_entropy(x: Any, target: Any) -> Any:
    return _nll_loss(_log_softmax(x, 1), target)


def _nll_loss(logp: Any, target: Any) -> Any:
    kept = target != IGNORE_INDEX
    picked = jnp.take_along_axis(logp, jnp.where(kept, target, 0)[:, None], axis=1)[:, 0]
    return -jnp.sum(jnp.where(kept, picked, 0.0)) / jnp.sum(kept)


def _cosine_similarity(a: Any, b: Any, dim: int = 1, eps: float = 1e-8) -> Any:
    na = jnp.maximum(jnp.linalg.norm(a, axis=dim, keepdims=True), eps)
    nb = jnp.maximum(jnp.linalg.norm(b, axis=dim, keepdims=True), eps)
    return jnp.sum(a / na * (b / nb), axis=dim)


def _cosine_embedding_loss(a: Any, b: Any, target: Any) -> Any:
    _same_shapes(a, b)
    if jnp.ndim(a) != 2:
        raise ValueError("cosine_embedding_loss takes (N, D) operands")
    cos = jnp.sum(a * b, -1) / jnp.sqrt((jnp.sum(a * a, -1) + 1e-12) * (jnp.sum(b * b, -1) + 1e-12))
    return jnp.mean(jnp.where(target == 1, 1 - cos, jnp.maximum(cos, 0.0)))


def _layer_norm(x: Any, shape: Sequence[int], eps: float = 1e-5) -> Any:
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean((x - mean) ** 2, axis=-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + eps)


_SELU_ALPHA, _SELU_SCALE = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946

_REFERENCE_FUNCTIONAL = types.SimpleNamespace(
    elu=_elu,
    celu=lambda x, alpha=1.0: jnp.where(x > 0, x, alpha * jnp.expm1(jnp.where(x > 0, 0.0, x) / alpha)),
    selu=lambda x: _SELU_SCALE * _elu(x, _SELU_ALPHA),
    leaky_relu=lambda x, negative_slope=0.01: jnp.where(x > 0, x, negative_slope * x),
    hardtanh=_hardtanh,
    relu6=lambda x: _hardtanh(x, 0.0, 6.0),
    hardsigmoid=lambda x: jnp.where(x <= -3, 0.0, jnp.where(x >= 3, 1.0, x / 6 + 0.5)),
    hardswish=lambda x: jnp.where(x <= -3, 0.0, jnp.where(x >= 3, x, x * (x + 3) / 6)),
    threshold=lambda x, th, value: jnp.where(x > th, x, value),
    softshrink=lambda x, lambd=0.5: jnp.where(x > lambd, x - lambd, jnp.where(x < -lambd, x + lambd, 0.0)),
    hardshrink=lambda x, lambd=0.5: jnp.where((x >= -lambd) & (x <= lambd), 0.0, x),
    softsign=lambda x: x / (1 + _abs(x)),
    tanhshrink=lambda x: x - jnp.tanh(x),
    logsigmoid=jax.nn.log_sigmoid,
    softplus=lambda x: jnp.where(x > 20, x, jnp.log1p(jnp.exp(jnp.minimum(x, 20.0)))),
    gelu=lambda x: jax.nn.gelu(x, approximate=False),
    silu=jax.nn.silu,
    mish=lambda x: x * jnp.tanh(jax.nn.softplus(x)),
    softmax=lambda x, dim: jax.nn.softmax(x, axis=dim),
    log_softmax=_log_softmax,
    layer_norm=_layer_norm,
    mse_loss=_pointwise_loss(lambda a, b: (a - b) ** 2),
    l1_loss=_pointwise_loss(lambda a, b: _abs(a - b)),
    smooth_l1_loss=_pointwise_loss(lambda a, b: _huber(a - b, 1.0)),  # beta = 1: Huber's delta = 1
    huber_loss=lambda a, b, delta: _pointwise_loss(lambda a, b: _huber(a - b, delta))(a, b),
    binary_cross_entropy=_pointwise_loss(
        lambda p, t: -(t * jnp.maximum(jnp.log(p), -100.0) + (1 - t) * jnp.maximum(jnp.log1p(-p), -100.0))
    ),
    binary_cross_entropy_with_logits=_pointwise_loss(lambda x, t: (1 - t) * x + jax.nn.softplus(-x)),
    kl_div=_kl_div,
    cross_entropy=_cross_entropy,
    nll_loss=_nll_loss,
    cosine_similarity=_cosine_similarity,
    cosine_embedding_loss=_cosine_embedding_loss,
    margin_ranking_loss=_margin_ranking_loss,
)


# -- helpers, one implementation per namespace ------------------------------------------------
def _class_targets(shape: tuple[int, ...]) -> np.ndarray:
    """Class indices for ``(N, C)`` logits: ``i % C``, the last one ignored when there are three or more."""
    if len(shape) != 2:
        raise ValueError("class targets are for (N, C) logits")
    targets = np.arange(shape[0]) % shape[1]
    if shape[0] > 2:
        targets[-1] = IGNORE_INDEX
    return targets


def _signs(n: int) -> np.ndarray:
    return np.where(np.arange(n) % 3 == 1, -1.0, 1.0)


@functools.lru_cache(maxsize=32)
def _cell(mode: str, size: int, dtype: str) -> xgrad.nn.Module:
    """A cell of ``size`` inputs and hidden units with fixed weights (constants, not differentiated)."""
    kinds: dict[str, Callable[..., xgrad.nn.Module]] = {
        "tanh": xgrad.nn.RNNCell, "relu": functools.partial(xgrad.nn.RNNCell, nonlinearity="relu"),
        "gru": xgrad.nn.GRUCell, "lstm": xgrad.nn.LSTMCell,
    }
    with jax.ensure_compile_time_eval():  # first made inside a trace (eval_shape, compile): concrete all the same
        cell = kinds[mode](size, size, key=size, dtype=jnp.dtype(dtype))
    cell.requires_grad_(False)
    return cell


def _cell_weights(mode: str, x: Any) -> list[Any]:
    cell = _cell(mode, x.shape[-1], str(x.dtype))
    return [jnp.asarray(p.numpy()) for p in (cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh)]


def _batch_shape(shape: tuple[int, ...]) -> tuple[int, int]:
    """Operands of any (broadcast) shape go through a cell as rows ``(B, H)`` of their last dim."""
    return (1, 1) if not shape else (-1, shape[-1])


def _xgrad_rnn_cell(x: xgrad.Tensor, h: xgrad.Tensor, mode: str) -> xgrad.Tensor:
    shape = np.broadcast_shapes(x.shape, h.shape)
    x, h = x.broadcast_to(shape), h.broadcast_to(shape)
    x, h = x.reshape(_batch_shape(shape)), h.reshape(_batch_shape(shape))
    cell = _cell(mode, x.shape[-1], str(x.dtype))
    if mode == "lstm":  # the hidden state doubles as the cell state: both outputs reach the result
        h_new, c_new = cell(x, (h, h))
        return (h_new + c_new).reshape(shape)
    return cell(x, h).reshape(shape)


def _reference_rnn_cell(x: Any, h: Any, mode: str) -> Any:
    x, h = jnp.broadcast_arrays(x, h)
    shape = x.shape
    x, h = x.reshape(_batch_shape(shape)), h.reshape(_batch_shape(shape))
    weights = _cell_weights(mode, x)
    if mode == "lstm":
        hs, c = reference_lstm(x[None], h, h, *weights, reverse=False)
        return (hs[0] + c).reshape(shape)
    recurrent_mode = {"tanh": "rnn_tanh", "relu": "rnn_relu", "gru": "gru"}[mode]
    return reference_recurrent(x[None], h, *weights, mode=recurrent_mode, reverse=False)[0].reshape(shape)


#: In-place methods the chains draw from, with their out-of-place references.
INPLACE_OPS: dict[str, Callable[..., Any]] = {
    "add_": lambda x, c: x + c, "mul_": lambda x, c: x * c, "neg_": lambda x: -x, "exp_": jnp.exp, "tanh_": jnp.tanh,
    "sigmoid_": jax.nn.sigmoid, "relu_": jax.nn.relu,
}
#: The in-place ops whose PyTorch derivative reads ``result`` (derivatives.yaml): they save the
#: tensor itself, so a later in-place write to it (or to a view of it) raises at backward.
SAVES_RESULT = frozenset({"exp_", "tanh_", "sigmoid_", "relu_"})


def inplace_chain_raises(chain: Sequence[tuple[Any, ...]]) -> bool:
    """Whether PyTorch's backward through ``chain`` (applied in order to one tensor) raises."""
    names = [step[0] for step in chain]
    return any(name in SAVES_RESULT for name in names[:-1])


def _xgrad_inplace(v: xgrad.Tensor, chain: Sequence[tuple[Any, ...]], view: bool = False) -> xgrad.Tensor:
    t = v.clone()
    target = t.unsqueeze(0) if view else t  # through a view, the write reaches ``t``
    for name, *args in chain:
        getattr(target, name)(*args)
    return t


def _reference_inplace(v: Any, chain: Sequence[tuple[Any, ...]], view: bool = False) -> Any:
    for name, *args in chain:
        v = INPLACE_OPS[name](v, *args)
    return v


class _Namespace:
    """``base``'s names, with ``nn.functional`` and the helpers above (NOTE [Program namespaces])."""

    def __init__(self, base: Any, functional: Any, **helpers: Callable[..., Any]) -> None:
        self._base = base
        self.nn = types.SimpleNamespace(functional=functional)
        self.__dict__.update(helpers)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._base, name)


_XGRAD = _Namespace(
    xgrad, xgrad.nn.functional,
    class_targets=lambda x: xgrad.tensor(_class_targets(x.shape)),
    signs=lambda n: xgrad.tensor(_signs(n)),
    rnn_cell=_xgrad_rnn_cell,
    inplace=_xgrad_inplace,
)
_REFERENCE = _Namespace(
    jnp, _REFERENCE_FUNCTIONAL,
    sigmoid=jax.nn.sigmoid,
    abs=_abs,
    class_targets=lambda x: jnp.asarray(_class_targets(x.shape)),
    signs=lambda n: jnp.asarray(_signs(n)),
    rnn_cell=_reference_rnn_cell,
    inplace=_reference_inplace,
)


def namespace(np_: Any) -> Any:
    """The namespace a program line runs in: the families' names on top of ``np_`` (NOTE [Program namespaces])."""
    if np_ is xgrad:
        return _XGRAD
    if np_ is jnp or np_ is np:
        return _REFERENCE
    return np_


# -- the families ------------------------------------------------------------------------------
def _spec(name: str, expr: str, arity: int = 1, smooth: bool = False, second_order: bool = True) -> OpSpec:
    # ``op``/``ref``/``shapes`` serve the op table's own tests; programs use ``expr`` alone.
    return OpSpec(name, lambda *a: None, lambda *a: None, (), (REAL,) * arity, smooth=smooth,
                  second_order=second_order, expr=expr)


_F = "np.nn.functional."
FAMILIES: dict[str, tuple[OpSpec, ...]] = {
    "functional": (
        _spec("elu", _F + "elu({0}, 0.7)"),
        _spec("celu", _F + "celu({0}, 1.3)"),
        _spec("selu", _F + "selu({0})"),
        _spec("leaky_relu", _F + "leaky_relu({0}, 0.1)"),
        _spec("hardtanh", _F + "hardtanh({0}, -1.0, 0.5)"),
        _spec("relu6", _F + "relu6({0} * 3.0)"),
        _spec("hardsigmoid", _F + "hardsigmoid({0} * 3.0)", second_order=False),  # PyTorch has none
        _spec("hardswish", _F + "hardswish({0} * 3.0)"),
        _spec("threshold", _F + "threshold({0}, 0.5, -1.0)"),
        _spec("softshrink", _F + "softshrink({0}, 0.5)"),
        _spec("hardshrink", _F + "hardshrink({0}, 0.5)"),
        _spec("softsign", _F + "softsign({0})"),
        _spec("tanhshrink", _F + "tanhshrink({0})", smooth=True),
        _spec("logsigmoid", _F + "logsigmoid({0})", smooth=True),
        _spec("softplus", _F + "softplus({0})", smooth=True),
        _spec("gelu", _F + "gelu({0})", smooth=True),
        _spec("silu", _F + "silu({0})", smooth=True),
        _spec("mish", _F + "mish({0})", smooth=True),
        _spec("softmax", _F + "softmax({0}, dim=-1)", smooth=True),
        _spec("log_softmax", _F + "log_softmax({0}, dim=-1)", smooth=True),
        _spec("layer_norm", _F + "layer_norm({0}, {0}.shape[-1:])", smooth=True),
    ),
    "losses": (
        _spec("mse_loss", _F + "mse_loss({0}, {1})", 2, smooth=True),
        _spec("l1_loss", _F + "l1_loss({0}, {1})", 2),
        _spec("smooth_l1_loss", _F + "smooth_l1_loss({0}, {1})", 2),
        _spec("huber_loss", _F + "huber_loss({0}, {1}, delta=0.5)", 2),
        _spec("binary_cross_entropy", _F + "binary_cross_entropy(np.sigmoid({0}), np.sigmoid({1}))", 2, smooth=True),
        _spec("binary_cross_entropy_with_logits", _F + "binary_cross_entropy_with_logits({0}, np.sigmoid({1}))", 2,
              smooth=True),
        _spec("kl_div", _F + "kl_div(" + _F + "log_softmax({0}, dim=-1), " + _F + "softmax({1}, dim=-1), "
              "reduction='batchmean')", 2, smooth=True),
        _spec("cross_entropy", _F + "cross_entropy({0}, np.class_targets({0}))", smooth=True),
        _spec("nll_loss", _F + "nll_loss(" + _F + "log_softmax({0}, dim=1), np.class_targets({0}))", smooth=True),
        _spec("cosine_similarity", _F + "cosine_similarity({0}, {1})", 2, smooth=True),
        _spec("cosine_embedding_loss", _F + "cosine_embedding_loss({0}, {1}, np.signs({0}.shape[0]))", 2),
        _spec("margin_ranking_loss", _F + "margin_ranking_loss({0}, {1}, np.signs({0}.shape[0]))", 2),
    ),
    "recurrent": (
        _spec("rnn_cell", "np.rnn_cell({0}, {1}, 'tanh')", 2, smooth=True),
        _spec("rnn_cell", "np.rnn_cell({0}, {1}, 'relu')", 2),
        _spec("gru_cell", "np.rnn_cell({0}, {1}, 'gru')", 2, smooth=True),
        _spec("lstm_cell", "np.rnn_cell({0}, {1}, 'lstm')", 2, smooth=True),
    ),
    "inplace": (
        _spec("inplace", "np.inplace({0}, (('mul_', 2.0), ('add_', -0.5), ('tanh_',)))"),
        _spec("inplace", "np.inplace({0}, (('neg_',), ('relu_',)), view=True)"),
        _spec("inplace", "np.inplace({0}, (('add_', 1.0), ('exp_',)), view=True)", smooth=True),
        _spec("inplace", "np.inplace({0}, (('mul_', 0.5), ('sigmoid_',)))", smooth=True),
    ),
}


def family_ops(families: Sequence[str]) -> list[OpSpec]:
    """The specs of ``families`` (keys of ``FAMILIES``)."""
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown:
        raise ValueError(f"unknown program families {unknown}; expected some of {sorted(FAMILIES)}")
    return [spec for family in families for spec in FAMILIES[family]]
