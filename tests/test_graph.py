"""The recorded graph: Node, Edge, AccumulateGrad, sequence and topological numbers, saved tensors."""

import threading

import jax.numpy as jnp
import pytest

import xgrad
from xgrad import autograd
from xgrad.autograd.graph import Node
from xgrad.engine.node import AccumulateGrad, Edge, GraphRoot
from xgrad.ops import defprim


@pytest.fixture
def ab():
    return xgrad.tensor([1.0, 2.0], requires_grad=True), xgrad.tensor([3.0, 4.0], requires_grad=True)


def test_next_functions_and_names(ab):
    a, b = ab
    y = (a * b).exp().sum()
    assert y.grad_fn.name() == "SumBackward" and isinstance(y.grad_fn, Node)
    ((exp, exp_nr),) = y.grad_fn.next_functions
    assert exp.name() == "ExpBackward" and exp_nr == 0
    ((mul, _),) = exp.next_functions
    (acc_a, nr_a), (acc_b, nr_b) = mul.next_functions
    assert mul.name() == "MulBackward" and nr_a == nr_b == 0
    assert isinstance(acc_a, AccumulateGrad) and acc_a.name() == "AccumulateGrad"
    assert acc_a.variable is a and acc_b.variable is b and acc_a.next_functions == ()
    assert mul.next_edges == (Edge(acc_a, 0), Edge(acc_b, 0))


def test_constant_and_non_grad_inputs_have_no_edge(ab):
    a, _ = ab
    c = xgrad.tensor([5.0, 6.0])
    assert (a * 2).grad_fn.next_functions[1] == (None, 0)
    assert (a * c).grad_fn.next_functions[1] == (None, 0)


def test_one_accumulate_grad_per_leaf(ab):
    a, b = ab
    n1 = (a * b).grad_fn.next_functions[0][0]
    p = a + 1
    n2 = p.grad_fn.next_functions[0][0]
    assert n1 is n2


def test_multi_output_nodes_use_input_nr():
    halves = xgrad.ops.from_jax(lambda v: (v[:2], v[2:] ** 2), name="halves")
    x = xgrad.tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True)
    first, second = halves(x)
    assert first.grad_fn is second.grad_fn and first.output_nr == 0 and second.output_nr == 1
    assert first.grad_fn.name() == "HalvesBackward" and first.grad_fn.num_inputs == 2
    total = first.sum() * second.sum()
    (s1, _), (s2, _) = total.grad_fn.next_functions
    assert s1.next_functions[0] == (first.grad_fn, 0) and s2.next_functions[0] == (second.grad_fn, 1)
    total.backward()
    # d/dx [(x0 + x1) * (x2^2 + x3^2)]
    assert x.grad.tolist() == [25.0, 25.0, 18.0, 24.0]


def test_input_metadata_describes_outputs(ab):
    a, _ = ab
    y = (a.astype(jnp.float32) * 2).reshape(2, 1)
    (meta,) = y.grad_fn.input_metadata
    assert meta.shape == (2, 1) and meta.dtype == jnp.float32 and meta.sharding == y.sharding and meta.ndim == 2


def test_metadata_is_a_per_node_dict(ab):
    a, b = ab
    y = a * b
    y.grad_fn.metadata["tag"] = "mine"
    assert y.grad_fn.metadata == {"tag": "mine"} and (a * b).grad_fn.metadata == {}


def test_sequence_nr_is_creation_order_per_thread(ab):
    a, b = ab
    p = a * b
    q = p.exp()
    r = q + p
    assert p.grad_fn.sequence_nr < q.grad_fn.sequence_nr < r.grad_fn.sequence_nr
    seen = []

    def worker():
        first = (a * b).grad_fn.sequence_nr
        second = (a * b).grad_fn.sequence_nr
        seen.append((first, second))

    before = (a * b).grad_fn.sequence_nr
    t = threading.Thread(target=worker)
    t.start()
    t.join()
    (first, second), = seen
    assert second == first + 1 and first < before  # a fresh thread counts from its own start
    assert (a * b).grad_fn.sequence_nr == before + 1  # the worker did not advance this thread's count


def test_topological_nr_is_longest_path_to_a_leaf(ab):
    a, b = ab
    acc = (a * b).grad_fn.next_functions[0][0]
    assert acc.topological_nr == 0
    p = a * b  # 1
    q = p.exp()  # 2
    r = q + a  # max(2, 0) + 1
    s = r * p  # max(3, 1) + 1
    assert [t.grad_fn.topological_nr for t in (p, q, r, s)] == [1, 2, 3, 4]
    assert (xgrad.tensor(1.0) * a).grad_fn.topological_nr == 1


def test_graph_root_for_several_roots(ab):
    a, b = ab
    edges = (Edge((a * 2).grad_fn, 0), Edge((b * 3).grad_fn, 0))
    root = GraphRoot(edges, [xgrad.ones(2), xgrad.ones(2)])
    assert root.name() == "GraphRoot" and root.next_edges == edges and root.input_metadata == ()


def test_saved_tensors_are_freed_after_backward(ab):
    a, b = ab
    y = (a * b).sum()
    y.backward()
    with pytest.raises(RuntimeError, match=r"^Trying to backward through the graph a second time \(or directly "
                       r"access saved tensors after they have already been freed\)"):
        y.backward()
    z = (a * b).sum()
    z.backward(retain_graph=True)
    z.backward()
    assert a.grad.tolist() == [9.0, 12.0]  # three backward passes of d(a*b)/da = b


def test_node_that_saved_nothing_can_run_again(ab):
    a, b = ab
    y = (a + b).sum() - a.sum()  # add, sum and sub save no tensors
    y.backward()
    y.backward()
    assert a.grad.tolist() == [0.0, 0.0] and b.grad.tolist() == [2.0, 2.0]


def test_node_that_saved_only_shapes_can_run_again():
    counted = []
    link = defprim(
        "graph_test_shape_only", lambda x: x * 2.0, [lambda g, out, x: counted.append(x.shape) or g * 2.0],
        save=(), register=False,
    )
    x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    y = link(x).sum()
    y.backward()
    y.backward()
    assert counted == [(2,), (2,)] and x.grad.tolist() == [4.0, 4.0]


def test_freed_graph_error_leaves_the_engine_usable(ab):
    a, b = ab
    y = (a * b).sum()
    y.backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        autograd.grad(y, a)
    (g,) = autograd.grad((a * b).sum(), a)
    assert g.tolist() == b.tolist()
