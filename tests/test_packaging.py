"""The installed distribution's metadata, as a package index or a license scanner reads it, and
what pyproject.toml declares is what CI runs (.ci/run) and what the import-time checks accept."""

import importlib.metadata
import re
import sys
import tomllib
import warnings
from pathlib import Path

import jax
import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from tests._scripts import FAST_COMPILE_CANDIDATES, FAST_COMPILES, known_xla_flags
from xgrad import jax_internals

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
CI_RUN = (ROOT / ".ci" / "run").read_text()


def test_license_is_an_spdx_expression_with_its_file():
    meta = importlib.metadata.metadata("xgrad")
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta.get_all("License-File") == ["LICENSE"]
    # PEP 639: the expression replaces license classifiers; both at once is an error for setuptools.
    assert not [c for c in meta.get_all("Classifier") if c.startswith("License ::")]
    assert "Apache License" in (ROOT / "LICENSE").read_text().splitlines()[1]


def test_project_urls_and_classifiers():
    meta = importlib.metadata.metadata("xgrad")
    urls = dict(entry.split(", ", 1) for entry in meta.get_all("Project-URL"))
    assert {"Homepage", "Documentation", "Source", "Issues"} <= set(urls)
    assert all(url.startswith("https://") for url in urls.values())
    classifiers = meta.get_all("Classifier")
    assert "Typing :: Typed" in classifiers
    # Every Python the project admits, up to its cap or else the newest it lists, has its classifier,
    # so an index lists the project under it.
    listed = [int(m) for m in re.findall(r"^Programming Language :: Python :: 3\.(\d+)$", "\n".join(classifiers), flags=re.M)]
    (oldest,) = re.findall(r">=\s*3\.(\d+)", meta["Requires-Python"])
    beyond = re.findall(r"<\s*3\.(\d+)", meta["Requires-Python"]) or [max(listed) + 1]
    assert sorted(listed) == list(range(int(oldest), int(beyond[0])))


def test_pytest_entry_point_is_the_import_free_module():
    (entry,) = [ep for ep in importlib.metadata.entry_points(group="pytest11") if ep.name == "xgrad"]
    assert entry.value == "_xgrad_pytest"


def _ci_setting(name: str) -> str:
    match = re.search(rf'^{name}="?([^"\n]+)"?$', CI_RUN, flags=re.M)
    assert match, f".ci/run sets no {name}"
    return match.group(1)


def _requirement(requirements: list[str], name: str) -> Requirement:
    (found,) = [r for r in map(Requirement, requirements) if r.name == name]
    return found


def _bounds(specifier: SpecifierSet) -> tuple[Version, Version]:
    """``(lowest allowed, first refused)`` of a ``>=A,<B`` range."""
    by_operator = {s.operator: Version(s.version) for s in specifier}
    assert set(by_operator) == {">=", "<"}, f"{specifier} is not a >=A,<B range"
    return by_operator[">="], by_operator["<"]


def _classifier_pythons() -> list[Version]:
    found = [re.fullmatch(r"Programming Language :: Python :: (3\.\d+)", c) for c in PROJECT["classifiers"]]
    return sorted(Version(m.group(1)) for m in found if m)


DECLARED_JAX = _requirement(PROJECT["dependencies"], "jax").specifier


def test_requires_python_is_the_oldest_classifier_with_no_upper_cap():
    requires = SpecifierSet(PROJECT["requires-python"])
    pythons = _classifier_pythons()
    assert [s.operator for s in requires] == [">="], f"requires-python {requires} caps the Python version"
    assert Version(next(iter(requires)).version) == pythons[0]
    assert pythons == [Version("3.11"), Version("3.12"), Version("3.13")]


