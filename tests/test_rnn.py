"""Recurrent layers (``xgrad.nn.RNN``, ``LSTM``, ``GRU`` and cells) against PyTorch and its equations.

Two independent references: the values and gradients PyTorch 2.13 computed for fixed
state dicts (``tests/fixtures/torch_rnn.npz``, written by ``make_torch_rnn.py``), and a
step-by-step ``jnp`` transcription of PyTorch's documented equations
(``xgrad.testing.rnn_reference``), differentiated with ``jax.grad``.
"""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xgrad
from tests._backward_modes import eager_and_compiled  # noqa: F401 - the fixture
from xgrad import nn
from xgrad.testing import gradcheck
from xgrad.testing.rnn_reference import reference_lstm, reference_recurrent

TORCH = np.load(Path(__file__).parent / "fixtures" / "torch_rnn.npz")
F64 = jnp.float64


def _case(name):
    prefix = f"{name}/"
    return {k.removeprefix(prefix): TORCH[k] for k in TORCH.files if k.startswith(prefix)}


def _torch_layer(name, data):
    layers = {
        "lstm": lambda: nn.LSTM(3, 4, num_layers=2, bidirectional=True, batch_first=True, dtype=F64),
        "gru": lambda: nn.GRU(3, 4, num_layers=2, dtype=F64),
        "rnn_relu": lambda: nn.RNN(3, 4, nonlinearity="relu", bias=False, bidirectional=True, dtype=F64),
        "rnn_tanh_unbatched": lambda: nn.RNN(3, 4, num_layers=2, dtype=F64),
        "lstm_cell": lambda: nn.LSTMCell(3, 4, dtype=F64),
        "gru_cell": lambda: nn.GRUCell(3, 4, dtype=F64),
        "rnn_cell": lambda: nn.RNNCell(3, 4, nonlinearity="relu", dtype=F64),
        "lstm_proj": lambda: nn.LSTM(3, 4, num_layers=2, bidirectional=True, proj_size=2, dtype=F64),
    }
    layer = layers[name]()
    state = {k: v for k, v in data.items() if k not in ("x", "h0", "c0", "out", "h_n", "c_n") and not k.startswith("grad/")}
    layer.load_state_dict(state)
    return layer


TORCH_CASES = ["lstm", "gru", "rnn_relu", "rnn_tanh_unbatched", "lstm_cell", "gru_cell", "rnn_cell", "lstm_proj"]


@pytest.mark.usefixtures("eager_and_compiled")
@pytest.mark.parametrize("name", TORCH_CASES)
def test_outputs_and_gradients_match_pytorch(name):
    data = _case(name)
    layer = _torch_layer(name, data)
    x = xgrad.tensor(data["x"], requires_grad=True)
    states = [xgrad.tensor(data[s]) for s in ("h0", "c0") if s in data]
    hx = None if not states else tuple(states) if len(states) == 2 else states[0]
    if "cell" in name:
        result = layer(x, hx)
        out, rest = (result[0], [result[1]]) if isinstance(result, tuple) else (result, [])
        names = ["c_n"]
    else:
        out, state = layer(x, hx)
        rest = list(state) if isinstance(state, tuple) else [state]
        names = ["h_n", "c_n"]
    np.testing.assert_allclose(out.detach().numpy(), data["out"], rtol=1e-10, atol=1e-12)
    for s, key in zip(rest, names, strict=False):
        np.testing.assert_allclose(s.detach().numpy(), data[key], rtol=1e-10, atol=1e-12)
    loss = (out**2).sum() + sum(s.sum() for s in rest)
    loss.backward()
    np.testing.assert_allclose(x.grad.numpy(), data["grad/x"], rtol=1e-9, atol=1e-12)
    for key, p in layer.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), data[f"grad/{key}"], rtol=1e-9, atol=1e-12, err_msg=key)


@pytest.mark.parametrize("name", ["lstm", "gru", "rnn_relu", "gru_cell", "lstm_proj"])
def test_state_dict_has_pytorchs_keys_and_shapes(name):
    data = _case(name)
    layer = _torch_layer(name, data)
    torch_keys = [k for k in data if not k.startswith("grad/") and k not in ("x", "h0", "c0", "out", "h_n", "c_n")]
    assert list(layer.state_dict()) == torch_keys
    assert all(v.shape == data[k].shape for k, v in layer.state_dict().items())
    if "cell" not in name:  # PyTorch's all_weights: per layer and direction, the parameters in state-dict order
        params = dict(layer.named_parameters())
        flat = [next(k for k, p in params.items() if p is w) for ws in layer.all_weights for w in ws]
        assert flat == torch_keys
        assert len(layer.all_weights) == layer.num_layers * (2 if layer.bidirectional else 1)
        layer.flatten_parameters()  # PyTorch programs call it for cuDNN: nothing to do here
        assert list(layer.state_dict()) == torch_keys


