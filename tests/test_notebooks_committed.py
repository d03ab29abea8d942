"""Guards for what nbval cannot see: a notebook committed without outputs passes nbval
silently (cells with no execution_count are not compared), so check here that every
notebook was committed from one clean "restart kernel and run all"."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks/NN_*.ipynb found"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_committed_from_one_clean_run(path: Path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    code = [c for c in nb["cells"] if c["cell_type"] == "code" and "".join(c["source"]).strip()]
    counts = [c.get("execution_count") for c in code]
    assert None not in counts, f"{path.name}: {counts.count(None)} code cell(s) never executed"
    assert counts == list(range(1, len(code) + 1)), (
        f"{path.name}: execution counts {counts} are not 1..{len(code)}: "
        "re-run with 'restart kernel and run all' before committing"
    )
    for i, c in enumerate(code):
        for out in c.get("outputs", []):
            assert out.get("output_type") != "error", f"{path.name}: code cell {i + 1} stored an error ({out.get('ename')})"


NBVAL_TAGS = {"nbval-ignore-output", "nbval-check-output", "nbval-skip", "raises-exception"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_no_output_hidden_without_reason(path: Path):
    """nbval markers are cell tags, out of the learner's sight, never ``# NBVAL_...`` comments in
    the code they read; a cell whose output nbval ignores says why in its metadata
    (``nbval-ignore-reason``), and no cell is skipped: its asserts must still run."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    for i, c in enumerate(nb["cells"]):
        src = "".join(c["source"])
        if c["cell_type"] != "code":
            continue
        assert "NBVAL_" not in src, f"{path.name}: cell {i} carries an nbval comment: use a cell tag instead"
        tags = set(c.get("metadata", {}).get("tags", []))
        assert "nbval-skip" not in tags, f"{path.name}: cell {i} is skipped by nbval"
        if "nbval-ignore-output" in tags:
            reason = c["metadata"].get("nbval-ignore-reason", "")
            assert len(reason.strip()) > 10, (
                f"{path.name}: cell {i} ignores its output without an 'nbval-ignore-reason' in its metadata"
            )
