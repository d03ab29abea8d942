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


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_no_output_hidden_without_reason(path: Path):
    """An ignore marker must sit alone on its line (nbval reads only an exact comment) and be
    followed by a comment line saying *because* what varies: timings or widget views."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    for i, c in enumerate(nb["cells"]):
        src = "".join(c["source"])
        assert "NBVAL_SKIP" not in src, f"{path.name}: cell {i} is skipped by nbval"
        if c["cell_type"] != "code" or "NBVAL_IGNORE_OUTPUT" not in src:
            continue
        lines = [ln.strip() for ln in src.splitlines()]
        assert "# NBVAL_IGNORE_OUTPUT" in lines, f"{path.name}: cell {i}: the marker must be alone on its line"
        j = lines.index("# NBVAL_IGNORE_OUTPUT")
        reason = lines[j + 1] if j + 1 < len(lines) else ""
        assert reason.startswith("#") and "because" in reason.lower(), (
            f"{path.name}: cell {i} ignores its output without a '# because ...' line under the marker"
        )