# -- against the equations, through the whole stack -------------------------------------------
def _reference_stack(mode, params, x, h0, c0, num_layers, bidirectional, batch_first):
    """The stacked layers on plain arrays: (output, h_n, c_n), as PyTorch's documentation composes them.

    Eager and compiled backward are both checked against PyTorch above; here the eager one, on more configurations.
    """
    if batch_first:
        x = jnp.swapaxes(x, 0, 1)
    directions = 2 if bidirectional else 1
    h_n, c_n = [], []
    for layer in range(num_layers):
        outs = []
        for d in range(directions):
            suffix = f"_l{layer}" + ("_reverse" if d else "")
            w = [params.get(f"{n}{suffix}") for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
            k = layer * directions + d
            if mode == "lstm":
                hs, c = reference_lstm(x, h0[k], c0[k], *w, reverse=bool(d))
                c_n.append(c)
            else:
                hs = reference_recurrent(x, h0[k], *w, mode=mode, reverse=bool(d))
            h_n.append(hs[0] if d else hs[-1])
            outs.append(hs)
        x = jnp.concatenate(outs, axis=-1)
    out = jnp.swapaxes(x, 0, 1) if batch_first else x
    return out, jnp.stack(h_n), jnp.stack(c_n) if c_n else None


# The reference runs op by op in JAX (seconds per direction), so few directions here; two layers of
# two directions each are checked against PyTorch above (the "lstm" and "gru" cases).
CONFIGS = [
    # mode, layers, bidirectional, batch_first, bias, with initial state
    ("lstm", 1, True, False, True, True),
    ("lstm", 1, False, True, False, False),
    ("gru", 2, False, True, True, True),
    ("rnn_tanh", 1, True, True, False, True),
]


def _make(mode, layers, bidirectional, batch_first, bias, key=0):
    kwargs = dict(num_layers=layers, bias=bias, batch_first=batch_first, bidirectional=bidirectional, key=key, dtype=F64)
    if mode.startswith("rnn"):
        return nn.RNN(3, 4, nonlinearity=mode.removeprefix("rnn_"), **kwargs)
    return {"lstm": nn.LSTM, "gru": nn.GRU}[mode](3, 4, **kwargs)


@pytest.mark.parametrize("config", CONFIGS, ids=["-".join(map(str, c)) for c in CONFIGS])
def test_stacked_layers_match_the_equations_and_jax_grad(config):
    mode, layers, bidirectional, batch_first, bias, initial = config
    rnn = _make(mode, layers, bidirectional, batch_first, bias)
    rng = np.random.default_rng(1)
    count = layers * (2 if bidirectional else 1)
    x = rng.standard_normal((2, 2, 3))  # T = B = 2
    h0, c0 = rng.standard_normal((2, count, 2, 4))
    params = {k: p.array for k, p in rnn.named_parameters()}
    x_t = xgrad.tensor(x, requires_grad=True)
    h_t, c_t = xgrad.tensor(h0, requires_grad=True), xgrad.tensor(c0, requires_grad=True)
    hx = (h_t, c_t) if mode == "lstm" else h_t
    out, state = rnn(x_t, hx if initial else None)
    h_n, c_n = state if mode == "lstm" else (state, None)
    loss = (out**2).sum() + (h_n * 0.5).sum() + (0.0 if c_n is None else (c_n**2).sum())
    loss.backward()

    def reference_loss(params, x, h0, c0):
        if not initial:
            h0, c0 = jnp.zeros_like(h0), jnp.zeros_like(c0)
        out, h_n, c_n = _reference_stack(mode, params, x, h0, c0, layers, bidirectional, batch_first)
        return jnp.sum(out**2) + jnp.sum(h_n * 0.5) + (0.0 if c_n is None else jnp.sum(c_n**2)), (out, h_n, c_n)

    value_and_grad = jax.value_and_grad(reference_loss, argnums=(0, 1, 2, 3), has_aux=True)
    (want_loss, (want_out, want_h, want_c)), grads = value_and_grad(
        params, jnp.asarray(x), jnp.asarray(h0), jnp.asarray(c0)
    )
    np.testing.assert_allclose(out.detach().numpy(), want_out, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(h_n.detach().numpy(), want_h, rtol=1e-10, atol=1e-12)
    if c_n is not None:
        np.testing.assert_allclose(c_n.detach().numpy(), want_c, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(loss.item(), want_loss, rtol=1e-10)
    param_grads, x_grad, h_grad, c_grad = grads
    for key, p in rnn.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), param_grads[key], rtol=1e-9, atol=1e-12, err_msg=key)
    np.testing.assert_allclose(x_t.grad.numpy(), x_grad, rtol=1e-9, atol=1e-12)
    if initial:
        np.testing.assert_allclose(h_t.grad.numpy(), h_grad, rtol=1e-9, atol=1e-12)
        if mode == "lstm":
            np.testing.assert_allclose(c_t.grad.numpy(), c_grad, rtol=1e-9, atol=1e-12)


def test_lstm_gradcheck_float64():
    lstm = nn.LSTM(2, 3, bidirectional=True, key=3, dtype=F64)
    rng = np.random.default_rng(2)
    x, h0, c0 = rng.standard_normal((3, 2, 2)), rng.standard_normal((2, 2, 3)), rng.standard_normal((2, 2, 3))

    def fn(x, h0, c0):
        out, (h, c) = lstm(x, (h0, c0))
        return out.sum() + (h * c).sum()

    assert gradcheck(fn, [xgrad.tensor(a, requires_grad=True) for a in (x, h0, c0)], fast_mode=True)


def test_gru_cell_gradcheck_float64():
    cell = nn.GRUCell(2, 3, key=4, dtype=F64)
    rng = np.random.default_rng(3)
    inputs = [xgrad.tensor(rng.standard_normal(s), requires_grad=True) for s in ((2, 2), (2, 3))]
    assert gradcheck(lambda x, h: cell(x, h) ** 2, inputs, fast_mode=True)


# -- one node per layer and direction ----------------------------------------------------------
def test_each_layer_direction_is_one_node():
    lstm = nn.LSTM(3, 4, num_layers=2, bidirectional=True, batch_first=True, key=0, dtype=F64)  # the "lstm" case's
    out, (h, c) = lstm(xgrad.tensor(np.ones((2, 5, 3)), requires_grad=True))
    seen, stack, scans = set(), [out.grad_fn], 0
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        scans += node.name() == "LstmScanBackward"
        stack.extend(fn for fn, _ in node.next_functions)
    assert scans == 4
    # The scans, a cat, the transposes and the leaves' accumulators: not 5 steps' worth of gates.
    assert len(seen) < 30


# -- training: dropout, compiled steps ---------------------------------------------------------
class _LanguageModel(nn.Module):
    def __init__(self, dropout):
        self.embed = nn.Embedding(7, 4, key=0, dtype=F64)
        self.rnn = nn.LSTM(4, 5, num_layers=2, dropout=dropout, key=1, dtype=F64)
        self.head = nn.Linear(5, 7, key=2, dtype=F64)

    def forward(self, tokens, hidden):
        out, hidden = self.rnn(self.embed(tokens), hidden)
        return self.head(out), hidden


def _training(dropout):
    model = _LanguageModel(dropout)
    opt = xgrad.optim.SGD(model.parameters(), lr=0.5)

    def step(tokens, targets, h, c):
        opt.zero_grad()
        logits, (h, c) = model(tokens, (h, c))
        loss = xgrad.cross_entropy(logits.reshape(-1, 7), targets.reshape(-1))
        loss.backward()
        opt.step()
        return loss, h.detach(), c.detach()

    return model, step


@pytest.mark.slow  # compiles a whole training step, and eager's ops and fused rules: about 10 s
def test_a_compiled_training_step_matches_eager_with_dropout_between_layers():
    rng = np.random.default_rng(5)
    tokens = xgrad.tensor(rng.integers(0, 7, (6, 3)))
    targets = xgrad.tensor(rng.integers(0, 7, (6, 3)))
    results = []
    for compiled in (False, True):
        model, step = _training(dropout=0.5)
        run = xgrad.compile(step) if compiled else step
        h = c = xgrad.zeros(2, 3, 5, dtype=F64)
        losses = []
        for _ in range(3):
            loss, h, c = run(tokens, targets, h, c)
            losses.append(loss.item())
        results.append((losses, [p.detach().numpy() for p in model.parameters()]))
        if compiled:
            assert run.stats()["fallbacks"] == 0
    (eager_losses, eager_params), (compiled_losses, compiled_params) = results
    np.testing.assert_allclose(compiled_losses, eager_losses, rtol=1e-10)
    assert eager_losses[2] < eager_losses[0]
    for a, b in zip(eager_params, compiled_params, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-9, atol=1e-12)


def test_dropout_applies_between_layers_in_training_only():
    def run(layer):
        return layer(x)[0].detach().numpy()

    rnn = nn.GRU(3, 4, num_layers=2, dropout=0.5, key=0, dtype=F64)
    plain = nn.GRU(3, 4, num_layers=2, key=0, dtype=F64)
    x = xgrad.tensor(np.random.default_rng(0).standard_normal((5, 2, 3)))
    first, second = run(rnn), run(rnn)
    assert not np.allclose(first, second)  # a fresh mask each call
    rnn.eval()
    np.testing.assert_allclose(run(rnn), run(plain), rtol=1e-12)
    # The first layer's output is not dropped: one layer with dropout is the plain layer (PyTorch warns).
    with pytest.warns(UserWarning, match="non-zero dropout expects num_layers greater than 1"):
        single = nn.GRU(3, 4, dropout=0.5, key=0, dtype=F64)
    np.testing.assert_allclose(run(single), run(nn.GRU(3, 4, key=0, dtype=F64)), rtol=1e-12)


# -- construction and errors --------------------------------------------------------------------
def test_initialisation_is_pytorchs_uniform_and_follows_the_key():
    lstm = nn.LSTM(3, 16, num_layers=2, key=7)
    values = np.concatenate([p.detach().numpy().ravel() for p in lstm.parameters()])
    assert np.abs(values).max() <= 0.25 and np.abs(values).max() > 0.24  # 1 / sqrt(16)
    again = nn.LSTM(3, 16, num_layers=2, key=7)
    np.testing.assert_array_equal(again.weight_hh_l1.detach().numpy(), lstm.weight_hh_l1.detach().numpy())
    assert not np.array_equal(lstm.weight_ih_l1.detach().numpy(), lstm.weight_hh_l1.detach().numpy())
    assert lstm.weight_ih_l0.dtype == jnp.float32
    assert repr(nn.RNN(3, 4, 2, "relu", batch_first=True)) == "RNN(3, 4, num_layers=2, nonlinearity='relu', batch_first=True)"


@pytest.mark.parametrize(("make", "error", "match"), [
    (lambda: nn.LSTM(3, 4, proj_size=4), ValueError, "proj_size has to be smaller than hidden_size"),
    (lambda: nn.LSTM(3, 4, proj_size=2)(xgrad.ones(2, 1, 3), (xgrad.zeros(1, 1, 4), xgrad.zeros(1, 1, 4))), RuntimeError,
     r"Expected hidden\[0\] size \(1, 1, 2\), got \[1, 1, 4\]"),
    (lambda: nn.RNN(3, 4, nonlinearity="gelu"), ValueError, "Unknown nonlinearity 'gelu'"),
    (lambda: nn.GRU(3, 0), ValueError, "hidden_size must be greater than zero"),
    (lambda: nn.GRU(3, 4, num_layers=0), ValueError, "num_layers must be greater than zero"),
    (lambda: nn.LSTM(3, 4, dropout=1.5), ValueError, "dropout should be a number in range"),
    (lambda: nn.LSTM(3, 4)(xgrad.ones(2, 2, 5)), RuntimeError, "input.size\\(-1\\) must be equal to input_size. Expected 3, got 5"),
    (lambda: nn.LSTM(3, 4)(xgrad.ones(2, 3, 2, 3)), ValueError, "LSTM: Expected input to be 2D or 3D, got 4D"),
    (lambda: nn.GRU(3, 4)(xgrad.ones(2, 2, 3), xgrad.zeros(1, 3, 4)), RuntimeError,
     r"Expected hidden size \(1, 2, 4\), got \[1, 3, 4\]"),
    (lambda: nn.LSTM(3, 4)(xgrad.ones(2, 3), (xgrad.zeros(1, 1, 4), xgrad.zeros(1, 1, 4))), RuntimeError,
     "For unbatched 2-D input, hx and cx should also be 2-D"),
    (lambda: nn.RNN(3, 4)(xgrad.ones(2, 2, 3), xgrad.zeros(1, 4)), RuntimeError, "For batched 3-D input, hx should also be 3-D"),
    (lambda: nn.LSTMCell(3, 4)(xgrad.ones(2, 2, 3)), ValueError, "LSTMCell: Expected input to be 1D or 2D, got 3D"),
    (lambda: nn.LSTM(3, 4)(xgrad.ones(2, 1, 3, dtype=F64)), ValueError,
     r"RNN input dtype \(float64\) does not match weight dtype \(float32\)"),
    (lambda: nn.GRUCell(3, 4)(xgrad.ones(2, 3, dtype=F64)), RuntimeError, "mat1 and mat2 must have the same dtype, but got Double and Float"),
])
def test_pytorchs_errors(make, error, match):
    with pytest.raises(error, match=match):
        make()


# -- unbatched cells and empty sequences ---------------------------------------------------------
CELLS = {"rnn_cell": lambda: nn.RNNCell(3, 4, key=1, dtype=F64), "gru_cell": lambda: nn.GRUCell(3, 4, key=1, dtype=F64),
         "lstm_cell": lambda: nn.LSTMCell(3, 4, key=1, dtype=F64)}


@pytest.mark.parametrize("mode", ["eager", "compiled", "xgrad.compile"])
@pytest.mark.parametrize("name", sorted(CELLS))
@pytest.mark.parametrize("with_state", [True, False], ids=["hx", "no-hx"])
def test_an_unbatched_cell_is_its_batched_self_with_one_row(name, with_state, mode):
    # PyTorch: input (I,) and hidden (H,) give (H,), the batched result's one row; gradients too.
    cell = CELLS[name]()
    lstm = name == "lstm_cell"
    x = np.linspace(-1.0, 1.0, 3)
    h, c = np.linspace(0.5, -0.5, 4), np.linspace(-0.2, 0.3, 4)

    def run(batched, backward_mode):
        cell.zero_grad()
        xs = xgrad.tensor(x[None] if batched else x, requires_grad=True)
        state = [xgrad.tensor(s[None] if batched else s, requires_grad=True) for s in ((h, c) if lstm else (h,))]

        def step(xs, *state):
            hx = None if not with_state else tuple(state) if lstm else state[0]
            out = cell(xs, hx)
            out = out if lstm else (out,)
            loss = sum((o * (i + 1.0)).sum() for i, o in enumerate(out))
            loss.backward(compiled=backward_mode == "compiled")
            return out

        out = (xgrad.compile(step) if backward_mode == "xgrad.compile" else step)(xs, *state)
        grads = [xs.grad] + ([s.grad for s in state] if with_state else [])
        return [o.detach().numpy() for o in out], [g.numpy() for g in grads], [p.grad.numpy() for p in cell.parameters()]

    out, grads, param_grads = run(False, mode)
    ref_out, ref_grads, ref_param_grads = run(True, "eager")
    assert all(o.shape == (4,) for o in out)
    for a, b in zip(out + grads + param_grads, [o[0] for o in ref_out] + [g[0] for g in ref_grads] + ref_param_grads,
                    strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize(("call", "error", "match"), [
    (lambda: nn.RNNCell(3, 4)(xgrad.ones(3), xgrad.zeros(1, 1, 4)), ValueError, "^RNNCell: Expected hidden to be 1D or 2D, got 3D instead$"),
    (lambda: nn.LSTMCell(3, 4)(xgrad.ones(3), (xgrad.zeros(4), xgrad.zeros(1, 1, 4))), ValueError,
     r"^LSTMCell: Expected hx\[1\] to be 1D or 2D, got 3D instead$"),
    (lambda: nn.GRUCell(3, 4)(xgrad.ones(3), xgrad.zeros(1, 4)), RuntimeError, "Expected hidden to be 1D for unbatched 1D input"),
    (lambda: nn.GRUCell(3, 4)(xgrad.ones(2, 3), xgrad.zeros(3, 4)), RuntimeError,
     "^Input batch size 2 doesn't match hidden0 batch size 3$"),
    (lambda: nn.LSTMCell(3, 4)(xgrad.ones(3), (xgrad.zeros(4), xgrad.zeros(5))), RuntimeError,
     "^hidden1 has inconsistent hidden_size: got 5, expected 4$"),
])
def test_cell_state_errors_are_pytorchs(call, error, match):
    with pytest.raises(error, match=match):
        call()


@pytest.mark.parametrize("layer", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("shape, batch_first", [((0, 2, 3), False), ((2, 0, 3), True), ((0, 3), False)],
                         ids=["seq-first", "batch-first", "unbatched"])
def test_an_empty_sequence_raises_pytorchs_runtime_error(layer, shape, batch_first):
    # PyTorch (RNN.cpp) refuses a sequence of length 0; an empty batch is fine.
    module = getattr(nn, layer)(3, 4, batch_first=batch_first, key=0)
    with pytest.raises(RuntimeError, match=r"^Expected sequence length to be larger than 0 in RNN$"):
        module(xgrad.ones(*shape))
    out, _ = module(xgrad.ones(*((2, 0, 3) if not batch_first else (0, 2, 3))))
    assert out.shape == ((2, 0, 4) if not batch_first else (0, 2, 4))
