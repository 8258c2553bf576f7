"""The table of ops xgrad.ops.OPS (NOTE [Op names come from OPS] in xgrad/ops/tensor_methods.py) and what is generated from it.

Every list of op names comes from ``xgrad.ops.OPS``: the methods attached to ``Tensor``,
``DIFFERENTIABLE_OPS``, and the two files written by ``python -m xgrad.ops.gen_tensor_stub``
(``xgrad.ops.__all__`` and the stub ``xgrad/tensor/op_methods.pyi``), which must be fresh.
"""

import ast
import inspect
from pathlib import Path

import pytest

import xgrad
import xgrad.ops
from xgrad.ops import gen_tensor_stub
from xgrad.ops.tensor_methods import differentiable_names, exported_names, methods
from xgrad.tensor import Tensor
from xgrad.tensor import core as tensor_core

REPO = Path(__file__).resolve().parent.parent


def test_the_generated_stub_and_all_are_fresh():
    assert gen_tensor_stub.render_stub() == gen_tensor_stub.STUB_PATH.read_text(), (
        "xgrad/tensor/op_methods.pyi is stale: run python -m xgrad.ops.gen_tensor_stub"
    )
    source = gen_tensor_stub.OPS_INIT_PATH.read_text()
    assert gen_tensor_stub.render_ops_init(source) == source, (
        "xgrad.ops.__all__ is stale: run python -m xgrad.ops.gen_tensor_stub"
    )
    assert gen_tensor_stub.main(["--check"]) == 0


def test_op_names_and_methods_come_from_the_table():
    table = xgrad.ops.OPS
    assert xgrad.ops.DIFFERENTIABLE_OPS == differentiable_names(table)
    assert sorted(xgrad.ops.__all__, key=str.lower) == sorted(
        [*exported_names(table), *xgrad.ops.REGISTRY_API], key=str.lower
    )
    names = [op.name for op in table]
    assert len(names) == len(set(names))
    for name, kind, op in methods(table):
        attached = Tensor.__dict__[name]
        if kind == "methods":  # arithmetic operators wrap theirs to defer to sparse tensors (ops/tensor_methods.py)
            assert attached is op.fn or attached.__wrapped__ is op.fn, name
        elif kind == "properties":
            assert isinstance(attached, property) and attached.fget is op.fn, name
        else:
            assert callable(attached) and attached is not op.fn, name
    # Every op function xgrad.ops exports is a row of the table.
    rows = {id(op.fn) for op in table}
    for name in xgrad.ops.__all__:
        value = getattr(xgrad.ops, name)
        if name not in xgrad.ops.REGISTRY_API:
            assert id(value) in rows, name
        assert getattr(xgrad, name) is value


def test_no_list_of_op_names_is_kept_by_hand():
    # The only literal collection of names left in xgrad/ops/__init__.py is the generated __all__,
    # and Tensor declares no op method of its own for type checkers (the stub does).
    tree = ast.parse(gen_tensor_stub.OPS_INIT_PATH.read_text())
    literal_lists = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, (ast.List, ast.Tuple, ast.Set, ast.Dict)):
            elements = node.value.keys if isinstance(node.value, ast.Dict) else node.value.elts
            if sum(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in elements) > 4:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                literal_lists.extend(t.id for t in targets if isinstance(t, ast.Name))
    assert literal_lists == ["__all__"]
    core_source = inspect.getsource(tensor_core)
    for name, _, _ in methods(xgrad.ops.OPS):
        assert f"def {name}(" not in core_source, name


SNIPPET = """\
import xgrad

t = xgrad.tensor([1.0, 2.0])
reveal_type(t.sum())
reveal_type(t.exp().sum(dim=0, keepdim=True))
reveal_type(t.add_(1.0) + 1)
reveal_type(t.T @ t)
t.smu()
"""


@pytest.mark.slow
def test_mypy_sees_the_op_methods_and_rejects_a_misspelt_one(tmp_path):
    from mypy import api

    (tmp_path / "snippet.py").write_text(SNIPPET)
    # JAX's and NumPy's own types are not under test: skipping them keeps this to seconds.
    (tmp_path / "mypy.ini").write_text(
        f"[mypy]\npython_version = 3.11\nignore_missing_imports = True\nmypy_path = {REPO}\n"
        "[mypy-jax.*,jaxlib.*,numpy.*,ml_dtypes.*,optax.*,scipy.*,opt_einsum.*]\nfollow_imports = skip\n"
    )
    out, err, status = api.run(
        ["--config-file", str(tmp_path / "mypy.ini"), "--cache-dir", str(tmp_path / "cache"), str(tmp_path / "snippet.py")]
    )
    lines = [line.split("snippet.py:", 1)[1] for line in out.splitlines() if "snippet.py:" in line]
    assert lines == [
        '4: note: Revealed type is "xgrad.tensor.core.Tensor"',
        '5: note: Revealed type is "xgrad.tensor.core.Tensor"',
        '6: note: Revealed type is "xgrad.tensor.core.Tensor"',
        '7: note: Revealed type is "xgrad.tensor.core.Tensor"',
        '8: error: "Tensor" has no attribute "smu"  [attr-defined]',
    ], out + err
    assert status == 1
