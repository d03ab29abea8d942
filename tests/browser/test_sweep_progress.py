"""``helpers.lab.sweep``'s progress line, seen in JupyterLab as a learner sees it (issue 23): while the
seeds run, one output line counts the finished seeds, updated in place; when the sweep ends it is
replaced by a blank 1x1 picture, so the saved notebook holds no count and no time."""
from __future__ import annotations

import nbformat

from .conftest import scratch_notebook
from .test_lab_sliders import KERNEL_IDLE

CELL = ("import time\nfrom helpers.lab.sweep import sweep\n"
        "res = sweep(lambda s: time.sleep(2.0) or float(s), [0, 1, 2], workers=1)\n"
        "print('done', res.values().tolist())")
OUTPUT_TEXT = """() => {
  const cell = window.jupyterapp.shell.currentWidget.content.widgets.find(c => c.model.type === 'code');
  return cell.node.querySelector('.jp-OutputArea') ? cell.node.querySelector('.jp-OutputArea').textContent : '';
}"""

OUTPUTS = """() => window.jupyterapp.shell.currentWidget.content.widgets.find(c => c.model.type === 'code').model.outputs.toJSON()"""


def test_a_sweep_shows_progress_in_place_and_leaves_no_text(lab, browser):
    with scratch_notebook(lab, browser, "_sweep_progress_check.ipynb", [nbformat.v4.new_code_cell(CELL)]) as page:
        page.wait_for_function(KERNEL_IDLE, timeout=120_000)
        # record every state of the cell's rendered output while it runs (a snapshot each 100 ms, when it changed)
        page.evaluate("() => { window.__seen = []; setInterval(() => { const c = window.jupyterapp.shell.currentWidget"
                      ".content.widgets.find(c => c.model.type === 'code'); const a = c.node.querySelector('.jp-OutputArea');"
                      " const o = a ? a.textContent : ''; if (window.__seen[window.__seen.length - 1] !== o) "
                      "window.__seen.push(o); }, 100); }")
        page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
        page.wait_for_function(f"() => ({OUTPUT_TEXT})().includes('done [0.0, 1.0, 2.0]')", timeout=180_000)
        page.wait_for_function(KERNEL_IDLE, timeout=60_000)
        seen = page.evaluate("() => window.__seen")
        after = page.evaluate(OUTPUT_TEXT)
        outputs = page.evaluate(OUTPUTS)
        during = [t for t in seen if "sweep:" in t]
        # while it ran: the line counted the finished seeds (each takes 2 s), one line updated in place
        assert any("sweep: 1 of 3 seeds finished (seed 0)" in t for t in during), seen
        assert any("sweep: 2 of 3 seeds finished (seeds 0, 1)" in t for t in during), seen
        assert all(t.count("sweep:") == 1 for t in during), during
        assert "sweep:" not in after, after                                  # and it is gone at the end
        kinds = [(o["output_type"], sorted(o.get("data", {}))) for o in outputs]
        assert ("display_data", ["image/png"]) in kinds, kinds
