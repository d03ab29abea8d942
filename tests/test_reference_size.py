"""The reference code a learner reads next stays short (issue 31): a default call runs few lines.

``tools/trace_lines.py`` counts the distinct lines of ``helpers`` that one steady-state call executes.
The budgets are those of nanoGPT's attention ``forward`` (about 22 lines) and Raschka's ``apply_rope`` (19),
with room for one validation call at the entry point.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import trace_lines  # noqa: E402

CALLS = trace_lines.reference_calls()


@pytest.mark.parametrize("name", list(CALLS))
def test_a_reference_call_executes_few_lines(name):
    fn, args, kwargs = CALLS[name]
    lines = trace_lines.traced_lines(fn, *args, **kwargs)
    shown = "\n".join(f"  {Path(f).name}:{n}" for f, n in lines)
    assert len(lines) <= trace_lines.BUDGETS[name], (
        f"{name} executes {len(lines)} distinct lines of helpers, over its budget of "
        f"{trace_lines.BUDGETS[name]}:\n{shown}")


def test_the_tracer_counts_helpers_lines_and_nothing_else():
    """It can fail: a call that runs more lines is counted higher, and torch's own lines are not counted."""
    import helpers

    x = torch.randn(1, 1, 3, 4)
    one = trace_lines.traced_lines(helpers.apply_rope, x)
    assert one and all(f.startswith(trace_lines.HELPERS_DIR) for f, _ in one)
    assert trace_lines.traced_lines(torch.matmul, x, x.transpose(-1, -2)) == []
    mha = helpers.MultiHeadAttention(8, 2)
    assert len(trace_lines.traced_lines(mha, torch.randn(1, 3, 8))) > len(one) // 2
