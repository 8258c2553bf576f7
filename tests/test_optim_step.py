"""``Optax.step``: one jitted update over all parameters, leaving those without a grad alone."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import xgrad
from xgrad import nn
from xgrad.optim import Optax, get_lr, optax_optimizer, set_lr


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


def _unpacked(monkeypatch):
    """Make ``Optax`` keep one array per state leaf, as it did before packing (NOTE [Packed optimizer state])."""
    of = optax_optimizer.StateLayout.of.__func__
    monkeypatch.setattr(optax_optimizer.StateLayout, "of", classmethod(lambda cls, state, params, pack: of(cls, state, params, False)))


@pytest.mark.parametrize(
    "make_transform",
    [lambda: optax.adam(1e-2), lambda: optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(0.1, momentum=0.9, nesterov=True))],
    ids=["adam", "clip_sgd_nesterov"],
)
def test_packed_state_gives_the_bits_of_one_array_per_leaf(make_transform, monkeypatch):
    # NOTE [Packed optimizer state]: the per-parameter entries of each dtype in one buffer
    # each, sliced and concatenated inside the update, give the very bits of the update on
    # one array per leaf, with parameters of two dtypes and one frozen (no grad).
    rng = np.random.default_rng(3)
    values = [rng.normal(size=(4, 3)).astype(np.float32), rng.normal(size=(3,)), rng.normal(size=(2,)).astype(np.float32)]
    grads = [[rng.normal(size=v.shape).astype(v.dtype) for v in values] for _ in range(4)]

    def run():
        params = [xgrad.tensor(v, requires_grad=True) for v in values]
        opt = Optax(params, make_transform())
        for step_grads in grads:
            for p, g in zip(params[:2], step_grads, strict=False):
                p.grad = xgrad.tensor(g)
            opt.step()
        return params, opt

    packed_params, packed = run()
    with monkeypatch.context() as m:
        _unpacked(m)
        plain_params, plain = run()
    assert len(packed._state_tensors) < len(plain._state_tensors) == len(jax.tree.leaves(plain.state))
    for a, b in zip(packed_params, plain_params, strict=True):
        np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy())
        assert a.dtype == b.dtype
    assert jax.tree.structure(packed.state) == jax.tree.structure(plain.state)
    for a, b in zip(jax.tree.leaves(packed.state), jax.tree.leaves(plain.state), strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)


def test_packed_state_read_and_assigned_back_keeps_its_buffers():
    # ``set_lr`` reads the state and assigns it back each time: the moments' buffers are
    # kept, not cut up and concatenated again; a leaf replaced by the user is packed anew.
    w = xgrad.tensor([1.0, 2.0, 3.0], requires_grad=True)
    opt = Optax([w], optax.inject_hyperparams(optax.adam)(learning_rate=0.5))
    w.grad = xgrad.tensor([1.0, -1.0, 2.0])
    opt.step()
    buffers = [t._array for t in opt._state_tensors]
    shown = jax.tree.leaves(opt.state)
    assert all(a is b for a, b in zip(shown, jax.tree.leaves(opt.state), strict=True))
    set_lr(opt, 0.25)
    assert get_lr(opt) == 0.25
    kept = [a for a, t in zip(buffers, opt._state_tensors, strict=True) if t._array is a]
    assert len(kept) == len(buffers) - 1  # all but the learning rate's own array
    state = opt.state
    state.inner_state[0].mu[0] = jnp.array([7.0, 8.0, 9.0])
    opt.state = state
    np.testing.assert_array_equal(opt.state.inner_state[0].mu[0], [7.0, 8.0, 9.0])
    np.testing.assert_array_equal(opt.state.inner_state[0].nu[0], shown[-1])


def test_a_transform_changing_its_state_dtypes_keeps_one_array_per_leaf():
    # A state whose update changes its leaves' dtypes (float16 in, float32 out) cannot
    # live in a fixed buffer: it keeps its leaves, and steps as optax does on arrays.
    def init(params):
        return [jnp.zeros(p.shape, jnp.float16) for p in params]

    def update(updates, state, params=None):
        new_state = [s.astype(jnp.float32) + u for s, u in zip(state, updates, strict=True)]
        return [-0.1 * s for s in new_state], new_state

    transform = optax.GradientTransformation(init, update)
    w = xgrad.tensor(np.array([1.0, 2.0], np.float32), requires_grad=True)
    opt = Optax([w], transform)
    ref, ref_state = [w.array], transform.init([w.array])
    for g in ([1.0, 2.0], [0.5, -1.0]):
        w.grad = xgrad.tensor(np.array(g, np.float32))
        opt.step()
        updates, ref_state = transform.update([jnp.array(g, jnp.float32)], ref_state, ref)
        ref = optax.apply_updates(ref, updates)
    np.testing.assert_array_equal(w.detach().numpy(), ref[0])
    assert [leaf.dtype for leaf in jax.tree.leaves(opt.state)] == [jnp.float32]
