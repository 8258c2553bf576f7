"""Every fenced ``python`` block of README.md and docs/*.md runs as written, page by page.

The conventions (CONTRIBUTING.md, "Examples in the docs"), each a comment on a block's first line:

- none: the block is a program of its own, run in a fresh namespace;
- ``# continues the previous block``: it runs in the namespace the previous block of the same
  page left;
- ``# run with XLA_FLAGS=...``: it runs as a script in a fresh interpreter with that
  environment (several host devices);
- ``# run in N processes: python example.py COORDINATOR PROCESS_ID``: it runs as a script in N
  fresh interpreters joined over ``jax.distributed`` on a loopback address (the suite never
  contacts another address).

A block that fails names its page and line in the traceback (the code is compiled with the
page as its file name and its own line numbers).
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import settings

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

CONTINUES = "# continues the previous block"
RUN_WITH = re.compile(r"# run with (?P<env>(?:\w+=\S+ ?)+)$")
RUN_IN_PROCESSES = re.compile(r"# run in (?P<n>\d+) processes: python \S+\.py COORDINATOR PROCESS_ID$")
PROCESS_TIMEOUT_S = 120


@dataclass(frozen=True)
class Block:
    """One fenced ``python`` block: its page, the page line of its first code line, its code."""

    page: Path
    line: int
    source: str

    @property
    def first_line(self) -> str:
        return self.source.split("\n", 1)[0].strip()

    def compiled(self):
        # Padded so that tracebacks show the page's own line numbers (and linecache its text).
        return compile("\n" * (self.line - 1) + self.source, str(self.page), "exec")


def python_blocks(page: Path) -> list[Block]:
    """The page's fenced blocks tagged ``python``, in order."""
    blocks, lines = [], page.read_text().splitlines()
    start = None
    for number, line in enumerate(lines, 1):
        if start is None and line.strip() == "```python":
            start = number + 1
        elif start is not None and line.strip() == "```":
            # Dedented: a block inside a list item is indented on the page.
            blocks.append(Block(page, start, textwrap.dedent("\n".join(lines[start - 1:number - 1]) + "\n")))
            start = None
    assert start is None, f"{page.name}: the python block opened at line {start - 1} is never closed"
    return blocks


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _environment(extra: dict[str, str]) -> dict[str, str]:
    # A fresh interpreter as a user's: none of the test session's XLA flags or x64 switch. The checkout
    # comes first on its path, before any packages folder the session's own PYTHONPATH names (CI's leg 2).
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "JAX_"))}
    path = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return {**env, "PYTHONPATH": path, "MPLBACKEND": "Agg", **extra}


def chains(blocks: list[Block]) -> list[list[Block]]:
    """The blocks grouped into runs: a block and the blocks that continue it."""
    grouped: list[list[Block]] = []
    for block in blocks:
        if block.first_line == CONTINUES:
            assert grouped, f"{block.page.name}: the python block at line {block.line} continues nothing"
            grouped[-1].append(block)
        else:
            grouped.append([block])
    return grouped


def script_of(chain: list[Block]) -> str:
    """The chain as one script, each block on its page lines (blank lines between)."""
    source = ""
    for block in chain:
        source += "\n" * (block.line - 1 - source.count("\n")) + block.source
    return source


