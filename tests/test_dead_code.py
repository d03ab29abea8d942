"""tools/dead_code.py: no public definition of helpers that no notebook, module or script uses.

The tool is also run on a tiny synthetic repository, so that it cannot pass by finding nothing.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "dead_code.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_helpers_has_no_dead_public_definition():
    res = _run()
    assert res.returncode == 0, "dead public definitions (delete them, or use them):\n" + res.stdout + res.stderr


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")


def _notebook(path: Path, code: list[str], markdown: list[str] = ()) -> None:
    cells = [{"cell_type": "markdown", "metadata": {}, "source": m} for m in markdown]
    cells += [{"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [], "source": c} for c in code]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}), encoding="utf-8")


def _toy_repo(root: Path) -> None:
    """A package ``toypkg``: used, test-only and unused definitions, and the uses that do and do not count."""
    _write(root / "toypkg" / "__init__.py", """\
        from .mod import Thing, fenced, helper_of_dead, only_in_tests, unused, used, used_by_script
        __all__ = ["Thing", "fenced", "helper_of_dead", "only_in_tests", "unused", "used", "used_by_script"]
        """)
    _write(root / "toypkg" / "mod.py", """\
        import json

        __all__ = ["unused"]  # an __all__ entry is not a use


        def used():
            return _private()


        def _private():
            return internal_but_live()


        def internal_but_live():  # called only inside its module, by a live function
            return 1


        def fenced():  # used only in a markdown code fence of a notebook
            return 2


        def used_by_script():
            return 3


        def by_name():  # named by a "module:function" string, as the practice deck names its checkers
            return 8


        CHECKERS = ("toypkg.mod:by_name",)


        def only_in_tests():
            return 4


        def unused():
            return helper_of_dead()


        def helper_of_dead():  # only a dead function calls it: dead too
            return 5


        class Thing(json.JSONEncoder):
            def __init__(self):
                super().__init__()

            def default(self, o):  # overrides json.JSONEncoder.default: exempt
                return str(o)

            def live_method(self):
                return 6

            def dead_method(self):
                return 7
        """)
    _notebook(root / "notebooks" / "01_toy.ipynb",
              code=["%matplotlib inline\nfrom toypkg import used, Thing\nused()\nThing().live_method()"],
              markdown=["Solution:\n\n```python\nfrom toypkg import fenced\nfenced()\n```\n"])
    _write(root / "experiments" / "run.py", "from toypkg import used_by_script\nused_by_script()\n")
    _write(root / "tests" / "test_toy.py", """\
        from toypkg import only_in_tests, unused, Thing
        def test_it():
            assert only_in_tests() == 4 and unused() == 5 and Thing().dead_method() == 7
        """)


def test_the_tool_finds_test_only_and_unused_definitions(tmp_path):
    _toy_repo(tmp_path)
    res = _run("--root", str(tmp_path), "--package", "toypkg", "-v")
    found = {line.split(": ", 1)[1].split(" (")[0] for line in res.stdout.splitlines() if " is used by no " in line}
    assert found == {"def only_in_tests", "def unused", "def helper_of_dead", "method Thing.dead_method"}, res.stdout
    assert res.returncode == 1
    assert "toypkg/mod.py:" in res.stdout  # where each one is


def test_the_tool_passes_once_the_dead_code_is_gone(tmp_path):
    _toy_repo(tmp_path)
    mod = tmp_path / "toypkg" / "mod.py"
    src = mod.read_text()
    for name in ("only_in_tests", "unused", "helper_of_dead"):
        start = src.index(f"def {name}(")
        src = src[:start] + src[src.index("\n\n\n", start) + 3:]
    src = src.replace("    def dead_method(self):\n        return 7\n", "")
    mod.write_text(src)
    init = tmp_path / "toypkg" / "__init__.py"
    init.write_text("from .mod import Thing, fenced, used, used_by_script\n")
    res = _run("--root", str(tmp_path), "--package", "toypkg")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "0 unused" in res.stdout
