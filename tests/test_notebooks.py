"""Every ``notebooks/*.py`` (jupytext percent format) executes top to bottom in a kernel."""

import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import jupytext
import nbclient
import numpy as np
import pytest

NOTEBOOKS_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("*.py"))


def test_notebooks_exist():
    names = {p.name for p in NOTEBOOKS}
    assert {"01_quickstart.py", "02_compiled_backward.py", "03_testing_your_gradients.py", "04_hooks_and_debugging.py",
            "05_for_jax_users.py"} <= names


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path, monkeypatch):
    notebook = jupytext.read(path)
    assert notebook.cells, f"{path.name} has no cells"
    # Headless plotting; the kernel inherits the environment (and the test session's device split).
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    client = nbclient.NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute()  # raises CellExecutionError naming the failing cell
    errors = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors


def test_hooks_notebook_clips_every_parameter():
    # The clipping cell of notebook 04, run in this process after the cells before it: a
    # hook on every parameter, so every gradient of the model is the clipped one.
    cells = [c.source for c in jupytext.read(NOTEBOOKS_DIR / "04_hooks_and_debugging.py").cells if c.cell_type == "code"]
    clipping = next(i for i, source in enumerate(cells) if "register_hook(lambda g: g.clamp(" in source)
    namespace: dict = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # anomaly mode's warning, as a notebook shows it
        for source in cells[:clipping + 1]:
            exec(compile(source, "04_hooks_and_debugging.py", "exec"), namespace)
    model, data, clip = namespace["model"], namespace["data"], namespace["clip"]
    params = list(model.parameters())
    unclipped = jax.grad(lambda arrays: _mlp_mse(arrays, data.array))([p.array for p in params])
    assert len(params) == 6
    for p, g in zip(params, unclipped, strict=True):
        np.testing.assert_allclose(p.grad.numpy(), np.clip(np.asarray(g), -clip, clip), rtol=1e-5, atol=1e-9)
    assert max(float(np.abs(g).max()) for g in unclipped) > clip  # the clip did change gradients


def _mlp_mse(arrays, x):
    """The notebook's MLP (Linear, Tanh, …; weights stored (out, in)) and its loss against zeros, in jnp."""
    h = x
    for i in range(0, len(arrays), 2):
        h = h @ arrays[i].T + arrays[i + 1]
        if i + 2 < len(arrays):
            h = jnp.tanh(h)
    return jnp.mean(h ** 2)
