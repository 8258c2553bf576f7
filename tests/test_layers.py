"""The import layers: NOTE [Layers] in ``xgrad/engine/README.md`` and the import-linter
contract in ``pyproject.toml`` name the same modules on the same floors, every module has a
floor, and the contract's exemptions are only Tensor's methods reaching up at call time."""

import ast
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "xgrad"
CONTRACT = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"][0]
MAX_EXEMPTIONS = 10


def _top_level_modules() -> set[str]:
    """``tensor``, ``grad_mode``, ...: every module and package directly under ``xgrad``."""
    files = {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    packages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    return files | packages


def _contract_floors() -> list[set[str]]:
    """The contract's layers, bottom first, as top-level module names."""
    return [{name.strip().removeprefix("xgrad.") for name in re.split(r"[:|]", layer)} for layer in reversed(CONTRACT["layers"])]


def _note_floors() -> list[set[str]]:
    """NOTE [Layers]'s numbered list, bottom first: the top-level modules each item names in backticks."""
    text = (PACKAGE / "engine" / "README.md").read_text()
    note = text[text.index("NOTE [Layers]") : text.index("The contract's only exemptions")]
    items = re.findall(r"^\d+\. (.*?)(?=^\d+\. |\Z)", note, re.M | re.S)
    modules = _top_level_modules()
    return [{name.rstrip("/") for name in re.findall(r"`([^`]+)`", item)} & modules for item in items]


def _pattern(expression: str) -> re.Pattern[str]:
    """An import-linter module expression (``*``: one segment, ``**``: any number) as a regex."""
    parts = [{"*": r"[^.]+", "**": r".+"}.get(part, re.escape(part)) for part in expression.split(".")]
    return re.compile(r"\.".join(parts) + r"\Z")


def _module_path(module: str) -> Path | None:
    base = ROOT.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.exists():
            return path
    return None


def _imports(module: str) -> list[tuple[str, int, bool]]:
    """``(imported module, line, inside a function)`` for each xgrad import in ``module`` that runs."""
    path = _module_path(module)
    assert path is not None, module
    found: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and ast.unparse(child.test).endswith("TYPE_CHECKING"):
                continue  # the contract leaves type-checking imports out
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend((alias.name, child.lineno, inside) for alias in child.names if alias.name.startswith("xgrad."))
            elif isinstance(child, ast.ImportFrom) and (child.module or "").startswith("xgrad"):
                for alias in child.names:
                    full = f"{child.module}.{alias.name}"
                    found.append((full if _module_path(full) else child.module, child.lineno, inside))
            visit(child, inside)

    visit(ast.parse(path.read_text()), False)
    return found


def test_note_and_contract_name_the_same_floors():
    assert _note_floors() == _contract_floors()


def test_every_module_has_a_floor():
    placed = set().union(*_contract_floors())
    assert _top_level_modules() - placed == set(), "add the module to a layer in pyproject.toml and NOTE [Layers]"


def test_exemptions_are_tensor_methods_reaching_up_at_call_time():
    exemptions = [tuple(rule.split(" -> ")) for rule in CONTRACT["ignore_imports"]]
    assert len(exemptions) <= MAX_EXEMPTIONS
    for importer, imported in exemptions:
        assert importer.startswith("xgrad.tensor.") and "*" not in importer, importer
        matches = [(line, inside) for target, line, inside in _imports(importer) if _pattern(imported).match(target)]
        assert matches, f"{importer} -> {imported} exempts no import"
        at_import = [line for line, inside in matches if not inside]
        assert at_import == [], f"{importer} imports {imported} at import time (lines {at_import})"
