"""Small helpers the test files share."""

from typing import Any

import numpy as np

import xgrad


def as_tensors(tree: Any) -> Any:
    """The tree with every array leaf a leaf Tensor that requires grad."""
    import equinox as eqx
    import jax

    return jax.tree_util.tree_map(lambda a: xgrad.tensor(a, requires_grad=True) if eqx.is_array(a) else a, tree)


def grads_of(tree: Any) -> list[Any]:
    """The ``.grad`` arrays of the tree's Tensors, in leaf order."""
    import jax

    return [t.grad.array for t in jax.tree_util.tree_leaves(tree, is_leaf=xgrad.is_tensor) if xgrad.is_tensor(t)]


def leaf(values: Any) -> xgrad.Tensor:
    """A float64 leaf that requires grad."""
    return xgrad.tensor(np.asarray(values, dtype=np.float64), requires_grad=True)


def close(actual: Any, expected: Any) -> None:
    """Equal to float64 precision (Tensors, arrays or lists)."""
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), rtol=1e-12, atol=1e-12)


def assert_view_write_matches(step: Any, reference: Any, shape: tuple[int, int], modes: tuple[str, ...]) -> None:
    """Gradients of a program that writes through a view of ``b = x * 1.5`` equal its functional rewrite's.

    ``step(b, y)`` writes through views of ``b`` and returns a tensor it reads; ``reference(b, y)``
    is the same in ``jax.numpy``, returning the new ``b`` and that tensor.
    """
    import jax.numpy as jnp

    from xgrad.testing import assert_grads_match

    def fn(x: Any, y: Any) -> Any:
        b = x * 1.5
        read = step(b, y)
        return (b * x).sin().sum() + (read * read).sum()

    def ref(x: Any, y: Any) -> Any:
        b, read = reference(x * 1.5, y)
        return jnp.sin(b * x).sum() + (read * read).sum()

    rng = np.random.default_rng(0)
    x, y = rng.standard_normal(shape), rng.standard_normal(shape[1])
    assert_grads_match(fn, x, y, reference=ref, modes=modes)
