"""The installed distribution's metadata, as a package index or a license scanner reads it."""

import importlib.metadata
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent


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
    # Every Python the project admits has its classifier, so an index lists the project under it.
    (oldest,) = re.findall(r">=\s*3\.(\d+)", meta["Requires-Python"])
    (beyond,) = re.findall(r"<\s*3\.(\d+)", meta["Requires-Python"])
    for minor in range(int(oldest), int(beyond)):
        assert f"Programming Language :: Python :: 3.{minor}" in classifiers


def test_pytest_entry_point_is_the_import_free_module():
    (entry,) = [ep for ep in importlib.metadata.entry_points(group="pytest11") if ep.name == "xgrad"]
    assert entry.value == "_xgrad_pytest"
