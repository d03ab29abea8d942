"""The committed notebooks, for the test command, when a learner's working copies differ.

Studying edits the notebooks: running a cell rewrites its outputs, and JupyterLab autosaves every two
minutes. nbval compares every cell's new output with the saved one, so a learner's own notes would make
``python -m pytest`` fail. This module lets the test command test what the repository committed instead:

* :func:`edited_notebooks` asks git which notebooks under ``notebooks/`` differ from ``HEAD``
  (``git diff --name-only HEAD``: staged or not, git's own line-ending filters applied);
* :func:`write_pristine_copies` writes each one's committed version beside it, under a hidden name
  ``.NAME.PID.committed.ipynb`` (same folder, so the notebook's relative paths still resolve; ignored by git
  and hidden by JupyterLab), and returns the mapping working copy -> committed copy;
* :func:`pristine` maps a path through that mapping (kept in the environment variable
  ``ATTN_PRISTINE_NOTEBOOKS`` so that pytest-xdist's workers, started after it is set, see it too).

The root ``conftest.py`` uses it: it collects the committed copies instead of the edited ones, names the
edited notebooks in its output and removes the copies at the end. Nothing here writes to a working copy.
Without git, or outside a git checkout, nothing is mapped and the working copies are tested.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

ENV = "ATTN_PRISTINE_NOTEBOOKS"
SUFFIX = ".committed.ipynb"


def pristine_name(path: Path, tag: str = "") -> Path:
    """``notebooks/01_x.ipynb`` -> ``notebooks/.01_x.TAG.committed.ipynb`` (TAG: the writing process's id, so
    that two test runs at once never share, or remove, each other's copies)."""
    return path.with_name("." + path.stem + (f".{tag}" if tag else "") + SUFFIX)


def working_name(copy_name: str) -> str:
    """``.01_x.1234.committed.ipynb`` -> ``01_x.ipynb``."""
    stem = copy_name[1:-len(SUFFIX)]
    head, _, tail = stem.rpartition(".")
    return (head if tail.isdigit() and head else stem) + ".ipynb"


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, timeout=60)


def edited_notebooks(repo: Path, folder: str = "notebooks") -> list[Path]:
    """The notebooks under ``repo/folder`` whose working copy differs from ``HEAD`` (absolute paths).

    A notebook git does not track (new, not committed) is not listed: there is no committed version to
    test instead. Returns ``[]`` when git is missing or ``repo`` is not a git checkout with a commit.
    """
    repo = Path(repo).resolve()
    try:
        done = _git(repo, "diff", "--name-only", "-z", "HEAD", "--", folder)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if done.returncode != 0:
        return []
    names = [n for n in done.stdout.decode("utf-8", "replace").split("\0") if n.endswith(".ipynb")]
    top = _git(repo, "rev-parse", "--show-toplevel")
    root = Path(top.stdout.decode().strip()) if top.returncode == 0 else repo
    out = []
    for name in names:
        path = (root / name).resolve()
        if path.exists() and not path.name.startswith("."):  # a deleted notebook is not studied
            out.append(path)
    return sorted(out)


def write_pristine_copies(repo: Path, paths: list[Path]) -> dict[str, str]:
    """Write ``HEAD``'s version of each path beside it (:func:`pristine_name`); return {working: copy}."""
    repo = Path(repo).resolve()
    top = _git(repo, "rev-parse", "--show-toplevel")
    root = Path(top.stdout.decode().strip()).resolve() if top.returncode == 0 else repo
    mapping: dict[str, str] = {}
    for path in paths:
        rel = Path(path).resolve().relative_to(root).as_posix()
        done = _git(repo, "show", f"HEAD:{rel}")
        if done.returncode != 0:
            continue
        copy = pristine_name(Path(path).resolve(), str(os.getpid()))
        copy.write_bytes(done.stdout)
        mapping[str(Path(path).resolve())] = str(copy)
    return mapping


def remove_pristine_copies(mapping: dict[str, str]) -> None:
    for copy in mapping.values():
        Path(copy).unlink(missing_ok=True)


def mapping_from_env() -> dict[str, str]:
    raw = os.environ.get(ENV, "")
    return json.loads(raw) if raw else {}


def pristine(path: Path | str) -> Path:
    """The path the tests read for notebook ``path``: its committed copy if the learner edited it."""
    return Path(mapping_from_env().get(str(Path(path).resolve()), path))
