"""xgrad.save / xgrad.load: round trips in both formats, and no pickle ever."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xgrad

FORMATS = ["npz", "safetensors"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_tensor_round_trip_keeps_values_dtype_and_requires_grad(tmp_path, fmt):
    path = tmp_path / f"t.{fmt}"
    for value, requires_grad in [(np.arange(6.0).reshape(2, 3), True), (np.array(3, np.int32), False)]:
        xgrad.save(xgrad.tensor(value, requires_grad=requires_grad), path)
        loaded = xgrad.load(path)
        assert isinstance(loaded, xgrad.Tensor) and loaded.is_leaf
        assert loaded.dtype == value.dtype and loaded.shape == value.shape
        assert loaded.requires_grad is requires_grad
        np.testing.assert_array_equal(loaded.numpy(), value)


@pytest.mark.parametrize("fmt", FORMATS)
def test_nested_state_dict_round_trip(tmp_path, fmt):
    model = xgrad.nn.MLP([3, 4, 2], key=0)
    state = {"model": model.state_dict(), "step": xgrad.tensor(7), "extras": {"bf16": jnp.ones(3, jnp.bfloat16), "np": np.zeros((0, 2))}}
    path = tmp_path / f"ckpt.{fmt}"
    xgrad.save(state, path)
    loaded = xgrad.load(path)
    assert list(loaded) == ["model", "step", "extras"] and list(loaded["model"]) == list(state["model"])
    for name, t in state["model"].items():
        np.testing.assert_array_equal(loaded["model"][name].numpy(), t.numpy())
    assert loaded["step"].item() == 7
    assert loaded["extras"]["bf16"].dtype == jnp.bfloat16 and loaded["extras"]["bf16"].tolist() == [1.0, 1.0, 1.0]
    assert loaded["extras"]["np"].shape == (0, 2)
    fresh = xgrad.nn.MLP([3, 4, 2], key=5)
    fresh.load_state_dict(loaded["model"])
    x = xgrad.randn(2, 3, key=jax.random.key(0))
    np.testing.assert_array_equal(fresh(x).numpy(), model(x).numpy())


def test_load_onto_device(tmp_path):
    path = tmp_path / "t.npz"
    xgrad.save(xgrad.ones(2), path)
    assert xgrad.load(path, device="cpu:1").device == jax.devices("cpu")[1]


def test_foreign_files_load_as_flat_dicts(tmp_path):
    np.savez(tmp_path / "plain.npz", a=np.ones(2), b=np.arange(3))
    loaded = xgrad.load(tmp_path / "plain.npz")
    assert sorted(loaded) == ["a", "b"] and loaded["b"].tolist() == [0, 1, 2]
    from safetensors.numpy import save_file

    save_file({"w": np.full((2, 2), 5.0, np.float32)}, str(tmp_path / "plain.safetensors"))
    assert xgrad.load(tmp_path / "plain.safetensors")["w"].tolist() == [[5.0, 5.0], [5.0, 5.0]]


class _Evil:
    def __reduce__(self):
        return (print, ("this must never run",))


def test_refuses_pickled_npz(tmp_path, capsys):
    path = tmp_path / "evil.npz"
    np.savez(path, payload=np.array([_Evil()], dtype=object))
    with pytest.raises(ValueError, match="contains pickled objects, which xgrad never unpickles"):
        xgrad.load(path)
    assert "must never run" not in capsys.readouterr().out


def test_bad_input_errors(tmp_path):
    with pytest.raises(ValueError, match="must end in .npz or .safetensors"):
        xgrad.save(xgrad.ones(1), tmp_path / "x.pt")
    with pytest.raises(ValueError, match="must end in .npz or .safetensors"):
        xgrad.load(tmp_path / "x.pkl")
    with pytest.raises(TypeError, match="got list at a"):
        xgrad.save({"a": [1, 2]}, tmp_path / "x.npz")
    with pytest.raises(ValueError, match="without '/'"):
        xgrad.save({"a/b": xgrad.ones(1)}, tmp_path / "x.npz")
    with pytest.raises(ValueError, match="reserved"):
        xgrad.save({"__xgrad__": xgrad.ones(1)}, tmp_path / "x.npz")