def _run_scripts(chain: list[Block], tmp_path: Path, argvs: list[list[str]], env: dict[str, str]) -> None:
    head = chain[0]
    script = tmp_path / f"{head.page.stem}_line{head.line}.py"
    script.write_text(script_of(chain))
    procs = [subprocess.Popen([sys.executable, str(script), *argv], cwd=tmp_path, env=_environment(env),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for argv in argvs]
    try:
        outputs = [proc.communicate(timeout=PROCESS_TIMEOUT_S)[0] for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
    for proc, output in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, f"{head.page.name}, the example at line {head.line}:\n{output}"


def run_chain(chain: list[Block], tmp_path: Path) -> dict:
    """Run a block and its continuations as the first block's first line says.

    Returns the namespace they leave (empty for those run in other processes).
    """
    head = chain[0].first_line
    if (match := RUN_IN_PROCESSES.match(head)) is not None:
        count, coordinator = int(match["n"]), f"127.0.0.1:{_free_port()}"
        _run_scripts(chain, tmp_path, [[coordinator, str(i)] for i in range(count)], {})
        return {}
    if (match := RUN_WITH.match(head)) is not None:
        _run_scripts(chain, tmp_path, [[]], dict(item.split("=", 1) for item in match["env"].split()))
        return {}
    namespace: dict = {"__name__": "__main__"}
    with _plain_hypothesis():
        for block in chain:
            exec(block.compiled(), namespace)
        # A test a block defines (a hypothesis property) runs, as a plain pytest would run it.
        for name, test in list(namespace.items()):
            if name.startswith("test_") and callable(test):
                test()
    return namespace


@contextlib.contextmanager
def _plain_hypothesis():
    """Hypothesis's own defaults, as a reader's ``pytest`` has them (200 ms deadline, health
    checks), not this suite's profile; only fewer examples, always the same, and no database."""
    previous = settings.default
    settings.register_profile("_docs_plain", settings.get_profile("default"), max_examples=5, derandomize=True,
                              database=None)
    settings.load_profile("_docs_plain")
    try:
        yield
    finally:
        settings.register_profile("_docs_restored", previous)
        settings.load_profile("_docs_restored")


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_page_examples_run(page, tmp_path, monkeypatch):
    blocks = python_blocks(page)
    assert blocks, f"{page.name} has no python blocks"
    monkeypatch.chdir(tmp_path)  # examples that write files write them here
    for chain in chains(blocks):
        run_chain(chain, tmp_path)


def test_blocks_chains_and_page_lines(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("intro\n```python\nx = 1\n```\n\n```bash\nls\n```\n```python\n# continues the previous block\n"
                    "y = x + 1\n```\n- item\n  ```python\n  z = x\n  ```\n")
    first, second, third = python_blocks(page)
    assert (first.line, first.source, second.line, third.line, third.source) == (3, "x = 1\n", 10, 15, "z = x\n")
    assert chains([first, second, third]) == [[first, second], [third]]
    assert script_of([first, second]).split("\n")[9:11] == [CONTINUES, "y = x + 1"]
    assert run_chain([first, second], tmp_path)["y"] == 2
    with pytest.raises(NameError) as info:  # a block that does not continue starts afresh
        run_chain([third], tmp_path)
    assert info.traceback[-1].lineno == 14  # the page's line 15, counted from 0
    with pytest.raises(AssertionError, match="continues nothing"):
        chains([second])


def test_tests_a_block_defines_run(tmp_path):
    block = Block(tmp_path / "page.md", 1, "calls = []\ndef test_it():\n    calls.append(1)\n")
    assert run_chain([block], tmp_path)["calls"] == [1]
    failing = Block(tmp_path / "page.md", 1, "def test_it():\n    assert False, 'the property failed'\n")
    with pytest.raises(AssertionError, match="the property failed"):
        run_chain([failing], tmp_path)


def test_scripts_run_in_other_processes_on_loopback(tmp_path):
    page = tmp_path / "page.md"
    with_env = Block(page, 1, "# run with XLA_FLAGS=--flag_a FOO=1\nimport os\n"
                              "assert os.environ['XLA_FLAGS'] == '--flag_a' and os.environ['FOO'] == '1'\n")
    assert run_chain([with_env], tmp_path) == {}
    processes = Block(page, 1, "# run in 2 processes: python example.py COORDINATOR PROCESS_ID\nimport sys\n"
                               "host, port = sys.argv[1].split(':')\nassert host == '127.0.0.1' and int(port) > 0\n"
                               "open(f'process{sys.argv[2]}', 'w').close()\n")
    run_chain([processes], tmp_path)
    assert {p.name for p in tmp_path.glob("process*")} == {"process0", "process1"}
    wrong = Block(page, 1, "# run with FOO=1\nraise SystemExit(3)\n")
    with pytest.raises(AssertionError, match="the example at line 1"):
        run_chain([wrong], tmp_path)


def test_import_xgrad_exposes_the_subpackages_the_docs_use_lazily():
    code = (
        "import sys, xgrad\n"
        "lazy = ['xgrad.testing', 'xgrad.func', 'xgrad.distributed', 'xgrad.utils', 'xgrad.utils.data']\n"
        "assert not [m for m in lazy if m in sys.modules], [m for m in lazy if m in sys.modules]\n"
        "assert {'testing', 'func', 'distributed', 'utils'} <= set(dir(xgrad))\n"
        "assert callable(xgrad.testing.gradcheck) and callable(xgrad.func.vmap)\n"
        "assert xgrad.distributed.CheckpointManager and xgrad.utils.data.DataLoader\n"
        "try:\n    xgrad.no_such_thing\nexcept AttributeError as e:\n    assert 'no_such_thing' in str(e)\n"
        "else:\n    raise SystemExit('no AttributeError')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], env=_environment({}), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_the_non_leaf_grad_warning_points_to_a_docs_section_that_exists():
    import warnings

    import xgrad
    from xgrad.tensor.core import WARN_NON_LEAF_GRAD

    y = xgrad.tensor([1.0], requires_grad=True) * 2
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert y.grad is None
    (message,) = [str(w.message) for w in caught]
    assert message == WARN_NON_LEAF_GRAD and "github.com" not in message
    section = re.search(r'"([^"]+)" in xgrad\'s docs/(\S+\.md)', message)
    assert section is not None, message
    title, page = section.groups()
    assert f"**{title}.**" in (ROOT / "docs" / page).read_text().replace("`", "")
    assert "help(xgrad.Tensor.retain_grad)" in message and xgrad.Tensor.retain_grad.__doc__
