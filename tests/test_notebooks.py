"""Every ``notebooks/*.py`` (jupytext percent format) executes top to bottom in a kernel."""

from pathlib import Path

import jupytext
import nbclient
import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.py"))


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
