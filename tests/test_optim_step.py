"""``Optax.step``: one jitted update over all parameters, leaving those without a grad alone."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import xgrad
from xgrad import nn
from xgrad.optim import Optax, get_lr, set_lr


@pytest.mark.parametrize(
    "make_transform",
    [lambda: optax.adamw(1e-2, weight_decay=0.1), lambda: optax.sgd(0.1, momentum=0.9)],
    ids=["adamw", "sgd_momentum"],
)
def test_frozen_and_gradless_parameters_are_left_alone(make_transform):
    # A frozen weight (requires_grad=False) and a parameter outside the loss (grad None)
    # keep their values and their optimizer-state entries; the others match optax on
    # plain arrays of just the stepped parameters.
    rng = np.random.default_rng(0)
    w = xgrad.tensor(rng.normal(size=(3, 2)), requires_grad=True)
    b = xgrad.tensor(rng.normal(size=(2,)), requires_grad=True)
    frozen = xgrad.tensor(rng.normal(size=(2,)))
    unused = xgrad.tensor(rng.normal(size=(4,)), requires_grad=True)
    x = rng.normal(size=(5, 3))
    initial_frozen, initial_unused = frozen.detach().numpy().copy(), unused.detach().numpy().copy()
    opt = Optax([w, b, frozen, unused], make_transform())
    unused_state = [leaf for leaf in jax.tree.leaves(opt.state) if leaf.shape == (4,)]

    def loss_fn(params):
        w_, b_ = params
        return jnp.sum(jnp.tanh(x @ w_ + b_ + frozen.array) ** 2)

    transform = make_transform()
    ref = [w.array, b.array]
    ref_state = transform.init(ref)
    for _ in range(4):
        opt.zero_grad()
        ((x @ w + b + frozen).tanh() ** 2).sum().backward()
        opt.step()
        updates, ref_state = transform.update(jax.grad(loss_fn)(ref), ref_state, ref)
        ref = optax.apply_updates(ref, updates)
    np.testing.assert_allclose(w.detach().numpy(), ref[0], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(b.detach().numpy(), ref[1], rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(frozen.detach().numpy(), initial_frozen)
    np.testing.assert_array_equal(unused.detach().numpy(), initial_unused)
    assert unused._version == 0 and w._version == 4
    after = [leaf for leaf in jax.tree.leaves(opt.state) if leaf.shape == (4,)]
    for old, new in zip(unused_state, after, strict=True):
        np.testing.assert_array_equal(old, new)


def test_state_is_the_optax_state_and_can_be_assigned():
    w = xgrad.tensor([1.0, 2.0], requires_grad=True)
    opt = Optax([w], optax.adam(0.1))
    w.grad = xgrad.tensor([2.0, 4.0])
    opt.step()
    assert int(opt.state[0].count) == 1
    np.testing.assert_allclose(opt.state[0].mu[0], 0.1 * np.array([2.0, 4.0]))
    # A second optimizer given the first one's state continues exactly where it was.
    w2 = xgrad.tensor(w.detach().numpy(), requires_grad=True)
    opt2 = Optax([w2], optax.adam(0.1))
    opt2.state = opt.state
    w.grad = w2.grad = xgrad.tensor([1.0, -3.0])
    opt.step()
    opt2.step()
    assert int(opt2.state[0].count) == 2
    np.testing.assert_array_equal(w2.detach().numpy(), w.detach().numpy())


def test_mlp_steps_match_optax_on_arrays_and_keep_parameter_identity():
    model = nn.MLP([2, 8, 3], key=1, dtype=jnp.float64)
    x = np.random.default_rng(1).normal(size=(6, 2))
    y = np.array([0, 2, 1, 1, 0, 2])
    params = list(model.parameters())
    ref = [p.array for p in params]
    transform = optax.adam(1e-2)
    ref_state = transform.init(ref)
    opt = Optax(params, optax.adam(1e-2))

    def loss_fn(ps):
        w0, b0, w1, b1 = ps
        logits = jax.nn.relu(x @ w0.T + b0) @ w1.T + b1
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], 1))

    for _ in range(3):
        opt.zero_grad()
        xgrad.cross_entropy(model(xgrad.tensor(x)), xgrad.tensor(y)).backward()
        opt.step()
        updates, ref_state = transform.update(jax.grad(loss_fn)(ref), ref_state, ref)
        ref = optax.apply_updates(ref, updates)
    assert all(a is b for a, b in zip(model.parameters(), params, strict=True))
    for p, r in zip(params, ref, strict=True):
        np.testing.assert_allclose(p.detach().numpy(), r, rtol=1e-9, atol=1e-12)


def test_learning_rate_of_an_injected_transform_is_read_and_set():
    w = xgrad.tensor([1.0, 2.0], requires_grad=True)
    opt = Optax([w], optax.inject_hyperparams(optax.sgd)(learning_rate=0.5))
    assert get_lr(opt) == 0.5
    set_lr(opt, 0.25)
    w.grad = xgrad.tensor([2.0, 4.0])
    opt.step()
    assert get_lr(opt) == 0.25 and w.tolist() == [0.5, 1.0]
    with pytest.raises(TypeError, match="inject_hyperparams"):
        get_lr(Optax([w], optax.sgd(0.1)))


@pytest.mark.parametrize(
    "make_optimizer", [lambda ps: xgrad.optim.Adam(ps, lr=0.1), lambda ps: Optax(ps, optax.adam(0.1))], ids=["Adam", "Optax"]
)
def test_placement_is_compared_again_only_after_the_parameters_change(make_optimizer, monkeypatch):
    # NOTE [Unmoved parameters]: a step after a step skips moving the state; a parameter
    # given a new array since (an in-place copy, ``module.to``) has it moved.
    model = nn.Linear(3, 2, key=0, dtype=np.float64)
    opt = make_optimizer(list(model.parameters()))
    follow = "_follow_param" if isinstance(opt, xgrad.optim.Optimizer) else "_follow_params"
    calls = []
    original = getattr(type(opt), follow)
    monkeypatch.setattr(type(opt), follow, lambda self, *args: (calls.append(1), original(self, *args))[1])
    x = xgrad.tensor(np.ones((4, 3)))

    def step():
        opt.zero_grad()
        (model(x) ** 2).sum().backward()
        opt.step()

    step()
    first = len(calls)
    assert first > 0
    step()
    assert len(calls) == first
    with xgrad.no_grad():
        model.weight.copy_(model.weight * 1.0)  # the same values in a new array
    step()
    assert len(calls) > first