def test_ci_legs_run_the_ends_of_the_declared_pythons_and_jax():
    lowest_jax, first_refused = _bounds(DECLARED_JAX)
    leg1, leg2 = (Requirement(_ci_setting(leg)).specifier for leg in ("LEG1_JAX", "LEG2_JAX"))
    assert _bounds(leg1)[0] == lowest_jax, f".ci/run's leg 1 installs {leg1}, not the lowest declared JAX {lowest_jax}"
    assert _bounds(leg2)[1] == first_refused, f".ci/run's leg 2 installs {leg2}, not the highest declared JAX"
    assert DECLARED_JAX.contains(_bounds(leg2)[0]) and _bounds(leg1)[1] <= first_refused
    pythons = _classifier_pythons()
    assert (Version(_ci_setting("LEG1_PYTHON")), Version(_ci_setting("LEG2_PYTHON"))) == (pythons[0], pythons[-1])


def test_cuda_extras_allow_the_same_jax():
    extras = PROJECT["optional-dependencies"]
    for extra in ("cuda12", "cuda13"):
        jax_with_cuda = _requirement(extras[extra], "jax")
        assert jax_with_cuda.extras == {extra} and jax_with_cuda.specifier == DECLARED_JAX


def test_extras_match_the_docs():
    extras = PROJECT["optional-dependencies"]
    names = {extra: {Requirement(r).name for r in extras[extra]} for extra in extras}
    assert {"graphviz", "matplotlib"} <= names["viz"]
    assert {"equinox", "flax", "orbax-checkpoint"} <= names["jax-libs"]
    assert {"jupytext", "nbclient", "ipykernel"} <= names["notebooks"]
    (itself,) = [Requirement(r) for r in extras["dev"] if Requirement(r).name == "xgrad"]
    assert itself.extras == {"viz", "notebooks", "jax-libs"}  # the suite runs the docs, notebooks and interop tests


def test_this_interpreter_and_jax_are_declared():
    """Runs on each CI leg: its Python and JAX lie in the declared ranges, and ``import xgrad``
    read this Python's bytecode exactly (no fallback) on every Python CI runs."""
    assert Version(f"{sys.version_info.major}.{sys.version_info.minor}") in _classifier_pythons()
    assert DECLARED_JAX.contains(jax.__version__)
    assert jax_internals.BYTECODE_SCAN_EXACT


def test_readme_test_command_is_what_ci_runs_on_both_legs():
    """Each leg runs README's command whole, on its own interpreter: no leg runs a subset of the files."""
    readme = (ROOT / "README.md").read_text()
    (command,) = re.findall(r"XGRAD_HYPOTHESIS_PROFILE=ci (python -m pytest [^\n`]*)", readme)
    assert " -q " in f"{command} " and "-qq" not in command  # one -q: the "N passed" line stays
    pytest_args = command.removeprefix("python ")
    runs = re.findall(r"^(.*?)(-m pytest.*?)\s*$", CI_RUN, flags=re.M)
    assert [interpreter for interpreter, _ in runs] == ["python ", 'PYTHONPATH="$site" "$py" '], runs
    for interpreter, args in runs:
        assert args == pytest_args, f".ci/run runs {interpreter}{args!r}, not README's {command!r}"


# -- version-sensitive pieces check themselves --------------------------------------------


def test_unknown_xla_flags_are_left_out():
    """An XLA flag this XLA does not know would abort the process at JAX's first computation."""
    kept = FAST_COMPILE_CANDIDATES[0]
    assert known_xla_flags(["--xla_no_such_flag_in_any_xla=1", kept, "--xla_nor_this_one"]) == [kept]
    assert set(FAST_COMPILES.split()) <= set(FAST_COMPILE_CANDIDATES)


def test_bytecode_misread_warns_and_counts_every_name(monkeypatch):
    monkeypatch.setattr(jax_internals, "_scanned_names", lambda code: set())  # a Python whose opcodes are all new
    with pytest.warns(jax_internals.BytecodeScanFallback, match="save all their inputs"):
        assert not jax_internals._check_bytecode_scan()

    def rule(g, out, x, y):
        return g * x

    monkeypatch.setattr(jax_internals, "BYTECODE_SCAN_EXACT", False)
    assert {"g", "out", "x", "y"} <= jax_internals.loaded_names(rule.__code__)


def test_bytecode_read_exactly_checks_quietly():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert jax_internals._check_bytecode_scan()
