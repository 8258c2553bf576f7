"""What a function reaches (NOTE [What a function reaches] in ``xgrad/reach.py``): the one walk, and how each of its
users configures it (``xgrad.func``'s cached transforms, ``xgrad.compile``'s host hooks)."""

from __future__ import annotations

import functools
import logging

import jax
import jax.numpy as jnp

import xgrad
from xgrad import nn
from xgrad.compile_step.host import _reaches_state
from xgrad.func_programs import _reached
from xgrad.reach import reached

IN_COMPREHENSION = xgrad.tensor([1.0])
TWO = 2.0


class _Box:
    def __init__(self, value):
        self.value = value

    def read(self):
        return self.value


def _ids(values):
    return {id(v) for v in values}


def test_reached_follows_partials_bound_self_closures_defaults_globals_and_wrapped():
    cell, default, argument, own = [1], [2], [3], _Box([4])

    def inner(x, d=default):
        return [x * IN_COMPREHENSION for _ in cell]  # a global named only in nested code

    @functools.wraps(inner)
    def wrapper(*args):
        return args

    found = [v for v, _ in reached(functools.partial(wrapper, argument))]
    assert _ids([cell, default, argument, inner, IN_COMPREHENSION]) <= _ids(found)
    assert id(own.value) in _ids(v for v, _ in reached(own.read, objects=True))
    assert id(own.value) not in _ids(v for v, _ in reached(own.read))  # an object's attributes: only with objects
    assert id(cell) in _ids(v for v, _ in reached(cell.append))  # a builtin's bound object
    assert all(followed for _, followed in reached(len))  # a plain builtin holds nothing, and says it followed it


def test_reached_stops_where_it_is_told_and_says_what_it_did_not_follow():
    deep, big = [[[["leaf"]]]], list(range(17))

    def fn():
        return deep, big

    followed = {id(v): f for v, f in reached(fn, depth=2, max_items=16)}
    assert followed[id(deep)] and not followed[id(deep[0])] and id(deep[0][0]) not in followed
    assert not followed[id(big)]
    assert not {id(v): f for v, f in reached(fn, stop=lambda v: v is deep)}[id(deep)]


def test_a_library_function_is_followed_only_into_its_closure():
    held_default, held_cell = [1], [2]

    def make():
        def library_fn(d=held_default):
            return held_cell

        library_fn.__module__ = "xgrad.somewhere"
        return library_fn

    found = _ids(v for v, _ in reached(make()))
    assert id(held_cell) in found and id(held_default) not in found


def test_transforms_reach_modules_and_tensors_but_not_into_objects():
    model, loose, boxed = nn.Linear(2, 2), xgrad.tensor([1.0]), _Box(xgrad.tensor([2.0]))

    def loss(x):
        return model(x).sum() + [loose for _ in range(1)][0].sum() + boxed.value.sum()

    modules, tensors = _reached(loss)
    assert modules == [model]  # a module is not walked into: its parameters come from ``modules()``
    assert _ids(tensors) == {id(loose)}


def test_a_host_hook_may_read_state_by_what_it_reaches():
    box = _Box(1.5)
    logger = logging.getLogger("tests.reach")

    def plain(g):
        logger.debug("scaled")
        return g * box.value * TWO

    def names_grad(g):
        return g * box.grad

    def holds_many(g, many=tuple(range(17))):
        return g

    assert _reaches_state(plain) == (False, [])
    assert _reaches_state(names_grad)[0]
    assert _reaches_state(holds_many)[0]  # a container past 16 items is not looked into


def test_a_host_hook_hands_over_the_step_tensors_it_holds_through_an_object():
    box, kept = _Box(None), xgrad.tensor([3.0])
    found = []

    def traced(a):
        box.value = xgrad.Tensor(a)
        found.append(_reaches_state(box.read))
        found.append(_reaches_state(lambda g: g * kept))
        return a

    jax.make_jaxpr(traced)(jnp.ones(1))
    (may_read, held), (may_read_kept, held_kept) = found
    assert may_read and held == [box.value]
    assert may_read_kept and held_kept == []  # a tensor of concrete value is not one the step made
