"""Studying must not break the check (issue 32): an edited notebook is tested as committed, and named.

``tools/pristine.py`` finds the notebooks whose working copy differs from ``HEAD`` and writes the committed
version beside each; the root ``conftest.py`` collects those copies instead. The last test runs the real
conftest on a small git repository: a notebook whose outputs a learner changed still passes, the output
names it with the ``git restore`` line, the learner's file is left as it was, and ``--working-notebooks``
tests the edited copy (which then fails, as it should).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import pristine

REPO = Path(__file__).resolve().parents[1]
needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                   env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t"})


def _notebook(output: str) -> dict:
    return {"nbformat": 4, "nbformat_minor": 5,
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
            "cells": [{"cell_type": "code", "id": "c1", "metadata": {}, "execution_count": 1, "source": "print(6 * 7)",
                       "outputs": [{"output_type": "stream", "name": "stdout", "text": output}]}]}


def _repo(tmp_path: Path, appendix: bool = True) -> Path:
    repo = tmp_path / "repo"
    (repo / "notebooks" / "appendix").mkdir(parents=True)
    (repo / "notebooks" / "01_a.ipynb").write_text(json.dumps(_notebook("42\n")))
    if appendix:
        (repo / "notebooks" / "appendix" / "01a_b.ipynb").write_text(json.dumps(_notebook("42\n")))
    (repo / "notebooks" / "02_c.ipynb").write_text(json.dumps(_notebook("42\n")))
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "committed")
    return repo


@needs_git
def test_finds_the_edited_notebooks_and_writes_their_committed_version(tmp_path):
    repo = _repo(tmp_path)
    assert pristine.edited_notebooks(repo) == []
    (repo / "notebooks" / "01_a.ipynb").write_text(json.dumps(_notebook("learner's note\n")))
    (repo / "notebooks" / "appendix" / "01a_b.ipynb").write_text(json.dumps(_notebook("43\n")))
    (repo / "notebooks" / "03_new.ipynb").write_text(json.dumps(_notebook("42\n")))  # untracked: nothing to test instead
    edited = pristine.edited_notebooks(repo)
    assert edited == sorted([(repo / "notebooks" / "01_a.ipynb").resolve(),
                             (repo / "notebooks" / "appendix" / "01a_b.ipynb").resolve()])
    mapping = pristine.write_pristine_copies(repo, edited)
    try:
        copy = Path(mapping[str(edited[0])])
        assert copy == edited[0].with_name(f".01_a.{os.getpid()}.committed.ipynb")
        assert pristine.working_name(copy.name) == "01_a.ipynb" and pristine.working_name(".01_a.committed.ipynb") == "01_a.ipynb"
        assert json.loads(copy.read_text())["cells"][0]["outputs"][0]["text"] == "42\n"
        assert "learner's note" in edited[0].read_text()  # the learner's copy is left as it was
        os.environ[pristine.ENV] = json.dumps(mapping)
        assert pristine.pristine(edited[0]) == copy and pristine.pristine(repo / "notebooks" / "02_c.ipynb") == repo / "notebooks" / "02_c.ipynb"
    finally:
        os.environ.pop(pristine.ENV, None)
        pristine.remove_pristine_copies(mapping)
    assert not any(p.name.endswith(pristine.SUFFIX) for p in (repo / "notebooks").rglob("*"))


def test_outside_a_git_checkout_nothing_is_mapped(tmp_path):
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "01_a.ipynb").write_text(json.dumps(_notebook("42\n")))
    assert pristine.edited_notebooks(tmp_path) == []


@needs_git
def test_the_test_command_passes_on_an_edited_notebook_and_names_it(tmp_path):
    """The root conftest on a small repository: nbval on an edited notebook (its output changed as a run in
    JupyterLab changes it) tests the committed version, passes, and says which notebook and how to restore it."""
    repo = _repo(tmp_path, appendix=False)
    shutil.copy(REPO / "conftest.py", repo / "conftest.py")
    (repo / "tools").mkdir()
    shutil.copy(REPO / "tools" / "pristine.py", repo / "tools" / "pristine.py")
    (repo / "pytest.ini").write_text("[pytest]\ntestpaths = notebooks\naddopts = -p no:cacheprovider --nbval --nbval-current-env\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "harness")
    edited = repo / "notebooks" / "01_a.ipynb"
    edited.write_text(json.dumps(_notebook("my own output\n")))
    before = edited.read_bytes()
    # nbval and the conftest are the plugins under test; the other installed ones (hypothesis, anyio, ...: about 1 s
    # of each run's start) are not loaded, and xdist stays off
    env = {k: v for k, v in os.environ.items() if k != pristine.ENV} | {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    cmd = [sys.executable, "-m", "pytest", "-p", "nbval", "-p", "no:xdist", "-q"]
    run = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 differ from the committed version" in run.stdout and "01_a.ipynb" in run.stdout
    assert "git restore notebooks/01_a.ipynb" in run.stdout
    assert "2 passed" in run.stdout  # 01_a (its committed version) and 02_c
    assert edited.read_bytes() == before
    assert not list((repo / "notebooks").glob(".*" + pristine.SUFFIX))  # the copies are removed at the end
    own = subprocess.run(cmd + ["--working-notebooks", "notebooks/01_a.ipynb"], cwd=repo, capture_output=True, text=True, env=env, timeout=300)
    assert own.returncode == 1 and "01_a.ipynb" in own.stdout and "differ from the committed" not in own.stdout
    named = subprocess.run(cmd + ["notebooks/01_a.ipynb"], cwd=repo, capture_output=True, text=True, env=env, timeout=300)
    assert named.returncode == 1, named.stdout  # a notebook named on the command line is tested as it is
