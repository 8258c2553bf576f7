"""The default-dtype rule (xgrad/creation.py's docstring): PyTorch's defaults where JAX's x64 switch allows."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _scripts import run_json

import xgrad


def test_python_floats_and_factories_agree_on_float32_with_x64_on():
    assert jax.config.jax_enable_x64  # the test session's setting
    made = {
        "tensor(1.0)": xgrad.tensor(1.0), "tensor([1.0, 2])": xgrad.tensor([1.0, 2]), "full": xgrad.full((2,), 1.5),
        "arange": xgrad.arange(0.0, 1.0, 0.5), "arange(end=2.0)": xgrad.arange(2.0), "zeros": xgrad.zeros(2),
        "ones": xgrad.ones(2), "eye": xgrad.eye(2), "randn": xgrad.randn(2), "rand": xgrad.rand(2),
        "Linear": xgrad.nn.Linear(2, 2, key=0).weight,
    }
    assert {name: t.dtype.name for name, t in made.items()} == dict.fromkeys(made, "float32")
    assert xgrad.tensor(1).dtype == jnp.int64 and xgrad.full((1,), 3).dtype == jnp.int64 and xgrad.arange(3).dtype == jnp.int64
    assert xgrad.tensor([True]).dtype == jnp.bool_ and xgrad.tensor(1j).dtype == jnp.complex64
    # arrays keep theirs; dtype= wins
    assert xgrad.tensor(np.ones(2)).dtype == jnp.float64 and xgrad.tensor(np.float64(1.0)).dtype == jnp.float64
    assert xgrad.tensor(jnp.ones(2, jnp.float64)).dtype == jnp.float64 and xgrad.tensor(np.ones(2, np.float16)).dtype == jnp.float16
    assert xgrad.tensor([1.0], dtype=jnp.float64).dtype == jnp.float64 and xgrad.full((1,), 1.5, dtype=jnp.float64).dtype == jnp.float64
    # a Python scalar meeting a tensor keeps the tensor's dtype
    assert (xgrad.tensor(np.ones(2)) * 2.5).dtype == jnp.float64 and (xgrad.zeros(2) + 1.0).dtype == jnp.float32


@pytest.mark.slow
def test_float64_data_with_x64_off_warns_and_becomes_float32():
    result = run_json(
        """
        jax.config.update("jax_enable_x64", False)
        import json, warnings
        import numpy as np
        import xgrad
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            narrowed = xgrad.tensor(np.ones(2))
            complex_ = xgrad.tensor(np.ones(2, np.complex128))
            quiet = [xgrad.tensor([1.0]).dtype.name, xgrad.tensor(np.arange(3)).dtype.name, xgrad.tensor(np.ones(2, np.float32)).dtype.name]
        print(json.dumps({
            "dtypes": [narrowed.dtype.name, complex_.dtype.name], "quiet": quiet,
            "warnings": [(w.category.__name__, str(w.message), w.filename) for w in caught],
            "defaults": [xgrad.tensor(1.0).dtype.name, xgrad.zeros(1).dtype.name, xgrad.tensor(1).dtype.name],
        }))
        """,
        devices=1,
    )
    assert result["dtypes"] == ["float32", "complex64"] and result["quiet"] == ["float32", "int32", "float32"]
    assert [w[0] for w in result["warnings"]] == ["UserWarning", "UserWarning"]
    assert "float64 data became float32 because jax_enable_x64 is off" in result["warnings"][0][1]
    assert result["warnings"][0][2] == "<string>"  # points at the caller's line
    assert result["defaults"] == ["float32", "float32", "int32"]
